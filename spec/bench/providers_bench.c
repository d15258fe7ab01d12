/*
 * The cost of the provider translations of issue #19, in-process (no network): Gemini's
 * generateContent per request, per non-stream answer and per streamed chunk, each
 * against what the gateway does with the same bytes when it passes them through.
 * (An Azure OpenAI account speaks chat completions: its cost is chat's passthrough plus
 * the deployment path, nothing per chunk.)
 *
 *   tg_providers_bench [ITERATIONS]          thread CPU ns per operation, best of 9
 *   tg_providers_bench --one CASE N          runs one case N times inside measured()
 *                                            (providers_bench.sh counts its
 *                                            instructions with callgrind)
 * Cases: request  a ~1.5 KB chat request (system prompt, four turns, a tool call and its
 *                 result, a tool), and the same in Messages and Responses shape;
 *                 translated = tg_translate_request to Gemini + json_dumps; passthrough
 *                 = json_dumps of the client's body (what the gateway does to a body it
 *                 edits).
 *        answer   a Gemini answer with text, a call and usageMetadata; translated =
 *                 tg_translate_response; passthrough = tg_usage_merge_json on it.
 *        chunk    a 1,000-chunk streamGenerateContent?alt=sse body (one text part and
 *                 usageMetadata per chunk, as Gemini sends it) in 4 KiB reads through the
 *                 SSE parser and tg_xlate_event, per chunk; passthrough = the SSE parser
 *                 and the usage read per chunk.
 * AWS Bedrock (Anthropic models), against an Anthropic account serving the same client:
 *        bedrock_request   the client's body to Anthropic Messages (translated, or as it
 *                 is for a Messages client), then InvokeModel's body (tg_bedrock_body) and
 *                 its SigV4 signature (tg_bedrock_sign); anthropic_request: the same
 *                 translation (or none) and json_dumps.
 *        bedrock_chunk     a 1,000-delta Anthropic stream framed as Bedrock sends it (AWS
 *                 event-stream messages, each event base64 in {"bytes"}) in 4 KiB reads
 *                 through tg_bedrock_stream_t (both CRCs, base64, the event's type), the
 *                 relay's usage read, and the client's translator (or, for a Messages
 *                 client, the event written as SSE); anthropic_chunk: the same events as
 *                 Anthropic's SSE through the SSE parser, the usage read and the
 *                 translator (or, for a Messages client, the bytes as they came).
 */
#include "tollgate/tg_aws.h"
#include "tollgate/tg_sse.h"
#include "tollgate/tg_translate.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHUNKS 1000
#define RUNS 9

static volatile size_t sink;

static const char chat_request[] =
    "{\"model\":\"gemini-2.5-flash\",\"stream\":true,\"max_tokens\":1024,\"temperature\":0.7,\"messages\":["
    "{\"role\":\"system\",\"content\":\"You are a helpful travel assistant. Answer briefly, cite the tools you "
    "used, and never invent prices. If the user asks for weather, call get_weather with the city name.\"},"
    "{\"role\":\"user\",\"content\":\"I am planning a trip to Paris next week. What should I pack, and what is "
    "the weather going to be like?\"},"
    "{\"role\":\"assistant\",\"content\":\"Let me check the forecast.\",\"tool_calls\":[{\"id\":\"call_A1\","
    "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\","
    "\\\"days\\\":7}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_A1\",\"content\":\"Paris: 14-19C, showers on Tuesday and "
    "Wednesday, sunny afterwards, light wind.\"},"
    "{\"role\":\"assistant\",\"content\":\"Pack layers and an umbrella: 14-19C with showers midweek.\"},"
    "{\"role\":\"user\",\"content\":\"Thanks! And shoes? I will walk a lot, mostly in the city centre.\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The forecast for a "
    "city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":"
    "\"integer\"}},\"required\":[\"city\"]}}}]}";

static const char gemini_answer[] =
    "{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Comfortable walking shoes that cope with rain: "
    "waterproof sneakers or light boots. Paris streets are cobbled in places, so cushioned soles help.\"},"
    "{\"functionCall\":{\"name\":\"get_weather\",\"args\":{\"city\":\"Lyon\",\"days\":2}}}],\"role\":\"model\"},"
    "\"finishReason\":\"STOP\",\"index\":0}],\"usageMetadata\":{\"promptTokenCount\":412,\"candidatesTokenCount\":"
    "48,\"cachedContentTokenCount\":256,\"thoughtsTokenCount\":30,\"totalTokenCount\":490},"
    "\"modelVersion\":\"gemini-2.5-flash\",\"responseId\":\"bench-resp\"}";

