/*
 * The providers' quota headers and error bodies (tg_quota.h): each family read into
 * limits and windows, malformed values ignored and counted, routing's view of them
 * (blocked until the reset, headroom, the window resetting soonest) and the fleet's
 * text form.
 */
#include "tg_test.h"
#include "tollgate/tg_quota.h"

#include <string.h>

#define NOW 1764633600000LL /* 2025-12-02T00:00:00Z */

static tg_quota_t parse(const char *lines) {
    tg_quota_t q;
    tg_quota_init(&q, NOW);
    tg_quota_parse_headers(&q, lines, strlen(lines), NOW);
    return q;
}

TG_TEST(quota, openai_headers) {
    tg_quota_t q = parse("x-ratelimit-limit-requests: 500\r\n"
                         "x-ratelimit-remaining-requests: 499\r\n"
                         "x-ratelimit-limit-tokens: 30000\r\n"
                         "X-RateLimit-Remaining-Tokens: 120\r\n"
                         "x-ratelimit-reset-requests: 120ms\r\n"
                         "x-ratelimit-reset-tokens: 1m30.5s\r\n"
                         "openai-processing-ms: 20\r\n");
    ASSERT_EQ_INT(q.known, 6);
    ASSERT_EQ_INT(q.malformed, 0);
    ASSERT_EQ_INT(q.lim[TG_QL_REQUESTS].limit, 500);
    ASSERT_EQ_INT(q.lim[TG_QL_REQUESTS].remaining, 499);
    ASSERT_EQ_INT(q.lim[TG_QL_REQUESTS].reset_at_ms, NOW + 120);
    ASSERT_EQ_INT(q.lim[TG_QL_TOKENS].remaining, 120);
    ASSERT_EQ_INT(q.lim[TG_QL_TOKENS].reset_at_ms, NOW + 90500);
    /* 120 tokens left cannot cover an estimate of 500: blocked until the tokens reset. */
    ASSERT_EQ_INT(tg_quota_blocked_until(&q, NOW, 500), NOW + 90500);
    ASSERT_EQ_INT(tg_quota_blocked_until(&q, NOW, 100), 0);
    ASSERT_EQ_INT(tg_quota_blocked_until(&q, NOW + 90501, 500), 0); /* never past the reset */
    double reset;
    double h = tg_quota_headroom(&q, NOW, &reset);
    ASSERT(h > 0.0039 && h < 0.0041);
    ASSERT(reset > 90499 && reset < 90501);
}

TG_TEST(quota, anthropic_headers) {
    tg_quota_t q = parse("anthropic-ratelimit-requests-limit: 50\r\n"
                         "anthropic-ratelimit-requests-remaining: 0\r\n"
                         "anthropic-ratelimit-requests-reset: 2025-12-02T00:00:30Z\r\n"
                         "anthropic-ratelimit-input-tokens-limit: 40000\r\n"
                         "anthropic-ratelimit-input-tokens-remaining: 39000\r\n"
                         "anthropic-ratelimit-input-tokens-reset: 2025-12-02T00:00:01.500+00:00\r\n"
                         "anthropic-ratelimit-output-tokens-remaining: 8000\r\n"
                         "anthropic-ratelimit-tokens-remaining: 47000\r\n"
                         "anthropic-ratelimit-unified-5h-status: allowed_warning\r\n"
                         "anthropic-ratelimit-unified-5h-utilization: 0.92\r\n"
                         "anthropic-ratelimit-unified-5h-reset: 1764640800\r\n"
                         "anthropic-ratelimit-unified-7d-utilization: 0.4\r\n"
                         "anthropic-ratelimit-unified-7d-reset: 1765238400\r\n"
                         "anthropic-ratelimit-unified-representative-claim: five_hour\r\n");
    ASSERT_EQ_INT(q.malformed, 0);
    ASSERT_EQ_INT(q.known, 13);
    ASSERT_EQ_INT(q.lim[TG_QL_REQUESTS].reset_at_ms, NOW + 30000);
    ASSERT_EQ_INT(q.lim[TG_QL_INPUT_TOKENS].reset_at_ms, NOW + 1500);
    ASSERT_EQ_INT(q.lim[TG_QL_OUTPUT_TOKENS].remaining, 8000);
    ASSERT_EQ_INT(q.win[TG_QW_SHORT].status, TG_QS_WARNING);
    ASSERT_EQ_INT(q.win[TG_QW_SHORT].reset_at_ms, 1764640800000LL);
    ASSERT_EQ_INT(q.win[TG_QW_SHORT].window_ms, 5 * 3600000LL);
    ASSERT(q.win[TG_QW_LONG].used > 0.39 && q.win[TG_QW_LONG].used < 0.41);
    /* No requests left: blocked until the requests reset. */
    ASSERT_EQ_INT(tg_quota_blocked_until(&q, NOW, 1), NOW + 30000);
    double left, in;
    ASSERT_EQ_INT(tg_quota_window_soonest(&q, NOW, &left, &in), 1);
    ASSERT(left > 0.079 && left < 0.081);
    ASSERT(in > 7199999 && in < 7200001);
}

