/*
 * Unit tests of the money arithmetic (core/src/tg_billing.c): parsing amounts and
 * pricing usage never wrap. A cost int64 cannot hold saturates at INT64_MAX (the callers
 * refuse or clamp it against TG_MONEY_REQUEST_MAX); it is never negative or small.
 */
#include "tollgate/tg_billing.h"

#include "tg_test.h"

static const tg_usage_t BOTH = {.known = TG_USAGE_INPUT | TG_USAGE_OUTPUT};

/* The reservation bound of issue #14: 1 USD / 2 USD per million tokens, 1x. */
static int64_t bound(int64_t input, int64_t output) {
    tg_price_t p = {.input = 1000000000, .output = 2000000000};
    tg_usage_t u = BOTH;
    u.input = input;
    u.output = output;
    return tg_price_usage(&p, &u, 1000000);
}

TG_TEST(money, price_exact_in_range) {
    ASSERT(bound(10, 20) == 10 * 1000 + 20 * 2000);
    ASSERT(bound(0, 0) == 0);
    /* 4096 output tokens at 2 USD per million: 8,192,000 nano-USD. */
    ASSERT(bound(0, 4096) == 8192000);
}

TG_TEST(money, price_saturates_never_wraps) {
    /* max_tokens 10^18 (was: a negative reservation), 2^62 and 2^63-1 (were: only the
     * input cost). */
    int64_t big[] = {1000000000000000000LL, (int64_t)1 << 62, INT64_MAX};
    for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
        int64_t c = bound(100, big[i]);
        ASSERT(c > TG_MONEY_REQUEST_MAX);
        ASSERT(c == INT64_MAX);
    }
    /* Every field at its largest, at the largest price and a 1,000,000x multiplier. */
    tg_price_t p = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    tg_usage_t u = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX,
                    TG_USAGE_INPUT | TG_USAGE_OUTPUT | TG_USAGE_CACHE_READ | TG_USAGE_CACHE_WRITE | TG_USAGE_REASONING};
    ASSERT(tg_price_usage(&p, &u, 1000000000000LL) == INT64_MAX);
    /* Around the most one request may reserve (2^53 nano-USD): 4,503,599,627,370 output
     * tokens at 2 USD per million fit, one more does not. */
    ASSERT(bound(0, 4503599627370LL) == 9007199254740000LL);
    ASSERT(bound(0, 4503599627371LL) > TG_MONEY_REQUEST_MAX);
}

TG_TEST(money, price_ignores_negatives) {
    tg_price_t p = {.input = -1000000000, .output = 2000000000};
    tg_usage_t u = BOTH;
    u.input = 5;
    u.output = -7;
    ASSERT(tg_price_usage(&p, &u, 1000000) == 0);
    u.output = 3;
    ASSERT(tg_price_usage(&p, &u, -1000000) == 0);
    /* More reasoning than output: reasoning is part of output, never more. */
    tg_price_t r = {.output = 2000000000, .reasoning = 4000000000};
    tg_usage_t v = {.output = 10, .reasoning = 1000, .known = TG_USAGE_OUTPUT | TG_USAGE_REASONING};
    ASSERT(tg_price_usage(&r, &v, 1000000) == 10 * 4000);
}

TG_TEST(money, parse_refuses_out_of_range) {
    int64_t n = 0;
    ASSERT(tg_money_parse("9223372036.854775807", &n) == TG_OK && n == INT64_MAX);
    ASSERT(tg_money_parse("9223372036.854775808", &n) == TG_ERROR);
    ASSERT(tg_money_parse("9223372037", &n) == TG_ERROR);
    ASSERT(tg_money_parse("9223372039", &n) == TG_ERROR); /* was accepted and wrapped */
    ASSERT(tg_money_parse("100000000000000000000", &n) == TG_ERROR);
    ASSERT(tg_money_parse("1000000000", &n) == TG_OK && n == TG_MONEY_BALANCE_MAX);
    ASSERT(tg_money_parse("0.000000001", &n) == TG_OK && n == 1);
    ASSERT(tg_money_parse("-2.5", &n) == TG_OK && n == -2500000000LL);
}