static void gemini_stream(tg_buf_t *b) {
    for (int i = 1; i <= CHUNKS; i++)
        tg_buf_printf(b, "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"tok%d \"}],\"role\": "
                         "\"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 412,"
                         "\"totalTokenCount\": 412},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": "
                         "\"bench\"}\r\n\r\n",
                      i);
    tg_buf_appends(b, "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"\"}],\"role\": \"model\"},"
                      "\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 412,"
                      "\"candidatesTokenCount\": 1000,\"totalTokenCount\": 1412},\"modelVersion\": "
                      "\"gemini-2.5-flash\",\"responseId\": \"bench\"}\r\n\r\n");
}

/* The Anthropic events of a 1,000-delta answer: as SSE (anth) and as Bedrock's event
 * stream (aws), the same JSON in each. */
static void anthropic_events(tg_buf_t *anth, tg_buf_t *aws) {
    static const char *const cn[] = {":event-type", ":content-type", ":message-type"};
    static const char *const cv[] = {"chunk", "application/json", "event"};
    tg_buf_t ev, pay;
    tg_buf_init(&ev);
    tg_buf_init(&pay);
    for (int i = 0; i <= CHUNKS + 4; i++) {
        const char *type;
        tg_buf_reset(&ev);
        if (i == 0) {
            type = "message_start";
            tg_buf_appends(&ev, "{\"type\":\"message_start\",\"message\":{\"id\":\"msg_bench\",\"type\":\"message\","
                                "\"role\":\"assistant\",\"model\":\"claude-3-5-sonnet-20240620\",\"content\":[],"
                                "\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":412,"
                                "\"output_tokens\":1}}}");
        } else if (i == 1) {
            type = "content_block_start";
            tg_buf_appends(&ev, "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\","
                                "\"text\":\"\"}}");
        } else if (i <= CHUNKS + 1) {
            type = "content_block_delta";
            tg_buf_printf(&ev, "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\","
                               "\"text\":\"tok%d \"}}", i - 1);
        } else if (i == CHUNKS + 2) {
            type = "content_block_stop";
            tg_buf_appends(&ev, "{\"type\":\"content_block_stop\",\"index\":0}");
        } else if (i == CHUNKS + 3) {
            type = "message_delta";
            tg_buf_appends(&ev, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\","
                                "\"stop_sequence\":null},\"usage\":{\"output_tokens\":1000}}");
        } else {
            type = "message_stop";
            tg_buf_appends(&ev, "{\"type\":\"message_stop\",\"amazon-bedrock-invocationMetrics\":{"
                                "\"inputTokenCount\":412,\"outputTokenCount\":1000,\"invocationLatency\":2000,"
                                "\"firstByteLatency\":300}}");
        }
        tg_buf_printf(anth, "event: %s\ndata: %s\n\n", type, ev.data);
        tg_buf_reset(&pay);
        tg_buf_reserve(&pay, 4 * (ev.len / 3 + 1) + 16);
        tg_buf_appends(&pay, "{\"bytes\":\"");
        pay.len += (size_t)EVP_EncodeBlock((unsigned char *)pay.data + pay.len, (const unsigned char *)ev.data,
                                           (int)ev.len);
        tg_buf_appends(&pay, "\"}");
        tg_es_encode(aws, cn, cv, 3, pay.data, pay.len);
    }
    tg_buf_free(&ev);
    tg_buf_free(&pay);
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static const char *short_name(tg_proto_t p) {
    return p == TG_PROTO_OPENAI_CHAT ? "chat" : p == TG_PROTO_ANTHROPIC ? "anthropic" : "responses";
}

typedef struct {
    tg_proto_t client;
    json_t *body;
    tg_buf_t stream, out;
    tg_buf_t anth, aws; /* the Anthropic answer as SSE and as Bedrock's event stream */
    tg_usage_t usage;
    tg_xlate_t *x;
} op_t;

static void op_request(op_t *o) {
    json_t *out = NULL;
    char err[256];
    if (tg_translate_request(o->client, TG_PROTO_GEMINI, o->body, "gemini-2.5-flash", &out, err, sizeof(err)) != TG_OK)
        abort();
    char *s = json_dumps(out, JSON_COMPACT);
    sink += strlen(s);
    free(s);
    json_decref(out);
}

static void op_request_pass(op_t *o) {
    char *s = json_dumps(o->body, JSON_COMPACT);
    sink += strlen(s);
    free(s);
}

static void op_answer(op_t *o) {
    tg_buf_reset(&o->out);
    if (tg_translate_response(TG_PROTO_GEMINI, o->client, gemini_answer, sizeof(gemini_answer) - 1, "client-model",
                              &o->out) != TG_OK)
        abort();
    sink += o->out.len;
}

static void op_answer_pass(op_t *o) {
    tg_usage_t u = {0};
    tg_usage_merge_json(&u, TG_PROTO_GEMINI, gemini_answer, sizeof(gemini_answer) - 1);
    sink += (size_t)u.known;
}

static void xlate_cb(void *ud, const char *ev, size_t el, const char *d, size_t dl) {
    op_t *o = ud;
    tg_usage_merge_json(&o->usage, TG_PROTO_GEMINI, d, dl); /* the relay reads usage too */
    tg_xlate_event(o->x, ev, el, d, dl, &o->out);
}

static void pass_cb(void *ud, const char *ev, size_t el, const char *d, size_t dl) {
    op_t *o = ud;
    TG_UNUSED(ev);
    TG_UNUSED(el);
    tg_usage_merge_json(&o->usage, TG_PROTO_GEMINI, d, dl);
    tg_buf_append(&o->out, d, dl); /* re-framed as it came */
}

static void feed(op_t *o, void (*cb)(void *, const char *, size_t, const char *, size_t)) {
    tg_buf_reset(&o->out);
    memset(&o->usage, 0, sizeof(o->usage));
    tg_sse_parser_t p;
    tg_sse_init(&p, 1 << 20, cb, o);
    for (size_t at = 0; at < o->stream.len; at += 4096)
        tg_sse_feed(&p, o->stream.data + at, TG_MIN((size_t)4096, o->stream.len - at));
    tg_sse_free(&p);
    sink += o->out.len;
}

static void op_stream(op_t *o) {
    o->x = tg_xlate_create(TG_PROTO_GEMINI, o->client, "client-model", "bench");
    tg_xlate_use_usage(o->x, &o->usage); /* the relay's fold, shared as the proxy does */
    feed(o, xlate_cb);
    tg_xlate_finish(o->x, &o->out);
    tg_xlate_destroy(o->x);
}

static void op_stream_pass(op_t *o) { feed(o, pass_cb); }

/* ---- Bedrock against an Anthropic account -------------------------------------------- */

static json_t *to_messages(op_t *o) {
    if (o->client == TG_PROTO_ANTHROPIC)
        return json_incref(o->body);
    json_t *out = NULL;
    char err[256];
    if (tg_translate_request(o->client, TG_PROTO_ANTHROPIC, o->body, "anthropic.claude-3-5-sonnet-20240620-v1:0", &out,
                             err, sizeof(err)) != TG_OK)
        abort();
    return out;
}

static void op_bedrock_request(op_t *o) {
    json_t *m = to_messages(o);
    char *s = tg_bedrock_body(m);
    tg_aws_creds_t c;
    tg_aws_creds_split("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", &c);
    c.region = "us-east-1";
    c.access_key = "AKIDEXAMPLE";
    tg_buf_t path;
    tg_buf_init(&path);
    tg_bedrock_path(&path, "anthropic.claude-3-5-sonnet-20240620-v1:0", 1);
    tg_buf_reset(&o->out);
    tg_bedrock_sign(&o->out, &c, "bedrock-runtime.us-east-1.amazonaws.com", path.data, s, strlen(s), 1764633600);
    tg_buf_free(&path);
    sink += strlen(s) + o->out.len;
    free(s);
    json_decref(m);
}

static void op_anthropic_request(op_t *o) {
    json_t *m = to_messages(o);
    char *s = json_dumps(m, JSON_COMPACT);
    sink += strlen(s);
    free(s);
    json_decref(m);
}

/* What the relay does with one upstream event (sse_event in tg_proxy_relay.c). */
static void relay_cb(void *ud, const char *ev, size_t el, const char *d, size_t dl) {
    op_t *o = ud;
    if (memmem(d, dl, "usage", 5))
        tg_usage_merge_json(&o->usage, TG_PROTO_ANTHROPIC, d, dl);
    if (o->x)
        tg_xlate_event(o->x, ev, el, d, dl, &o->out);
}

static void aws_cb(void *ud, const char *ev, size_t el, const char *d, size_t dl) {
    op_t *o = ud;
    relay_cb(o, ev, el, d, dl);
    if (el == 12 && !memcmp(ev, "message_stop", 12))
        tg_bedrock_metrics_usage(&o->usage, d, dl);
    if (!o->x) { /* a Messages client gets the event as SSE (aws_event in tg_proxy_relay.c) */
        tg_buf_appends(&o->out, "event: ");
        tg_buf_append(&o->out, ev, el);
        tg_buf_appends(&o->out, "\ndata: ");
        tg_buf_append(&o->out, d, dl);
        tg_buf_appends(&o->out, "\n\n");
    }
}

static void op_bedrock_stream(op_t *o) {
    tg_buf_reset(&o->out);
    memset(&o->usage, 0, sizeof(o->usage));
    o->x = o->client == TG_PROTO_ANTHROPIC ? NULL : tg_xlate_create(TG_PROTO_ANTHROPIC, o->client, "client-model", "bench");
    if (o->x)
        tg_xlate_use_usage(o->x, &o->usage); /* the relay's fold, shared as the proxy does */
    tg_bedrock_stream_t s;
    tg_bedrock_stream_init(&s, 1 << 20, aws_cb, o);
    for (size_t at = 0; at < o->aws.len; at += 4096)
        tg_bedrock_stream_feed(&s, o->aws.data + at, TG_MIN((size_t)4096, o->aws.len - at));
    tg_bedrock_stream_free(&s);
    if (o->x)
        tg_xlate_finish(o->x, &o->out);
    tg_xlate_destroy(o->x);
    sink += o->out.len + (size_t)o->usage.output;
}

static void op_anthropic_stream(op_t *o) {
    tg_buf_reset(&o->out);
    memset(&o->usage, 0, sizeof(o->usage));
    o->x = o->client == TG_PROTO_ANTHROPIC ? NULL : tg_xlate_create(TG_PROTO_ANTHROPIC, o->client, "client-model", "bench");
    if (o->x)
        tg_xlate_use_usage(o->x, &o->usage); /* the relay's fold, shared as the proxy does */
    tg_sse_parser_t p;
    tg_sse_init(&p, 1 << 20, relay_cb, o);
    for (size_t at = 0; at < o->anth.len; at += 4096) {
        size_t n = TG_MIN((size_t)4096, o->anth.len - at);
        tg_sse_feed(&p, o->anth.data + at, n);
        if (!o->x) /* passed through as it came */
            tg_buf_append(&o->out, o->anth.data + at, n);
    }
    tg_sse_free(&p);
    if (o->x)
        tg_xlate_finish(o->x, &o->out);
    tg_xlate_destroy(o->x);
    sink += o->out.len + (size_t)o->usage.output;
}

static double best_of(int iters, void (*fn)(op_t *), op_t *o) {
    double best = 1e300;
    for (int r = 0; r < RUNS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < iters; i++)
            fn(o);
        double dt = (now_ns() - t0) / iters;
        best = dt < best ? dt : best;
    }
    return best;
}