TG_TEST(quota, unified_rejected_blocks_until_reset) {
    tg_quota_t q = parse("anthropic-ratelimit-unified-status: rejected\r\n"
                         "anthropic-ratelimit-unified-reset: 1764637200\r\n"
                         "anthropic-ratelimit-unified-5h-status: rejected\r\n"
                         "anthropic-ratelimit-unified-5h-reset: 1764637200\r\n");
    ASSERT_EQ_INT(tg_quota_blocked_until(&q, NOW, 1), NOW + 3600000);
    q = parse("anthropic-ratelimit-unified-status: allowed\r\nanthropic-ratelimit-unified-reset: 1764637200\r\n");
    ASSERT_EQ_INT(tg_quota_blocked_until(&q, NOW, 1), 0);
}

TG_TEST(quota, codex_headers) {
    tg_quota_t q = parse("x-codex-primary-used-percent: 100.0\r\n"
                         "x-codex-primary-window-minutes: 300\r\n"
                         "x-codex-primary-reset-after-seconds: 600\r\n"
                         "x-codex-secondary-used-percent: 35\r\n"
                         "x-codex-secondary-window-minutes: 10080\r\n"
                         "x-codex-secondary-reset-after-seconds: 86400\r\n"
                         "x-codex-primary-over-secondary-limit-percent: 12\r\n");
    ASSERT_EQ_INT(q.known, 6);
    ASSERT_EQ_INT(q.malformed, 0);
    ASSERT_EQ_INT(q.win[TG_QW_SHORT].window_ms, 300 * 60000LL);
    ASSERT_EQ_INT(tg_quota_blocked_until(&q, NOW, 1), NOW + 600000); /* the primary is spent */
    double reset, h = tg_quota_headroom(&q, NOW, &reset);
    ASSERT(h == 0);
}

TG_TEST(quota, malformed_values_ignored_and_counted) {
    tg_quota_t q = parse("x-ratelimit-remaining-requests: lots\r\n"
                         "x-ratelimit-reset-tokens: 5 fortnights\r\n"
                         "x-ratelimit-limit-tokens: -4\r\n"
                         "x-ratelimit-remaining-tokens: 99999999999999999999999\r\n"
                         "anthropic-ratelimit-requests-reset: 2025-13-45T99:00:00Z\r\n"
                         "anthropic-ratelimit-unified-5h-utilization: NaN\r\n"
                         "anthropic-ratelimit-unified-5h-status: maybe\r\n"
                         "x-codex-primary-used-percent: 250\r\n"
                         "x-codex-secondary-reset-after-seconds: \r\n"
                         "x-ratelimit-remaining-something: 5\r\n"
                         "x-codex-primary\r\n"
                         ": 1\r\n"
                         "x-ratelimit-limit-requests: 10");
    ASSERT_EQ_INT(q.malformed, 9);
    ASSERT_EQ_INT(q.known, 1);
    ASSERT_EQ_INT(q.lim[TG_QL_REQUESTS].limit, 10);
    ASSERT_EQ_INT(q.lim[TG_QL_REQUESTS].remaining, -1);
    ASSERT_EQ_INT(tg_quota_blocked_until(&q, NOW, 1000000), 0);
    double reset;
    ASSERT(tg_quota_headroom(&q, NOW, &reset) < 0);
}

