/*
 * The process-wide half of the plugin runtime: its copy of the `plugins` config section
 * (parsed with the config file, base/tg_config_plugins.c), reading plugin files into an
 * immutable source snapshot, reloads (validate once, publish, wake every worker), the
 * status JSON for the admin API, and `tollgate check`.
 *
 * Everything here may run on any thread; one mutex guards the registry of worker
 * runtimes, the published source and the last reload's result. Reloads are
 * serialized by a second mutex so two triggers never validate at the same time.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "tg_plugin_internal.h"

/* ---- config ------------------------------------------------------------------------- */

static void config_copy(tg_plugins_config_t *dst, const tg_plugins_config_t *src) {
    *dst = *src;
    memset(&dst->capture, 0, sizeof(dst->capture)); /* the recorder's (tg_capture.c), not the runtime's */
    dst->store = src->store ? strdup(src->store) : NULL;
    dst->dirs = calloc(src->ndirs + 1, sizeof(char *));
    for (size_t i = 0; i < src->ndirs; i++)
        dst->dirs[i] = strdup(src->dirs[i]);
    dst->enabled = calloc(src->nenabled + 1, sizeof(*dst->enabled));
    for (size_t i = 0; i < src->nenabled; i++) {
        dst->enabled[i].name = strdup(src->enabled[i].name);
        dst->enabled[i].config_lua = strdup(src->enabled[i].config_lua);
    }
}

/* ---- reading plugin files ----------------------------------------------------------- */

static char *read_file(const char *path, int *err_no) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err_no = errno;
        return NULL;
    }
    tg_buf_t b;
    tg_buf_init(&b);
    char chunk[8192];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        tg_buf_append(&b, chunk, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        *err_no = EIO;
        tg_buf_free(&b);
        return NULL;
    }
    if (!b.data)
        tg_buf_append(&b, "", 0);
    return b.data;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void tg__plugin_src_ref(tg_plugin_src_t *s) { atomic_fetch_add(&s->refs, 1); }

static void src_plugin_free(tg_plugin_src_plugin_t *p) {
    free(p->name);
    free(p->handler_src);
    free(p->handler_file);
    free(p->schema_src);
    free(p->schema_file);
    free(p->config_src);
    free(p->version);
    free(p->hooks);
}

void tg__plugin_src_unref(tg_plugin_src_t *s) {
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    for (size_t i = 0; i < s->n; i++)
        src_plugin_free(&s->p[i]);
    for (size_t i = 0; i < s->ncat; i++)
        src_plugin_free(&s->cat[i]);
    free(s->p);
    free(s->cat);
    free(s);
}

const tg_plugin_src_plugin_t *tg__plugin_src_find(const tg_plugin_src_t *s, const char *name) {
    for (size_t i = 0; s && i < s->n; i++)
        if (!strcmp(s->p[i].name, name))
            return &s->p[i];
    for (size_t i = 0; s && i < s->ncat; i++)
        if (!strcmp(s->cat[i].name, name))
            return &s->cat[i];
    return NULL;
}

static int valid_name(const char *name) {
    if (!*name || strlen(name) > 63)
        return 0;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_'))
            return 0;
    return 1;
}

/*
 * Finds plugin `name` in the folders (<dir>/<name>/handler.lua + schema.lua, or
 * <dir>/<name>.lua; the first folder that has it wins) and reads its files into p.
 * TG_OK, or TG_ERROR + err.
 */
static int src_plugin_read(const tg_plugins_config_t *cfg, const char *name, tg_plugin_src_plugin_t *p, char *err,
                           size_t errlen) {
    char path[4096];
    int found = 0, e = 0;
    p->name = strdup(name);
    for (size_t d = 0; d < cfg->ndirs && !found; d++) {
        snprintf(path, sizeof(path), "%s/%s/handler.lua", cfg->dirs[d], name);
        if (is_file(path)) {
            found = 1;
            p->handler_file = strdup(path);
            snprintf(path, sizeof(path), "%s/%s/schema.lua", cfg->dirs[d], name);
            if (is_file(path))
                p->schema_file = strdup(path);
            break;
        }
        snprintf(path, sizeof(path), "%s/%s.lua", cfg->dirs[d], name);
        if (is_file(path)) {
            found = 1;
            p->handler_file = strdup(path);
        }
    }
    if (!found) {
        tg_buf_t b;
        tg_buf_init(&b);
        for (size_t d = 0; d < cfg->ndirs; d++)
            tg_buf_printf(&b, "%s%s", d ? ", " : "", cfg->dirs[d]);
        snprintf(err, errlen, "plugins.%s: not found in %s (looked for <dir>/%s/handler.lua and <dir>/%s.lua)", name,
                 b.data ? b.data : "(no dirs)", name, name);
        tg_buf_free(&b);
        return TG_ERROR;
    }
    p->handler_src = read_file(p->handler_file, &e);
    if (p->handler_src && p->schema_file)
        p->schema_src = read_file(p->schema_file, &e);
    if (!p->handler_src || (p->schema_file && !p->schema_src)) {
        snprintf(err, errlen, "plugins.%s: %s: %s", name,
                 p->schema_file && p->handler_src ? p->schema_file : p->handler_file, strerror(e));
        return TG_ERROR;
    }
    return TG_OK;
}

