/*
 * The cost of protocol translation, measured in-process (no network): per request, per
 * non-stream response and per streamed chunk, each against passthrough of the same bytes.
 *
 *   tg_translate_bench [ITERATIONS]      (spec/bench/translate_bench.sh runs it)
 *
 * Each row has three times: the translation, a memcpy of the same bytes (pure
 * passthrough), and what the gateway already does with those bytes today without
 * translation ("today"), which is the fairer baseline:
 *   request   a ~2 KB chat request with a system prompt, six turns, two tool calls and
 *             their results, two tools (and the same request in the other protocols).
 *             The gateway has parsed the client's body already; translated =
 *             tg_translate_request + json_dumps of the new body; today = json_dumps of
 *             the client's body (the gateway re-serializes any body it edits: model
 *             mapping, stream_options).
 *   response  a ~600 B answer with text and a tool call; translated =
 *             tg_translate_response; today = tg_usage_merge_json on it (usage).
 *   stream    a 1,000-token answer as each upstream sends it (one text delta per event),
 *             fed in 4 KiB reads through the SSE parser and tg_xlate_event, per event;
 *             today = the SSE parser and the passthrough translator (parse, usage,
 *             re-frame: the gateway's path whenever it edits a stream).
 * Times are thread CPU ns per operation (immune to other processes on the machine),
 * best of 9 runs.
 */
#include "tollgate/tg_sse.h"
#include "tollgate/tg_translate.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile size_t sink;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static const char *proto_short(tg_proto_t p) {
    return p == TG_PROTO_OPENAI_CHAT ? "chat" : p == TG_PROTO_ANTHROPIC ? "anthropic" : "responses";
}

/* ---- bodies ------------------------------------------------------------------------- */

static const char chat_request[] =
    "{\"model\":\"gpt-4o\",\"stream\":true,\"max_tokens\":1024,\"temperature\":0.7,"
    "\"messages\":["
    "{\"role\":\"system\",\"content\":\"You are a helpful travel assistant. Answer briefly, cite the tools you "
    "used, and never invent prices. If the user asks for weather, call get_weather with the city name.\"},"
    "{\"role\":\"user\",\"content\":\"I am planning a trip to Paris next week. What should I pack, and what "
    "is the weather going to be like? I will also visit Lyon for two days.\"},"
    "{\"role\":\"assistant\",\"content\":\"Let me check the forecast for both cities.\",\"tool_calls\":["
    "{\"id\":\"call_A1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":7}\"}},"
    "{\"id\":\"call_A2\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"arguments\":\"{\\\"city\\\":\\\"Lyon\\\",\\\"days\\\":2}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_A1\",\"content\":\"Paris: 14-19C, showers on Tuesday and "
    "Wednesday, sunny afterwards, light wind.\"},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_A2\",\"content\":\"Lyon: 16-22C, sunny, no rain expected.\"},"
    "{\"role\":\"assistant\",\"content\":\"Paris will be mild with showers early in the week; Lyon is warmer "
    "and dry. Pack layers, a light rain jacket, comfortable walking shoes and sunglasses.\"},"
    "{\"role\":\"user\",\"content\":\"Great. Any museums that are open late on Wednesday in Paris? And can "
    "you remind me what the temperature range in Lyon was?\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather "
    "forecast for a city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","
    "\"description\":\"City name\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14}},"
    "\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search_museums\",\"description\":\"Museums with opening "
    "hours\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"day\":"
    "{\"type\":\"string\",\"enum\":[\"mon\",\"tue\",\"wed\",\"thu\",\"fri\",\"sat\",\"sun\"]}},"
    "\"required\":[\"city\"]}}}],\"tool_choice\":\"auto\"}";

static const char chat_response[] =
    "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"gpt-4o\","
    "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"The Musee d'Orsay is open "
    "until 21:45 on Thursdays; on Wednesday the Louvre stays open until 21:00. Lyon was 16-22C.\","
    "\"tool_calls\":[{\"id\":\"call_B1\",\"type\":\"function\",\"function\":{\"name\":\"search_museums\","
    "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"day\\\":\\\"wed\\\"}\"}}]},\"logprobs\":null,"
    "\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":612,\"completion_tokens\":58,"
    "\"total_tokens\":670,\"prompt_tokens_details\":{\"cached_tokens\":512}}}";

/* ---- streams ------------------------------------------------------------------------ */

#define CHUNKS 1000
#define RUNS 9 /* best of */

