/*
 * The plugin runtime: LuaJIT policy plugins called at fixed points of each request.
 *
 * Plugins (plugins/<name>/handler.lua + schema.lua, or policies/<name>.lua) are loaded
 * into a *generation*: an immutable set of plugins with validated configs, sorted by
 * priority (highest first). Each worker has its own lua_State (tg_plugins_t), touched
 * only by that worker's thread, holding its current generation and any older ones that
 * requests in flight still use (counted references: a request keeps the generation it
 * began with until tg_plugins_end).
 *
 * A reload (file watch on the plugin folders, SIGHUP, or tg_plugins_request_reload()
 * from the admin API) reads the files once, validates them in a scratch state (load,
 * schema, a dry call of every hook on a sample context) and, if everything passes,
 * publishes the source as generation N and wakes every worker (uv_async), which builds
 * N in its own state and swaps it in for new requests. A generation that fails is
 * refused whole; the old one keeps serving and the error is kept for the status JSON.
 *
 * Hooks, their defaults (no plugin implements the hook) and fallbacks (a plugin raised
 * an error or ran out of its instruction budget; the hook stops there):
 *
 *   on_request        may reject, set model/group, add headers.  default: pass.
 *                     fallback: pass (the changes made so far are kept).
 *   map_model         may set model/group, reject.               default: model as sent.
 *                     fallback: model and group restored to what the hook started with.
 *   select_account    may exclude, score, select, reject.        default and fallback:
 *                     tg_plugins_default_select (priority, then least loaded).
 *   on_upstream_error may retry(same/other, delay) or give up.   default: the core
 *                     retries on another account while attempts, accounts and the
 *                     deadline allow (at once after 429/529/401/403, else a backoff
 *                     with jitter). Once a plugin implements it, it starts at give up
 *                     and the plugin decides. fallback: give up.
 *   on_limiter_down   may open or close.                         default: the
 *                     configured policy (limiter.on_redis_down_*) for what no plugin
 *                     decides (money: closed).
 *                     fallback: every limit closed.
 *   price             may set the cost (nano-USD).               default and fallback:
 *                     unpriced (cost_nanousd = -1; billing flags it, never drops it).
 *   on_log            read-only but for log fields.              default and fallback:
 *                     nothing.
 *
 * Thread safety: tg_plugins_request_reload, tg_plugins_status_json and the global
 * init/shutdown may be called from any thread; everything taking a tg_plugins_t only
 * from the thread of that worker's loop.
 */
#ifndef TOLLGATE_TG_PLUGIN_H
#define TOLLGATE_TG_PLUGIN_H

#include <stdio.h>
#include <uv.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_config.h"
#include "tollgate/tg_ffi.h"
#include "tollgate/tg_metrics.h"

/**
 * Process-wide start: copies cfg, loads and validates generation 1. Call once before
 * creating workers. Returns TG_OK, or TG_ERROR with the first problem in err
 * (a missing plugin, a schema error, a syntax error with file and line).
 */
int tg_plugins_global_init(const tg_plugins_config_t *cfg, char *err, size_t errlen);
/** Releases what tg_plugins_global_init made; every tg_plugins_t must be destroyed first. */
void tg_plugins_global_shutdown(void);

typedef struct tg_plugins_s tg_plugins_t;

/**
 * Creates a worker's runtime on `loop` (not yet running, or the calling thread's) and
 * builds the current generation in it. Worker 0 also watches the plugin folders and
 * SIGHUP. Returns NULL (logs, and says why in err) only when the generation cannot be
 * built: the caller must then not serve, since no policy would run.
 */
tg_plugins_t *tg_plugins_create(uv_loop_t *loop, int worker, int nworkers, char *err, size_t errlen);
/** Closes the runtime's handles; the memory goes once the loop has run their close callbacks. */
void tg_plugins_destroy(tg_plugins_t *pl);

