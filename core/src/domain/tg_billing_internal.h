/*
 * Billing's parts, shared between its files (not for other modules: tg_billing.h is the
 * interface):
 *
 *   tg_billing.c            the worker's billing: create, drain, destroy, counters
 *   tg_billing_holds.c      holds in Redis: reservations (reserve.lua, or the admission's
 *                           admit.lua), live balances loaded from Postgres, holds given
 *                           back (settle.lua), top-ups
 *   tg_billing_settle.c     the settlement batcher (reservation rows and settlements to
 *                           Postgres, batched, tg_settle_batch), the local spool, and
 *                           the holds given back once a settlement is durable
 *   tg_billing_reconcile.c  the reconciler: its election (a Redis lock, heart-beats) and
 *                           its passes (rows whose usage is unknown, holds without a row)
 *   tg_ledger.c             `tollgate ledger verify|reconcile`
 */
#ifndef TOLLGATE_TG_BILLING_INTERNAL_H
#define TOLLGATE_TG_BILLING_INTERNAL_H

#include <jansson.h>
#include <libpq-fe.h>

#include "tollgate/tg_billing.h"

#define ALIVE_KEY "tollgate:alive"
#define ALIVE_TTL_MS 15000

struct tg_billing_s {
    uv_loop_t *loop;
    tg_state_t *st;
    tg_billing_config_t cfg;
    char *spool_dir;
    char spool_path[512];
    int reserve_script, settle_script;
    json_t *queue;          /* settlements waiting for the next batch */
    size_t queue_max;       /* beyond this the queue spills to the spool (bounded memory) */
    int live_inflight;      /* batches of the queue at Postgres */
    int replay_inflight;    /* a spooled batch at Postgres (one at a time) */
    long replay_offset;     /* where the replay file's next batch starts */
    uv_timer_t flush_timer;
    uv_timer_t spool_timer;
    uv_timer_t reconcile_timer;
    int replaying;
    int closing; /* timers still closing */
    uint64_t pg_down_until; /* after a failed batch: straight to the spool until then */
    int leader;             /* this worker holds the reconciler lock */
    int stopping;           /* draining for shutdown: no new reconciler pass */
    int lock_released;      /* the lock's release was answered (or failed) */
    int scanning;           /* a scan of {t:*}:holds is under way */
    int returning;          /* holds being given back whose last answer is awaited */
    int alerts_claiming;    /* budget alerts: the claim query is out (tg_budget_alerts.c) */
    int alerts_inflight;    /* budget alerts being posted on the thread pool */
    tg_billing_stats_t stats;
};

/* This process's identity for reservations and the reconciler lock (tg_billing_create
 * makes it once). */
extern char tg__billing_instance[40];

/* ---- holds (tg_billing_holds.c) ---- */

/** The keys of one attempt's hold (all under the tenant's hash tag {t:T}: money,
 *  res:<id>:<attempt>, kmoney:<key>, holds) and its field in {t:T}:holds. */
void tg__billing_hold_keys(char keys[4][128], char field[96], int64_t tenant, int64_t key, const char *id,
                           int attempt);
/** Returns an attempt's hold (the part above `actual` goes back), exactly once. */
void tg__billing_hold_return(tg_billing_t *b, int64_t tenant, int64_t key, const char *id, int attempt,
                             int64_t actual);
/** Returns every attempt's hold of settlement s; the last attempt's keeps cost_last. */
void tg__billing_release_attempts(tg_billing_t *b, const tg_settlement_t *s, int64_t cost_last);

/** [[budget id, period start], ...]: the periods a settlement counts in (new reference). */
json_t *tg__billing_budgets_json(const tg_budget_use_t *u, int n);

/* ---- the settlement batcher and the spool (tg_billing_settle.c) ---- */

/** Queues an element (owned) for the next batch to Postgres. */
void tg__billing_enqueue(tg_billing_t *b, json_t *item);
/** Sends what is queued, as many batches as may be in flight. */
void tg__billing_flush(tg_billing_t *b);
void tg__billing_flush_cb(uv_timer_t *t);
/** Replays the spool when Postgres is back (b->spool_timer). */
void tg__billing_spool_cb(uv_timer_t *t);
/** Appends `batch` to the spool, fsync'd: 0, or -1 (kept in memory). */
int tg__billing_spool_append(tg_billing_t *b, json_t *batch, const char *why);
/** A settlement as tg_settle_batch reads it (new reference). */
json_t *tg__billing_settlement_json(const tg_settlement_t *s);

/* ---- budget alerts (tg_budget_alerts.c) ---- */

/** The reconciler's pass over budget alerts due: claims them, posts them to their
 *  webhooks on the thread pool, records each attempt. */
void tg__budget_alerts_pass(tg_billing_t *b);

/* ---- the reconciler (tg_billing_reconcile.c) ---- */

/** The reservations due for reconciliation: $1 older than (ms), $2 the live instances. */
extern const char tg__billing_due_sql[];
/** Row i of tg__billing_due_sql's result as the settlement the reconciliation rule
 *  makes: estimated, at the reserved bound (charge_unknown) or at 0. Its strings point
 *  into res. */
tg_settlement_t tg__billing_due_settlement(const PGresult *res, int i, int charge_unknown);
/** Holds of the Redis holds index ($1: a JSON array of tg__billing_hold_record's
 *  records) with, per hold: its row exists, its request was settled, the settled cost
 *  of that attempt (nano-USD); holds of keys this Postgres does not know are left out. */
extern const char tg__billing_orphans_sql[];
/** Appends the hold (field, value) of {t:T}:holds to j as one record of
 *  tg__billing_orphans_sql's array (`first`: no comma before it), unless it is younger
 *  than older_ms or `alive` (may be NULL) says its instance lives. 1 if appended. */
int tg__billing_hold_record(tg_buf_t *j, int first, const char *field, const char *v, uint64_t now,
                            uint64_t older_ms, int (*alive)(void *ud, const char *instance, size_t len), void *ud);
/** One reconciler turn (b->reconcile_timer): heart-beat, election, a pass if elected. */
void tg__billing_reconcile_cb(uv_timer_t *t);

#endif
