/*
 * Periodic budgets (issue #24): a spend limit per key, per user (every key whose user_id
 * is that user) or per tenant, for a calendar day, ISO week (from Monday) or month in an
 * IANA time zone, or for windows of N hours counted from the budget's creation. The
 * gateway computes the period a request falls in here (the system's time zone database,
 * /usr/share/zoneinfo) and sends it to the admission script, which keeps each period's
 * spend in its own Redis key under the tenant's hash tag, {t:T}:bud:<id>:<period start>:
 * a new period is a new key, so nothing is swept at a boundary. See README "Budgets".
 */
#ifndef TOLLGATE_TG_BUDGETS_H
#define TOLLGATE_TG_BUDGETS_H

#include <stdint.h>

/* The budgets one request is checked against at most (a key's, its user's, its
 * tenant's: several of each scope may exist). More are ignored by the query that loads
 * them, which takes the first by id. */
#define TG_BUDGETS_MAX 6

typedef enum { TG_BUDGET_DAY = 0, TG_BUDGET_WEEK, TG_BUDGET_MONTH, TG_BUDGET_HOURS } tg_budget_kind_t;

typedef struct {
    int64_t id;
    int64_t amount;      /* nano-USD */
    int kind;            /* tg_budget_kind_t */
    int hours;           /* TG_BUDGET_HOURS: the window */
    int64_t anchor_s;    /* TG_BUDGET_HOURS: windows start at anchor + k·hours (its creation) */
    char scope;          /* 'k' key, 'u' user, 't' tenant */
    char tz[64];         /* calendar periods: the IANA zone */
    char name[96];
    int64_t cur_start, cur_end; /* the period last computed (a cache: recomputed outside it) */
} tg_budget_t;

/** The budgets' clock, Unix seconds: the wall clock, plus the test offset when one is set. */
int64_t tg_budget_now_s(void);
/** Shifts the budgets' clock by `seconds` (tests: TOLLGATE_TEST_CLOCK_OFFSET, honoured only
 *  with billing.test_clock = true in the config). */
void tg_budget_set_clock_offset(int64_t seconds);
/** Call once before threads start: makes TZ an existing environment variable, so the
 *  conversions below only ever replace its value (never grow the environment). */
void tg_budget_tz_init(void);

/** The period of b that contains `now_s`: [*start, *end) in Unix seconds. Cached in b.
 *  Returns 0, or -1 when b's time zone cannot be read (the caller refuses: fail closed). */
int tg_budget_period(tg_budget_t *b, int64_t now_s, int64_t *start, int64_t *end);

/** Parses "day" | "week" | "month" | "hours": the kind, or -1. */
int tg_budget_kind(const char *s);
/** "daily", "weekly", "monthly", "every N hours" (into buf). */
const char *tg_budget_kind_text(const tg_budget_t *b, char *buf, int len);

#endif
