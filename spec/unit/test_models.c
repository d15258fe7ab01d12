/*
 * The providers' models lists (issue #19, item 7; `tg_unit providers`): each shape read
 * into entries (ids, created, owners, the cursor of the next page), and hostile pages —
 * not JSON, the list not an array, entries without ids or of the wrong types, a cursor
 * too long, more entries than a page may bring — refused or skipped, never a crash.
 */
#include "tollgate/tg_models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_common.h"
#include "tg_test.h"

static char next[TG_MODELS_CURSOR_MAX];

/* The ids read from body in shape, comma separated ("!" when refused), into out. */
static const char *ids(tg_models_shape_t shape, const char *body) {
    static char out[1024];
    json_t *e = json_array(), *m;
    size_t i;
    if (!tg_models_page(shape, body, strlen(body), 1750000000, e, next)) {
        json_decref(e);
        return "!";
    }
    out[0] = '\0';
    json_array_foreach(e, i, m) {
        size_t n = strlen(out);
        snprintf(out + n, sizeof(out) - n, "%s%s", i ? "," : "", json_string_value(json_object_get(m, "id")));
    }
    json_decref(e);
    return out;
}

TG_TEST(providers, models_lists_each_shape) {
    ASSERT_EQ_STR(ids(TG_MODELS_OPENAI, "{\"object\":\"list\",\"data\":[{\"id\":\"gpt-4o\",\"object\":\"model\"},"
                                        "{\"id\":\"\"},{\"id\":3},{\"x\":1},\"s\",{\"id\":\"o3\"}]}"),
                  "gpt-4o,o3");
    ASSERT_EQ_STR(next, "");
    ASSERT_EQ_STR(ids(TG_MODELS_ANTHROPIC, "{\"data\":[{\"type\":\"model\",\"id\":\"claude-a\",\"created_at\":"
                                           "\"2025-02-19T00:00:00Z\"}],\"has_more\":true,\"last_id\":\"claude-a\"}"),
                  "claude-a");
    ASSERT_EQ_STR(next, "claude-a");
    ids(TG_MODELS_ANTHROPIC, "{\"data\":[],\"has_more\":false,\"last_id\":\"z\"}");
    ASSERT_EQ_STR(next, "");
    ASSERT_EQ_STR(ids(TG_MODELS_GEMINI, "{\"models\":[{\"name\":\"models/gemini-2.0-flash\"},{\"name\":\"models/\"},"
                                        "{\"name\":7}],\"nextPageToken\":\"Ch0=\"}"),
                  "gemini-2.0-flash");
    ASSERT_EQ_STR(next, "Ch0=");
    ASSERT_EQ_STR(ids(TG_MODELS_GEMINI, "{}"), ""); /* an empty list leaves "models" out */
    ASSERT_EQ_STR(ids(TG_MODELS_GEMINI, "{\"models\":[{\"name\":\"models/text-embedding-004\",\"supportedGenerationMethods\":"
                                        "[\"embedContent\"]},{\"name\":\"models/gemini-2.5-pro\",\"supportedGenerationMethods\":"
                                        "[\"generateContent\",\"countTokens\"]}]}"),
                  "gemini-2.5-pro");
    ASSERT_EQ_STR(ids(TG_MODELS_VERTEX, "{\"publisherModels\":[{\"name\":\"publishers/google/models/gemini-2.5-pro\","
                                        "\"versionId\":\"001\"},{\"name\":\"publishers/anthropic/models/claude-x\"},"
                                        "{\"name\":\"publishers/google/models/imagen-4.0-generate-001\"}]}"),
                  "gemini-2.5-pro,claude-x");
    /* Azure: a model that cannot infer and one retired for inference are left out. */
    ASSERT_EQ_STR(ids(TG_MODELS_AZURE, "{\"data\":[{\"id\":\"gpt-4o\",\"created_at\":1715558400,\"capabilities\":"
                                       "{\"inference\":true},\"deprecation\":{\"inference\":1800000000}},"
                                       "{\"id\":\"curie\",\"deprecation\":{\"inference\":1709284527}},"
                                       "{\"id\":\"ft-base\",\"capabilities\":{\"inference\":false}},"
                                       "{\"id\":\"plain\"}],\"object\":\"list\"}"),
                  "gpt-4o,plain");
    /* Bedrock: the Anthropic models only. */
    ASSERT_EQ_STR(ids(TG_MODELS_BEDROCK, "{\"modelSummaries\":[{\"modelId\":\"anthropic.claude-3-haiku-20240307-v1:0\","
                                         "\"providerName\":\"Anthropic\"},{\"modelId\":\"amazon.titan-text-express-v1\","
                                         "\"providerName\":\"Amazon\"},{\"modelId\":\"anthropic.claude-v2\"},"
                                         "{\"providerName\":\"Anthropic\"}]}"),
                  "anthropic.claude-3-haiku-20240307-v1:0,anthropic.claude-v2");
    /* ... served on demand: one only through an inference profile is left out. */
    ASSERT_EQ_STR(ids(TG_MODELS_BEDROCK, "{\"modelSummaries\":[{\"modelId\":\"anthropic.a\",\"inferenceTypesSupported\":"
                                         "[\"INFERENCE_PROFILE\"]},{\"modelId\":\"anthropic.b\",\"inferenceTypesSupported\":"
                                         "[\"PROVISIONED\",\"ON_DEMAND\"]}]}"),
                  "anthropic.b");
    ASSERT_EQ_STR(ids(TG_MODELS_BEDROCK_PROFILES,
                      "{\"inferenceProfileSummaries\":[{\"inferenceProfileId\":\"us.anthropic.claude-sonnet-4-v1:0\","
                      "\"status\":\"ACTIVE\"},{\"inferenceProfileId\":\"us.amazon.nova-lite-v1:0\"},{\"inferenceProfileId\":"
                      "\"eu.anthropic.old\",\"status\":\"LEGACY\"}],\"nextToken\":\"abc/=\"}"),
                  "us.anthropic.claude-sonnet-4-v1:0");
    ASSERT_EQ_STR(next, "abc/=");

    /* The entries' fields: created from created_at, the provider's object kept. */
    json_t *e = json_array();
    const char *an = "{\"data\":[{\"type\":\"model\",\"id\":\"c\",\"display_name\":\"C\",\"created_at\":\"2023-11-14T22:13:20Z\"}]}";
    ASSERT(tg_models_page(TG_MODELS_ANTHROPIC, an, strlen(an), 0, e, next));
    json_t *m = json_array_get(e, 0);
    ASSERT_EQ_INT(json_integer_value(json_object_get(m, "created")), 1700000000);
    ASSERT_EQ_STR(json_string_value(json_object_get(m, "display_name")), "C");
    ASSERT(json_is_object(json_object_get(m, "an")));
    json_decref(e);
}

