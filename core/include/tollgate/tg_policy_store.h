/*
 * The policy workbench's store: the operator policies kept in Postgres (policies,
 * policy_generations, policy_audit: sql/0013_policies.sql) written to the folder the
 * gateway owns (plugins.store), on every instance, and reloaded hot.
 *
 * Every change the admin API makes is one row of policy_audit, whose id N numbers it;
 * "policies:N" on the Redis invalidation channel tells every worker of every instance.
 * One worker per process (the first to claim N) reads the current generations, writes
 * each policy as <store>/<name>.lua (write and rename, only when its bytes changed),
 * removes the files of policies no longer stored, sets the ones live for every request
 * (tg_plugins_set_fleet) and reloads; then each worker drops its key cache, whose group
 * settings may name a policy just written. Worker 0 also compares its number with the
 * database's every few seconds, so an instance that missed a message catches up.
 *
 * A bad generation never goes live: the admin API validates a source before storing it,
 * and a reload that fails keeps the running generation.
 */
#ifndef TOLLGATE_TG_POLICY_STORE_H
#define TOLLGATE_TG_POLICY_STORE_H

#include <uv.h>

#include "tollgate/tg_config.h"
#include "tollgate/tg_state.h"

typedef struct tg_policy_store_s tg_policy_store_t;
typedef struct tg_policy_wait_s tg_policy_wait_t;

/**
 * At startup, before the plugin runtime: creates the store folder and, with Postgres,
 * writes the stored policies into it and sets the fleet's (blocking). A database that
 * cannot be read is logged and the folder's files serve (worker 0 retries). TG_OK, or
 * TG_ERROR + err when the folder cannot be made.
 */
int tg_policy_store_boot(const tg_config_t *cfg, char *err, size_t errlen);

/** A worker's part (NULL without plugins.store or Postgres). Worker's thread only. */
tg_policy_store_t *tg_policy_store_create(uv_loop_t *loop, tg_state_t *st, const tg_config_t *cfg, int worker);
void tg_policy_store_destroy(tg_policy_store_t *ps);

/** Called with NULL once this process holds change seq (reloaded), else with why not. */
typedef void (*tg_policy_synced_cb)(void *ud, const char *err);
/**
 * Brings this process up to change `seq` (syncs now, or waits for the worker that
 * does). The callback never runs inside this call. Returns a handle for
 * tg_policy_store_cancel (valid until the callback runs).
 */
tg_policy_wait_t *tg_policy_store_sync(tg_policy_store_t *ps, uint64_t seq, tg_policy_synced_cb cb, void *ud);
void tg_policy_store_cancel(tg_policy_wait_t *w);

/** The change this process holds (0: none). Any thread. */
uint64_t tg_policy_store_synced(void);
/** The stored config of policy `name` as a Lua constructor (malloc'd), or NULL. Any thread. */
char *tg_policy_store_config_lua(const char *name);

#endif
