/*
 * Unit tests of the money arithmetic (core/src/domain/tg_money.c): parsing, checking and
 * formatting amounts, and pricing usage, which never wraps. A cost int64 cannot hold saturates at INT64_MAX (the callers
 * refuse or clamp it against TG_MONEY_REQUEST_MAX); it is never negative or small.
 */
#include "tollgate/tg_money.h"

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

TG_TEST(money, parse_refuses_malformed) {
    int64_t n = 7;
    const char *bad[] = {"", "-", ".", "1.2.3", "1e3", " 1", "1 ", "+1", "0x10", "1,5", "--1", "abc"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ASSERT(tg_money_parse(bad[i], &n) == TG_ERROR);
    ASSERT_EQ_INT(n, 7); /* untouched on error */
    ASSERT(tg_money_parse("0", &n) == TG_OK && n == 0);
    ASSERT(tg_money_parse(".5", &n) == TG_OK && n == 500000000);
    ASSERT(tg_money_parse("3.", &n) == TG_OK && n == 3000000000LL);
    /* Digits past the ninth decimal are cut, not rounded. */
    ASSERT(tg_money_parse("0.0000000019", &n) == TG_OK && n == 1);
    ASSERT(tg_money_parse("0.15", &n) == TG_OK && n == 150000000);
}

TG_TEST(money, check_is_zero_to_the_largest_balance) {
    ASSERT(tg_money_check("0") == TG_OK);
    ASSERT(tg_money_check("12.5") == TG_OK);
    ASSERT(tg_money_check(TG_MONEY_BALANCE_MAX_TEXT) == TG_OK);
    ASSERT(tg_money_check("1000000000.000000001") == TG_ERROR);
    ASSERT(tg_money_check("-0.000000001") == TG_ERROR);
    ASSERT(tg_money_check("ten") == TG_ERROR);
    ASSERT(tg_money_check(NULL) == TG_ERROR);
}

TG_TEST(money, format_round_trips) {
    char out[32];
    tg_money_format(150000000, out);
    ASSERT_EQ_STR(out, "0.150000000");
    tg_money_format(0, out);
    ASSERT_EQ_STR(out, "0.000000000");
    tg_money_format(-1, out);
    ASSERT_EQ_STR(out, "-0.000000001");
    tg_money_format(INT64_MAX, out);
    ASSERT_EQ_STR(out, "9223372036.854775807");
    tg_money_format(INT64_MIN, out);
    ASSERT_EQ_STR(out, "-9223372036.854775808");
    int64_t vals[] = {1, 999999999, 1000000000, -2500000000LL, TG_MONEY_REQUEST_MAX, TG_MONEY_BALANCE_MAX, INT64_MAX};
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        int64_t back = 0;
        tg_money_format(vals[i], out);
        ASSERT(tg_money_parse(out, &back) == TG_OK);
        ASSERT_EQ_INT(back, vals[i]);
    }
}

TG_TEST(money, price_rounds_half_up_and_applies_the_multiplier) {
    /* 1 token at 1.5 nano-USD per token (1,500,000 per million) is 1.5: rounds to 2; at
     * 1.4, to 1. */
    tg_price_t p = {.input = 1500000};
    tg_usage_t u = {.input = 1, .known = TG_USAGE_INPUT};
    ASSERT_EQ_INT(tg_price_usage(&p, &u, 1000000), 2);
    p.input = 1400000;
    ASSERT_EQ_INT(tg_price_usage(&p, &u, 1000000), 1);
    /* 1000 input tokens at 1 USD per million, 2.5x: 2,500,000 nano-USD; 0.5x: 500,000. */
    tg_price_t q = {.input = 1000000000};
    tg_usage_t v = {.input = 1000, .known = TG_USAGE_INPUT};
    ASSERT_EQ_INT(tg_price_usage(&q, &v, 2500000), 2500000);
    ASSERT_EQ_INT(tg_price_usage(&q, &v, 500000), 500000);
    ASSERT_EQ_INT(tg_price_usage(&q, &v, 0), 0);
}

TG_TEST(money, price_counts_only_known_fields) {
    tg_price_t p = {.input = 1000000000, .output = 2000000000, .cache_read = 100000000, .cache_write = 1250000000,
                    .reasoning = 3000000000LL};
    tg_usage_t u = {.input = 1000, .output = 500, .cache_read = 2000, .cache_write = 400, .reasoning = 100};
    ASSERT_EQ_INT(tg_price_usage(&p, &u, 1000000), 0); /* nothing known */
    u.known = TG_USAGE_CACHE_READ | TG_USAGE_CACHE_WRITE;
    ASSERT_EQ_INT(tg_price_usage(&p, &u, 1000000), 2000 * 100 + 400 * 1250);
    /* Output with reasoning: 400 tokens at the output price, 100 at the reasoning price. */
    u.known = TG_USAGE_INPUT | TG_USAGE_OUTPUT | TG_USAGE_REASONING;
    ASSERT_EQ_INT(tg_price_usage(&p, &u, 1000000), 1000 * 1000 + 400 * 2000 + 100 * 3000);
    /* Reasoning not known: all output at the output price. */
    u.known = TG_USAGE_OUTPUT;
    ASSERT_EQ_INT(tg_price_usage(&p, &u, 1000000), 500 * 2000);
}
