/*
 * The per-worker snapshot of upstream accounts and the groups they serve, read from
 * Postgres at start and again whenever an admin change is published (tg_state). The
 * hot path never queries the database: each group is indexed once per snapshot (by
 * priority, by model, by id), and tg_select picks from that index in memory.
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
    /* What every selection reads (tg_select), together at the front: one or two cache
     * lines per sampled account. */
    int64_t id;
    int priority;
    int weight;
    int concurrency;
    int active;
    int64_t cooldown_until_ms;
    char *provider;       /* "openai" | "anthropic" | "gemini" | "azure" | "vertex" */
    char *name;
    char *credential;     /* opened; NULL when none, and for an identity (auth not key) */
    int auth;             /* TG_AUTH_* (tg_identity.h): 0 a key in credential, else a token */
    char *auth_error;     /* why the last token refresh failed (accounts.auth_error), or NULL */
    int kind_subscription;
    char **models;        /* NULL/0: any */
    int nmodels;
    json_t *model_map;    /* object: client model -> upstream model (Azure: deployment) */
    json_t *settings;     /* object: the provider's settings (azure: api_version), or NULL */
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
/** The worker's upstream client for a base URL (created on first use, kept while the
 *  worker lives; token endpoints use it too), or NULL for a URL it cannot serve. */
tg_upstream_t *tg_accounts_upstream(tg_accounts_t *a, const char *url);
/** The i-th account of the snapshot (by id), i < tg_snapshot_size. */
const tg_account_t *tg_snapshot_account_at(const tg_snapshot_t *s, size_t i);
/** Number of accounts in the snapshot, and the generation (1, 2, ...). */
size_t tg_snapshot_size(const tg_snapshot_t *s);
uint64_t tg_snapshot_generation(const tg_snapshot_t *s);

/**
 * The accounts of a group that serve one model, as two disjoint arrays owned by the
 * snapshot: acc[0] the members that list no models (they serve any), acc[1] those that
 * list or map this model. Each is sorted by priority (highest first), then id, so a
 * priority tier is a contiguous run in each. Built when the snapshot is loaded: the
 * lookup is a binary search over the group's model names, never a scan of its accounts.
 */
typedef struct {
    const tg_account_t *const *acc[2];
    int n[2];
} tg_pool_t;

/** Fills *out with the pool of (group, model). Returns 1, or 0 if the group has no
 *  accounts in this snapshot (out is then empty). */
int tg_snapshot_pool(const tg_snapshot_t *s, int64_t group_id, const char *model, tg_pool_t *out);
/** The member of the group with this id, or NULL (binary search). */
const tg_account_t *tg_snapshot_member(const tg_snapshot_t *s, int64_t group_id, int64_t account_id);
/** Every member of the group, by id (the snapshot owns the array); returns how many. */
int tg_snapshot_members(const tg_snapshot_t *s, int64_t group_id, const tg_account_t *const **out);
/** 1 if the account serves `model`: it lists no models, or lists or maps this one. */
int tg_account_serves(const tg_account_t *acc, const char *model);

/** One account's membership of one group (tg_snapshot_build). */
typedef struct {
    int64_t group_id;
    int64_t account_id;
} tg_membership_t;

/**
 * A snapshot built from memory instead of Postgres, for tests and benchmarks: deep
 * copies of the n accounts (name, provider, credential, models; model_map is
 * referenced), indexed with the memberships m[0..nm) exactly like a loaded one.
 * Memberships naming an unknown account are ignored. Release with tg_snapshot_release.
 */
tg_snapshot_t *tg_snapshot_build(const tg_account_t *accounts, size_t n, const tg_membership_t *m, size_t nm);

/** The account with this id (binary search), or NULL: left out (see tg_snapshot_broken)
 *  or not loaded yet. */
const tg_account_t *tg_snapshot_account(const tg_snapshot_t *s, int64_t id);
/** Why the account with this id cannot be used by this gateway (a base_url or
 *  model_map that slipped past the admin API, a credential that cannot be opened, no
 *  upstream client), or NULL. The snapshot owns the text. */
const char *tg_snapshot_broken(const tg_snapshot_t *s, int64_t id);

/** An Azure OpenAI account's api-version when its settings name none (the GA version
 *  that takes max_completion_tokens and stream_options). */
#define TG_AZURE_API_VERSION "2024-10-21"

/** The account's setting `key` (its settings object), or dflt when unset or empty. */
const char *tg_account_setting(const tg_account_t *acc, const char *key, const char *dflt);
/** The model name to send upstream for this account (the mapping, or `model`). */
const char *tg_account_map_model(const tg_account_t *acc, const char *model);
/** The list price of `model` (nano-USD per million tokens, from model_prices). Returns 1
 *  if the model has a price, 0 otherwise. */
int tg_snapshot_price(const tg_snapshot_t *s, const char *model, struct tg_price_s *out);

#endif