TG_TEST(providers, models_lists_hostile) {
    static const char *const never[] = {"", "not json", "{\"data\":[{\"id\":\"cut", "[]", "null", "\"s\""};
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++)
        for (int shape = TG_MODELS_OPENAI; shape <= TG_MODELS_BEDROCK_PROFILES; shape++)
            ASSERT_EQ_STR(ids((tg_models_shape_t)shape, never[i]), "!");
    /* The list of another type than an array. */
    ASSERT_EQ_STR(ids(TG_MODELS_OPENAI, "{\"data\":\"not a list\"}"), "!");
    ASSERT_EQ_STR(ids(TG_MODELS_ANTHROPIC, "{\"data\":{}}"), "!");
    ASSERT_EQ_STR(ids(TG_MODELS_AZURE, "{\"object\":\"list\"}"), "!");
    ASSERT_EQ_STR(ids(TG_MODELS_GEMINI, "{\"models\":{}}"), "!");
    ASSERT_EQ_STR(ids(TG_MODELS_VERTEX, "{\"publisherModels\":\"x\"}"), "!");
    ASSERT_EQ_STR(ids(TG_MODELS_BEDROCK, "{\"modelSummaries\":null}"), "!");
    ASSERT_EQ_STR(ids(TG_MODELS_BEDROCK_PROFILES, "{\"nextToken\":\"x\"}"), "!");
    /* A cursor of another type: no next page. */
    ASSERT_EQ_STR(ids(TG_MODELS_GEMINI, "{\"models\":[],\"nextPageToken\":5}"), "");
    ASSERT_EQ_STR(next, "");
    /* A cursor too long to follow: the page is refused, not truncated. */
    char *big = malloc(TG_MODELS_CURSOR_MAX + 64);
    int n = snprintf(big, TG_MODELS_CURSOR_MAX + 64, "{\"models\":[],\"nextPageToken\":\"");
    memset(big + n, 'a', TG_MODELS_CURSOR_MAX);
    strcpy(big + n + TG_MODELS_CURSOR_MAX, "\"}");
    ASSERT_EQ_STR(ids(TG_MODELS_GEMINI, big), "!");
    free(big);
    /* More entries than a page may bring: the first TG_MODELS_PAGE_ENTRIES_MAX. */
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_appends(&b, "{\"data\":[");
    for (int i = 0; i < TG_MODELS_PAGE_ENTRIES_MAX + 5; i++)
        tg_buf_printf(&b, "%s{\"id\":\"m%d\"}", i ? "," : "", i);
    tg_buf_appends(&b, "]}");
    json_t *e = json_array();
    ASSERT(tg_models_page(TG_MODELS_OPENAI, b.data, b.len, 0, e, next));
    ASSERT_EQ_INT((int)json_array_size(e), TG_MODELS_PAGE_ENTRIES_MAX);
    json_decref(e);
    tg_buf_free(&b);
}
