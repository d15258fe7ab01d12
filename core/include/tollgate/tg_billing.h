/*
 * Two-phase metering and idempotent settlement.
 *
 * Before the upstream call a request reserves the upper bound of its cost (estimated
 * input + max output, priced) in Redis, atomically against the tenant's live available
 * balance and the key's budget (hash tag {t:<tenant>}); a balance that cannot cover the
 * bound refuses the request (402), so concurrent requests can never overspend. The first
 * attempt's reservation is taken by the admission script itself (tg_limits.h), in the
 * same round trip as the rate, token and concurrency limits and only if they all
 * admit (tg_billing_admission_money builds its part; tg_billing_admitted records it);
 * a retry's, or one the admission could not take, by tg_billing_reserve (a script of
 * its own, the same writes).
 * The reservation's durable Postgres row (`reserved`) is written by the settlement
 * batcher within a millisecond, or appended to the local fsync'd spool when Postgres is
 * unreachable — so no request waits on Postgres, and a Postgres outage does not stop
 * traffic for tenants whose balance is live in Redis. The hold is also indexed in Redis
 * ({t:T}:holds), so the reconciler finds the holds of a gateway that died before their
 * row reached Postgres.
 *
 * After the response, the exact usage is priced and settled: the Redis reservation's
 * unused part is returned exactly once (the reservation key is deleted by the same
 * script that credits it back), and the Postgres settlement (tg_settle_batch: dedup row
 * first, and only if it was inserted: debit, usage row, ledger row, reservation
 * reconciled) is queued, grouped with others into one transaction per batch, and on
 * failure — or when the queue reaches queue_max because Postgres is slower than the
 * traffic — appended to a local fsync'd spool that is replayed until it succeeds.
 *
 * Money is handled in C as integer nano-USD (1e-9 USD; its arithmetic is tg_money.h)
 * and in Postgres as NUMERIC; never as a float.
 */
#ifndef TOLLGATE_TG_BILLING_H
#define TOLLGATE_TG_BILLING_H

#include <uv.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_limits.h"
#include "tollgate/tg_money.h"
#include "tollgate/tg_state.h"
#include "tollgate/tg_usage.h"

typedef struct tg_billing_s tg_billing_t;
typedef struct tg_reserve_s tg_reserve_t;

typedef struct {
    const char *spool_dir;
    int reconcile_after_ms; /* a `reserved` row older than this, or `pending_reconciliation`, is settled by the reconciler */
    int charge_unknown;     /* 1: unknown usage is charged at the reserved bound; 0: released */
    int worker;             /* index, for the spool file name */
    int reconciler;         /* this worker competes for the reconciler lock */
    int queue_max;          /* elements queued for Postgres before the queue spills to the spool (0: default) */
} tg_billing_config_t;

tg_billing_t *tg_billing_create(uv_loop_t *loop, tg_state_t *st, const tg_billing_config_t *cfg);
void tg_billing_destroy(tg_billing_t *b);

/** The outcome of a reservation: 0 reserved (code "unheld": without a hold, money open
 *  while Redis was down; NULL otherwise); 402 the balance or budget cannot cover it;
 *  503 it could not be checked (Redis or Postgres down: money fails closed unless
 *  money_open says otherwise when Redis is the one down). */
typedef void (*tg_reserve_cb)(void *ud, int status, const char *code, const char *msg);

/** One periodic budget a request is checked against, in the period it falls in (the
 *  gateway computes it: tg_budget_period). Its Redis key is {t:T}:bud:<id>:<start>. */
typedef struct {
    int64_t id;
    int64_t limit;      /* nano-USD */
    int64_t start, end; /* the period, Unix seconds */
    char init[24];      /* the period's spend to load into Redis (nano-USD), "" unknown */
} tg_budget_use_t;

typedef struct {
    const char *request_id;
    int attempt;
    int64_t tenant_id, key_id;
    const char *model;
    int64_t amount; /* nano-USD */
    int key_budget; /* the key has a budget (else only the tenant's balance is checked) */
    /** Optional: asked (with `ud`) when Redis did not answer; nonzero = the money limit
     *  fails open for this request (the on_limiter_down hook): it goes ahead without a
     *  hold, its reservation row still goes to Postgres and it settles as usual. */
    int (*money_open)(void *ud);
    /** The periodic budgets that apply, in their periods (copied by tg_billing_reserve). */
    const tg_budget_use_t *budgets;
    int nbudgets;
} tg_reserve_req_t;

/** Reserves; the callback runs exactly once, never synchronously. */
tg_reserve_t *tg_billing_reserve(tg_billing_t *b, const tg_reserve_req_t *r, tg_reserve_cb cb, void *ud);
/** The caller is gone: no callback; what was reserved is kept for settlement. */
void tg_reserve_detach(tg_reserve_t *r);

/**
 * The first attempt's reservation (r->attempt is taken as 1) as the admission script
 * takes it: keys, amount, hold, and the live balances to load into Redis when the
 * admission answered TG_ADMIT_MONEY_INIT (NULL or "" before: unknown). The hold's undo
 * (a lost answer, a client gone mid-admission) is tg_billing_release_attempt.
 */
void tg_billing_admission_money(tg_billing_t *b, const tg_reserve_req_t *r, const char *tenant_init,
                                const char *key_init, tg_limit_money_t *out);
/** The admission reserved r (TG_ADMIT_OK, reserved): records it as tg_billing_reserve
 *  does (the Postgres row through the batcher, the counter). Call it when the upstream
 *  call is about to be made; a request that ends before gives the hold back with
 *  tg_billing_release_attempt instead, and nothing is recorded. */