/* Adds every plugin of the folders that is not in s yet to s->cat. A plugin that
 * cannot be read is left out: a group naming it gets "not found". */
static void src_read_catalog(const tg_plugins_config_t *cfg, tg_plugin_src_t *s) {
    size_t cap = 0;
    for (size_t d = 0; d < cfg->ndirs; d++) {
        DIR *dir = opendir(cfg->dirs[d]);
        if (!dir)
            continue;
        struct dirent *de;
        while ((de = readdir(dir)) != NULL) {
            char name[256];
            size_t len = strlen(de->d_name);
            snprintf(name, sizeof(name), "%s", de->d_name);
            if (len > 4 && !strcmp(name + len - 4, ".lua"))
                name[len - 4] = '\0';
            if (!valid_name(name) || tg__plugin_src_find(s, name))
                continue;
            tg_plugin_src_plugin_t one = {0};
            char err[512];
            if (src_plugin_read(cfg, name, &one, err, sizeof(err)) != TG_OK) {
                src_plugin_free(&one);
                continue;
            }
            if (s->ncat == cap) {
                cap = cap ? cap * 2 : 16;
                s->cat = realloc(s->cat, cap * sizeof(*s->cat));
            }
            s->cat[s->ncat++] = one;
        }
        closedir(dir);
    }
}

tg_plugin_src_t *tg__plugin_src_read(const tg_plugins_config_t *cfg, int catalog, char *err, size_t errlen) {
    tg_plugin_src_t *s = calloc(1, sizeof(*s));
    atomic_init(&s->refs, 1);
    s->max_instructions = cfg->max_instructions;
    s->max_hook_ms = cfg->max_hook_ms;
    s->p = calloc(cfg->nenabled + 1, sizeof(*s->p));
    for (size_t i = 0; i < cfg->nenabled; i++) {
        tg_plugin_src_plugin_t *p = &s->p[s->n++];
        if (src_plugin_read(cfg, cfg->enabled[i].name, p, err, errlen) != TG_OK) {
            tg__plugin_src_unref(s);
            return NULL;
        }
        p->config_src = strdup(cfg->enabled[i].config_lua);
    }
    if (catalog)
        src_read_catalog(cfg, s);
    return s;
}

/* ---- group settings ------------------------------------------------------------------ */

/* Bounds on a group's plugins JSON: a config is data an operator writes, not a store. */
#define GROUP_MAX_DEPTH 32
#define GROUP_MAX_LUA (256u * 1024)

/* Writes JSON value v as a Lua constructor (objects keyed by string, arrays 1..n). */
static int json_to_lua(json_t *v, tg_buf_t *b, const char *path, int depth, char *err, size_t errlen) {
    if (b->len > GROUP_MAX_LUA)
        return tg_err_at(err, errlen, "", path, "config too large (over %u bytes)", GROUP_MAX_LUA);
    switch (json_typeof(v)) {
    case JSON_STRING:
        tg_config_lua_quote(b, json_string_value(v), json_string_length(v));
        return TG_OK;
    case JSON_INTEGER:
        tg_buf_printf(b, "%lld", (long long)json_integer_value(v));
        return TG_OK;
    case JSON_REAL:
        tg_buf_printf(b, "%.17g", json_real_value(v));
        return TG_OK;
    case JSON_TRUE:
    case JSON_FALSE:
        tg_buf_appends(b, json_is_true(v) ? "true" : "false");
        return TG_OK;
    case JSON_NULL:
        return tg_err_at(err, errlen, "", path, "null is not a value (leave the field out for its default)");
    default:
        break;
    }
    if (depth >= GROUP_MAX_DEPTH)
        return tg_err_at(err, errlen, "", path, "nested too deeply (more than %d levels)", GROUP_MAX_DEPTH);
    char sub[512];
    tg_buf_appends(b, "{");
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            snprintf(sub, sizeof(sub), "%s[%zu]", path, i + 1);
            if (json_to_lua(x, b, sub, depth + 1, err, errlen) != TG_OK)
                return TG_ERROR;
            tg_buf_appends(b, ",");
        }
    } else {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            snprintf(sub, sizeof(sub), "%s.%s", path, k);
            tg_buf_appends(b, "[");
            tg_config_lua_quote(b, k, strlen(k));
            tg_buf_appends(b, "]=");
            if (json_to_lua(x, b, sub, depth + 1, err, errlen) != TG_OK)
                return TG_ERROR;
            tg_buf_appends(b, ",");
        }
    }
    tg_buf_appends(b, "}");
    return TG_OK;
}

void tg__plugins_group_free(tg_group_plugin_t *g, int n) {
    for (int i = 0; g && i < n; i++) {
        free(g[i].name);
        free(g[i].config_lua);
    }
    free(g);
}