/* The loop callgrind counts (--toggle-collect=measured). */
__attribute__((noinline)) void measured(void (*fn)(op_t *), op_t *o, int n);
__attribute__((noinline)) void measured(void (*fn)(op_t *), op_t *o, int n) {
    for (int i = 0; i < n; i++)
        fn(o);
}

static const struct {
    const char *name;
    void (*fn)(op_t *);
} cases[] = {
    {"request", op_request},   {"request_pass", op_request_pass}, {"answer", op_answer},
    {"answer_pass", op_answer_pass}, {"chunk", op_stream},       {"chunk_pass", op_stream_pass},
    {"bedrock_request", op_bedrock_request}, {"anthropic_request", op_anthropic_request},
    {"bedrock_chunk", op_bedrock_stream},    {"anthropic_chunk", op_anthropic_stream},
};

int main(int argc, char **argv) {
    const tg_proto_t clients[] = {TG_PROTO_OPENAI_CHAT, TG_PROTO_ANTHROPIC, TG_PROTO_RESPONSES};
    json_t *bodies[3];
    json_error_t jerr;
    char err[256];
    bodies[0] = json_loads(chat_request, 0, &jerr);
    if (!bodies[0])
        return 1;
    for (int i = 1; i < 3; i++)
        if (tg_translate_request(TG_PROTO_OPENAI_CHAT, clients[i], bodies[0], "m", &bodies[i], err, sizeof(err)))
            return 1;
    op_t o;
    memset(&o, 0, sizeof(o));
    tg_buf_init(&o.stream);
    gemini_stream(&o.stream);
    tg_buf_init(&o.anth);
    tg_buf_init(&o.aws);
    anthropic_events(&o.anth, &o.aws);
    if (argc > 3 && !strcmp(argv[1], "--one")) {
        /* CASE is NAME or NAME:CLIENT (chat, anthropic, responses). */
        char name[64];
        snprintf(name, sizeof(name), "%s", argv[2]);
        char *colon = strchr(name, ':');
        int ci = 0;
        if (colon) {
            *colon = '\0';
            ci = !strcmp(colon + 1, "anthropic") ? 1 : !strcmp(colon + 1, "responses") ? 2 : 0;
        }
        o.client = clients[ci];
        o.body = bodies[ci];
        for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
            if (!strcmp(cases[k].name, name))
                measured(cases[k].fn, &o, atoi(argv[3]));
        return 0;
    }
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    iters = iters < 10 ? 10 : iters;
    int siters = iters / 100 > 5 ? iters / 100 : 5;
    printf("| what | client <- upstream | translated ns/op | passthrough ns/op | extra ns/op |\n|---|---|---:|---:|---:|\n");
    for (int i = 0; i < 3; i++) {
        o.client = clients[i];
        o.body = bodies[i];
        double t = best_of(iters, op_request, &o), p = best_of(iters, op_request_pass, &o);
        printf("| request | %s -> gemini | %.0f | %.0f | %.0f |\n", short_name(clients[i]), t, p, t - p);
    }
    for (int i = 0; i < 3; i++) {
        o.client = clients[i];
        double t = best_of(iters, op_answer, &o), p = best_of(iters, op_answer_pass, &o);
        printf("| answer | %s <- gemini | %.0f | %.0f | %.0f |\n", short_name(clients[i]), t, p, t - p);
    }
    for (int i = 0; i < 3; i++) {
        o.client = clients[i];
        double t = best_of(siters, op_stream, &o) / (CHUNKS + 1), p = best_of(siters, op_stream_pass, &o) / (CHUNKS + 1);
        printf("| stream chunk | %s <- gemini | %.0f | %.0f | %.0f |\n", short_name(clients[i]), t, p, t - p);
    }
    for (int i = 0; i < 3; i++) {
        o.client = clients[i];
        o.body = bodies[i];
        double t = best_of(iters, op_bedrock_request, &o), p = best_of(iters, op_anthropic_request, &o);
        printf("| request | %s -> bedrock (vs anthropic) | %.0f | %.0f | %.0f |\n", short_name(clients[i]), t, p, t - p);
    }
    for (int i = 0; i < 3; i++) {
        o.client = clients[i];
        double t = best_of(siters, op_bedrock_stream, &o) / (CHUNKS + 5),
               p = best_of(siters, op_anthropic_stream, &o) / (CHUNKS + 5);
        printf("| stream chunk | %s <- bedrock (vs anthropic) | %.0f | %.0f | %.0f |\n", short_name(clients[i]), t, p,
               t - p);
    }
    for (int i = 0; i < 3; i++)
        json_decref(bodies[i]);
    tg_buf_free(&o.anth);
    tg_buf_free(&o.aws);
    tg_buf_free(&o.stream);
    tg_buf_free(&o.out);
    return sink == 42 ? 1 : 0;
}
