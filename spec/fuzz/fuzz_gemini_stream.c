/*
 * libFuzzer target for the Gemini stream decoder (tg__gemini_dec in
 * core/src/proto/tg_translate_gemini.c, reached through tg_xlate_*) and Gemini's
 * usageMetadata reader (tg_usage).
 *
 * Input: byte 0 picks where the stream is split in two, byte 1 whether the usage chunk
 * is on, whether tg_xlate_finish is called and whether the client model is given; the
 * rest is a streamGenerateContent?alt=sse body, parsed by the real SSE parser and
 * translated for each client protocol. Beyond ASan/UBSan, the target checks that
 *   - the client bytes are the same whether the input came in one piece or two;
 *   - the output is a well-formed event stream (every event's data a JSON object or
 *     chat's [DONE], Anthropic and Responses events named after their "type") and
 *     nothing follows its end;
 *   - the usage the translator reports is the fold of tg_usage_merge_json over the
 *     same events (every one: an error event's, an unreadable one's, one after the
 *     end, as the proxy bills them), and the fast usage reader agrees with the full
 *     parse on each event both can read.
 */
#include "tollgate/tg_usage.h"

#define FUZZ_NAME "fuzz_gemini_stream"
#include "fuzz_xlate_check.h"

typedef struct {
    tg_xlate_t *x;
    tg_buf_t out;
    tg_usage_t usage; /* tg_usage_merge_json over the events */
} run_t;

static void feed_cb(void *ud, const char *event, size_t elen, const char *data, size_t dlen) {
    run_t *r = ud;
    tg_xlate_event(r->x, event, elen, data, dlen, &r->out);
    tg_usage_t fast = r->usage, full = r->usage;
    int a = tg_usage_merge_json(&fast, TG_PROTO_GEMINI, data, dlen);
    int b = tg_usage_merge_json_full(&full, TG_PROTO_GEMINI, data, dlen);
    if (a != TG_ERROR && b != TG_ERROR)
        check(a == b && !memcmp(&fast, &full, sizeof(fast)), "the usage scan and the full parse disagree");
    if (a != TG_ERROR) /* what the proxy bills: the fast reader's fold */
        r->usage = fast;
}

static void run(run_t *r, int to, int flags, const char *s, size_t n, size_t split) {
    r->x = tg_xlate_create(TG_PROTO_GEMINI, (tg_proto_t)to, (flags & 4) ? NULL : "client-model", "fuzz");
    check(r->x != NULL, "no translator from Gemini");
    tg_xlate_set_usage_chunk(r->x, flags & 1);
    tg_buf_init(&r->out);
    memset(&r->usage, 0, sizeof(r->usage));
    tg_sse_parser_t p;
    tg_sse_init(&p, 1 << 16, feed_cb, r);
    tg_sse_feed(&p, s, split);
    tg_sse_feed(&p, s + split, n - split);
    if (flags & 2)
        tg_xlate_finish(r->x, &r->out);
    tg_sse_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    size_t split = n * data[0] / 255;
    int flags = data[1];
    for (int to = 0; to < 3; to++) {
        run_t a, b;
        run(&a, to, flags, s, n, 0);
        run(&b, to, flags, s, n, split);
        check(!memcmp(tg_xlate_usage(a.x), &a.usage, sizeof(a.usage)), "the translator's usage is not tg_usage's");
        verify_stream(to, &a.out);
        /* Compared with the clock zeroed (leading zeros: no longer JSON, so after). */
        zero_clock(&a.out);
        zero_clock(&b.out);
        check(a.out.len == b.out.len && (!a.out.len || !memcmp(a.out.data, b.out.data, a.out.len)),
              "output depends on how the input was split");
        tg_xlate_destroy(a.x);
        tg_xlate_destroy(b.x);
        tg_buf_free(&a.out);
        tg_buf_free(&b.out);
    }
    return 0;
}
