/*
 * Unit tests of usage extraction (core/src/proto/tg_usage.c), on the bodies and streams the
 * providers really send. The stream tests run the bytes through the SSE parser, split at
 * every offset, exactly as the gateway does, and check the usage that would be billed.
 */
#include "tollgate/tg_sse.h"
#include "tollgate/tg_usage.h"

#include "tg_test.h"

#define ALL_BUT(bits) ((TG_USAGE_INPUT | TG_USAGE_OUTPUT | TG_USAGE_CACHE_READ |            \
                        TG_USAGE_CACHE_WRITE | TG_USAGE_REASONING) & ~(unsigned)(bits))

static int merge(tg_usage_t *u, tg_proto_t proto, const char *json) {
    return tg_usage_merge_json(u, proto, json, strlen(json));
}

/* The usage rendered as the ledger's JSON, for one-line comparisons. */
static const char *usage_str(const tg_usage_t *u) {
    static char out[256];
    tg_buf_t b;
    tg_buf_init(&b);
    tg_usage_append_json(u, &b);
    snprintf(out, sizeof(out), "%s", b.data);
    tg_buf_free(&b);
    return out;
}

typedef struct {
    tg_proto_t proto;
    tg_usage_t u;
    int found;   /* events that carried usage */
    int errors;  /* events whose JSON was malformed */
} stream_t;

static void stream_cb(void *ud, const char *event, size_t event_len, const char *data,
                      size_t data_len) {
    stream_t *s = ud;
    int rc = tg_usage_merge_json(&s->u, s->proto, data, data_len);
    if (rc == TG_ERROR)
        s->errors++;
    else
        s->found += rc;
}

/* Runs a whole stream split at every offset; all must agree; returns the last run. */
static stream_t run_stream(tg_proto_t proto, const char *in) {
    size_t n = strlen(in);
    stream_t first = {0};
    for (size_t a = 0; a <= n; a++) {
        stream_t s = {.proto = proto};
        tg_sse_parser_t p;
        tg_sse_init(&p, 1 << 20, stream_cb, &s);
        tg_sse_feed(&p, in, a);
        tg_sse_feed(&p, in + a, n - a);
        tg_sse_free(&p);
        if (a == 0)
            first = s;
        ASSERT(memcmp(&s.u, &first.u, sizeof(s.u)) == 0);
        ASSERT_EQ_INT(s.found, first.found);
        ASSERT_EQ_INT(s.errors, first.errors);
    }
    return first;
}

TG_TEST(usage, openai_chat_body) {
    tg_usage_t u = {0};
    ASSERT_EQ_INT(merge(&u, TG_PROTO_OPENAI_CHAT,
                        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\","
                        "\"model\":\"gpt-4o\","
                        "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                        "\"content\":\"Hi\"},\"finish_reason\":\"stop\"}],"
                        "\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":300,"
                        "\"total_tokens\":1500,\"prompt_tokens_details\":{\"cached_tokens\":1024,"
                        "\"audio_tokens\":0},\"completion_tokens_details\":"
                        "{\"reasoning_tokens\":256,\"audio_tokens\":0}}}"),
                  1);
    ASSERT_EQ_STR(usage_str(&u),
                  "{\"input\":176,\"output\":300,\"cache_read\":1024,\"cache_write\":null,"
                  "\"reasoning\":256}");
    ASSERT_EQ_INT(u.known, ALL_BUT(TG_USAGE_CACHE_WRITE));
}

TG_TEST(usage, openai_chat_without_details_leaves_cache_unknown) {
    tg_usage_t u = {0};
    ASSERT_EQ_INT(merge(&u, TG_PROTO_OPENAI_CHAT,
                        "{\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,"
                        "\"prompt_tokens_details\":null}}"),
                  1);
    ASSERT_EQ_INT(u.known, TG_USAGE_INPUT | TG_USAGE_OUTPUT);
    ASSERT_EQ_STR(usage_str(&u), "{\"input\":10,\"output\":5,\"cache_read\":null,"
                                 "\"cache_write\":null,\"reasoning\":null}");
}

static const char openai_stream[] =
    "data: {\"id\":\"chatcmpl-AB1\",\"object\":\"chat.completion.chunk\",\"created\":1727000000,"
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_1\","
    "\"choices\":[{\"index\":0,"
    "\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,"
    "\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"chatcmpl-AB1\",\"object\":\"chat.completion.chunk\",\"created\":1727000000,"
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_1\","
    "\"choices\":[{\"index\":0,"
    "\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}],"
    "\"usage\":null}\n\n"
    "data: {\"id\":\"chatcmpl-AB1\",\"object\":\"chat.completion.chunk\",\"created\":1727000000,"
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_1\","
    "\"choices\":[{\"index\":0,"
    "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"
    "data: {\"id\":\"chatcmpl-AB1\",\"object\":\"chat.completion.chunk\",\"created\":1727000000,"
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_1\","
    "\"choices\":[],"
    "\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":40,\"total_tokens\":1240,"
    "\"prompt_tokens_details\":{\"cached_tokens\":1024,\"audio_tokens\":0},"
    "\"completion_tokens_details\":{\"reasoning_tokens\":0,\"audio_tokens\":0,"
    "\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}\n\n"
    "data: [DONE]\n\n";

