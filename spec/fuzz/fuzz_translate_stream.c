/*
 * libFuzzer target for stream translation (tg_xlate_*, core/src/proto/tg_translate*.c).
 *
 * Input: byte 0 picks where the stream is split in two, byte 1 whether the usage chunk
 * is on and whether tg_xlate_finish is called; the rest is an upstream event stream,
 * parsed by the real SSE parser and fed to every stream translator (each upstream
 * protocol to each client protocol, passthrough included). Beyond ASan/UBSan, the target
 * checks that
 *   - the client bytes are the same whether the input came in one piece or two, and
 *     whether the parser's events came whole (the translator holds no partial input);
 *   - the output is a well-formed event stream: every event's data is a JSON object
 *     (or chat's [DONE]), Anthropic and Responses events are named after their "type";
 *   - nothing follows the end of a translated stream: chat's [DONE], Anthropic's
 *     message_stop, Responses' response.completed / response.incomplete, or an error;
 *   - the usage the translator reports (its usage chunk) is the fold of
 *     tg_usage_merge_json over every event, as the proxy bills them (an error event's,
 *     an unreadable one's and one after the end included).
 */
#define FUZZ_NAME "fuzz_translate_stream"
#include "fuzz_xlate_check.h"

typedef struct {
    tg_xlate_t *x;
    tg_buf_t out;
    int from;
    tg_usage_t usage; /* tg_usage_merge_json over the events: what the proxy bills */
} run_t;

static void feed_cb(void *ud, const char *event, size_t elen, const char *data, size_t dlen) {
    run_t *r = ud;
    tg_usage_merge_json(&r->usage, (tg_proto_t)r->from, data ? data : "", data ? dlen : 0);
    tg_xlate_event(r->x, event, elen, data, dlen, &r->out);
}

static void run(run_t *r, int from, int to, int flags, const char *s, size_t n, size_t split) {
    r->x = tg_xlate_create((tg_proto_t)from, (tg_proto_t)to, (flags & 4) ? NULL : "client-model", "fuzz");
    check(r->x != NULL, "no translator for a supported pair");
    r->from = from;
    memset(&r->usage, 0, sizeof(r->usage));
    tg_xlate_set_usage_chunk(r->x, flags & 1);
    tg_buf_init(&r->out);
    tg_sse_parser_t p;
    tg_sse_init(&p, 1 << 16, feed_cb, r);
    tg_sse_feed(&p, s, split);
    tg_sse_feed(&p, s + split, n - split);
    if (flags & 2)
        tg_xlate_finish(r->x, &r->out);
    tg_sse_free(&p);
    check(!memcmp(tg_xlate_usage(r->x), &r->usage, sizeof(r->usage)), "the translator's usage is not the billed fold");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    size_t split = n * data[0] / 255;
    int flags = data[1];
    for (int from = 0; from < 3; from++)
        for (int to = 0; to < 3; to++) {
            run_t a, b;
            run(&a, from, to, flags, s, n, 0);
            run(&b, from, to, flags, s, n, split);
            tg_buf_t ca, cb;
            tg_buf_init(&ca);
            tg_buf_init(&cb);
            tg_buf_append(&ca, a.out.data, a.out.len);
            tg_buf_append(&cb, b.out.data, b.out.len);
            zero_clock(&ca);
            zero_clock(&cb);
            check(ca.len == cb.len && (!ca.len || !memcmp(ca.data, cb.data, ca.len)),
                  "output depends on how the input was split");
            tg_buf_free(&ca);
            tg_buf_free(&cb);
            if (from != to) {
                verify_stream(to, &a.out);
            }
            tg_xlate_destroy(a.x);
            tg_xlate_destroy(b.x);
            tg_buf_free(&a.out);
            tg_buf_free(&b.out);
        }
    return 0;
}
