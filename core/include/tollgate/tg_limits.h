/*
 * Admission control in Redis that holds across every gateway instance: one atomic
 * script per admission (one round trip, EVALSHA) checks and charges, for the key and
 * its tenant,
 *
 *   - the RPM token bucket: capacity B (burst), refill r per second, t = min(B, t + r·Δ)
 *     with Δ from Redis's own clock (TIME), never negative, never above B;
 *   - the TPM bucket, charged with the request's estimate and corrected once afterwards;
 *   - the concurrency lease: a sorted set per key and per tenant (member = request id,
 *     score = lease expiry), expired members removed first, renewed for long streams
 *     (a renewal re-acquires a lease that Redis lost, without refusing the stream);
 *   - with billing, the first attempt's budget reservation against the tenant's live
 *     balance and the key's budget (tg_limit_money_t, filled by billing: see
 *     tg_billing.h), checked after the limits and taken with them, so a billed request
 *     is admitted and reserved in one round trip; a request with billing but no limit
 *     sends only that part;
 *
 * and remembers the request id (marker key with TTL, extended while the request runs),
 * so the same request is never charged twice: a retried admission of an already
 * admitted id just refreshes its leases. Nothing is written unless everything fits: a
 * refusal (a limit, the balance, the key's budget) charges no bucket, takes no lease and
 * holds no money. Release is one idempotent script too, sent again when it gets no
 * answer, and sent after an admission that timed out (it may have run). All keys of one
 * script share the hash tag {t:<tenant id>}, so the scripts run unchanged on Redis
 * Cluster.
 *
 * When Redis does not answer (timeout, disconnected, or no usable client), the decision
 * is made per limit (rate, tokens, concurrency; money is billing's): closed (refuse,
 * 503), open (not checked), or local (a bucket / counter of the same limit kept by this
 * instance, shared by its workers). The on_limiter_down hook may choose per limit; what
 * it leaves undecided takes the configured policy. See README "Limits" for what each
 * choice can over-admit.
 */
#ifndef TOLLGATE_TG_LIMITS_H
#define TOLLGATE_TG_LIMITS_H

#include "tollgate/tg_common.h"
#include "tollgate/tg_state.h"

typedef struct tg_limits_s tg_limits_t;
typedef struct tg_admit_s tg_admit_t;

/** The failure policy for one limit kind when Redis is down. */
typedef enum { TG_FAIL_CLOSED = 0, TG_FAIL_OPEN = 1, TG_FAIL_LOCAL = 2 } tg_fail_policy_t;

/** The limit kinds a Redis-down decision is made for (bit 1 << kind = TG_LIMIT_* of
 *  tg_ffi.h). */
enum { TG_DOWN_RATE = 0, TG_DOWN_TOKENS, TG_DOWN_CONCURRENCY, TG_DOWN_MONEY, TG_DOWN__COUNT };

/**
 * The budget reservation the admission script takes for the first attempt (built by
 * tg_billing_admission_money; the keys and the hold are billing's, see tg_billing.h).
 */
typedef struct {
    int nkeys;             /* 3: money, reservation, holds index; 4: and the key's budget */
    char keys[4][128];
    char amount[24];       /* nano-USD, decimal */
    char tenant_init[32];  /* the tenant's available balance to load into Redis, "" unknown */
    char key_init[32];     /* the key's (sent only with nkeys 4), "" unknown */
    char hold[256];        /* the hold's value in the holds index */
    /* Periodic budgets (tg_budgets.h): with nbudgets > 0 the key's budget key and
     * key_init ("-1": none) are always sent, then each budget's key, and bspec. */
    int nbudgets;
    char bkeys[6][96];     /* {t:T}:bud:<budget>:<period start>; 6 = TG_BUDGETS_MAX */
    char bspec[6 * 72];    /* "<limit> <expire at> <spend to load or '-'> " per budget */
    /** Gives back the hold the script may have taken when its answer was lost, or when
     *  the client left while it ran (no-op when there is none). */
    void (*undo)(void *undo_ud, const char *request_id, int64_t tenant_id, int64_t key_id);
    void *undo_ud;
} tg_limit_money_t;

/** Limits of one request, -1 = none. */
typedef struct {
    int64_t tenant_id, key_id;
    int64_t key_rpm, key_burst, tenant_rpm, tenant_burst;
    int64_t key_tpm, tenant_tpm;
    int64_t key_conc, tenant_conc;
    int64_t est_tokens;
    /** Optional: asked when Redis is down with the bits (1 << TG_DOWN_*) of the limits
     *  that could not be checked, and `policy` filled with the configured policies; may
     *  change any of them (the on_limiter_down hook). Called from the loop, never from
     *  inside tg_limits_admit. */
    void (*on_down)(void *ud, int limit_bits, tg_fail_policy_t policy[TG_DOWN__COUNT]);
    /** Optional (copied): the first attempt's budget reservation, taken in the same
     *  script. Without it, and without any limit, tg_limits_admit makes no Redis call. */
    const tg_limit_money_t *money;
    /** Optional (copied): the first attempt's account concurrency slot, a sorted set
     *  ({a:<id>}:conc, ≤ 63 bytes) taken by the same script when it admits (the script
     *  "admit+slot"), on a single Redis only: on a cluster the account lives under
     *  another hash tag, the outcome's `slot` is -1 and the caller asks separately. */
    const char *slot_key;
    int64_t slot_limit;    /* the account's concurrency */
    int slot_ttl_ms;       /* the slot's lifetime (renewed by its holder) */
} tg_limit_req_t;

