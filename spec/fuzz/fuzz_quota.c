/*
 * libFuzzer target for the providers' quota headers and error bodies
 * (core/src/proto/tg_quota.c).
 *
 * Input: header lines ("Name: value\r\n"), read as the upstream's forwarded headers and
 * as an error body. Invariants: never a crash or a read outside the input (ASan); each
 * quota header is either read or counted as malformed; a learned state's utilisation
 * stays within 0..1 and its text form reads back to the same text.
 */
#include "tollgate/tg_quota.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_quota invariant failed: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const int64_t now = 1764633600000LL;
    /* A copy of exactly `size` bytes, so ASan sees any read past the end. */
    char *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    tg_quota_t q;
    tg_quota_init(&q, now);
    int n = tg_quota_parse_headers(&q, buf, size, now);
    check(n >= 0 && n == q.known, "values read = known");
    for (int i = 0; i < TG_QW__COUNT; i++)
        check(q.win[i].used <= 1.0 && (q.win[i].used >= 0 || q.win[i].used == -1), "utilisation within 0..1");
    tg_quota_parse_error(&q, buf, size, now);
    double reset, left;
    double h = tg_quota_headroom(&q, now, &reset);
    check(h <= 1.0, "headroom at most 1");
    tg_quota_window_soonest(&q, now, &left, &reset);
    int64_t until = tg_quota_blocked_until(&q, now, 1000);
    check(until == 0 || until > now, "a block ends in the future");
    char t1[TG_QUOTA_TEXT_MAX], t2[TG_QUOTA_TEXT_MAX];
    size_t l1 = tg_quota_encode(&q, t1, sizeof(t1));
    if (l1) {
        tg_quota_t back;
        check(tg_quota_decode(&back, t1, l1), "its own text reads back");
        size_t l2 = tg_quota_encode(&back, t2, sizeof(t2));
        check(l2 == l1 && !memcmp(t1, t2, l1), "text round trip");
    }
    tg_quota_t d;
    tg_quota_decode(&d, buf, size);
    free(buf);
    return 0;
}