TG_TEST(usage, openai_chat_stream_final_chunk) {
    stream_t s = run_stream(TG_PROTO_OPENAI_CHAT, openai_stream);
    ASSERT_EQ_INT(s.found, 1);
    ASSERT_EQ_INT(s.errors, 0);
    ASSERT_EQ_STR(usage_str(&s.u), "{\"input\":176,\"output\":40,\"cache_read\":1024,"
                                   "\"cache_write\":null,\"reasoning\":0}");
}

TG_TEST(usage, openai_chat_usage_null_is_no_usage) {
    tg_usage_t u = {.input = 7, .known = TG_USAGE_INPUT};
    ASSERT_EQ_INT(merge(&u, TG_PROTO_OPENAI_CHAT,
                        "{\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":null}"),
                  0);
    ASSERT_EQ_INT(u.known, TG_USAGE_INPUT);
    ASSERT_EQ_INT(u.input, 7);
}

TG_TEST(usage, anthropic_body) {
    tg_usage_t u = {0};
    ASSERT_EQ_INT(merge(&u, TG_PROTO_ANTHROPIC,
                        "{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\","
                        "\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}],"
                        "\"model\":\"claude-sonnet-4-20250514\",\"stop_reason\":\"end_turn\","
                        "\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":300,"
                        "\"cache_read_input_tokens\":2048,\"output_tokens\":6}}"),
                  1);
    ASSERT_EQ_INT(u.known, ALL_BUT(TG_USAGE_REASONING));
    ASSERT_EQ_STR(usage_str(&u), "{\"input\":12,\"output\":6,\"cache_read\":2048,"
                                 "\"cache_write\":300,\"reasoning\":null}");
}

static const char anthropic_stream[] =
    "event: message_start\n"
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\","
    "\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-20250514\","
    "\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,"
    "\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":2000,"
    "\"output_tokens\":1}}}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\","
    "\"text\":\"\"}}\n\n"
    "event: ping\n"
    "data: {\"type\": \"ping\"}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\","
    "\"text\":\"Hello\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\","
    "\"text\":\"! The usage is fine.\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
    "event: message_delta\n"
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\","
    "\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n"
    "event: message_stop\n"
    "data: {\"type\":\"message_stop\"}\n\n";

TG_TEST(usage, anthropic_stream_start_and_delta_combine) {
    stream_t s = run_stream(TG_PROTO_ANTHROPIC, anthropic_stream);
    ASSERT_EQ_INT(s.found, 2);
    ASSERT_EQ_INT(s.errors, 0);
    /* message_delta's output_tokens (15) overwrites message_start's (1); the rest stays. */
    ASSERT_EQ_STR(usage_str(&s.u), "{\"input\":25,\"output\":15,\"cache_read\":2000,"
                                   "\"cache_write\":100,\"reasoning\":null}");
}

TG_TEST(usage, anthropic_delta_nulls_do_not_overwrite) {
    tg_usage_t u = {0};
    ASSERT_EQ_INT(merge(&u, TG_PROTO_ANTHROPIC,
                        "{\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":40,"
                        "\"cache_read_input_tokens\":8,\"output_tokens\":1}}}"),
                  1);
    ASSERT_EQ_INT(merge(&u, TG_PROTO_ANTHROPIC,
                        "{\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"input_tokens\":null,"
                        "\"cache_read_input_tokens\":null,\"cache_creation_input_tokens\":null,"
                        "\"output_tokens\":99}}"),
                  1);
    ASSERT_EQ_STR(usage_str(&u), "{\"input\":40,\"output\":99,\"cache_read\":8,"
                                 "\"cache_write\":null,\"reasoning\":null}");
}

static const char responses_stream[] =
    "event: response.created\n"
    "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\","
    "\"object\":\"response\",\"status\":\"in_progress\",\"model\":\"gpt-4.1\",\"output\":[],"
    "\"usage\":null}}\n\n"
    "event: response.output_text.delta\n"
    "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\","
    "\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n"
    "event: response.completed\n"
    "data: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{\"id\":\"resp_1\","
    "\"object\":\"response\",\"status\":\"completed\",\"model\":\"gpt-4.1\",\"output\":[],"
    "\"usage\":{\"input_tokens\":328,\"input_tokens_details\":{\"cached_tokens\":128},"
    "\"output_tokens\":52,\"output_tokens_details\":{\"reasoning_tokens\":20},"
    "\"total_tokens\":380}}}\n\n";