TG_TEST(quota, error_bodies) {
    tg_quota_t q;
    tg_quota_init(&q, NOW);
    const char *b = "{\"error\":{\"type\":\"usage_limit_reached\",\"message\":\"The usage limit has been reached\","
                    "\"plan_type\":\"plus\",\"resets_at\":1764637200,\"resets_in_seconds\":3600}}";
    ASSERT_EQ_INT(tg_quota_parse_error(&q, b, strlen(b), NOW), 1);
    ASSERT_EQ_INT(q.blocked_until_ms, NOW + 3600000);
    tg_quota_init(&q, NOW);
    b = "{\"error\":{\"type\":\"usage_limit_reached\",\"resets_in_seconds\": 90}}";
    ASSERT_EQ_INT(tg_quota_parse_error(&q, b, strlen(b), NOW), 1);
    ASSERT_EQ_INT(tg_quota_blocked_until(&q, NOW, 1), NOW + 90000);
    tg_quota_init(&q, NOW);
    b = "{\"error\":{\"resets_at\":\"soon\"}}";
    ASSERT_EQ_INT(tg_quota_parse_error(&q, b, strlen(b), NOW), 0);
    ASSERT_EQ_INT(q.malformed, 1);
    b = "{\"error\":{\"resets_at\":";
    ASSERT_EQ_INT(tg_quota_parse_error(&q, b, strlen(b), NOW), 0);
}

TG_TEST(quota, merge_and_text_round_trip) {
    tg_quota_t st = parse("x-ratelimit-limit-requests: 100\r\nx-ratelimit-remaining-requests: 5\r\n"
                          "x-ratelimit-reset-requests: 10s\r\n");
    tg_quota_t in = parse("x-ratelimit-remaining-requests: 4\r\n"
                          "anthropic-ratelimit-unified-5h-utilization: 0.5\r\n"
                          "anthropic-ratelimit-unified-5h-reset: 1764640800\r\n"
                          "anthropic-ratelimit-unified-status: rejected\r\n"
                          "anthropic-ratelimit-unified-reset: 1764640800\r\n");
    tg_quota_merge(&st, &in);
    ASSERT_EQ_INT(st.lim[TG_QL_REQUESTS].limit, 100);
    ASSERT_EQ_INT(st.lim[TG_QL_REQUESTS].remaining, 4);
    char text[TG_QUOTA_TEXT_MAX];
    size_t n = tg_quota_encode(&st, text, sizeof(text));
    ASSERT(n > 0 && n < sizeof(text));
    tg_quota_t back;
    ASSERT_EQ_INT(tg_quota_decode(&back, text, n), 1);
    ASSERT_EQ_INT(back.lim[TG_QL_REQUESTS].remaining, 4);
    ASSERT_EQ_INT(back.lim[TG_QL_REQUESTS].reset_at_ms, NOW + 10000);
    ASSERT(back.win[TG_QW_SHORT].used > 0.49 && back.win[TG_QW_SHORT].used < 0.51);
    ASSERT_EQ_INT(tg_quota_blocked_until(&back, NOW, 1), 1764640800000LL);
    ASSERT_EQ_INT(tg_quota_decode(&back, "q1 1 2 3", 8), 0);
    ASSERT_EQ_INT(tg_quota_decode(&back, "zz", 2), 0);
}
