/*
 * libFuzzer target for the SSE parser (core/src/proto/tg_sse.c).
 *
 * Input: byte 0 picks where the stream is split in two, byte 1 picks max_event (times
 * 16, so 0..4080 bytes), the rest is the stream. The stream is parsed three ways: in one
 * feed, split at the chosen offset, and byte by byte. Beyond "no crash, no leak, no
 * out-of-bounds read" (ASan/UBSan), the target checks that
 *   - every dispatched event fits max_event;
 *   - the parser's buffers stay bounded after every feed;
 *   - all three ways give the same events and the same dropped count, i.e. the result
 *     never depends on how the network cut the bytes.
 */
#include "tollgate/tg_sse.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    tg_sse_parser_t p;
    tg_buf_t out;  /* every event, length-prefixed, for comparison */
    size_t max_event;
    uint64_t calls;
} run_t;

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_sse invariant failed: %s\n", what);
        abort();
    }
}

static void record_cb(void *ud, const char *event, size_t event_len, const char *data,
                      size_t data_len) {
    run_t *r = ud;
    check(event_len <= r->max_event && data_len <= r->max_event - event_len,
          "event larger than max_event");
    r->calls++;
    uint64_t lens[2] = {event_len, data_len};
    tg_buf_append(&r->out, lens, sizeof(lens));
    tg_buf_append(&r->out, event, event_len);
    tg_buf_append(&r->out, data, data_len);
}

static void run_init(run_t *r, size_t max_event) {
    tg_buf_init(&r->out);
    r->max_event = max_event;
    r->calls = 0;
    tg_sse_init(&r->p, max_event, record_cb, r);
}

static void run_feed(run_t *r, const char *s, size_t n) {
    tg_sse_feed(&r->p, s, n);
    check(r->p.event.len + r->p.data.len <= r->max_event, "event buffers exceed max_event");
    check(r->p.line.len <= r->max_event + 16, "line buffer exceeds its bound");
    check(r->p.events == r->calls, "events counter differs from callbacks");
}

static void run_same(const run_t *a, const run_t *b, const char *how) {
    if (a->out.len != b->out.len || (a->out.len && memcmp(a->out.data, b->out.data, a->out.len)) ||
        a->p.dropped != b->p.dropped) {
        fprintf(stderr, "fuzz_sse: %s differs from one feed\n", how);
        abort();
    }
}

static void run_free(run_t *r) {
    tg_sse_free(&r->p);
    tg_buf_free(&r->out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    size_t max_event = (size_t)data[1] * 16;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    size_t split = n * data[0] / 255;

    run_t whole, two, bytes;
    run_init(&whole, max_event);
    run_feed(&whole, s, n);

    run_init(&two, max_event);
    run_feed(&two, s, split);
    run_feed(&two, s + split, 0);
    run_feed(&two, s + split, n - split);
    run_same(&whole, &two, "split feed");

    run_init(&bytes, max_event);
    for (size_t i = 0; i < n; i++)
        run_feed(&bytes, s + i, 1);
    run_same(&whole, &bytes, "byte-by-byte feed");

    run_free(&whole);
    run_free(&two);
    run_free(&bytes);
    return 0;
}
