/*
 * The per-worker snapshot of upstream accounts and the groups they serve, read from
 * Postgres at start and again whenever an admin change is published (tg_state). The
 * hot path never queries the database: picking an account is a scan of the group's
 * array in memory.
 *
 * Each distinct base URL gets one tg_upstream_t (connection pool) that lives as long
 * as the worker, so a refresh keeps pools warm. Credentials are opened (AES-256-GCM)
 * once per refresh and kept only in memory.
 *
 * Snapshots are reference-counted: a request keeps the snapshot (and so its account)
 * it picked from until it ends, even if a refresh replaces it meanwhile.
 */
#ifndef TOLLGATE_TG_ACCOUNTS_H
#define TOLLGATE_TG_ACCOUNTS_H

#include <jansson.h>
#include <openssl/ssl.h>
#include <uv.h>

#include "tollgate/tg_config.h"
#include "tollgate/tg_state.h"
#include "tollgate/tg_upstream.h"

typedef struct tg_accounts_s tg_accounts_t;
typedef struct tg_snapshot_s tg_snapshot_t;
struct tg_price_s;

typedef struct {
    int64_t id;
    char *name;
    char *provider;       /* "openai" | "anthropic" */
    char *credential;     /* opened; NULL when none */
    int kind_subscription;
    int concurrency;
    int priority;
    int weight;
    char **models;        /* NULL/0: any */
    int nmodels;
    json_t *model_map;    /* object: client model -> upstream model */
    int active;
    int64_t cooldown_until_ms;
    int64_t reset_at_ms;
    char cost_multiplier[32];
    tg_upstream_t *upstream;
} tg_account_t;

tg_accounts_t *tg_accounts_create(uv_loop_t *loop, tg_state_t *st, const tg_config_t *cfg, SSL_CTX *client_tls);
void tg_accounts_destroy(tg_accounts_t *a);
/** Starts an asynchronous reload from Postgres (coalesced if one is running). */
void tg_accounts_refresh(tg_accounts_t *a);
/** The current snapshot, retained; NULL before the first load (or without Postgres). */
tg_snapshot_t *tg_accounts_snapshot(tg_accounts_t *a);
void tg_snapshot_release(tg_snapshot_t *s);
/** Number of accounts in the snapshot, and the generation (1, 2, ...). */
size_t tg_snapshot_size(const tg_snapshot_t *s);

/**
 * The candidates of a group for a model: active, not cooling down at now_ms, serving the
 * model (listed, or mapped, or the account lists no models). Fills out[] (max entries)
 * and returns how many. *upstream_model gets the mapped name for each candidate through
 * tg_account_map_model.
 */
int tg_snapshot_candidates(const tg_snapshot_t *s, int64_t group_id, const char *model, int64_t now_ms,
                           const tg_account_t **out, int max);
/** The model name to send upstream for this account (the mapping, or `model`). */
const char *tg_account_map_model(const tg_account_t *acc, const char *model);
/** The list price of `model` (nano-USD per million tokens, from model_prices). Returns 1
 *  if the model has a price, 0 otherwise. */
int tg_snapshot_price(const tg_snapshot_t *s, const char *model, struct tg_price_s *out);

/** The default choice: highest priority, then weighted random by weight. NULL if n == 0. */
const tg_account_t *tg_accounts_pick_default(const tg_account_t *const *c, int n);

#endif
