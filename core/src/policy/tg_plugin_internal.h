/*
 * Internals shared by the plugin runtime's files: tg_plugin.c (a worker's lua_State,
 * generations, running hooks), tg_plugin_global.c (config, reading plugin files,
 * reloads, status) and tg_plugin_workbench.c (`tollgate policy test`).
 */
#ifndef TOLLGATE_TG_PLUGIN_INTERNAL_H
#define TOLLGATE_TG_PLUGIN_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "tollgate/tg_plugin.h"

/** One plugin's files as read from disk, plus what validation learned about it. */
typedef struct {
    char *name;
    char *handler_src, *handler_file;
    char *schema_src, *schema_file; /* NULL for single-file policies */
    char *config_src;
    /* Filled by validation. */
    char *version;
    long priority;
    char *hooks; /* comma-separated */
} tg_plugin_src_plugin_t;

/**
 * An immutable snapshot of every enabled plugin's source: what a generation is built
 * from. Shared by all workers (atomic reference count).
 */
typedef struct {
    _Atomic int refs;
    uint64_t number; /* the generation number, 0 until published */
    size_t n;
    tg_plugin_src_plugin_t *p;
    /* Every other plugin found in the folders (no config): what a group may enable
     * besides the config file's list. Not validated until a group uses one. */
    size_t ncat;
    tg_plugin_src_plugin_t *cat;
    long max_instructions;
    int max_hook_ms;
} tg_plugin_src_t;

void tg__plugin_src_ref(tg_plugin_src_t *s);
void tg__plugin_src_unref(tg_plugin_src_t *s);

/**
 * Reads the enabled plugins' files, and with `catalog` every other plugin in the
 * folders too. NULL + err when an enabled one is missing or unreadable.
 */
tg_plugin_src_t *tg__plugin_src_read(const tg_plugins_config_t *cfg, int catalog, char *err, size_t errlen);
/** The source of plugin `name` in s (enabled list first, then the catalog), or NULL. */
const tg_plugin_src_plugin_t *tg__plugin_src_find(const tg_plugin_src_t *s, const char *name);

/** One entry of a group's `plugins` setting, parsed (see tg__plugins_group_parse). */
typedef struct {
    char *name;
    int enabled;
    int shadow;       /* "mode": "shadow": runs beside the live plugins, decides nothing */
    double sample;    /* shadow: the share of requests it runs on (default 1) */
    char *config_lua; /* the group's config as a Lua table constructor; NULL: none given */
} tg_group_plugin_t;

/**
 * Parses a group's `plugins` JSON ({"<name>": {"enabled": bool, "config": {...}}}):
 * shape, names, and each config converted to a Lua constructor (depth and size
 * bounded). Returns the number of entries (>= 0, *out malloc'd, free with
 * tg__plugins_group_free) or TG_ERROR with one message naming the field in err.
 */
int tg__plugins_group_parse(const char *json, size_t len, tg_group_plugin_t **out, char *err, size_t errlen);
void tg__plugins_group_free(tg_group_plugin_t *g, int n);

typedef struct tg_plugin_gen_s tg_plugin_gen_t;

/**
 * The cell the Lua runtime reads the running hook's context from (`cell` in
 * core/lua/tg_runtime.lua, same layout): the context, NULL between hook calls.
 */
typedef struct {
    tg_hookctx_t *ctx;
} tg_ctxcell_t;

/** A base generation's cached variant for one group (see tg_plugins_use_group). */
typedef struct {
    int64_t group_id; /* 0: empty slot */
    char *text;       /* the group's plugins JSON it was built from */
    tg_plugin_gen_t *gen;
} tg_plugin_variant_t;

/**
 * One worker's generation (the C side). Only its worker's thread touches it. A group
 * whose plugins setting differs from the config file gets a *variant*: a generation
 * of its own built from the base one (sharing the base's unchanged plugin instances),
 * cached in the base while the base is current.
 */
struct tg_plugin_gen_s {
    int refs; /* requests holding it, plus one while it is current (or cached) */
    uint64_t number;
    int gen_ref;
    int dispatch_ref[TG_HOOK__COUNT];
    /* A hook one plugin implements: that plugin's function and config (else LUA_NOREF),
     * called directly instead of through the dispatcher. */
    int single_fn_ref[TG_HOOK__COUNT];
    int single_conf_ref[TG_HOOK__COUNT];
    tg_plugins_t *owner;
    tg_plugin_gen_t *base;          /* a variant: the generation it derives from (a ref) */
    tg_plugin_gen_t *shadow;        /* a variant's shadow plugins (owned), or NULL */
    uint64_t shadow_cut;            /* a request runs them when hash(id) < this (2^32: all) */
    unsigned live_mask;             /* 1 << hook: a plugin of this generation implements it */
    unsigned mask;                  /* live_mask | the shadow's: the hooks to call */
    /* A shadow generation: the name of its first plugin at each hook (for the
     * disagreement samples), looked up once per generation and hook. */
    unsigned first_name_known;
    char first_name[TG_HOOK__COUNT][64];
    tg_plugin_variant_t *variants;  /* a base: open-addressed by group id, one ref each */
    size_t nvariants, cap;
};

