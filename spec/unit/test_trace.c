/*
 * OpenTelemetry traces (tg_trace.h): the W3C traceparent parser (what is a trace to
 * continue and what is ignored), its formatter, tracestate's bounds, the sampling
 * decision (parent-based, then the ratio), the OTLP JSON of a record, and the
 * `tracing` config section.
 */
#include "tg_test.h"
#include "tollgate/tg_trace.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static int parse(const char *s) {
    tg_traceparent_t t;
    return tg_traceparent_parse(s, strlen(s), &t);
}

TG_TEST(trace, traceparent_valid) {
    tg_traceparent_t t;
    ASSERT_EQ_INT(tg_traceparent_parse(TP, strlen(TP), &t), 1);
    ASSERT_EQ_INT(t.trace_id[0], 0x4b);
    ASSERT_EQ_INT(t.trace_id[15], 0x36);
    ASSERT_EQ_INT(t.span_id[0], 0x00);
    ASSERT_EQ_INT(t.span_id[7], 0xb7);
    ASSERT_EQ_INT(t.flags, 1);
    char out[56];
    tg_traceparent_format(t.trace_id, t.span_id, 1, out);
    ASSERT_EQ_STR(out, TP);
    tg_traceparent_format(t.trace_id, t.span_id, 0, out);
    ASSERT_EQ_STR(out, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
    /* A later version may carry more after a '-'; what we know of it is read. */
    ASSERT_EQ_INT(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later"), 1);
    ASSERT_EQ_INT(parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"), 1);
}

TG_TEST(trace, traceparent_invalid) {
    ASSERT_EQ_INT(parse(""), 0);
    ASSERT_EQ_INT(parse("garbage"), 0);
    ASSERT_EQ_INT(parse("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), 0); /* upper case */
    ASSERT_EQ_INT(parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), 0); /* zero trace */
    ASSERT_EQ_INT(parse("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"), 0); /* zero parent */
    ASSERT_EQ_INT(parse("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), 0); /* version ff */
    ASSERT_EQ_INT(parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"), 0); /* 00 is 55 exactly */
    ASSERT_EQ_INT(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x"), 0);
    ASSERT_EQ_INT(parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g"), 0);
    ASSERT_EQ_INT(parse("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), 0);
    ASSERT_EQ_INT(parse("0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), 0);
    ASSERT_EQ_INT(parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1"), 0);
    char big[1024];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    memcpy(big, "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", 56);
    ASSERT_EQ_INT(parse(big), 0); /* oversized */
    tg_traceparent_t t;
    ASSERT_EQ_INT(tg_traceparent_parse(NULL, 55, &t), 0);
    ASSERT_EQ_INT(tg_traceparent_parse(TP, 54, &t), 0); /* cut short */
}

TG_TEST(trace, tracestate_bounds) {
    ASSERT_EQ_INT(tg_tracestate_ok("vendor=abc,other=x", 18), 1);
    ASSERT_EQ_INT(tg_tracestate_ok("", 0), 0);
    ASSERT_EQ_INT(tg_tracestate_ok("a=\x01", 3), 0);
    ASSERT_EQ_INT(tg_tracestate_ok("a=\xc3\xa9", 4), 0);
    char big[TG_TRACESTATE_MAX + 2];
    memset(big, 'a', sizeof(big));
    ASSERT_EQ_INT(tg_tracestate_ok(big, TG_TRACESTATE_MAX), 1);
    ASSERT_EQ_INT(tg_tracestate_ok(big, TG_TRACESTATE_MAX + 1), 0);
}

TG_TEST(trace, decide_parent_based) {
    /* Tracing not started: the ratio's threshold is 0, so new traces are not sampled;
     * a parent's flag decides either way. */
    tg_traceparent_t in, ctx;
    ASSERT_EQ_INT(tg_traceparent_parse(TP, strlen(TP), &in), 1);
    ASSERT_EQ_INT(tg_trace_decide(&in, &ctx), 1);
    ASSERT(!memcmp(ctx.trace_id, in.trace_id, 16));
    ASSERT(memcmp(ctx.span_id, in.span_id, 8) != 0);
    in.flags = 0;
    ASSERT_EQ_INT(tg_trace_decide(&in, &ctx), 0);
    uint8_t prev[16];
    for (int i = 0; i < 100; i++) {
        memcpy(prev, ctx.trace_id, 16);
        ASSERT_EQ_INT(tg_trace_decide(NULL, &ctx), 0);
        ASSERT(memcmp(prev, ctx.trace_id, 16) != 0); /* a new id each time */
    }
}

TG_TEST(trace, encode_otlp_json) {
    tg_trace_rec_t r;
    memset(&r, 0, sizeof(r));
    tg_traceparent_t in;
    tg_traceparent_parse(TP, strlen(TP), &in);
    memcpy(r.trace_id, in.trace_id, 16);
    memcpy(r.parent_id, in.span_id, 8);
    r.has_parent = 1;
    memset(r.span_id, 0x11, 8);
    r.wall_minus_mono = 1000;
    r.start = 5000;
    r.end = 9000;
    r.method = "POST";
    snprintf(r.path, sizeof(r.path), "/v1/chat/completions");
    snprintf(r.request_id, sizeof(r.request_id), "req-1");
    snprintf(r.model, sizeof(r.model), "m\"odel");
    r.operation = "chat";
    r.status = 502;
    r.input_tokens = 12;
    r.output_tokens = -1;
    r.cache_read_tokens = -1;
    r.nat = 1;
    r.at[0].start = 6000;
    r.at[0].end = 8000;
    memset(r.at[0].span_id, 0x22, 8);
    r.at[0].status = 503;
    snprintf(r.at[0].provider, sizeof(r.at[0].provider), "openai");
    tg_trace_rec_t *recs[1] = {&r};
    tg_buf_t b;
    tg_buf_init(&b);
    tg_trace_encode(recs, 1, "svc", &b);
    json_error_t e;
    json_t *doc = json_loadb(b.data, b.len, 0, &e);
    ASSERT(doc != NULL);
    json_t *spans = json_object_get(json_array_get(json_object_get(json_array_get(json_object_get(doc, "resourceSpans"), 0),
                                                                   "scopeSpans"),
                                                   0),
                                    "spans");
    ASSERT_EQ_INT(json_array_size(spans), 2);
    json_t *srv = json_array_get(spans, 0), *call = json_array_get(spans, 1);
    ASSERT_EQ_STR(json_string_value(json_object_get(srv, "traceId")), "4bf92f3577b34da6a3ce929d0e0e4736");
    ASSERT_EQ_STR(json_string_value(json_object_get(srv, "parentSpanId")), "00f067aa0ba902b7");
    ASSERT_EQ_STR(json_string_value(json_object_get(srv, "spanId")), "1111111111111111");
    ASSERT_EQ_STR(json_string_value(json_object_get(srv, "startTimeUnixNano")), "6000");
    ASSERT_EQ_INT(json_integer_value(json_object_get(srv, "kind")), 2);
    ASSERT_EQ_INT(json_integer_value(json_object_get(json_object_get(srv, "status"), "code")), 2);
    ASSERT_EQ_STR(json_string_value(json_object_get(call, "parentSpanId")), "1111111111111111");
    ASSERT_EQ_STR(json_string_value(json_object_get(call, "name")), "chat m\"odel");
    ASSERT_EQ_INT(json_integer_value(json_object_get(call, "kind")), 3);
    ASSERT(strstr(b.data, "{\"key\":\"gen_ai.usage.input_tokens\",\"value\":{\"intValue\":\"12\"}}") != NULL);
    ASSERT(strstr(b.data, "gen_ai.usage.output_tokens") == NULL); /* unknown: absent */
    ASSERT(strstr(b.data, "{\"key\":\"error.type\",\"value\":{\"stringValue\":\"503\"}}") != NULL);
    json_decref(doc);
    tg_buf_free(&b);
}

static char path[64];

static int load(const char *text, tg_config_t *cfg, char *err) {
    snprintf(path, sizeof(path), "/tmp/tg_unit_trace_%d.lua", (int)getpid());
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    int rc = tg_config_load(path, cfg, err, 256);
    unlink(path);
    return rc;
}

TG_TEST(trace, config_section) {
    tg_config_t cfg;
    char err[256];
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://127.0.0.1:9/v1' } }", &cfg, err), 0);
    ASSERT(cfg.tracing.endpoint == NULL); /* off by default */
    ASSERT(cfg.tracing.sample_ratio == 1);
    tg_config_free(&cfg);
    ASSERT_EQ_INT(load("return { upstream = { url = 'http://127.0.0.1:9/v1' }, tracing = { endpoint = "
                       "'http://127.0.0.1:4318/v1/traces', sample_ratio = 0.25, batch_size = 10, headers = { "
                       "['x-key'] = 'v' } } }",
                       &cfg, err),
                  0);
    ASSERT_EQ_STR(cfg.tracing.endpoint, "http://127.0.0.1:4318/v1/traces");
    ASSERT(cfg.tracing.sample_ratio == 0.25);
    ASSERT_EQ_INT(cfg.tracing.batch_size, 10);
    ASSERT_EQ_INT((int)cfg.tracing.nheaders, 1);
    ASSERT_EQ_STR(cfg.tracing.headers[0], "x-key: v");
    tg_config_free(&cfg);
    ASSERT(load("return { upstream = { url = 'http://x/v1' }, tracing = { sample_ratio = 2 } }", &cfg, err) != 0);
    ASSERT(strstr(err, "tracing.sample_ratio") != NULL);
    ASSERT(load("return { upstream = { url = 'http://x/v1' }, tracing = { endpoint = 'ftp://x' } }", &cfg, err) != 0);
    ASSERT(strstr(err, "tracing.endpoint") != NULL);
    ASSERT(load("return { upstream = { url = 'http://x/v1' }, tracing = { headers = { ['a b'] = 'v' } } }", &cfg, err) !=
           0);
    ASSERT(strstr(err, "tracing.headers") != NULL);
    ASSERT(load("return { upstream = { url = 'http://x/v1' }, tracing = { endpont = 'http://x' } }", &cfg, err) != 0);
    ASSERT(strstr(err, "tracing.endpont") != NULL);
}