TG_TEST(usage, responses_stream_completed) {
    stream_t s = run_stream(TG_PROTO_RESPONSES, responses_stream);
    ASSERT_EQ_INT(s.found, 1);
    ASSERT_EQ_INT(s.errors, 0);
    ASSERT_EQ_STR(usage_str(&s.u), "{\"input\":200,\"output\":52,\"cache_read\":128,"
                                   "\"cache_write\":null,\"reasoning\":20}");
}

TG_TEST(usage, responses_body_and_incomplete) {
    tg_usage_t u = {0};
    ASSERT_EQ_INT(merge(&u, TG_PROTO_RESPONSES,
                        "{\"id\":\"resp_2\",\"object\":\"response\",\"status\":\"completed\","
                        "\"usage\":{\"input_tokens\":10,\"output_tokens\":3}}"),
                  1);
    ASSERT_EQ_INT(u.known, TG_USAGE_INPUT | TG_USAGE_OUTPUT);
    ASSERT_EQ_INT(u.input, 10);
    tg_usage_t v = {0};
    ASSERT_EQ_INT(merge(&v, TG_PROTO_RESPONSES,
                        "{\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\","
                        "\"incomplete_details\":{\"reason\":\"max_output_tokens\"},"
                        "\"usage\":{\"input_tokens\":50,"
                        "\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":16,"
                        "\"output_tokens_details\":{\"reasoning_tokens\":16}}}}"),
                  1);
    ASSERT_EQ_STR(usage_str(&v), "{\"input\":50,\"output\":16,\"cache_read\":0,"
                                 "\"cache_write\":null,\"reasoning\":16}");
}

TG_TEST(usage, embeddings) {
    tg_usage_t u = {0};
    ASSERT_EQ_INT(merge(&u, TG_PROTO_EMBEDDINGS,
                        "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
                        "\"embedding\":[0.1,-0.2]}],\"model\":\"text-embedding-3-small\","
                        "\"usage\":{\"prompt_tokens\":8,\"total_tokens\":8}}"),
                  1);
    ASSERT_EQ_INT(u.known, TG_USAGE_INPUT | TG_USAGE_OUTPUT);
    ASSERT_EQ_STR(usage_str(&u), "{\"input\":8,\"output\":0,\"cache_read\":null,"
                                 "\"cache_write\":null,\"reasoning\":null}");
}

TG_TEST(usage, missing_usage_stays_unknown) {
    static const char *docs[] = {
        "{\"id\":\"chatcmpl-1\",\"choices\":[]}",
        "{\"choices\":[{\"message\":{\"content\":\"the usage of words\"}}]}",
        "{\"usage\":{}}",
        "{\"usage\":\"lots\"}",
        ("{\"usage\":{\"prompt_tokens\":-5,\"completion_tokens\":\"7\",\"input_tokens\":1.5,"
         "\"output_tokens\":true}}"),
        "[\"usage\"]",
        "data: [DONE]",
    };
    for (int proto = TG_PROTO_OPENAI_CHAT; proto <= TG_PROTO_EMBEDDINGS; proto++) {
        for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
            tg_usage_t u = {.input = 777, .output = 777};
            int rc = merge(&u, (tg_proto_t)proto, docs[i]);
            if (rc != 0 || u.known != 0 || u.input != 777 || u.output != 777) {
                fprintf(stderr, "proto %d doc %zu: rc %d known %u\n", proto, i, rc, u.known);
                exit(1);
            }
            ASSERT_EQ_STR(usage_str(&u), "{\"input\":null,\"output\":null,\"cache_read\":null,"
                                         "\"cache_write\":null,\"reasoning\":null}");
        }
    }
}

TG_TEST(usage, other_protocols_shape_is_not_read) {
    /* An Anthropic body read as OpenAI chat has a usage object but none of chat's keys. */
    tg_usage_t u = {0};
    ASSERT_EQ_INT(merge(&u, TG_PROTO_OPENAI_CHAT,
                        "{\"type\":\"message\","
                        "\"usage\":{\"input_tokens\":3,\"output_tokens\":4}}"),
                  0);
    ASSERT_EQ_INT(u.known, 0);
}

TG_TEST(usage, malformed_json) {
    static const char *docs[] = {
        "{\"usage\":{\"prompt_tokens\":5",
        "{\"usage\": }",
        "usage",
        "{\"usage\":{\"prompt_tokens\":5}} trailing",
    };
    for (int proto = TG_PROTO_OPENAI_CHAT; proto <= TG_PROTO_EMBEDDINGS; proto++) {
        for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
            tg_usage_t u = {0};
            ASSERT_EQ_INT(merge(&u, (tg_proto_t)proto, docs[i]), TG_ERROR);
            ASSERT_EQ_INT(u.known, 0);
        }
    }
    /* Without the bytes "usage" a document is not parsed at all, malformed or not. */
    tg_usage_t u = {0};
    ASSERT_EQ_INT(merge(&u, TG_PROTO_OPENAI_CHAT, "{\"choices\":[{"), 0);
}

