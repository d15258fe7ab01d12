/*
 * The providers' models lists read into one form (tg_models.h).
 */
#include "tollgate/tg_models.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "tollgate/tg_json.h"

json_t *tg_models_entry(const char *id, int64_t created, const char *display, const char *owner) {
    return json_pack("{s:s,s:I,s:s,s:s}", "id", id, "created", (json_int_t)created, "display_name",
                     display ? display : id, "owned_by", owner);
}

static int64_t parse_rfc3339(const char *s) {
    struct tm tm = {0};
    int y, mo, d, h, mi, se;
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &se) != 6)
        return 0;
    tm.tm_year = y - 1900, tm.tm_mon = mo - 1, tm.tm_mday = d, tm.tm_hour = h, tm.tm_min = mi, tm.tm_sec = se;
    time_t t = timegm(&tm);
    return t < 0 ? 0 : (int64_t)t;
}

static int64_t int_of(json_t *v) { return json_is_integer(v) && json_integer_value(v) > 0 ? json_integer_value(v) : 0; }

/* The part of a resource name after its last "models/" ("models/gemini-2.0-flash",
 * "publishers/google/models/gemini-2.0-flash"), or the name; NULL when empty. */
static const char *name_id(const char *name) {
    if (!name)
        return NULL;
    const char *at = name, *p;
    while ((p = strstr(at, "models/")) != NULL)
        at = p + 7;
    return *at ? at : NULL;
}

/* An Azure model a deployment can serve: not one that cannot infer, nor one retired
 * for inference (deprecation.inference in the past). */
static int azure_serves(json_t *m, int64_t now_s) {
    json_t *caps = json_object_get(m, "capabilities");
    if (json_is_false(json_object_get(caps, "inference")))
        return 0;
    int64_t retired = int_of(json_object_get(json_object_get(m, "deprecation"), "inference"));
    return !retired || retired > now_s;
}

/* 1 if `list` is not an array (not given: no restriction) or holds the string s. */
static int has_string(json_t *list, const char *s) {
    json_t *t;
    size_t i;
    if (!json_is_array(list))
        return 1;
    json_array_foreach(list, i, t) if (json_is_string(t) && !strcmp(json_string_value(t), s)) return 1;
    return 0;
}

static void append(json_t *entries, size_t *n, json_t *e) {
    if (e && (*n)++ < TG_MODELS_PAGE_ENTRIES_MAX)
        json_array_append_new(entries, e);
    else
        json_decref(e);
}

int tg_models_page(tg_models_shape_t shape, const char *body, size_t len, int64_t now_s, json_t *entries,
                   char next[TG_MODELS_CURSOR_MAX]) {
    next[0] = '\0';
    json_t *doc = tg_json_loadb(body ? body : "", len, 0, NULL);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return 0;
    }
    static const char *const list_key[] = {"data",           "data",           "models",
                                           "data",           "modelSummaries", "publisherModels",
                                           "inferenceProfileSummaries"};
    json_t *list = json_object_get(doc, list_key[shape]), *m;
    const char *cursor = NULL;
    size_t i, n = 0;
    int ok = 1;
    if (shape == TG_MODELS_GEMINI || shape == TG_MODELS_VERTEX) {
        /* Google's lists leave an empty list out. */
        ok = !list || json_is_array(list);
        cursor = json_string_value(json_object_get(doc, "nextPageToken"));
    } else {
        ok = json_is_array(list);
        if (shape == TG_MODELS_BEDROCK_PROFILES)
            cursor = json_string_value(json_object_get(doc, "nextToken"));
        if (shape == TG_MODELS_ANTHROPIC && json_is_true(json_object_get(doc, "has_more")))
            cursor = json_string_value(json_object_get(doc, "last_id"));
    }
    if (ok && cursor && strlen(cursor) >= TG_MODELS_CURSOR_MAX)
        ok = 0;
    if (!ok) {
        json_decref(doc);
        return 0;
    }
    json_array_foreach(list, i, m) {
        const char *id = json_string_value(json_object_get(m, "id")), *name;
        json_t *e = NULL;
        switch (shape) {
        case TG_MODELS_OPENAI:
            if (id && *id) {
                const char *owner = json_string_value(json_object_get(m, "owned_by"));
                e = tg_models_entry(id, int_of(json_object_get(m, "created")), NULL, owner ? owner : "openai");
                json_object_set(e, "oa", m);
            }
            break;
        case TG_MODELS_ANTHROPIC:
            if (id && *id) {
                e = tg_models_entry(id, parse_rfc3339(json_string_value(json_object_get(m, "created_at"))),
                                    json_string_value(json_object_get(m, "display_name")), "anthropic");
                json_object_set(e, "an", m);
            }
            break;
        case TG_MODELS_AZURE:
            if (id && *id && azure_serves(m, now_s))
                e = tg_models_entry(id, int_of(json_object_get(m, "created_at")), NULL, "azure");
            break;
        case TG_MODELS_BEDROCK: {
            /* Bedrock accounts call Anthropic models (InvokeModel's Messages body), those
             * served on demand: one served only through an inference profile or
             * provisioned throughput is not called by its modelId. */
            const char *mid = json_string_value(json_object_get(m, "modelId"));
            const char *prov = json_string_value(json_object_get(m, "providerName"));
            if (mid && *mid && ((prov && !strcasecmp(prov, "anthropic")) || !strncmp(mid, "anthropic.", 10)) &&
                has_string(json_object_get(m, "inferenceTypesSupported"), "ON_DEMAND"))
                e = tg_models_entry(mid, 0, json_string_value(json_object_get(m, "modelName")), "bedrock");
            break;
        }
        case TG_MODELS_BEDROCK_PROFILES: {
            /* A (cross-region) inference profile of an Anthropic model: its id is what
             * InvokeModel takes for models that are not served on demand. */
            const char *pid = json_string_value(json_object_get(m, "inferenceProfileId"));
            const char *st = json_string_value(json_object_get(m, "status"));
            if (pid && strstr(pid, "anthropic.") && (!st || !strcmp(st, "ACTIVE")))
                e = tg_models_entry(pid, 0, json_string_value(json_object_get(m, "inferenceProfileName")), "bedrock");
            break;
        }
        case TG_MODELS_GEMINI:
        case TG_MODELS_VERTEX:
            /* Gemini: the models generateContent serves (supportedGenerationMethods,
             * when given, names it; an embedding-only model does not). */
            if (shape == TG_MODELS_GEMINI && !has_string(json_object_get(m, "supportedGenerationMethods"), "generateContent"))
                break;
            name = json_string_value(json_object_get(m, "name"));
            if ((id = name_id(name)) == NULL)
                break;
            /* Vertex: Google's models through generateContent are its Gemini models (its
             * image, speech and embedding models take predict). */
            if (shape == TG_MODELS_VERTEX && !strncmp(name, "publishers/google/", 18) && strncmp(id, "gemini", 6) != 0)
                break;
            e = tg_models_entry(id, 0, json_string_value(json_object_get(m, "displayName")),
                                shape == TG_MODELS_GEMINI ? "google" : "vertex");
            break;
        }
        append(entries, &n, e);
    }
    if (cursor)
        snprintf(next, TG_MODELS_CURSOR_MAX, "%s", cursor);
    json_decref(doc);
    return 1;
}