int tg__plugins_group_parse(const char *text, size_t len, tg_group_plugin_t **out, char *err, size_t errlen) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return tg_err_at(err, errlen, "", "plugins", "not valid JSON: %s", jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return tg_err_at(err, errlen, "", "plugins", "expected an object {\"<plugin>\": {\"enabled\": ..., \"config\": {...}}}");
    }
    tg_group_plugin_t *g = calloc(json_object_size(root) + 1, sizeof(*g));
    int n = 0, rc = TG_OK;
    const char *name;
    json_t *e;
    json_object_foreach(root, name, e) {
        char path[160];
        snprintf(path, sizeof(path), "plugins.%.64s", name);
        if (!valid_name(name)) {
            rc = tg_err_at(err, errlen, "", path, "a plugin name holds only a-z, 0-9, - and _ (at most 63)");
            break;
        }
        if (!json_is_object(e)) {
            rc = tg_err_at(err, errlen, "", path, "expected an object {\"enabled\": true|false, \"config\": {...}}");
            break;
        }
        tg_group_plugin_t *p = &g[n++];
        p->name = strdup(name);
        p->enabled = 1;
        p->sample = 1;
        const char *k;
        json_t *v;
        json_object_foreach(e, k, v) {
            if (!strcmp(k, "enabled")) {
                if (!json_is_boolean(v)) {
                    rc = tg_err_at(err, errlen, "", path, "enabled: expected true or false");
                    break;
                }
                p->enabled = json_is_true(v);
            } else if (!strcmp(k, "mode")) {
                if (!json_is_string(v) || (strcmp(json_string_value(v), "live") && strcmp(json_string_value(v), "shadow"))) {
                    rc = tg_err_at(err, errlen, "", path, "mode: expected \"live\" or \"shadow\"");
                    break;
                }
                p->shadow = !strcmp(json_string_value(v), "shadow");
            } else if (!strcmp(k, "sample")) {
                if (!json_is_number(v) || json_number_value(v) <= 0 || json_number_value(v) > 1) {
                    rc = tg_err_at(err, errlen, "", path, "sample: expected a share of requests above 0, at most 1");
                    break;
                }
                p->sample = json_number_value(v);
            } else if (!strcmp(k, "config")) {
                char cpath[200];
                snprintf(cpath, sizeof(cpath), "%s.config", path);
                if (!json_is_object(v)) {
                    rc = tg_err_at(err, errlen, "", cpath, "expected an object");
                    break;
                }
                tg_buf_t b;
                tg_buf_init(&b);
                rc = json_to_lua(v, &b, cpath, 0, err, errlen);
                p->config_lua = rc == TG_OK ? strdup(b.data) : NULL;
                tg_buf_free(&b);
                if (rc != TG_OK)
                    break;
            } else {
                rc = tg_err_at(err, errlen, "", path, "unknown key \"%.64s\" (expected enabled, mode, sample, config)", k);
                break;
            }
        }
        if (rc == TG_OK && p->sample < 1 && !p->shadow)
            rc = tg_err_at(err, errlen, "", path, "sample: only a shadow plugin (\"mode\": \"shadow\") runs on a sample");
        if (rc != TG_OK)
            break;
    }
    json_decref(root);
    if (rc != TG_OK) {
        tg__plugins_group_free(g, n);
        return TG_ERROR;
    }
    *out = g;
    return n;
}

/* ---- global state ------------------------------------------------------------------- */

/* Registry, published source and last result; statically initialised because
 * offline runtimes (tollgate check, the workbench) register without global init. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t reload_mu = PTHREAD_MUTEX_INITIALIZER; /* serializes reloads */
static pthread_cond_t wd_cond = PTHREAD_COND_INITIALIZER;
static int wd_started;
static tg_plugins_t *registry; /* every runtime: workers and offline ones */

static struct {
    int inited;
    tg_plugins_config_t cfg;
    tg_plugin_src_t *current;
    uint64_t next_number;
    /* The last reload. */
    int last_ok;
    uint64_t last_at_ms;
    uint64_t last_generation;
    char last_trigger[16];
    char last_error[1024];
    uint64_t reloads, reload_failures;
} G;

const tg_plugins_config_t *tg__plugins_global_cfg(void) { return G.inited ? &G.cfg : NULL; }

tg_plugin_src_t *tg__plugins_current_src(void) {
    if (!G.inited)
        return NULL;
    pthread_mutex_lock(&mu);
    tg_plugin_src_t *s = G.current;
    if (s)
        tg__plugin_src_ref(s);
    pthread_mutex_unlock(&mu);
    return s;
}

/*
 * The watchdog: a detached thread that, while any runtime exists, looks every few
 * milliseconds for a Lua call that has run past its limit and signals its thread
 * (see guarded_pcall in tg_plugin.c). It sleeps on a condition while none exists.
 */
static void *watchdog_main(void *arg) {
    TG_UNUSED(arg);
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!registry)
            pthread_cond_wait(&wd_cond, &mu);
        long interval_ms = 25;
        for (tg_plugins_t *pl = registry; pl; pl = pl->next) {
            interval_ms = TG_MIN(interval_ms, TG_MAX(1, pl->max_hook_ms / 4));
            uint64_t start = atomic_load_explicit(&pl->call_id, memory_order_acquire);
            if (!start || !atomic_load(&pl->thread_known) || pl->signalled_start == start)
                continue;
            /* CPU time the call has used since the watchdog first saw it running. */
            struct timespec ts;
            if (clock_gettime(pl->cpu_clock, &ts) != 0)
                continue;
            uint64_t cpu = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
            if (pl->seen_start != start) {
                pl->seen_start = start;
                pl->seen_cpu_ns = cpu;
                continue;
            }
            uint64_t limit = atomic_load_explicit(&pl->call_limit_ns, memory_order_relaxed);
            if (cpu - pl->seen_cpu_ns > limit) {
                pl->signalled_start = start;
                pthread_kill(pl->thread, TG_PLUGINS_WATCHDOG_SIGNAL);
            }
        }
        pthread_mutex_unlock(&mu);
        struct timespec ts = {0, interval_ms * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&mu);
    }
    return NULL;
}

