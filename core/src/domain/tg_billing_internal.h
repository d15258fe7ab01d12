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

/*
 * An element of a batch for tg_settle_batch (a settlement, a reservation row, an unknown
 * outcome): its JSON text, written directly by the hot paths (no jansson tree), and what
 * the batcher needs of it once it is durable (release_durable, debit_unheld) or refused
 * (quarantine). One allocation: the JSON, NUL, the request id, NUL.
 */
enum { TG__OP_SETTLE, TG__OP_RESERVE, TG__OP_UNKNOWN, TG__OP_OTHER };
typedef struct {
    char *json;
    uint32_t len;              /* of the JSON text */
    uint8_t op;                /* TG__OP_*: a settlement has no "op" field */
    uint8_t release;           /* a settlement with release_cost: its holds go back once durable */
    uint8_t has_unheld_cost;   /* a settlement billed without a hold: debited once committed */
    uint8_t mergeable;         /* a reservation of attempt 1 made the normal way (held, no note): it may
                                * travel inside its settlement when both are in one batch (batch_text) */
    int attempts;
    unsigned unheld;           /* release_unheld */
    int64_t tenant_id, key_id, release_cost, unheld_cost;
    int64_t amount;            /* a mergeable reservation's bound (nano-USD) */
} tg__elem_t;

/** Writes v in decimal, with its sign, to out (room for 20 bytes); returns its length. */
static inline size_t tg__fmt_i64(char *out, int64_t v) {
    size_t m = 0;
    if (v < 0)
        out[m++] = '-';
    return m + tg_fmt_u64(out + m, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
}

/** Appends v in decimal, with its sign. */
static inline void tg__buf_i64(tg_buf_t *b, int64_t v) {
    if (v < 0) {
        tg_buf_append(b, "-", 1);
        tg_buf_append_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        tg_buf_append_u64(b, (uint64_t)v);
    }
}

static inline const char *tg__elem_rid(const tg__elem_t *e) { return e->json + e->len + 1; }

struct tg_billing_s {
    uv_loop_t *loop;
    tg_state_t *st;
    tg_billing_config_t cfg;
    char *spool_dir;
    char spool_path[512];
    int reserve_script, settle_script, restore_script;
    tg__elem_t *queue;      /* elements waiting for the next batch: queue[qhead .. qhead + qlen) */
    size_t qhead, qlen, qcap;
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
    uint64_t partitions_due; /* next tg_partitions_ensure by the reconciler (tg_now_ms) */
    uint64_t compact_due;    /* next tg_usage_compact by the reconciler (tg_now_ms) */
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
/** A hold to give back: which, and how much of it was spent. */
typedef struct {
    const char *request_id;
    int64_t tenant_id, key_id, actual;
    int attempt;
    int keep; /* the reservation stays, at `actual`, until its request settles (settle.lua "k") */
} tg__hold_t;
/** Settlement s's holds (one per attempt, s->attempts of them, at least one) into out. */
size_t tg__billing_attempt_holds(const tg_settlement_t *s, int64_t cost_last, tg__hold_t *out);
/** Gives back n holds (reordered: by tenant), one settle.lua call per tenant. */
void tg__billing_holds_return(tg_billing_t *b, tg__hold_t *h, size_t n);

/* ---- the settlement batcher and the spool (tg_billing_settle.c) ---- */

/** Queues an element (owned) for the next batch to Postgres. */
void tg__billing_enqueue(tg_billing_t *b, tg__elem_t *e);
/** An element made from its JSON text (`json`, taken over: a tg_buf_t's data) and the
 *  fields given; the request id is copied. */
void tg__elem_init(tg__elem_t *e, tg_buf_t *json, const char *request_id, int op);
/** An element made from a jansson object (the rare paths and the spool's replay): its
 *  text and every field the batcher reads. 0, or -1 when it has no request id. */
int tg__elem_from_json(tg__elem_t *e, const json_t *o);
/** Queues a jansson object (not stolen) as an element: for the rare paths. */
void tg__billing_enqueue_json(tg_billing_t *b, const json_t *o);
void tg__elem_free(tg__elem_t *e);
/** Frees every element queued (shutdown, after they were spooled). */
void tg__billing_queue_free(tg_billing_t *b);
/** Sends what is queued, as many batches as may be in flight. */
void tg__billing_flush(tg_billing_t *b);
void tg__billing_flush_cb(uv_timer_t *t);
/** Replays the spool when Postgres is back (b->spool_timer). */
void tg__billing_spool_cb(uv_timer_t *t);
/** Appends the queue to the spool, fsync'd, and empties it: 0, or -1 (kept in memory). */
int tg__billing_spool_queue(tg_billing_t *b, const char *why);
/** A settlement as tg_settle_batch reads it: the JSON object appended to `out`. */
void tg__billing_settlement_text(const tg_settlement_t *s, tg_buf_t *out);

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
 *  of that attempt (nano-USD), its instance lives; holds of keys this Postgres does not
 *  know are left out. */
extern const char tg__billing_orphans_sql[];
/** Its columns, as the reconciler and `ledger reconcile` read them. */
enum {
    TG__ORPH_RID, TG__ORPH_ATT, TG__ORPH_KEY, TG__ORPH_MS, TG__ORPH_AMOUNT, TG__ORPH_MODEL, TG__ORPH_INSTANCE,
    TG__ORPH_LIVE,    /* its instance heart-beats (the reconciler's scan; never for ledger reconcile) */
    TG__ORPH_HAS_ROW, /* its reservation row exists */
    TG__ORPH_SETTLED, /* its request has its usage row */
    TG__ORPH_COST,    /* the settled cost of this attempt, nano-USD (0: not the billed attempt) */
};
/** Appends the hold (field, value) of {t:T}:holds to j as one record of
 *  tg__billing_orphans_sql's array (`first`: no comma before it), unless it is younger
 *  than older_ms; marked live when `alive` (may be NULL) says its instance lives (such a
 *  hold is only given back, when its request was settled). 1 if appended. */
int tg__billing_hold_record(tg_buf_t *j, int first, const char *field, const char *v, uint64_t now,
                            uint64_t older_ms, int (*alive)(void *ud, const char *instance, size_t len), void *ud);
/** One reconciler turn (b->reconcile_timer): heart-beat, election, a pass if elected. */
void tg__billing_reconcile_cb(uv_timer_t *t);

#endif