static void stream_of(tg_proto_t p, tg_buf_t *b) {
    if (p == TG_PROTO_OPENAI_CHAT) {
        for (int i = 1; i <= CHUNKS; i++)
            tg_buf_printf(b, "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":"
                             "1700000000,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{%s\"content\":"
                             "\"tok%d \"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n",
                          i == 1 ? "\"role\":\"assistant\"," : "", i);
        tg_buf_appends(b, "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":"
                          "1700000000,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,"
                          "\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"
                          "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":"
                          "1700000000,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":612,"
                          "\"completion_tokens\":1000,\"total_tokens\":1612}}\n\ndata: [DONE]\n\n");
    } else if (p == TG_PROTO_ANTHROPIC) {
        tg_buf_appends(b, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_bench\","
                          "\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4\",\"content\":[],"
                          "\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":612,"
                          "\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":"
                          "\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
        for (int i = 1; i <= CHUNKS; i++)
            tg_buf_printf(b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
                             "\"delta\":{\"type\":\"text_delta\",\"text\":\"tok%d \"}}\n\n",
                          i);
        tg_buf_appends(b, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
                          "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
                          "\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1000}}\n\n"
                          "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    } else {
        tg_buf_appends(b, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,"
                          "\"response\":{\"id\":\"resp_bench\",\"object\":\"response\",\"created_at\":1700000000,"
                          "\"status\":\"in_progress\",\"model\":\"gpt-4.1\",\"output\":[],\"usage\":null}}\n\n"
                          "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\","
                          "\"sequence_number\":1,\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_b\","
                          "\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n");
        for (int i = 1; i <= CHUNKS; i++)
            tg_buf_printf(b, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\","
                             "\"sequence_number\":%d,\"item_id\":\"msg_b\",\"output_index\":0,\"content_index\":0,"
                             "\"delta\":\"tok%d \"}\n\n",
                          i + 1, i);
        tg_buf_appends(b, "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\","
                          "\"sequence_number\":1002,\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":"
                          "\"msg_b\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[]}}\n\n"
                          "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1003,"
                          "\"response\":{\"id\":\"resp_bench\",\"object\":\"response\",\"status\":\"completed\","
                          "\"model\":\"gpt-4.1\",\"output\":[],\"usage\":{\"input_tokens\":612,\"output_tokens\":1000,"
                          "\"total_tokens\":1612}}}\n\n");
    }
}

typedef struct {
    tg_xlate_t *x;
    tg_buf_t *out;
} feed_t;

static void feed_cb(void *ud, const char *event, size_t elen, const char *data, size_t dlen) {
    feed_t *f = ud;
    tg_xlate_event(f->x, event, elen, data, dlen, f->out);
}

/* One whole stream, fed in 4 KiB reads as a socket would deliver it. */
static void run_stream(tg_proto_t from, tg_proto_t to, const tg_buf_t *in, tg_buf_t *out) {
    tg_buf_reset(out);
    feed_t f = {tg_xlate_create(from, to, "client-model", "bench"), out};
    tg_sse_parser_t p;
    tg_sse_init(&p, 1 << 20, feed_cb, &f);
    for (size_t at = 0; at < in->len; at += 4096)
        tg_sse_feed(&p, in->data + at, TG_MIN((size_t)4096, in->len - at));
    tg_xlate_finish(f.x, out);
    tg_sse_free(&p);
    tg_xlate_destroy(f.x);
    sink += out->len;
}

static double best_of(int runs, int iters, void (*fn)(void *), void *arg) {
    double best = 1e300;
    for (int r = 0; r < runs; r++) {
        double t0 = now_ns();
        for (int i = 0; i < iters; i++)
            fn(arg);
        double dt = (now_ns() - t0) / iters;
        if (dt < best)
            best = dt;
    }
    return best;
}

/* ---- the measured operations -------------------------------------------------------- */

typedef struct {
    tg_proto_t from, to;
    json_t *body;        /* request */
    const tg_buf_t *in;  /* bytes: response body or stream */
    tg_buf_t out;
    char *dst;
} op_t;

static void op_memcpy(void *a) {
    op_t *o = a;
    memcpy(o->dst, o->in->data, o->in->len);
    sink += (size_t)o->dst[o->in->len / 2];
}

static void op_request(void *a) {
    op_t *o = a;
    json_t *out = NULL;
    char err[256];
    if (tg_translate_request(o->from, o->to, o->body, "upstream-model", &out, err, sizeof(err)) != TG_OK)
        abort();
    char *s = json_dumps(out, JSON_COMPACT);
    sink += strlen(s);
    free(s);
    json_decref(out);
}

static void op_dumps(void *a) {
    op_t *o = a;
    char *s = json_dumps(o->body, JSON_COMPACT);
    sink += strlen(s);
    free(s);
}

static void op_usage(void *a) {
    op_t *o = a;
    tg_usage_t u = {0};
    tg_usage_merge_json(&u, o->from, o->in->data, o->in->len);
    sink += (size_t)u.known;
}

static void op_parse_event(void *a) {
    TG_UNUSED(a);
    static const char ev[] =
        "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tok12 \"}}";
    json_error_t e;
    json_t *d = json_loadb(ev, sizeof(ev) - 1, 0, &e);
    sink += json_object_size(d);
    json_decref(d);
}

static void op_response(void *a) {
    op_t *o = a;
    tg_buf_reset(&o->out);
    if (tg_translate_response(o->from, o->to, o->in->data, o->in->len, "client-model", &o->out) != TG_OK)
        abort();
    sink += o->out.len;
}

static void op_stream(void *a) {
    op_t *o = a;
    run_stream(o->from, o->to, o->in, &o->out);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    if (iters < 10)
        iters = 10;
    const tg_proto_t protos[] = {TG_PROTO_OPENAI_CHAT, TG_PROTO_ANTHROPIC, TG_PROTO_RESPONSES};
    char err[256];

    /* The request in each client protocol (translated from the chat one). */
    json_error_t jerr;
    json_t *req[3];
    req[0] = json_loads(chat_request, 0, &jerr);
    if (!req[0]) {
        fprintf(stderr, "bench request: %s\n", jerr.text);
        return 1;
    }
    for (int i = 1; i < 3; i++)
        if (tg_translate_request(TG_PROTO_OPENAI_CHAT, protos[i], req[0], "m", &req[i], err, sizeof(err)) != TG_OK) {
            fprintf(stderr, "bench request: %s\n", err);
            return 1;
        }
    tg_buf_t resp[3];
    tg_buf_init(&resp[0]);
    tg_buf_appends(&resp[0], chat_response);
    for (int i = 1; i < 3; i++) {
        tg_buf_init(&resp[i]);
        tg_translate_response(TG_PROTO_OPENAI_CHAT, protos[i], chat_response, strlen(chat_response), "m", &resp[i]);
    }
    tg_buf_t streams[3];
    for (int i = 0; i < 3; i++) {
        tg_buf_init(&streams[i]);
        stream_of(protos[i], &streams[i]);
    }
    char *dst = malloc(1 << 20);

    printf("| what | from -> to | input bytes | translated ns/op | passthrough (memcpy) ns/op | "
           "gateway today ns/op | extra over today ns/op |\n");
    printf("|---|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            if (i == j)
                continue;
            char *body = json_dumps(req[i], JSON_COMPACT);
            tg_buf_t bytes;
            tg_buf_init(&bytes);
            tg_buf_appends(&bytes, body);
            free(body);
            op_t o = {protos[i], protos[j], req[i], &bytes, {0}, dst};
            double t = best_of(RUNS, iters, op_request, &o);
            double p = best_of(RUNS, iters, op_memcpy, &o);
            double g = best_of(RUNS, iters, op_dumps, &o);
            printf("| request | %s -> %s | %zu | %.0f | %.0f | %.0f | %.0f |\n", proto_short(protos[i]),
                   proto_short(protos[j]), bytes.len, t, p, g, t - g);
            tg_buf_free(&bytes);
        }
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            if (i == j)
                continue;
            op_t o = {protos[i], protos[j], NULL, &resp[i], {0}, dst};
            tg_buf_init(&o.out);
            double t = best_of(RUNS, iters, op_response, &o);
            double p = best_of(RUNS, iters, op_memcpy, &o);
            double g = best_of(RUNS, iters, op_usage, &o);
            printf("| response | %s -> %s | %zu | %.0f | %.0f | %.0f | %.0f |\n", proto_short(protos[i]),
                   proto_short(protos[j]), resp[i].len, t, p, g, t - g);
            tg_buf_free(&o.out);
        }
    int siters = iters / 100 > 5 ? iters / 100 : 5;
    for (int i = 0; i < 3; i++) {
        op_t o = {protos[i], protos[i], NULL, &streams[i], {0}, dst};
        tg_buf_init(&o.out);
        double p = best_of(RUNS, siters, op_memcpy, &o) / (CHUNKS + 4);
        double g = best_of(RUNS, siters, op_stream, &o) / (CHUNKS + 4);
        for (int j = 0; j < 3; j++) {
            if (i == j)
                continue;
            o.to = protos[j];
            double t = best_of(RUNS, siters, op_stream, &o) / (CHUNKS + 4);
            printf("| stream chunk | %s -> %s | %zu | %.0f | %.1f | %.0f | %.0f |\n", proto_short(protos[i]),
                   proto_short(protos[j]), streams[i].len / (CHUNKS + 4), t, p, g, t - g);
        }
        tg_buf_free(&o.out);
    }
    printf("\nFor scale, on this machine: jansson parses one 86-byte Anthropic text delta in %.0f ns.\n",
           best_of(RUNS, iters * 10, op_parse_event, NULL));
    for (int i = 0; i < 3; i++) {
        tg_buf_free(&resp[i]);
        tg_buf_free(&streams[i]);
        json_decref(req[i]);
    }
    free(dst);
    return sink == 42 ? 1 : 0;
}