void tg__plugins_set_thread(tg_plugins_t *pl) {
    pthread_mutex_lock(&mu);
    pl->thread = pthread_self();
    if (pthread_getcpuclockid(pl->thread, &pl->cpu_clock) != 0)
        pl->cpu_clock = CLOCK_MONOTONIC;
    pl->seen_start = 0;
    atomic_store(&pl->thread_known, 1);
    pthread_mutex_unlock(&mu);
}

void tg__plugins_register(tg_plugins_t *pl) {
    pthread_mutex_lock(&mu);
    if (!wd_started) {
        tg__plugins_install_signal();
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        /* The watchdog must never take the signal it sends. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        if (pthread_create(&t, &attr, watchdog_main, NULL) == 0)
            wd_started = 1;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
    }
    pl->next = registry;
    registry = pl;
    pthread_cond_signal(&wd_cond);
    pthread_mutex_unlock(&mu);
}

void tg__plugins_unregister(tg_plugins_t *pl) {
    pthread_mutex_lock(&mu);
    for (tg_plugins_t **pp = &registry; *pp; pp = &(*pp)->next) {
        if (*pp == pl) {
            *pp = pl->next;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
}

/* The last few shadow disagreements, newest last (a ring under mu), raw: put into
 * words when the status is read (sample_text). */
#define SHADOW_SAMPLES 32
static tg_shadow_sample_t shadow_samples[SHADOW_SAMPLES];
static uint64_t shadow_nsamples;

void tg__plugins_shadow_sample(const tg_shadow_sample_t *s) {
    pthread_mutex_lock(&mu);
    shadow_samples[shadow_nsamples % SHADOW_SAMPLES] = *s;
    shadow_nsamples++;
    pthread_mutex_unlock(&mu);
}

/* A decision in a few words. */
static void describe(int hook, const tg_shadow_side_t *c, char *out, size_t n) {
    static const char *const act[] = {"give up", "retry same", "retry other"};
    static const char *const lim[] = {"closed", "open", "local"};
    if (c->reject_status) {
        snprintf(out, n, "reject %d %s", c->reject_status, c->code);
        return;
    }
    switch (hook) {
    case TG_HOOK_SELECT_ACCOUNT:
        snprintf(out, n, "account %s", c->what);
        return;
    case TG_HOOK_ON_UPSTREAM_ERROR:
        snprintf(out, n, "%s", c->retry_action >= 0 && c->retry_action <= 2 ? act[c->retry_action] : "?");
        return;
    case TG_HOOK_ON_LIMITER_DOWN: {
        size_t o = 0;
        out[0] = '\0';
        for (int k = 0; k < 4 && o < n; k++) {
            static const char *const names[] = {"rate", "tokens", "concurrency", "money"};
            int d = c->limiter_decision[k];
            if (c->limits & (1 << k))
                o += (size_t)snprintf(out + o, n - o, "%s%s %s", o ? ", " : "", names[k],
                                      d >= 0 && d <= 2 ? lim[d] : "default");
        }
        return;
    }
    case TG_HOOK_PRICE:
        snprintf(out, n, "cost %lld nano-USD", (long long)c->cost_nanousd);
        return;
    default:
        snprintf(out, n, "model %s, group %s", c->what, c->group);
        return;
    }
}

/* "request R, group G, HOOK: live DECISION; shadow PLUGIN: DECISION", at most 511 bytes. */
static void sample_text(const tg_shadow_sample_t *s, char out[1024]) {
    char lv[256], sh[256];
    describe(s->hook, &s->live, lv, sizeof(lv));
    describe(s->hook, &s->shadow, sh, sizeof(sh));
    snprintf(out, 1024, "request %s, group %s, %s: live %s; shadow %s: %s", s->request_id, s->group,
             tg_ffi_hook_name(s->hook), lv, s->plugin, sh);
    out[511] = '\0';
}

static void record(const char *trigger, int ok, uint64_t number, const char *err) {
    pthread_mutex_lock(&mu);
    G.last_ok = ok;
    G.last_at_ms = tg_wall_ms();
    G.last_generation = number;
    snprintf(G.last_trigger, sizeof(G.last_trigger), "%s", trigger);
    snprintf(G.last_error, sizeof(G.last_error), "%s", err ? err : "");
    G.reloads++;
    if (!ok)
        G.reload_failures++;
    pthread_mutex_unlock(&mu);
}

/* The policies the workbench made live for every request (tg_plugins_set_fleet): run
 * after the config file's list, as if it named them. Under mu. */
static tg_plugin_enable_t *fleet;
static size_t nfleet;

static void enable_list_free(tg_plugin_enable_t *e, size_t n) {
    for (size_t i = 0; e && i < n; i++) {
        free(e[i].name);
        free(e[i].config_lua);
    }
    free(e);
}

static tg_plugin_enable_t *enable_list_copy(const tg_plugin_enable_t *e, size_t n) {
    tg_plugin_enable_t *c = calloc(n + 1, sizeof(*c));
    for (size_t i = 0; i < n; i++) {
        c[i].name = strdup(e[i].name);
        c[i].config_lua = strdup(e[i].config_lua ? e[i].config_lua : "{}");
    }
    return c;
}

/* cfg with `extra` appended to its enabled list (names it has already are skipped):
 * shares cfg's strings; free the result's `enabled` only. */
static tg_plugins_config_t with_extra(const tg_plugins_config_t *cfg, const tg_plugin_enable_t *extra, size_t n) {
    tg_plugins_config_t out = *cfg;
    out.enabled = calloc(cfg->nenabled + n + 1, sizeof(*out.enabled));
    memcpy(out.enabled, cfg->enabled, cfg->nenabled * sizeof(*out.enabled));
    out.nenabled = cfg->nenabled;
    for (size_t i = 0; i < n; i++) {
        int dup = 0;
        for (size_t k = 0; k < out.nenabled; k++)
            dup |= !strcmp(out.enabled[k].name, extra[i].name);
        if (!dup)
            out.enabled[out.nenabled++] = extra[i];
    }
    return out;
}

/* Reads and validates; on success publishes as the next generation. */
static long load_generation(const char *trigger, char *err, size_t errlen) {
    pthread_mutex_lock(&mu);
    size_t nf = nfleet;
    tg_plugin_enable_t *f = enable_list_copy(fleet, nf);
    pthread_mutex_unlock(&mu);
    tg_plugins_config_t cfg = with_extra(&G.cfg, f, nf);
    tg_plugin_src_t *src = tg__plugin_src_read(&cfg, 1, err, errlen);
    free(cfg.enabled);
    enable_list_free(f, nf);
    if (!src || tg__plugins_validate(src, err, errlen) != TG_OK) {
        tg__plugin_src_unref(src);
        record(trigger, 0, 0, err);
        return TG_ERROR;
    }
    pthread_mutex_lock(&mu);
    src->number = ++G.next_number;
    tg_plugin_src_t *old = G.current;
    G.current = src;
    for (tg_plugins_t *w = registry; w; w = w->next)
        if (w->has_async)
            uv_async_send(&w->async);
    pthread_mutex_unlock(&mu);
    tg__plugin_src_unref(old);
    record(trigger, 1, src->number, NULL);
    return (long)src->number;
}

int tg_plugins_global_init(const tg_plugins_config_t *cfg, char *err, size_t errlen) {
    if (G.inited)
        tg_plugins_global_shutdown();
    config_copy(&G.cfg, cfg);
    G.inited = 1;
    if (load_generation("startup", err, errlen) < 0) {
        tg_plugins_global_shutdown();
        return TG_ERROR;
    }
    return TG_OK;
}

void tg_plugins_global_shutdown(void) {
    pthread_mutex_lock(&mu);
    enable_list_free(fleet, nfleet);
    fleet = NULL;
    nfleet = 0;
    pthread_mutex_unlock(&mu);
    if (!G.inited)
        return;
    tg__plugin_src_unref(G.current);
    tg_plugins_config_free(&G.cfg);
    memset(&G, 0, sizeof(G));
}

long tg__plugins_reload(const char *trigger, char *err, size_t errlen) {
    if (!G.inited) {
        snprintf(err, errlen, "plugins are not initialised");
        return TG_ERROR;
    }
    pthread_mutex_lock(&reload_mu);
    long n = load_generation(trigger, err, errlen);
    pthread_mutex_unlock(&reload_mu);
    if (n < 0)
        tg_log_error("plugins: reload (%s) refused, the current generation keeps serving: %s", trigger, err);
    return n;
}

long tg_plugins_request_reload(char *err, size_t errlen) { return tg__plugins_reload("api", err, errlen); }

long tg_plugins_reload_trigger(const char *trigger, char *err, size_t errlen) {
    return tg__plugins_reload(trigger, err, errlen);
}

/* ---- status ------------------------------------------------------------------------- */

char *tg_plugins_status_json(void) {
    json_t *root = json_object();
    if (!G.inited) {
        json_object_set_new(root, "enabled", json_false());
        char *s = json_dumps(root, JSON_COMPACT);
        json_decref(root);
        return s;
    }
    pthread_mutex_lock(&mu);
    json_object_set_new(root, "enabled", json_true());
    json_object_set_new(root, "generation", json_integer(G.current ? (json_int_t)G.current->number : 0));
    json_t *plugins = json_array();
    for (size_t i = 0; G.current && i < G.current->n; i++) {
        const tg_plugin_src_plugin_t *p = &G.current->p[i];
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(p->name));
        json_object_set_new(o, "version", json_string(p->version ? p->version : ""));
        json_object_set_new(o, "priority", json_integer(p->priority));
        json_t *hooks = json_array();
        if (p->hooks && *p->hooks) {
            char *dup = strdup(p->hooks), *save = NULL;
            for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                json_array_append_new(hooks, json_string(tok));
            free(dup);
        }
        json_object_set_new(o, "hooks", hooks);
        json_object_set_new(o, "file", json_string(p->handler_file));
        json_array_append_new(plugins, o);
    }
    json_object_set_new(root, "plugins", plugins);
    json_t *last = json_object();
    json_object_set_new(last, "ok", json_boolean(G.last_ok));
    json_object_set_new(last, "trigger", json_string(G.last_trigger));
    json_object_set_new(last, "at_ms", json_integer((json_int_t)G.last_at_ms));
    json_object_set_new(last, "generation", G.last_ok ? json_integer((json_int_t)G.last_generation) : json_null());
    json_object_set_new(last, "error", G.last_ok ? json_null() : json_string(G.last_error));
    json_object_set_new(root, "last_reload", last);
    json_object_set_new(root, "reloads", json_integer((json_int_t)G.reloads));
    json_object_set_new(root, "reload_failures", json_integer((json_int_t)G.reload_failures));
    uint64_t calls[TG_HOOK__COUNT] = {0}, errors[TG_HOOK__COUNT] = {0};
    uint64_t agree[TG_HOOK__COUNT] = {0}, disagree[TG_HOOK__COUNT] = {0}, serrors[TG_HOOK__COUNT] = {0};
    json_t *workers = json_array();
    for (tg_plugins_t *w = registry; w; w = w->next) {
        if (!w->loop)
            continue;
        for (int h = 0; h < TG_HOOK__COUNT; h++) {
            calls[h] += atomic_load_explicit(&w->calls[h], memory_order_relaxed);
            errors[h] += atomic_load_explicit(&w->errors[h], memory_order_relaxed);
            agree[h] += atomic_load_explicit(&w->shadow_agree[h], memory_order_relaxed);
            disagree[h] += atomic_load_explicit(&w->shadow_disagree[h], memory_order_relaxed);
            serrors[h] += atomic_load_explicit(&w->shadow_errors[h], memory_order_relaxed);
        }
        json_t *o = json_object();
        json_object_set_new(o, "worker", json_integer(w->worker));
        json_object_set_new(o, "generation", json_integer((json_int_t)atomic_load(&w->generation)));
        json_array_insert_new(workers, 0, o);
    }
    json_object_set_new(root, "workers", workers);
    json_t *hooks = json_object();
    for (int h = 0; h < TG_HOOK__COUNT; h++) {
        json_t *o = json_object();
        json_object_set_new(o, "calls", json_integer((json_int_t)calls[h]));
        json_object_set_new(o, "errors", json_integer((json_int_t)errors[h]));
        json_object_set_new(hooks, tg_ffi_hook_name(h), o);
    }
    json_object_set_new(root, "hooks", hooks);
    json_t *shadow = json_object(), *sh = json_object(), *samples = json_array();
    for (int h = 0; h < TG_HOOK__COUNT; h++) {
        if (h == TG_HOOK_ON_LOG)
            continue;
        json_t *o = json_object();
        json_object_set_new(o, "agree", json_integer((json_int_t)agree[h]));
        json_object_set_new(o, "disagree", json_integer((json_int_t)disagree[h]));
        json_object_set_new(o, "errors", json_integer((json_int_t)serrors[h]));
        json_object_set_new(sh, tg_ffi_hook_name(h), o);
    }
    uint64_t first = shadow_nsamples > SHADOW_SAMPLES ? shadow_nsamples - SHADOW_SAMPLES : 0;
    for (uint64_t i = first; i < shadow_nsamples; i++)
    {
        char text[1024];
        sample_text(&shadow_samples[i % SHADOW_SAMPLES], text);
        json_array_append_new(samples, json_string(text));
    }
    json_object_set_new(shadow, "hooks", sh);
    json_object_set_new(shadow, "disagreements", samples);
    json_object_set_new(root, "shadow", shadow);
    json_object_set_new(root, "max_instructions", json_integer(G.cfg.max_instructions));
    json_object_set_new(root, "max_hook_ms", json_integer(G.cfg.max_hook_ms));
    pthread_mutex_unlock(&mu);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* ---- check and admin validation ----------------------------------------------------- */

int tg_plugins_check(const tg_plugins_config_t *cfg, FILE *out) {
    char err[1024];
    tg_plugin_src_t *src = tg__plugin_src_read(cfg, 0, err, sizeof(err));
    if (!src || tg__plugins_validate(src, err, sizeof(err)) != TG_OK) {
        fprintf(out, "plugins: %s\n", err);
        tg__plugin_src_unref(src);
        return 2;
    }
    if (!src->n)
        fprintf(out, "plugins ok: none enabled\n");
    for (size_t i = 0; i < src->n; i++) {
        const tg_plugin_src_plugin_t *p = &src->p[i];
        fprintf(out, "plugin ok: %s %s (priority %ld, hooks %s) from %s\n", p->name, p->version ? p->version : "?",
                p->priority, p->hooks && *p->hooks ? p->hooks : "none", p->handler_file);
    }
    tg__plugin_src_unref(src);
    return 0;
}

int tg_plugins_validate_config(const tg_plugins_config_t *cfg, const char *name, const char *config_lua, char *err,
                               size_t errlen) {
    tg_plugins_config_t one = *cfg;
    tg_plugin_enable_t e = {(char *)name, (char *)config_lua};
    one.enabled = &e;
    one.nenabled = 1;
    tg_plugin_src_t *src = tg__plugin_src_read(&one, 0, err, errlen);
    if (!src)
        return TG_ERROR;
    int rc = tg__plugins_validate(src, err, errlen);
    tg__plugin_src_unref(src);
    return rc;
}

int tg_plugins_validate_group(const tg_plugins_config_t *cfg, const char *json, size_t len, char *err, size_t errlen) {
    tg_group_plugin_t *g;
    int n = tg__plugins_group_parse(json, len, &g, err, errlen);
    if (n < 0)
        return TG_ERROR;
    int rc = TG_OK;
    for (int i = 0; i < n && rc == TG_OK; i++) {
        const tg_plugin_enable_t *global = NULL;
        for (size_t k = 0; k < cfg->nenabled; k++)
            if (!strcmp(cfg->enabled[k].name, g[i].name))
                global = &cfg->enabled[k];
        if (g[i].config_lua || (g[i].enabled && (!global || g[i].shadow))) {
            /* Load, schema (types, defaults, ranges), init and a dry call of every hook. */
            rc = tg_plugins_validate_config(cfg, g[i].name, g[i].config_lua ? g[i].config_lua : "{}", err, errlen);
        } else if (!global) {
            /* Turning off a plugin that does not exist is a typo, not a no-op. */
            tg_plugin_src_plugin_t one = {0};
            rc = src_plugin_read(cfg, g[i].name, &one, err, errlen);
            src_plugin_free(&one);
        }
    }
    tg__plugins_group_free(g, n);
    return rc;
}

/* ---- /metrics ------------------------------------------------------------------------ */

static void plugins_collect(const void *const *inst, int n, tg_buf_t *out) {
    uint64_t v[3][TG_HOOK__COUNT] = {{0}};
    for (int i = 0; i < n; i++) {
        const tg_plugins_t *w = inst[i];
        if (!w)
            continue;
        for (int h = 0; h < TG_HOOK__COUNT; h++) {
            v[0][h] += atomic_load_explicit(&w->shadow_agree[h], memory_order_relaxed);
            v[1][h] += atomic_load_explicit(&w->shadow_disagree[h], memory_order_relaxed);
            v[2][h] += atomic_load_explicit(&w->shadow_errors[h], memory_order_relaxed);
        }
    }
    static const char *const results[] = {"agree", "disagree", "error"};
    tg_buf_appends(out, "# HELP tollgate_plugin_shadow_total Shadow plugins' decisions compared with the live ones, "
                        "per hook.\n# TYPE tollgate_plugin_shadow_total counter\n");
    for (int h = 0; h < TG_HOOK__COUNT; h++)
        for (int k = 0; k < 3; k++)
            if (h != TG_HOOK_ON_LOG)
                tg_buf_printf(out, "tollgate_plugin_shadow_total{hook=\"%s\",result=\"%s\"} %llu\n",
                              tg_ffi_hook_name(h), results[k], (unsigned long long)v[k][h]);
}

void tg_plugins_metrics(tg_metrics_t *m, tg_plugins_t *pl) {
    if (pl)
        tg_metrics_collector_add(m, plugins_collect, pl);
}

/* ---- uploads -------------------------------------------------------------------------- */

int tg_plugins_validate_source(const char *name, const char *source, size_t len, const char *config_lua,
                               char *version, char *hooks, char *err, size_t errlen) {
    if (!valid_name(name))
        return tg_err_at(err, errlen, "", "name", "a policy name holds only a-z, 0-9, - and _ (at most 63)");
    if (len > TG_POLICY_SOURCE_MAX)
        return tg_err_at(err, errlen, "", "source", "%zu bytes, over the limit of %u", len, TG_POLICY_SOURCE_MAX);
    if (len && (unsigned char)source[0] == 27)
        return tg_err_at(err, errlen, "", "source", "bytecode is not accepted (upload the Lua source)");
    if (memchr(source, '\0', len))
        return tg_err_at(err, errlen, "", "source", "holds a NUL byte: not Lua source text");
    const tg_plugins_config_t *g = tg__plugins_global_cfg();
    tg_plugin_src_t *src = calloc(1, sizeof(*src));
    atomic_init(&src->refs, 1);
    src->max_hook_ms = g ? g->max_hook_ms : 50;
    src->max_instructions = g ? g->max_instructions : 0;
    src->p = calloc(1, sizeof(*src->p));
    src->n = 1;
    tg_plugin_src_plugin_t *p = &src->p[0];
    p->name = strdup(name);
    p->handler_src = malloc(len + 1);
    memcpy(p->handler_src, source, len);
    p->handler_src[len] = '\0';
    char file[96];
    snprintf(file, sizeof(file), "policies/%s.lua", name);
    p->handler_file = strdup(file);
    p->config_src = strdup(config_lua ? config_lua : "{}");
    int rc = tg__plugins_validate(src, err, errlen);
    if (rc == TG_OK) {
        snprintf(version, 64, "%s", p->version ? p->version : "");
        snprintf(hooks, 256, "%s", p->hooks ? p->hooks : "");
    }
    tg__plugin_src_unref(src);
    return rc;
}

/* ---- the workbench's store (tg_policy_store.c) ---------------------------------------- */

void tg_plugins_set_fleet(const tg_plugin_enable_t *e, size_t n) {
    tg_plugin_enable_t *c = enable_list_copy(e, n);
    pthread_mutex_lock(&mu);
    enable_list_free(fleet, nfleet);
    fleet = c;
    nfleet = n;
    pthread_mutex_unlock(&mu);
}

int tg_plugins_check_fleet(const tg_plugin_enable_t *e, size_t n, char *err, size_t errlen) {
    if (!G.inited)
        return tg_err_at(err, errlen, "", "plugins", "plugins are not initialised");
    tg_plugins_config_t cfg = with_extra(&G.cfg, e, n);
    tg_plugin_src_t *src = tg__plugin_src_read(&cfg, 0, err, errlen);
    free(cfg.enabled);
    int rc = src ? tg__plugins_validate(src, err, errlen) : TG_ERROR;
    tg__plugin_src_unref(src);
    return rc;
}

int tg_plugins_config_to_lua(const char *json, size_t len, char **out, char *err, size_t errlen) {
    *out = NULL;
    json_error_t jerr;
    json_t *v = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(v)) {
        json_decref(v);
        return tg_err_at(err, errlen, "", "config", "expected an object");
    }
    tg_buf_t b;
    tg_buf_init(&b);
    int rc = json_to_lua(v, &b, "config", 0, err, errlen);
    json_decref(v);
    if (rc == TG_OK)
        *out = strdup(b.data);
    tg_buf_free(&b);
    return rc;
}

/* The folder a plugin was read from is the store (the workbench's, not shipped). */
static int in_store(const char *store, const char *file) {
    size_t n = store ? strlen(store) : 0;
    return n && !strncmp(file, store, n) && file[n] == '/' && !strchr(file + n + 1, '/');
}

int tg_plugins_is_shipped(const char *name) {
    const tg_plugins_config_t *cfg = tg__plugins_global_cfg();
    if (!cfg)
        return 0;
    tg_plugins_config_t other = *cfg;
    other.ndirs = 0;
    char **dirs = calloc(cfg->ndirs + 1, sizeof(char *));
    for (size_t i = 0; i < cfg->ndirs; i++)
        if (!cfg->store || strcmp(cfg->dirs[i], cfg->store))
            dirs[other.ndirs++] = cfg->dirs[i];
    other.dirs = dirs;
    tg_plugin_src_plugin_t one = {0};
    char err[512];
    int found = src_plugin_read(&other, name, &one, err, sizeof(err)) == TG_OK;
    src_plugin_free(&one);
    free(dirs);
    return found;
}

static void catalog_one(json_t *arr, const tg_plugin_src_plugin_t *p, const char *store, int enabled) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(p->name));
    json_object_set_new(o, "kind", json_string(in_store(store, p->handler_file) ? "stored"
                                               : p->schema_file ? "plugin" : "policy"));
    json_object_set_new(o, "shipped", json_boolean(!in_store(store, p->handler_file)));
    json_object_set_new(o, "file", json_string(p->handler_file));
    json_object_set_new(o, "enabled", json_boolean(enabled));
    if (p->version)
        json_object_set_new(o, "version", json_string(p->version));
    json_array_append_new(arr, o);
}