/**
 * Starts a request: zeroes *ctx, fills the defaults (selected -1, cost -1, hook -1,
 * now_ms) and takes a reference on the current generation. The caller then sets the
 * inputs (request_id, route, protocol, headers, model via tg_plugins_ctx_set_model).
 */
void tg_plugins_begin(tg_plugins_t *pl, tg_hookctx_t *ctx);
/** Ends a request: drops the generation reference. Safe to call twice. */
void tg_plugins_end(tg_plugins_t *pl, tg_hookctx_t *ctx);
/** Sets ctx->model and ctx->original_model (truncating at 127 bytes). */
void tg_plugins_ctx_set_model(tg_hookctx_t *ctx, const char *model, size_t len);

/**
 * Runs one hook: calls the generation's plugins that implement it (one call into Lua),
 * then applies the default or the fallback. Returns TG_OK, or TG_DONE when a plugin
 * rejected the request (answer with ctx->reject_status/code/message). Also TG_DONE
 * from select_account when no candidate is left (reject_status 503).
 */
int tg_plugins_run(tg_plugins_t *pl, int hook, tg_hookctx_t *ctx);

/**
 * Switches the request to its group's plugins: call after tg_plugins_begin, before the
 * first hook. `group_plugins` is the group's `plugins` JSON; NULL, "" or "{}" keep the
 * config file's list. A worker builds each group's variant of the current generation
 * once (merging the group's entries into the config file's list, configs validated
 * against the schemas, defaults filled in, init called) and reuses it until the
 * generation or the group's setting changes; a plugin whose group config no longer
 * loads runs as a plugin that fails (its fallbacks apply, the error is counted).
 */
void tg_plugins_use_group(tg_plugins_t *pl, tg_hookctx_t *ctx, int64_t group_id, const char *group_plugins);

/**
 * Seeds math.random in pl's Lua state. A captured request's hook calls each run with
 * tg_plugins_hook_seed, live and in `policy test`, so a replay draws the same numbers.
 */
void tg_plugins_seed(tg_plugins_t *pl, uint32_t seed);
/** The seed of a captured request's call of `hook` (attempt: 1-based for select_account
 *  and on_upstream_error, 0 for the other hooks). */
static inline uint32_t tg_plugins_hook_seed(uint32_t seed, int hook, int attempt) {
    return seed ^ (uint32_t)(hook * 2654435761u) ^ (uint32_t)(attempt * 40503u);
}

/** True when the request's generation has a plugin implementing `hook`. */
int tg_plugins_has_hook(const tg_plugins_t *pl, const tg_hookctx_t *ctx, int hook);

/** The built-in account choice: highest priority, then least loaded. -1 if none. */
int tg_plugins_default_select(const tg_hookctx_t *ctx);

/**
 * Appends `,"plugins":{"generation":N,"errors":E}` plus the plugins' log fields to an
 * access-log line under construction.
 */
void tg_plugins_log_json(const tg_hookctx_t *ctx, tg_buf_t *b);

/**
 * Reloads now: reads the plugin files, validates them, and if they pass publishes a
 * new generation to every worker (each swaps it in within one loop iteration).
 * Returns the new generation number (> 0), or TG_ERROR with the reason in err (the old
 * generation keeps serving). Any thread; reloads are serialized.
 */
long tg_plugins_request_reload(char *err, size_t errlen);

/**
 * GET /admin/api/v1/plugins: a malloc'd JSON document with the generation, the loaded
 * plugins (name, version, priority, hooks, source file), the last reload's result,
 * per-hook call and error counts summed over the workers, and each worker's
 * generation. Any thread. The caller frees it.
 */
char *tg_plugins_status_json(void);

/** Registers the runtime's counters on /metrics: shadow plugins' decisions per hook
 *  (tollgate_plugin_shadow_total{hook, result = agree | disagree | error}). */
void tg_plugins_metrics(tg_metrics_t *m, tg_plugins_t *pl);

/**
 * `tollgate check`: loads and validates the plugins of cfg (load, schema, dry call)
 * and prints one line per plugin to out. Returns 0, or 2 after printing the error.
 */
