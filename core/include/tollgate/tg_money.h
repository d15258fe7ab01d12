/*
 * Money arithmetic, in one place: amounts are integer nano-USD (1e-9 USD) in C, decimal
 * text at the edges (the admin API, apply, Postgres NUMERIC), never a float. This module
 * parses and checks amounts, formats them, and prices usage (price × tokens × the
 * group's multiplier), saturating instead of wrapping. Pure functions: no I/O, no
 * allocation, no state; billing, the accounts snapshot, the admin API and apply use it.
 */
#ifndef TOLLGATE_TG_MONEY_H
#define TOLLGATE_TG_MONEY_H

#include <stdint.h>

#include "tollgate/tg_usage.h"

/** Prices in nano-USD per one million tokens. */
typedef struct tg_price_s {
    int64_t input, output, cache_read, cache_write, reasoning;
} tg_price_t;

/** The largest amount one request may reserve or be charged: 2^53 nano-USD
 *  (9007199.254740992 USD), the largest integer the Redis scripts hold exactly (a Lua
 *  number is a double). A request whose bound prices above it is refused; a cost above
 *  it is not believed (see tg_price_usage and the README's billing rules). */
#define TG_MONEY_REQUEST_MAX ((int64_t)1 << 53)
/** The largest balance, budget, top-up or price (per million tokens): 1,000,000,000 USD
 *  (10^18 nano-USD). Balances live in Redis and in C as int64 nano-USD: a largest
 *  balance plus a largest top-up or reservation still fits with room to spare. */
#define TG_MONEY_BALANCE_MAX ((int64_t)1000000000 * 1000000000)
#define TG_MONEY_BALANCE_MAX_TEXT "1000000000"
/** More tokens than this in one field of one request's usage is not believed: 2^40
 *  (about 1.1 trillion). */
#define TG_USAGE_TOKENS_MAX ((int64_t)1 << 40)

/** Parses a decimal string ("0.15", "-2.5") as nano-units (150000000). TG_ERROR if
 *  malformed or outside int64 nano-units (about +-9.2 billion); digits past the ninth
 *  decimal are cut. */
int tg_money_parse(const char *s, int64_t *nano);
/** A money input (a balance, budget, top-up or price, as decimal text): TG_OK when it is a
 *  decimal from 0 to TG_MONEY_BALANCE_MAX (digits past the ninth decimal are cut). */
int tg_money_check(const char *decimal);
/** Formats nano-units as a decimal string with 9 fractional digits ("-0.000000001"). */
void tg_money_format(int64_t nano, char out[32]);
/** The cost of `u` at price `p` times multiplier (millionths: 1000000 = 1x), rounded
 *  half up to whole nano-USD. Unknown fields count as 0; negative counts, prices and
 *  multipliers as 0; reasoning tokens are part of output, priced at `reasoning`.
 *  Saturates: a cost that int64 cannot hold is INT64_MAX (callers
 *  compare with TG_MONEY_REQUEST_MAX), never a wrapped or negative number. */
int64_t tg_price_usage(const tg_price_t *p, const tg_usage_t *u, int64_t multiplier_micro);

#endif