char *tg_plugins_catalog_json(void) {
    tg_plugin_src_t *s = tg__plugins_current_src();
    const tg_plugins_config_t *cfg = tg__plugins_global_cfg();
    json_t *arr = json_array();
    for (size_t i = 0; s && i < s->n; i++)
        catalog_one(arr, &s->p[i], cfg ? cfg->store : NULL, 1);
    for (size_t i = 0; s && i < s->ncat; i++)
        catalog_one(arr, &s->cat[i], cfg ? cfg->store : NULL, 0);
    tg__plugin_src_unref(s);
    char *out = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    return out;
}

char *tg_plugins_source_json(const char *name) {
    tg_plugin_src_t *s = tg__plugins_current_src();
    const tg_plugin_src_plugin_t *p = tg__plugin_src_find(s, name);
    const tg_plugins_config_t *cfg = tg__plugins_global_cfg();
    char *out = NULL;
    if (p) {
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(p->name));
        json_object_set_new(o, "shipped", json_boolean(!in_store(cfg ? cfg->store : NULL, p->handler_file)));
        json_object_set_new(o, "file", json_string(p->handler_file));
        json_object_set_new(o, "source", json_string(p->handler_src));
        if (p->schema_file) {
            json_object_set_new(o, "schema_file", json_string(p->schema_file));
            json_object_set_new(o, "schema_source", json_string(p->schema_src));
        }
        out = json_dumps(o, JSON_COMPACT);
        json_decref(o);
    }
    tg__plugin_src_unref(s);
    return out;
}