int tg_plugins_check(const tg_plugins_config_t *cfg, FILE *out);

/**
 * Validates one plugin's config (a Lua table constructor) against its schema, as the
 * admin API must on every write. Returns TG_OK or TG_ERROR with the message in err.
 */
int tg_plugins_validate_config(const tg_plugins_config_t *cfg, const char *name, const char *config_lua,
                               char *err, size_t errlen);

/**
 * Validates a group's `plugins` setting (JSON text), as the admin API and `tollgate
 * apply` must before writing it: the shape ({"<plugin>": {"enabled": bool, "config":
 * {...}}}, nothing else), that every named plugin exists in cfg's folders, and each
 * given config (or, for a plugin the config file does not enable, the defaults)
 * against the plugin's schema, with its init and a dry call of every hook. Returns
 * TG_OK, or TG_ERROR with one message naming the field
 * ("plugins.model-map.config.aliases: expected table, got string").
 */
int tg_plugins_validate_group(const tg_plugins_config_t *cfg, const char *json, size_t len, char *err,
                              size_t errlen);

/** tg_plugins_request_reload with the trigger the status shows ("store": the workbench). */
long tg_plugins_reload_trigger(const char *trigger, char *err, size_t errlen);

/* ---- the policy workbench's store (app/tg_policy_store.c); any thread ------------- */

/**
 * Sets the policies live for every request (the workbench's "promote for all"): the
 * next reload runs them after the config file's enabled list (a name the list has is
 * skipped). Copies e[0..n).
 */
void tg_plugins_set_fleet(const tg_plugin_enable_t *e, size_t n);
/** Validates the config file's list plus e[0..n) as a reload would, publishing nothing.
 *  TG_OK, or TG_ERROR + err. Blocks for at most a few max_hook_ms per plugin. */
int tg_plugins_check_fleet(const tg_plugin_enable_t *e, size_t n, char *err, size_t errlen);
/** A JSON object (config) as a Lua table constructor in *out (malloc'd). TG_OK, or
 *  TG_ERROR + err ("config: expected an object", depth and size bounded). */
int tg_plugins_config_to_lua(const char *json, size_t len, char **out, char *err, size_t errlen);
/** 1 when plugin `name` is found in a folder of plugins.dirs other than plugins.store. */
int tg_plugins_is_shipped(const char *name);
/** Every plugin the current generation was read from (enabled and the catalog): a JSON
 *  array of {name, kind: plugin | policy | stored, shipped, file, enabled, version?}. */
char *tg_plugins_catalog_json(void);
/** Plugin `name`'s files as the current generation read them, as a JSON object
 *  {name, shipped, file, source, schema_file?, schema_source?}; NULL when unknown. */
char *tg_plugins_source_json(const char *name);

/** The largest policy source tg_plugins_validate_source accepts. */
#define TG_POLICY_SOURCE_MAX (256u * 1024)

/**
 * Validates an uploaded single-file policy (its Lua source, `name` as it would be saved
 * in a policies folder) exactly as a reload would: size (TG_POLICY_SOURCE_MAX), no
 * bytecode, compile in the sandbox (file and line in a syntax error), the handler's
 * shape and name, its schema and `config_lua` (NULL: "{}") against it, `init`, and a
 * dry call of every hook on a sample request under the budgets. On TG_OK fills
 * version (64) and hooks (a comma-separated list, 256); else TG_ERROR with one message
 * naming the problem in err. Any thread; blocks for at most a few max_hook_ms.
 */
int tg_plugins_validate_source(const char *name, const char *source, size_t len, const char *config_lua,
                               char *version, char *hooks, char *err, size_t errlen);

/**
 * `tollgate policy test POLICY --requests FILE.jsonl [...]`: runs a policy over
 * recorded request contexts and prints each decision. argv[0] is "policy". Returns
 * the exit code.
 */
int tg_policy_test_main(int argc, char **argv);

#endif
