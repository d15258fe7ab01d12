/*
 * libFuzzer target for the W3C trace context (core/src/http/tg_trace.c): the traceparent
 * parser, the tracestate check, and the OTLP JSON of a record whose strings come from
 * the input.
 *
 * Input: any bytes, read as a traceparent header value (and, after a NUL, as the
 * request's model name and tracestate). Invariants: never a crash or a read outside
 * the input (ASan); an accepted traceparent has non-zero ids, and its formatted form
 * parses back to the same ids and sampled flag (and is the input itself for version 00
 * with flags 00 or 01); a tracestate accepted is printable ASCII within the limit; the
 * record's OTLP JSON is valid JSON whatever its strings hold.
 */
#include "tollgate/tg_trace.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_traceparent invariant failed: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A copy of exactly `size` bytes, so ASan sees any read past the end. */
    char *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    const char *nul = memchr(buf, '\0', size);
    size_t tp_len = nul ? (size_t)(nul - buf) : size;
    tg_traceparent_t t;
    if (tg_traceparent_parse(buf, tp_len, &t)) {
        static const uint8_t zero[16];
        check(memcmp(t.trace_id, zero, 16) != 0 && memcmp(t.span_id, zero, 8) != 0, "ids not all zero");
        check(tp_len == TG_TRACEPARENT_LEN || (tp_len > TG_TRACEPARENT_LEN && buf[TG_TRACEPARENT_LEN] == '-'),
              "length");
        char out[56];
        tg_traceparent_format(t.trace_id, t.span_id, t.flags & 1, out);
        tg_traceparent_t back;
        check(tg_traceparent_parse(out, strlen(out), &back), "the formatted form parses");
        check(!memcmp(back.trace_id, t.trace_id, 16) && !memcmp(back.span_id, t.span_id, 8) &&
                  (back.flags & 1) == (t.flags & 1),
              "round trip");
        if (!memcmp(buf, "00-", 3) && (t.flags == 0 || t.flags == 1))
            check(!memcmp(out, buf, TG_TRACEPARENT_LEN), "version 00 formats back to itself");
    }
    const char *rest = nul ? nul + 1 : buf + size;
    size_t rest_len = (size_t)(buf + size - rest);
    if (tg_tracestate_ok(rest, rest_len)) {
        check(rest_len <= TG_TRACESTATE_MAX, "tracestate within the limit");
        for (size_t i = 0; i < rest_len; i++)
            check(rest[i] >= 0x20 && rest[i] <= 0x7e, "tracestate printable");
    }
    /* A record whose strings are the input's: its JSON must stay JSON. */
    static tg_trace_rec_t r;
    memset(&r, 0, sizeof(r));
    r.input_tokens = r.output_tokens = r.cache_read_tokens = -1;
    r.method = "POST";
    snprintf(r.model, sizeof(r.model), "%.*s", (int)TG_MIN(tp_len, sizeof(r.model) - 1), buf);
    snprintf(r.path, sizeof(r.path), "%.*s", (int)TG_MIN(rest_len, sizeof(r.path) - 1), rest);
    if (tg_tracestate_ok(rest, rest_len))
        snprintf(r.tracestate, sizeof(r.tracestate), "%.*s", (int)rest_len, rest);
    snprintf(r.error, sizeof(r.error), "%.*s", (int)TG_MIN(tp_len, sizeof(r.error) - 1), buf);
    r.operation = "chat";
    r.nat = 1;
    r.at[0].start = 1;
    r.at[0].end = 2;
    r.start = 1;
    r.end = 3;
    tg_trace_rec_t *recs[1] = {&r};
    tg_buf_t b;
    tg_buf_init(&b);
    tg_trace_encode(recs, 1, "svc", &b);
    json_error_t e;
    json_t *doc = json_loadb(b.data, b.len, 0, &e);
    check(doc != NULL, "the OTLP body is JSON");
    json_decref(doc);
    tg_buf_free(&b);
    free(buf);
    return 0;
}
