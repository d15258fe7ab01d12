/*
 * The cost per request of reading the providers' quota headers (#20): what
 * tg__quota_learn does for every upstream answer of an account — parse the forwarded
 * header lines (tg_quota_parse_headers), fold them into the account's state
 * (tg_quota_merge), and what routing then reads (tg_quota_blocked_until, headroom, the
 * soonest window) — plus, every 1,000th request, the text of the fleet's copy
 * (tg_quota_encode; the SET goes out fire-and-forget at most once a second per account
 * per worker: every 1,000th request at 1,000 requests a second on one account). Each
 * encode alone costs ~7,000 instructions (snprintf of 26 numbers). The build without quota did none of this: its
 * cost is the difference.
 *
 *   build/tg_quota_bench [iterations]          ns per request for each provider's headers
 *   valgrind --tool=callgrind build/tg_quota_bench 100000   instructions (spec/bench/quota_bench.sh)
 */
#include "tollgate/tg_quota.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The forwarded header lines of one answer, as tg_upstream.c collects them (the quota
 * headers plus the provider's other x-ratelimit-* / openai-* / anthropic-* lines). */
static const char *const sets[][2] = {
    {"openai",
     "openai-organization: org-bench\r\nopenai-processing-ms: 412\r\nopenai-version: 2020-10-01\r\n"
     "x-ratelimit-limit-requests: 10000\r\nx-ratelimit-limit-tokens: 2000000\r\n"
     "x-ratelimit-remaining-requests: 9999\r\nx-ratelimit-remaining-tokens: 1999571\r\n"
     "x-ratelimit-reset-requests: 6ms\r\nx-ratelimit-reset-tokens: 12ms\r\n"},
    {"anthropic",
     "anthropic-organization-id: 0f1e2d3c\r\nanthropic-ratelimit-requests-limit: 4000\r\n"
     "anthropic-ratelimit-requests-remaining: 3999\r\nanthropic-ratelimit-requests-reset: 2026-12-02T03:40:01Z\r\n"
     "anthropic-ratelimit-input-tokens-limit: 400000\r\nanthropic-ratelimit-input-tokens-remaining: 399000\r\n"
     "anthropic-ratelimit-input-tokens-reset: 2026-12-02T03:40:00Z\r\n"
     "anthropic-ratelimit-output-tokens-limit: 80000\r\nanthropic-ratelimit-output-tokens-remaining: 80000\r\n"
     "anthropic-ratelimit-output-tokens-reset: 2026-12-02T03:40:00Z\r\n"
     "anthropic-ratelimit-tokens-limit: 480000\r\nanthropic-ratelimit-tokens-remaining: 479000\r\n"
     "anthropic-ratelimit-tokens-reset: 2026-12-02T03:40:00Z\r\n"},
    {"unified",
     "anthropic-organization-id: 0f1e2d3c\r\nanthropic-ratelimit-unified-status: allowed\r\n"
     "anthropic-ratelimit-unified-reset: 1796183000\r\nanthropic-ratelimit-unified-5h-status: allowed\r\n"
     "anthropic-ratelimit-unified-5h-utilization: 0.42\r\nanthropic-ratelimit-unified-5h-reset: 1796183000\r\n"
     "anthropic-ratelimit-unified-7d-status: allowed\r\nanthropic-ratelimit-unified-7d-utilization: 0.17\r\n"
     "anthropic-ratelimit-unified-7d-reset: 1796700000\r\nanthropic-ratelimit-unified-representative-claim: five_hour\r\n"},
    {"codex",
     "x-codex-primary-used-percent: 42.0\r\nx-codex-primary-window-minutes: 300\r\n"
     "x-codex-primary-reset-after-seconds: 9000\r\nx-codex-secondary-used-percent: 17.0\r\n"
     "x-codex-secondary-window-minutes: 10080\r\nx-codex-secondary-reset-after-seconds: 500000\r\n"
     "x-codex-primary-over-secondary-limit-percent: 0\r\n"},
    {"none", "openai-processing-ms: 412\r\nopenai-version: 2020-10-01\r\n"},
};

static volatile int64_t sink;

/* One answer: parse, fold in, what routing reads; and, when `share`, the fleet's text. */
static void one(tg_quota_t *st, const char *lines, size_t len, int64_t now, int share) {
    tg_quota_t q;
    tg_quota_init(&q, now);
    tg_quota_parse_headers(&q, lines, len, now);
    if (!q.known)
        return;
    tg_quota_merge(st, &q);
    double reset, left, in;
    int64_t b = tg_quota_blocked_until(st, now, 1500);
    double h = tg_quota_headroom(st, now, &reset);
    tg_quota_window_soonest(st, now, &left, &in);
    size_t n = 0;
    if (share) {
        char text[TG_QUOTA_TEXT_MAX];
        n = tg_quota_encode(st, text, sizeof(text));
    }
    sink += b + (int64_t)(h * 1000) + (int64_t)n;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 2000000;
    const char *only = argc > 2 ? argv[2] : NULL;
    const int64_t now = 1796180000000LL;
    printf("| headers | bytes | ns / request |\n|---|---:|---:|\n");
    for (size_t s = 0; s < sizeof(sets) / sizeof(sets[0]); s++) {
        if (only && strcmp(only, sets[s][0]) != 0)
            continue;
        const char *lines = sets[s][1];
        size_t len = strlen(lines);
        tg_quota_t st;
        tg_quota_init(&st, now);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        /* The fleet's copy is written at most once a second per account per worker: at
         * 1,000 requests a second on one account, every 1,000th request. */
        for (long i = 0; i < iters; i++)
            one(&st, lines, len, now + i, i % 1000 == 0);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)iters;
        printf("| %s | %zu | %.1f |\n", sets[s][0], len, ns);
    }
    return 0;
}