TG_TEST(usage, embedded_nul_does_not_truncate) {
    /* The length is authoritative: a NUL inside the document makes it malformed. */
    static const char doc[] = "{\"usage\":{\"prompt_tokens\":5}}\0garbage";
    tg_usage_t u = {0};
    ASSERT_EQ_INT(tg_usage_merge_json(&u, TG_PROTO_EMBEDDINGS, doc, sizeof(doc) - 1), TG_ERROR);
    ASSERT_EQ_INT(tg_usage_merge_json(&u, TG_PROTO_EMBEDDINGS, doc, 29), 1);
    ASSERT_EQ_INT(u.input, 5);
}

TG_TEST(usage, append_json_all_known) {
    tg_usage_t u = {.input = 1, .output = 2, .cache_read = 3, .cache_write = 4,
                    .reasoning = 9007199254740993LL, .known = ALL_BUT(0)};
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_appends(&b, "x=");
    tg_usage_append_json(&u, &b);
    ASSERT_EQ_STR(b.data, "x={\"input\":1,\"output\":2,\"cache_read\":3,\"cache_write\":4,"
                          "\"reasoning\":9007199254740993}");
    tg_buf_free(&b);
}

/* The fast path (structural scan + member reader) against the full jansson parse, on
 * documents built to hit its corners: duplicates, nesting, reals, big numbers, escapes. */
TG_TEST(usage, fast_path_agrees_with_full_parse) {
    static const char *docs[] = {
        "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}",
        "{\"usage\":{\"prompt_tokens\":5,\"prompt_tokens\":\"x\",\"completion_tokens\":7}}",
        "{\"usage\":{\"prompt_tokens\":5},\"usage\":null,\"message\":{\"usage\":{\"input_tokens\":3}}}",
        "{\"usage\":null,\"usage\":{\"prompt_tokens\":1e2,\"completion_tokens\":2.0}}",
        "{\"usage\":{\"prompt_tokens\":9223372036854775807,\"completion_tokens\":-0}}",
        "{\"usage\":{\"prompt_tokens\":-5,\"completion_tokens\":0}}",
        "{\"usage\":{\"prompt_tokens\":30,\"prompt_tokens_details\":{\"cached_tokens\":10},"
        "\"prompt_tokens_details\":null,\"completion_tokens\":4}}",
        "{\"usage\":{\"prompt_tokens\":30,\"prompt_tokens_details\":{\"cached_tokens\":10,\"x\":{\"cached_tokens\":99}},"
        "\"completion_tokens_details\":{\"reasoning_tokens\":[1,{\"a\":2}],\"reasoning_tokens\":3},\"completion_tokens\":4}}",
        "{\"usage\":{\"prompt_\\u0074okens\":5,\"completion_tokens\":7}}",
        "{\"choices\":[{\"message\":{\"content\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":999}\"}}],"
        "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3}}",
        "{\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":11,\"output_tokens\":1,"
        "\"cache_read_input_tokens\":4,\"service_tier\":\"standard\",\"cache_creation\":{\"a\":1}}}}",
        "{\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":8,\"output_tokens\":9,"
        "\"input_tokens_details\":{\"cached_tokens\":2},\"output_tokens_details\":{\"reasoning_tokens\":5}}}}",
        "{\"message\":{\"usage\":{\"input_tokens\":1}},\"message\":{\"id\":\"x\"}}",
        "[{\"usage\":{\"prompt_tokens\":5}}]",
        "{\"usage\":{\"prompt_tokens\":5 , \"completion_tokens\" : 6 }  }  ",
        "{\"usage\":{\"prompt_tokens\":true,\"completion_tokens\":[],\"total_tokens\":{}}}",
    };
    for (int proto = TG_PROTO_OPENAI_CHAT; proto <= TG_PROTO_EMBEDDINGS; proto++) {
        for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
            tg_usage_t fast = {0}, full = {0};
            int a = tg_usage_merge_json(&fast, (tg_proto_t)proto, docs[i], strlen(docs[i]));
            int b = tg_usage_merge_json_full(&full, (tg_proto_t)proto, docs[i], strlen(docs[i]));
            if (a != b || memcmp(&fast, &full, sizeof(fast)) != 0)
                fprintf(stderr, "disagree: proto %d doc %zu: fast %d full %d\n", proto, i, a, b);
            ASSERT_EQ_INT(a, b);
            ASSERT_EQ_INT(memcmp(&fast, &full, sizeof(fast)), 0);
        }
    }
}
