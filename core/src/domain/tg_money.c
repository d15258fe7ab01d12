/*
 * Money arithmetic (see tg_money.h): decimal text to and from integer nano-USD, and
 * usage priced in 128-bit integers so that nothing wraps.
 */
#include "tollgate/tg_money.h"

#include <stdio.h>

#include "tollgate/tg_common.h"

int tg_money_parse(const char *s, int64_t *nano) {
    int neg = 0;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    /* Whole units up to INT64_MAX / 1e9 (9223372036), then the fraction: the sum is
     * checked, so nothing wraps. */
    int64_t whole = 0, frac = 0;
    int digits = 0, fd = 0;
    while (*s >= '0' && *s <= '9') {
        whole = whole * 10 + (*s++ - '0');
        if (whole > INT64_MAX / 1000000000)
            return TG_ERROR;
        digits++;
    }
    if (*s == '.') {
        s++;
        while (*s >= '0' && *s <= '9') {
            if (fd < 9) {
                frac = frac * 10 + (*s - '0');
                fd++;
            }
            s++;
            digits++;
        }
    }
    if (*s || !digits)
        return TG_ERROR;
    while (fd < 9) {
        frac *= 10;
        fd++;
    }
    if (whole * 1000000000 > INT64_MAX - frac)
        return TG_ERROR;
    *nano = (whole * 1000000000 + frac) * (neg ? -1 : 1);
    return TG_OK;
}

int tg_money_check(const char *decimal) {
    int64_t n;
    return decimal && tg_money_parse(decimal, &n) == TG_OK && n >= 0 && n <= TG_MONEY_BALANCE_MAX ? TG_OK : TG_ERROR;
}

void tg_money_format(int64_t nano, char out[32]) {
    /* "%s%llu.%09llu" without printf: it runs twice per billed request. */
    uint64_t a = nano < 0 ? (uint64_t)(-(nano + 1)) + 1 : (uint64_t)nano;
    size_t n = 0;
    if (nano < 0)
        out[n++] = '-';
    n += tg_fmt_u64(out + n, a / 1000000000ull);
    out[n++] = '.';
    uint64_t f = a % 1000000000ull;
    for (int i = 8; i >= 0; i--, f /= 10)
        out[n + (size_t)i] = (char)('0' + f % 10);
    out[n + 9] = '\0';
}

/* tokens x price (nano-USD per million tokens), both taken as >= 0: below 2^126, exact. */
static __int128 term(int64_t tokens, int64_t price) {
    return tokens > 0 && price > 0 ? (__int128)tokens * price : 0;
}

int64_t tg_price_usage(const tg_price_t *p, const tg_usage_t *u, int64_t multiplier_micro) {
    /* The result is sum * multiplier / 10^12; any sum above LIMIT gives more than
     * INT64_MAX at a multiplier of at least 1x, and every term is kept at or below it,
     * so the sum of five never overflows. */
    const __int128 div = (__int128)1000000 * 1000000;
    const __int128 limit = (__int128)INT64_MAX * div;
    __int128 t[5] = {0};
    if (u->known & TG_USAGE_INPUT)
        t[0] = term(u->input, p->input);
    if (u->known & TG_USAGE_OUTPUT) {
        /* Reasoning tokens are part of output; priced apart when a reasoning price exists. */
        int64_t out = TG_MAX(u->output, 0);
        int64_t reasoning = (u->known & TG_USAGE_REASONING) ? TG_MIN(TG_MAX(u->reasoning, 0), out) : 0;
        t[1] = term(out - reasoning, p->output);
        t[2] = term(reasoning, p->reasoning);
    }
    if (u->known & TG_USAGE_CACHE_READ)
        t[3] = term(u->cache_read, p->cache_read);
    if (u->known & TG_USAGE_CACHE_WRITE)
        t[4] = term(u->cache_write, p->cache_write);
    __int128 sum = 0;
    for (int i = 0; i < 5; i++)
        sum += TG_MIN(t[i], limit);
    if (sum == 0 || multiplier_micro <= 0)
        return 0;
    /* sum is nano-USD per million tokens * tokens; times multiplier / 1e6; / 1e6 tokens. */
    if (sum > (limit - div / 2) / multiplier_micro)
        return INT64_MAX;
    __int128 scaled = sum * multiplier_micro;
    return (int64_t)((scaled + div / 2) / div);
}
