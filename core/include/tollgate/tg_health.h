/*
 * Per-worker health of upstream accounts: error rate and time to first token as
 * exponentially weighted moving averages, requests in flight, and the cooldown state
 * machine (healthy -> cooling until T -> half-open: one trial request -> healthy, or
 * cooling again for longer). Nothing here does I/O: the pipeline (cool_account in
 * app/tg_proxy_route.c) also writes a cooldown to Postgres (accounts.cooldown_until, only ever
 * extended) so every instance sees it on its next snapshot reload.
 */
#ifndef TOLLGATE_TG_HEALTH_H
#define TOLLGATE_TG_HEALTH_H

#include "tollgate/tg_common.h"
#include "tollgate/tg_quota.h"

typedef struct tg_health_s tg_health_t;

typedef struct {
    int64_t account_id;
    double err_ewma;        /* 0..1 */
    double ttft_ewma_ms;    /* < 0: unknown */
    int inflight;
    int64_t cooldown_until_ms; /* wall clock; 0: not cooling */
    int64_t cooldown_ms;    /* the last cooldown's length (doubles on a failed probe) */
    int half_open;          /* cooled before: the next request is a trial */
    int probing;            /* a trial request is in flight */
    uint64_t successes, failures;
    double picks;           /* requests routed here by this worker (fair share) */
    tg_quota_t *quota;      /* what the provider said about its quota (tg_quota.h); NULL
                               until it said something (allocated once, kept) */
    int64_t quota_shared_ms; /* when this worker last wrote it to the fleet's copy */
    int64_t quota_read_ms;  /* when this worker last read the fleet's copy */
} tg_health_entry_t;

tg_health_t *tg_health_create(void);
void tg_health_destroy(tg_health_t *h);
/** The entry of an account (created on first use). */
tg_health_entry_t *tg_health_get(tg_health_t *h, int64_t account_id);

/** Asks the CPU to start loading the account's entry, if it has one (tg_select looks up
 *  several at once: their cache misses then overlap). No effect otherwise. */
void tg_health_prefetch(const tg_health_t *h, int64_t account_id);
/** How many accounts have an entry (tests: selection looks at a bounded few). */
size_t tg_health_count(const tg_health_t *h);
/** Calls fn for every account this worker has an entry for (on the worker's own thread). */
void tg_health_foreach(const tg_health_t *h, void (*fn)(const tg_health_entry_t *e, void *ud), void *ud);

/** 1 if the account may take a request now (not cooling; a half-open account only when
 *  no trial is in flight). */
int tg_health_available(tg_health_entry_t *e, int64_t now_ms);
/** 1 if the account cooled and its cooldown is over with no trial in flight: its one
 *  trial request is due, and goes first (tg_select's order; over a plugin's pick too). */
int tg_health_trial_due(const tg_health_entry_t *e, int64_t now_ms);
/** Folds what one response said about the account's quota into its entry (allocates
 *  the entry's state the first time only). */
void tg_health_learn(tg_health_entry_t *e, const tg_quota_t *q);
/** The entry's learned quota if it is at most stale_ms old (0: no bound), else NULL. */
const tg_quota_t *tg_health_quota(const tg_health_entry_t *e, int64_t now_ms, int64_t stale_ms);
/** Marks the start of a request on the account (a trial if half-open). */
void tg_health_begin(tg_health_entry_t *e);
/** The request ended: ok or failed, with its TTFT in ms (< 0 unknown). */
void tg_health_end(tg_health_entry_t *e, int ok, double ttft_ms);
/** Cools the account until at least now + ms; extends, never shortens. Returns the new
 *  cooldown end. */
int64_t tg_health_cool(tg_health_entry_t *e, int64_t now_ms, int64_t ms);

#endif
