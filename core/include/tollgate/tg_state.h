/*
 * Per-worker access to the facts in Postgres, without touching the database on the hot
 * path: the API-key cache and the group/account snapshot.
 *
 * The key cache is keyed by the key's SHA-256. Entries live for a TTL with random jitter
 * (so instances do not refresh in lockstep); unknown keys are cached too (negative
 * entries, shorter TTL) so a flood of bad keys cannot reach the database; concurrent
 * misses for one key wait on a single query (single-flight). Any admin change publishes
 * on the Redis channel "tollgate:invalidate" ("*" or "key:<sha256 hex>"), and every
 * worker of every instance drops the affected entries at once.
 *
 * Principals are reference-counted: a request keeps the one it authenticated with even
 * if the cache entry is replaced meanwhile.
 */
#ifndef TOLLGATE_TG_STATE_H
#define TOLLGATE_TG_STATE_H

#include <uv.h>

#include "tollgate/tg_budgets.h"
#include "tollgate/tg_common.h"
#include "tollgate/tg_config.h"
#include "tollgate/tg_metrics.h"

typedef struct tg_state_s tg_state_t;
typedef struct tg_auth_wait_s tg_auth_wait_t;
typedef struct tg_pg_s tg_pg_t;
typedef struct tg_redis_s tg_redis_t;

typedef struct {
    uint8_t addr[16];
    int family; /* 4 or 6 */
    int bits;
} tg_cidr_t;

typedef struct tg_principal_s {
    int refs;
    int64_t key_id;     /* 0 for a static key from the config file */
    int64_t tenant_id;
    int64_t group_id;
    int active;         /* key active and tenant active */
    int64_t expires_at_ms; /* 0: never */
    char **allowed_models; /* NULL: any model of the group */
    int nallowed;
    char **group_models;   /* NULL/0: any */
    int ngroup_models;
    tg_cidr_t *ip_allow;   /* NULL: any address */
    int nip;
    int64_t rpm, tpm, concurrency; /* -1: no limit */
    int64_t rpm_burst;             /* -1: the rpm */
    int64_t tenant_rpm, tenant_rpm_burst, tenant_tpm, tenant_concurrency;
    int64_t rate_multiplier_micro; /* the group's price multiplier, 1000000 = 1x */
    char budget[40];       /* "" when none; a decimal string otherwise */
    char group_name[128];
    char *group_plugins;   /* the group's plugins setting (JSON text); NULL: none */
    char key_prefix[16];
    /* The periodic budgets that apply (the key's, its user's, its tenant's; by id), each
     * with the period last computed by this worker (a principal is per worker). */
    tg_budget_t budgets[TG_BUDGETS_MAX];
    int nbudgets;
} tg_principal_t;

/** Called when a lookup that had to wait ends: p is NULL for an unknown key; err is
 *  non-NULL when the database could not answer (the request should get 503). */
typedef void (*tg_auth_cb)(void *ud, tg_principal_t *p, const char *err);

/** Creates the worker's state: a Postgres pool and a Redis client when configured. */
tg_state_t *tg_state_create(uv_loop_t *loop, const tg_config_t *cfg, const uint8_t (*static_keys)[32], size_t nstatic);
void tg_state_destroy(tg_state_t *st);
tg_pg_t *tg_state_pg(tg_state_t *st);       /* NULL without Postgres */
tg_redis_t *tg_state_redis(tg_state_t *st); /* NULL without Redis */

/**
 * Looks up a key by its SHA-256. Returns TG_OK with *out set (a new reference, or NULL for
 * an unknown key) when the cache answers; TG_AGAIN with *wait set when a query is needed
 * (cb runs later with a reference the callee must release); TG_ERROR when there is no
 * way to answer (no database and not a static key: *out NULL).
 */
int tg_state_auth(tg_state_t *st, const uint8_t digest[32], tg_auth_cb cb, void *ud, tg_principal_t **out,
                  tg_auth_wait_t **wait);
/** Stops waiting: cb will not run. */
void tg_state_auth_cancel(tg_auth_wait_t *wait);
void tg_principal_release(tg_principal_t *p);

/** 1 if the model may be used by this principal. */
int tg_principal_allows_model(const tg_principal_t *p, const char *model);
/** 1 if the client address (text) is allowed. */
int tg_principal_allows_ip(const tg_principal_t *p, const char *ip);

/** Drops cache entries: all of them (hex == NULL) or one key's. */
void tg_state_invalidate(tg_state_t *st, const char *sha256_hex);
/** Publishes "accounts": every instance reloads its account snapshot (cooldowns) without
 *  dropping its key cache. */
void tg_state_publish_accounts(tg_state_t *st);
/** Registers a function called after every full invalidation (e.g. to reload the
 *  account snapshot). Up to 8 listeners. */
void tg_state_on_invalidate(tg_state_t *st, void (*fn)(void *ud), void *ud);
/** Registers the function called for a "policies:<N>" message (the policy workbench's
 *  change N is in Postgres); without one such a message drops the whole key cache. */
void tg_state_on_policies(tg_state_t *st, void (*fn)(void *ud, uint64_t seq), void *ud);
/** Publishes an invalidation to every instance (and applies it locally at once). */
void tg_state_publish_invalidation(tg_state_t *st, const char *what);

/** Counters for /metrics. */
typedef struct {
    uint64_t hits, misses, db_lookups, negative_hits, invalidations;
    uint64_t stale; /* keys served past their cache time because Postgres could not answer */
} tg_state_stats_t;
const tg_state_stats_t *tg_state_stats(const tg_state_t *st);
/** Registers the key cache's collector (tollgate_auth_*) on a worker's metrics; NULL st: none. */
void tg_state_metrics(tg_metrics_t *m, const tg_state_t *st);

/** Parses "10.0.0.0/8" or an address; returns 0 or TG_ERROR. */
int tg_cidr_parse(const char *s, tg_cidr_t *out);
int tg_cidr_match(const tg_cidr_t *c, const char *ip);

#endif