void tg_billing_admitted(tg_billing_t *b, const tg_reserve_req_t *r);
/** The admission refused on money (TG_ADMIT_BALANCE, TG_ADMIT_BUDGET: key_budget 1):
 *  counts it; the client error's code and message (status 402), as tg_billing_reserve's. */
void tg_billing_refused(tg_billing_t *b, int key_budget, const char **code, const char **msg);
/** A periodic budget refused (its index in r->budgets): counted; tg_billing_reserve's
 *  callback then gets 402 "budget_exceeded" with msg "budget <index>". */
void tg_billing_refused_budget(tg_billing_t *b);

/** tg_billing_load's answer: status 0 with the balances (nano-USD, decimal; the key's
 *  "-1" without a budget), or 503 with the client error's code and message. */
typedef void (*tg_balance_cb)(void *ud, int status, const char *code, const char *msg, const char *tenant_avail,
                              const char *key_avail, const char *budget_spend);
/* budget_spend: each of r->budgets' period spend to load (nano-USD), space-separated. */
/** Puts tg_balance_cb's budget_spend into u[0..n-1].init. */
void tg_billing_budget_inits(tg_budget_use_t *u, int n, const char *budget_spend);
/** Loads r's live balances from Postgres (the admission answered TG_ADMIT_MONEY_INIT).
 *  The callback runs exactly once, never synchronously; tg_reserve_detach cancels it. */
tg_reserve_t *tg_billing_load(tg_billing_t *b, const tg_reserve_req_t *r, tg_balance_cb cb, void *ud);

typedef struct {
    const char *request_id;
    int64_t tenant_id, key_id, group_id, account_id;
    const char *model;
    tg_usage_t usage;
    int64_t cost;        /* nano-USD */
    int estimated;       /* usage (partly) estimated: client gone, no usage from upstream */
    int clamped;         /* the upstream's usage was not believable: billed at the bound (counted) */
    int unreadable;      /* a 2xx answer without readable usage: estimated (counted) */
    int attempts;
    unsigned unheld;     /* bit a-1: attempt a went ahead without a Redis hold (money open
                            while Redis was down): its cost comes off the live balance */
    int status;
    double ttft_ms, total_ms;
    /* The periodic budgets the billed (last) attempt was admitted against: its cost
     * counts in these periods in Postgres (budget_periods). */
    const tg_budget_use_t *budgets;
    int nbudgets;
} tg_settlement_t;

/**
 * Settles request `s` whose attempts 1..attempts reserved (the Redis reservations of every
 * attempt are returned, the unused part exactly once). Asynchronous; never fails from the
 * caller's point of view (spooled when Postgres is unreachable).
 */
void tg_billing_settle(tg_billing_t *b, const tg_settlement_t *s);
/** Gives an attempt's hold back whole, for a request that recorded nothing (its
 *  admission's answer lost, its client gone before the upstream call). */
void tg_billing_release_attempt(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id,
                                int attempt);
/** An attempt that failed with a known outcome (an error status, a connect failure)
 *  costs nothing: its hold goes back now, before the next attempt reserves, but its
 *  reservation is kept at zero until the request's settlement (or the reconciler's)
 *  gives it back at the cost that settlement decides. */
void tg_billing_release_failed(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id,
                               int attempt);
/** Sends what is queued and waits (running the loop) until Postgres took it or
 *  timeout_ms passed; what is left goes to the spool at destroy. Stops the reconciler
 *  and gives its Redis lock back if this worker holds it. For shutdown. */
void tg_billing_drain(tg_billing_t *b, uv_loop_t *loop, int timeout_ms);
/** Usage is unknown (upstream timed out after the request was sent): the reservations
 *  of attempts 1..attempts become pending_reconciliation and keep holding the money.
 *  `amount` (each attempt's, nano-USD) and `model` are what the rows hold, written by
 *  this element when it reaches Postgres before them. */
void tg_billing_unknown(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id, int attempts,
                        const char *model, int64_t amount);
/** Adds a top-up to the tenant's live balance in Redis (after Postgres committed it). */
void tg_billing_topup(tg_state_t *st, int64_t tenant_id, int64_t nano);

typedef struct {
    uint64_t reserved, refused, settled, duplicates, conflicts, batches, spooled, replayed, reconciled;
    uint64_t unheld; /* admitted without a hold: Redis down and money open */
    uint64_t quarantined; /* batch elements Postgres refused on their own (quarantine file) */
    uint64_t clamped;     /* settlements whose usage or cost was not believable: billed at the bound */
    uint64_t estimated;   /* 2xx answers whose usage could not be read: billed by estimate */
    uint64_t refused_budget; /* refused by a periodic budget (also in refused) */
    uint64_t alerts_sent, alerts_delivered, alerts_retried, alerts_failed; /* budget alerts' webhooks */
    uint64_t merged; /* reservations committed inside their settlement's element (one row for both) */
} tg_billing_stats_t;
const tg_billing_stats_t *tg_billing_stats(const tg_billing_t *b);
/** Registers billing's collector (tollgate_billing_total) on a worker's metrics; NULL b: none. */
void tg_billing_metrics(tg_metrics_t *m, const tg_billing_t *b);

/** `tollgate ledger verify -c CFG`: checks the invariants; prints each problem; exit 0/1. */
int tg_ledger_verify_main(const char *pg_conninfo, const char *redis_url);
/** `tollgate ledger reconcile -c CFG`: runs one reconciliation pass now (operators, tests). */
int tg_ledger_reconcile_main(const char *pg_conninfo, const char *redis_url, int older_than_ms, int charge_unknown);

#endif