struct tg_plugins_s {
    lua_State *L;
    uv_loop_t *loop; /* NULL for offline runtimes (validation, check, workbench) */
    int worker, nworkers;
    tg_plugin_gen_t *current;
    tg_plugin_src_t *src; /* the source `current` was built from */
    long max_instructions;
    int max_hook_ms;
    int runtime_ref;
    tg_ctxcell_t *cell; /* where the runtime reads the running hook's context (Lua-owned) */
    int ctx_ref;        /* the ctx object plugins receive */
    int quiet; /* do not log plugin errors (dry runs) */
    char last_error[512];
    /* Counters read by the status JSON from other threads. */
    _Atomic uint64_t calls[TG_HOOK__COUNT];
    _Atomic uint64_t errors[TG_HOOK__COUNT];
    _Atomic uint64_t generation;
    /* Worker handles. */
    uv_async_t async;
    uv_signal_t sighup;
    uv_timer_t debounce;
    uv_fs_event_t *watches;
    int nwatches, max_watches;
    int open_handles;
    int live;      /* requests holding one of its generations */
    int destroyed; /* tg_plugins_destroy was called */
    int has_async, has_signal, has_timer;
    struct tg_plugins_s *next; /* global registry */
    /* Watchdog: the running Lua call (a number per call, 0: none) and its limit. */
    _Atomic uint64_t call_id;
    uint64_t call_seq; /* the last call's number (the worker's) */
    _Atomic uint64_t call_limit_ns;
    uint64_t seen_start;      /* watchdog's: the call it is timing */
    uint64_t seen_cpu_ns;     /* watchdog's: the thread's CPU time when it first saw it */
    uint64_t signalled_start; /* watchdog's: the call it already signalled */
    clockid_t cpu_clock;      /* the thread's CPU-time clock */
    pthread_t thread;         /* the thread that runs this state's calls */
    _Atomic int thread_known;
    /* The last hook failure, for callers that want it (dry run, workbench). */
    char last_hook_error[512];
    /* Shadow plugins: a scratch copy of the request's context they run on, and their
     * counts per hook (read by the status and /metrics from other threads). */
    tg_hookctx_t *shadow_ctx;
    tg_ffi_account_t *shadow_accts;
    _Atomic uint64_t shadow_agree[TG_HOOK__COUNT];
    _Atomic uint64_t shadow_disagree[TG_HOOK__COUNT];
    _Atomic uint64_t shadow_errors[TG_HOOK__COUNT];
};

/** Creates a runtime (state + Lua half) without building a generation. */
tg_plugins_t *tg__plugins_new(uv_loop_t *loop, int worker, int nworkers, long max_instructions,
                              int max_hook_ms, char *err, size_t errlen);
/** Frees an offline runtime at once (no handles). */
void tg__plugins_free(tg_plugins_t *pl);
/** Builds generation `src` in pl and makes it current. TG_OK or TG_ERROR + err. */
int tg__plugins_install(tg_plugins_t *pl, tg_plugin_src_t *src, char *err, size_t errlen);
/**
 * Validates src in a scratch runtime: build, then a dry call of every hook on a sample
 * context. Fills the plugins' version/priority/hooks. TG_OK or TG_ERROR + err.
 */
int tg__plugins_validate(tg_plugin_src_t *src, char *err, size_t errlen);
/** Fills a sample context (3 accounts) for dry runs; `accts` must hold 3. */
void tg__plugins_sample_ctx(tg_hookctx_t *ctx, tg_ffi_account_t *accts);

/** The signal the watchdog sends a thread whose plugin call overran. */
#define TG_PLUGINS_WATCHDOG_SIGNAL (SIGRTMIN + 5)
void tg__plugins_install_signal(void);
/** Records the calling thread as the one running pl's Lua calls (for the watchdog). */
void tg__plugins_set_thread(tg_plugins_t *pl);

/** Global registry of runtimes (reload fan-out and status: those with a loop; watchdog: all). */
void tg__plugins_register(tg_plugins_t *pl);
void tg__plugins_unregister(tg_plugins_t *pl);
/** The published source (a new reference), or NULL. */
tg_plugin_src_t *tg__plugins_current_src(void);
const tg_plugins_config_t *tg__plugins_global_cfg(void);
/* One side of a shadow disagreement, as it stood: the fields describe() words, copied
 * raw on the request path and put into words only when the status is read. */
typedef struct {
    int reject_status;   /* a reject (on_request, map_model, select_account), else 0 */
    char code[64];       /* its code */
    char what[128];      /* select_account: the account id ("none"); map_model, on_request: the model */
    char group[64];      /* map_model, on_request: the group */
    int retry_action;    /* on_upstream_error */
    int limits;          /* on_limiter_down: the request's limits (TG_LIMIT_* bits) */
    int limiter_decision[4];
    int64_t cost_nanousd; /* price */
} tg_shadow_side_t;

typedef struct {
    int hook;
    char request_id[128];
    char group[64]; /* the live request's */
    char plugin[64]; /* the shadow plugin */
    tg_shadow_side_t live, shadow;
} tg_shadow_sample_t;

/** Keeps one shadow disagreement among the last few, for the status (copied). */
void tg__plugins_shadow_sample(const tg_shadow_sample_t *s);

/** Reload with a trigger name for the status ("watch", "sighup", "api"). */
long tg__plugins_reload(const char *trigger, char *err, size_t errlen);

#endif