typedef enum {
    TG_ADMIT_OK = 0,
    TG_ADMIT_RATE,        /* an RPM bucket is empty */
    TG_ADMIT_TOKENS,      /* a TPM bucket is empty */
    TG_ADMIT_CONCURRENCY, /* every slot is taken (after the wait queue gave up) */
    TG_ADMIT_QUEUE_FULL,  /* the wait queue for a slot is full */
    TG_ADMIT_UNAVAILABLE, /* Redis is down and the policy is closed */
    TG_ADMIT_BALANCE,     /* money: the tenant's balance cannot cover the reservation */
    TG_ADMIT_BUDGET,      /* money: the key's budget cannot cover it */
    TG_ADMIT_MONEY_INIT,  /* money: the live balance is not in Redis; load it from Postgres
                             (tg_billing_load) and admit again with it (nothing was taken) */
    TG_ADMIT_PERIOD_BUDGET, /* money: a periodic budget cannot cover it (outcome.budget) */
} tg_admit_result_t;

typedef struct {
    tg_admit_result_t result;
    const char *which;     /* "key rpm", "tenant concurrency", ... */
    int64_t retry_after_ms; /* rate, tokens: when the bucket holds enough again;
                               concurrency: how often a slot frees (see README "Limits") */
    int degraded;          /* decided without Redis (open or local policy) */
    int waited_ms;         /* time to the decision of an admission that waited in the queue, else 0 */
    int reserved;          /* TG_ADMIT_OK with money: the reservation was taken. 0: it was
                              not (Redis did not answer, or the id was already admitted):
                              reserve separately (tg_billing_reserve) */
    int budget;            /* TG_ADMIT_PERIOD_BUDGET: which (0-based, in money's order) */
    int queued;            /* it entered the wait queue for a concurrency slot */
    int slot;              /* TG_ADMIT_OK with lim->slot_key: 1 taken (the caller holds it
                              and gives it back), 0 the account is full; -1 not asked, or
                              not known (any slot the script may have taken was given back) */
} tg_admit_outcome_t;

typedef void (*tg_admit_cb)(void *ud, const tg_admit_outcome_t *out);

typedef struct {
    int lease_ttl_ms;        /* concurrency lease lifetime; renewed at a third of it */
    int queue_max;           /* requests that may wait for a slot per worker (default 16) */
    int queue_timeout_ms;    /* how long one may wait (default 8000) */
    tg_fail_policy_t fail_rate, fail_tokens, fail_concurrency; /* when Redis is down */
} tg_admission_config_t;

tg_limits_t *tg_limits_create(uv_loop_t *loop, tg_state_t *st, const tg_admission_config_t *cfg);
/** Call after tg_state_destroy (the Redis client calls back every pending release with an
 *  error first), then run the loop once more to close the handles. */
void tg_limits_destroy(tg_limits_t *l);

/**
 * Admits request `request_id` (NUL-terminated, ≤ 64 bytes) against `lim`. The callback
 * runs exactly once, never synchronously. Returns a handle for tg_admit_cancel (client
 * gone while waiting) and for release. One EVALSHA per try (another only after waiting
 * for a slot); the reservation in lim->money, if any, is kept by the caller after
 * admission (the handle's release does not give it back: settlement does).
 */
tg_admit_t *tg_limits_admit(tg_limits_t *l, const char *request_id, const tg_limit_req_t *lim, tg_admit_cb cb,
                            void *ud);
/** The client went away before the callback: no callback; any lease taken is released. */
void tg_admit_cancel(tg_admit_t *a);
/**
 * The request ended: releases its concurrency leases and corrects the TPM buckets by
 * (actual_tokens - estimate) once (actual < 0: unknown, no correction): the correction
 * goes with this worker's next admission that reads the bucket, or alone within
 * 20 ms (tg_limits.c). Frees `a`.
 */
void tg_admit_release(tg_admit_t *a, int64_t actual_tokens);

/** Counters for /metrics. */
typedef struct {
    uint64_t admitted, refused_rate, refused_tokens, refused_concurrency, queue_full, waited;
    /* Admissions decided without Redis, per request: closed when any limit was closed,
     * else local when any was local, else open. */
    uint64_t redis_down_open, redis_down_local, redis_down_closed;
    uint64_t down[TG_DOWN__COUNT][3]; /* per limit kind and tg_fail_policy_t */
    uint64_t round_trips;
    uint64_t leases_reacquired; /* leases a renewal had to add back (Redis lost them) */
    uint64_t corrections_alone; /* TPM corrections no admission carried (correct.lua) */
} tg_limits_stats_t;
const tg_limits_stats_t *tg_limits_stats(const tg_limits_t *l);
/** Registers admission's collector (tollgate_admission_*, tollgate_limiter_*) on a
 *  worker's metrics; NULL l: none. */
void tg_limits_metrics(tg_metrics_t *m, const tg_limits_t *l);
/** Counts a Redis-down decision made elsewhere (billing's money limit). */
void tg_limits_count_down(tg_limits_t *l, int kind, tg_fail_policy_t policy);

#endif
