/*
 * The plugin runtime of one worker: its lua_State, the generations built in it, and
 * the hook calls of its requests (see tollgate/tg_plugin.h for the contract).
 *
 * Each state loads the embedded Lua half (core/lua/tg_runtime.lua) and gets a count
 * hook that fires every TICK instructions of *interpreted* code. Plugin code is loaded
 * with the JIT off, so its loops are always interpreted and the hook bounds every hook
 * call by max_instructions and max_hook_ms; the error it raises cannot be swallowed by
 * a plugin's own pcall. Compiled traces never see the hook, which is why every plugin
 * function that could run forever must stay interpreted: only those without a loop, a
 * backward jump or a tail call get the JIT back, and only when max_instructions is off
 * (tg_runtime.lua, M.compile). See plugins/README.md, "Isolation".
 *
 * A generation is reference counted by the requests that began on it; the worker's
 * current generation holds one more reference. Swapping drops that one; the last
 * request to end frees the generation (and calls the plugins' destroy()).
 */
#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "tg_plugin_internal.h"
#include "tollgate/tg_embed.h"

#define TICK 1000

/*
 * The budget of plugin code running on this thread.
 *
 * Two mechanisms, both relying on plugin loops being interpreted (jit.off):
 *  - max_hook_ms (always): a watchdog thread notices a call that has used more than
 *    max_hook_ms of its thread's CPU time (CPU, not wall clock, so a worker that was
 *    merely descheduled on a busy machine is not punished) and
 *    sends its thread TG_PLUGINS_WATCHDOG_SIGNAL; the handler, on that thread, installs a
 *    count hook with lua_sethook, which is what LuaJIT's own command line does on
 *    Ctrl-C. The hook raises an error at the next interpreted instruction. Costs
 *    nothing while plugins behave.
 *  - max_instructions (optional, 0 = off): a count hook installed for good counts
 *    every interpreted instruction; deterministic, but it halves the interpreter's speed.
 */
static __thread long tl_ticks, tl_tick_limit;
static __thread lua_State *volatile tl_L;
static __thread volatile sig_atomic_t tl_in_call, tl_expired;
static __thread int tl_expired_ms;

static void count_hook(lua_State *L, lua_Debug *ar) {
    TG_UNUSED(ar);
    if (++tl_ticks > tl_tick_limit) {
        char msg[96];
        snprintf(msg, sizeof(msg), "plugin budget exceeded: more than %ld instructions", tl_tick_limit * TICK);
        lua_pushstring(L, msg);
        lua_error(L);
    }
}

static void expired_hook(lua_State *L, lua_Debug *ar) {
    TG_UNUSED(ar);
    char msg[96];
    snprintf(msg, sizeof(msg), "plugin budget exceeded: ran longer than %d ms", tl_expired_ms);
    /* Fire again every TICK instructions until the call has unwound. */
    lua_sethook(L, expired_hook, LUA_MASKCOUNT, TICK);
    lua_pushstring(L, msg);
    lua_error(L);
}

static void on_watchdog_signal(int sig) {
    TG_UNUSED(sig);
    int saved = errno;
    if (tl_in_call && tl_L && !tl_expired) {
        tl_expired = 1;
        lua_sethook(tl_L, expired_hook, LUA_MASKCOUNT, 1);
    }
    errno = saved;
}

/* Runs lua_pcall under the budget; `mult` scales it (loading gets more than a hook). */
static int guarded_pcall(tg_plugins_t *pl, int nargs, int nresults, long mult) {
    lua_State *L = pl->L;
    /* A worker's state is built on the main thread, then used on the worker's. */
    if (!pl->thread_known || !pthread_equal(pl->thread, pthread_self()))
        tg__plugins_set_thread(pl);
    tl_ticks = 0;
    tl_tick_limit = TG_MAX(1, pl->max_instructions * mult / TICK);
    tl_expired_ms = (int)(pl->max_hook_ms * mult);
    tl_L = L;
    atomic_store_explicit(&pl->call_limit_ns, (uint64_t)pl->max_hook_ms * (uint64_t)mult * 1000000u,
                          memory_order_relaxed);
    /* The watchdog only needs to tell one call from the next: a counter, no clock read. */
    if (++pl->call_seq == 0)
        pl->call_seq = 1;
    atomic_store_explicit(&pl->call_id, pl->call_seq, memory_order_release);
    tl_in_call = 1;
    int rc = lua_pcall(L, nargs, nresults, 0);
    tl_in_call = 0;
    atomic_store_explicit(&pl->call_id, 0, memory_order_release);
    if (tl_expired) {
        tl_expired = 0;
        if (pl->max_instructions > 0)
            lua_sethook(L, count_hook, LUA_MASKCOUNT, TICK);
        else
            lua_sethook(L, NULL, 0, 0);
    }
    return rc;
}

void tg__plugins_install_signal(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_watchdog_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(TG_PLUGINS_WATCHDOG_SIGNAL, &sa, NULL);
}

static inline void counter_inc(_Atomic uint64_t *c) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* package.preload searcher for the embedded modules. */
static int load_embedded(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    for (const tg_embed_file_t *f = tg_embedded_lua; f->name; f++) {
        if (strcmp(f->name, name) == 0) {
            char chunk[128];
            snprintf(chunk, sizeof(chunk), "=core/lua/%s.lua", name);
            if (luaL_loadbuffer(L, f->data, f->len, chunk) != 0)
                return lua_error(L);
            lua_call(L, 0, 1);
            return 1;
        }
    }
    return luaL_error(L, "no embedded module %s", name);
}

tg_plugins_t *tg__plugins_new(uv_loop_t *loop, int worker, int nworkers, long max_instructions, int max_hook_ms,
                              char *err, size_t errlen) {
    tg_plugins_t *pl = calloc(1, sizeof(*pl));
    if (!pl)
        abort();
    pl->loop = loop;
    pl->worker = worker;
    pl->nworkers = nworkers;
    pl->max_instructions = max_instructions > 0 ? max_instructions : 0;
    pl->max_hook_ms = max_hook_ms > 0 ? max_hook_ms : 50;
    pl->runtime_ref = pl->ctx_ref = LUA_NOREF;
    lua_State *L = luaL_newstate();
    if (!L) {
        snprintf(err, errlen, "plugins: cannot create a Lua state");
        free(pl);
        return NULL;
    }
    pl->L = L;
    luaL_openlibs(L);
    /* Seed math.random per worker so top-K draws differ between workers. */
    uint32_t seed = 0;
    tg_random_bytes(&seed, sizeof(seed));
    lua_getglobal(L, "math");
    lua_getfield(L, -1, "randomseed");
    lua_pushnumber(L, (double)(seed % 2147483647u));
    lua_call(L, 1, 0);
    lua_pop(L, 1);
    /* Embedded modules resolve through package.preload. */
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    for (const tg_embed_file_t *f = tg_embedded_lua; f->name; f++) {
        lua_pushcfunction(L, load_embedded);
        lua_setfield(L, -2, f->name);
    }
    lua_pop(L, 2);
    if (pl->max_instructions > 0)
        lua_sethook(L, count_hook, LUA_MASKCOUNT, TICK);
    tg__plugins_register(pl);
    lua_getglobal(L, "require");
    lua_pushstring(L, "tg_runtime");
    if (guarded_pcall(pl, 1, 1, 100) != 0) {
        snprintf(err, errlen, "plugins: runtime: %s", lua_tostring(L, -1));
        tg__plugins_free(pl);
        return NULL;
    }
    /* Plugin functions without loops or tail calls run compiled, unless
     * max_instructions must count every instruction (tg_runtime.lua, M.compile). */
    lua_pushboolean(L, pl->max_instructions == 0);
    lua_setfield(L, -2, "jit_plugins");
    lua_getfield(L, -1, "cell_address");
    pl->cell = (tg_ctxcell_t *)(uintptr_t)lua_tonumber(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, -1, "ctx");
    pl->ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    pl->runtime_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    if (!pl->cell) {
        snprintf(err, errlen, "plugins: runtime: no context cell");
        tg__plugins_free(pl);
        return NULL;
    }
    return pl;
}

static void gen_unref(tg_plugin_gen_t *g);

static void gen_free(tg_plugin_gen_t *g) {
    tg_plugins_t *pl = g->owner;
    lua_State *L = pl->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, pl->runtime_ref);
    lua_getfield(L, -1, "destroy");
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->gen_ref);
    if (guarded_pcall(pl, 1, 0, 1) != 0) {
        tg_log_warn("plugins: worker %d: generation %llu destroy: %s", pl->worker, (unsigned long long)g->number,
                    lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    for (int h = 0; h < TG_HOOK__COUNT; h++) {
        luaL_unref(L, LUA_REGISTRYINDEX, g->dispatch_ref[h]);
        luaL_unref(L, LUA_REGISTRYINDEX, g->single_fn_ref[h]);
        luaL_unref(L, LUA_REGISTRYINDEX, g->single_conf_ref[h]);
    }
    luaL_unref(L, LUA_REGISTRYINDEX, g->gen_ref);
    if (g->shadow)
        gen_unref(g->shadow);
    tg_plugin_gen_t *base = g->base;
    free(g->variants); /* emptied when the generation was retired */
    free(g);
    lua_gc(L, LUA_GCSTEP, 0);
    if (base)
        gen_unref(base);
}

static void gen_unref(tg_plugin_gen_t *g) {
    if (--g->refs == 0)
        gen_free(g);
}

/* A generation stops being current: its cached group variants go with it (each is
 * freed once the requests that use it have ended), then its own reference. */
static void gen_retire(tg_plugin_gen_t *g) {
    for (size_t i = 0; i < g->cap; i++) {
        tg_plugin_variant_t *v = &g->variants[i];
        if (!v->group_id)
            continue;
        free(v->text);
        gen_unref(v->gen);
    }
    if (g->variants)
        memset(g->variants, 0, g->cap * sizeof(*g->variants));
    g->nvariants = 0;
    gen_unref(g);
}

static void push_str_field(lua_State *L, const char *k, const char *v) {
    if (!v)
        return;
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

/* Makes the C side of the generation table at the top of pl's stack (popped). */
static tg_plugin_gen_t *gen_from_table(tg_plugins_t *pl, uint64_t number) {
    lua_State *L = pl->L;
    tg_plugin_gen_t *g = calloc(1, sizeof(*g));
    if (!g)
        abort();
    g->owner = pl;
    g->number = number;
    g->refs = 1;
    lua_getfield(L, -1, "shadow");
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "sample");
        double sample = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : 1;
        lua_pop(L, 1);
        g->shadow_cut = sample >= 1 ? (1ull << 32) : (uint64_t)(sample * 4294967296.0);
        g->shadow = gen_from_table(pl, number); /* pops it */
    } else {
        lua_pop(L, 1);
    }
    lua_getfield(L, -1, "single");
    for (int h = 0; h < TG_HOOK__COUNT; h++) {
        g->single_fn_ref[h] = g->single_conf_ref[h] = LUA_NOREF;
        lua_rawgeti(L, -1, h);
        if (lua_istable(L, -1)) {
            lua_rawgeti(L, -1, 1);
            g->single_fn_ref[h] = luaL_ref(L, LUA_REGISTRYINDEX);
            lua_rawgeti(L, -1, 2);
            g->single_conf_ref[h] = luaL_ref(L, LUA_REGISTRYINDEX);
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    lua_getfield(L, -1, "dispatch");
    for (int h = 0; h < TG_HOOK__COUNT; h++) {
        lua_rawgeti(L, -1, h);
        if (lua_isfunction(L, -1)) {
            g->dispatch_ref[h] = luaL_ref(L, LUA_REGISTRYINDEX);
        } else {
            lua_pop(L, 1);
            g->dispatch_ref[h] = LUA_NOREF;
        }
    }
    lua_pop(L, 1);
    g->gen_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    for (int h = 0; h < TG_HOOK__COUNT; h++)
        if (g->dispatch_ref[h] != LUA_NOREF)
            g->live_mask |= 1u << h;
    g->mask = g->live_mask | (g->shadow ? g->shadow->live_mask : 0);
    return g;
}

/* Builds src in pl's state; returns the C generation or NULL + err. */
static tg_plugin_gen_t *gen_build(tg_plugins_t *pl, const tg_plugin_src_t *src, char *err, size_t errlen) {
    lua_State *L = pl->L;
    int top = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, pl->runtime_ref);
    lua_getfield(L, -1, "build");
    lua_createtable(L, 0, 2);
    lua_pushnumber(L, (double)src->number);
    lua_setfield(L, -2, "generation");
    lua_createtable(L, (int)src->n, 0);
    for (size_t i = 0; i < src->n; i++) {
        const tg_plugin_src_plugin_t *p = &src->p[i];
        lua_createtable(L, 0, 6);
        push_str_field(L, "name", p->name);
        push_str_field(L, "handler_src", p->handler_src);
        push_str_field(L, "handler_file", p->handler_file);
        push_str_field(L, "schema_src", p->schema_src);
        push_str_field(L, "schema_file", p->schema_file);
        push_str_field(L, "config_src", p->config_src);
        lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "plugins");
    if (guarded_pcall(pl, 1, 2, 10) != 0) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1));
        lua_settop(L, top);
        return NULL;
    }
    if (lua_isnil(L, -2)) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "build failed");
        lua_settop(L, top);
        return NULL;
    }
    lua_pop(L, 1);
    tg_plugin_gen_t *g = gen_from_table(pl, src->number);
    lua_settop(L, top);
    return g;
}

int tg__plugins_install(tg_plugins_t *pl, tg_plugin_src_t *src, char *err, size_t errlen) {
    tg_plugin_gen_t *g = gen_build(pl, src, err, errlen);
    if (!g)
        return TG_ERROR;
    tg_plugin_gen_t *old = pl->current;
    tg_plugin_src_t *old_src = pl->src;
    pl->current = g;
    tg__plugin_src_ref(src);
    pl->src = src;
    atomic_store(&pl->generation, src->number);
    if (old)
        gen_retire(old);
    if (old_src)
        tg__plugin_src_unref(old_src);
    return TG_OK;
}

void tg__plugins_free(tg_plugins_t *pl) {
    if (!pl)
        return;
    tg__plugins_unregister(pl);
    if (pl->current)
        gen_retire(pl->current);
    pl->current = NULL;
    if (pl->src)
        tg__plugin_src_unref(pl->src);
    if (pl->L)
        lua_close(pl->L);
    free(pl->watches);
    free(pl->shadow_ctx);
    free(pl->shadow_accts);
    free(pl);
}

/* ---- requests ----------------------------------------------------------------------- */

void tg_plugins_begin(tg_plugins_t *pl, tg_hookctx_t *ctx) {
    memset(ctx, 0, sizeof(*ctx));
    ctx->hook = -1;
    ctx->selected = -1;
    ctx->retry_after_ms = -1;
    ctx->max_tokens = -1;
    ctx->cost_nanousd = -1;
    ctx->ttft_ms = -1;
    ctx->now_ms = (double)tg_wall_ms();
    ctx->request_id = ctx->route = ctx->protocol = ctx->key_id = ctx->tenant_id = "";
    if (pl) {
        ctx->worker = pl->worker;
        ctx->nworkers = pl->nworkers;
        if (pl->current) {
            pl->current->refs++;
            pl->live++;
            ctx->gen_ = pl->current;
            ctx->generation = pl->current->number;
        }
    }
}

static void maybe_free(tg_plugins_t *pl);

void tg_plugins_end(tg_plugins_t *pl, tg_hookctx_t *ctx) {
    TG_UNUSED(pl);
    tg_plugin_gen_t *g = ctx->gen_;
    ctx->gen_ = NULL;
    if (!g)
        return;
    tg_plugins_t *owner = g->owner; /* may already be destroyed: it waits for us */
    owner->live--;
    gen_unref(g);
    maybe_free(owner);
}

/* ---- group variants ----------------------------------------------------------------- */

/* The slot of group_id in base's open-addressed table: its entry, or the empty slot
 * where it belongs. base->cap is a power of two and the table is never full. */
static tg_plugin_variant_t *variant_slot(tg_plugin_gen_t *base, int64_t group_id) {
    size_t mask = base->cap - 1;
    size_t i = (size_t)(((uint64_t)group_id * 0x9E3779B97F4A7C15ull) >> 32) & mask;
    while (base->variants[i].group_id && base->variants[i].group_id != group_id)
        i = (i + 1) & mask;
    return &base->variants[i];
}

/* Keeps the table at most half full, so a probe ends quickly. */
static void variants_reserve(tg_plugin_gen_t *base) {
    if ((base->nvariants + 1) * 2 <= base->cap)
        return;
    tg_plugin_variant_t *old = base->variants;
    size_t old_cap = base->cap;
    base->cap = old_cap ? old_cap * 2 : 8;
    base->variants = calloc(base->cap, sizeof(*base->variants));
    if (!base->variants)
        abort();
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].group_id)
            *variant_slot(base, old[i].group_id) = old[i];
    free(old);
}

/* Builds group_id's variant of base (pl's current generation) from the group's
 * setting `text`. NULL only when the Lua state itself failed (logged). */
static tg_plugin_gen_t *variant_build(tg_plugins_t *pl, tg_plugin_gen_t *base, int64_t group_id, const char *text) {
    lua_State *L = pl->L;
    int top = lua_gettop(L);
    char err[512] = "";
    tg_group_plugin_t *gp = NULL;
    int n = tg__plugins_group_parse(text, strlen(text), &gp, err, sizeof(err));
    lua_rawgeti(L, LUA_REGISTRYINDEX, pl->runtime_ref);
    lua_getfield(L, -1, "build_variant");
    lua_rawgeti(L, LUA_REGISTRYINDEX, base->gen_ref);
    lua_createtable(L, 0, 3);
    char gid[24];
    snprintf(gid, sizeof(gid), "%lld", (long long)group_id);
    push_str_field(L, "group", gid);
    if (n < 0)
        push_str_field(L, "error", err);
    lua_createtable(L, n > 0 ? n : 0, 0);
    for (int i = 0; i < n; i++) {
        const tg_plugin_src_plugin_t *src = tg__plugin_src_find(pl->src, gp[i].name);
        lua_createtable(L, 0, 7);
        push_str_field(L, "name", gp[i].name);
        lua_pushboolean(L, gp[i].enabled);
        lua_setfield(L, -2, "enabled");
        push_str_field(L, "config_src", gp[i].config_lua);
        lua_pushboolean(L, gp[i].shadow);
        lua_setfield(L, -2, "shadow");
        lua_pushnumber(L, gp[i].sample);
        lua_setfield(L, -2, "sample");
        if (src) {
            push_str_field(L, "handler_src", src->handler_src);
            push_str_field(L, "handler_file", src->handler_file);
            push_str_field(L, "schema_src", src->schema_src);
            push_str_field(L, "schema_file", src->schema_file);
        }
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "plugins");
    tg__plugins_group_free(gp, n);
    if (guarded_pcall(pl, 2, 1, 10) != 0) {
        tg_log_error("plugins: worker %d: group %lld: building its plugins failed: %s", pl->worker,
                     (long long)group_id, lua_tostring(L, -1));
        lua_settop(L, top);
        return NULL;
    }
    lua_getfield(L, -1, "errors");
    int nerr = (int)lua_objlen(L, -1);
    for (int i = 1; i <= nerr; i++) {
        lua_rawgeti(L, -1, i);
        tg_log_error("plugins: worker %d: generation %llu, group %lld: %s (this plugin fails for the group until "
                     "its config is fixed)",
                     pl->worker, (unsigned long long)base->number, (long long)group_id, lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    tg_plugin_gen_t *v = gen_from_table(pl, base->number);
    v->base = base;
    base->refs++;
    lua_settop(L, top);
    return v;
}

void tg_plugins_use_group(tg_plugins_t *pl, tg_hookctx_t *ctx, int64_t group_id, const char *text) {
    tg_plugin_gen_t *base = ctx->gen_;
    if (!pl || !base || base->base || group_id <= 0 || !text || !text[0] || !strcmp(text, "{}"))
        return;
    /* Variants are cached on the current generation only (a retired one is never
     * asked again): the hot path is one probe and one comparison of the setting. */
    if (base != pl->current)
        return;
    variants_reserve(base);
    tg_plugin_variant_t *slot = variant_slot(base, group_id);
    if (!slot->group_id || strcmp(slot->text, text) != 0) {
        tg_plugin_gen_t *v = variant_build(pl, base, group_id, text);
        if (!v)
            return;
        if (slot->group_id) {
            /* The group's setting changed: requests on the old variant finish on it. */
            free(slot->text);
            gen_unref(slot->gen);
        } else {
            slot->group_id = group_id;
            base->nvariants++;
        }
        slot->text = strdup(text);
        slot->gen = v;
    }
    slot->gen->refs++;
    ctx->gen_ = slot->gen;
    gen_unref(base); /* the variant holds the base */
}

void tg_plugins_ctx_set_model(tg_hookctx_t *ctx, const char *model, size_t len) {
    len = TG_MIN(len, sizeof(ctx->model) - 1);
    memcpy(ctx->model, model, len);
    ctx->model[len] = '\0';
    ctx->model_len = len;
    memcpy(ctx->original_model, model, len);
    ctx->original_model[len] = '\0';
    ctx->original_model_len = len;
}

void tg_plugins_seed(tg_plugins_t *pl, uint32_t seed) {
    lua_State *L = pl->L;
    lua_getglobal(L, "math");
    lua_getfield(L, -1, "randomseed");
    lua_pushnumber(L, (double)seed);
    lua_call(L, 1, 0);
    lua_pop(L, 1);
}

int tg_plugins_has_hook(const tg_plugins_t *pl, const tg_hookctx_t *ctx, int hook) {
    TG_UNUSED(pl);
    const tg_plugin_gen_t *g = ctx->gen_;
    return g && hook >= 0 && hook < TG_HOOK__COUNT && (g->mask >> hook & 1);
}

int tg_plugins_default_select(const tg_hookctx_t *ctx) {
    int best = -1;
    double best_load = 0;
    for (int i = 0; i < ctx->naccounts; i++) {
        const tg_ffi_account_t *a = &ctx->accounts[i];
        if (a->excluded)
            continue;
        double load = a->max_concurrency > 0 ? (double)a->inflight / a->max_concurrency : a->inflight * 1e-3;
        if (a->max_concurrency > 0 && a->inflight >= a->max_concurrency)
            load += 1e6; /* saturated: only if nothing else is left */
        if (best < 0 || a->priority > ctx->accounts[best].priority ||
            (a->priority == ctx->accounts[best].priority && load < best_load)) {
            best = i;
            best_load = load;
        }
    }
    return best;
}

/* The failing plugin's name (gen.names[hook][idx]) and whether it is fail_closed. */
static void plugin_at(lua_State *L, const tg_plugin_gen_t *g, int hook, int idx, char *name, size_t n,
                      int *fail_closed) {
    snprintf(name, n, "?");
    *fail_closed = 0;
    if (idx <= 0)
        return;
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->gen_ref);
    lua_getfield(L, -1, "names");
    lua_rawgeti(L, -1, hook);
    lua_rawgeti(L, -1, idx);
    if (lua_isstring(L, -1))
        snprintf(name, n, "%s", lua_tostring(L, -1));
    lua_pop(L, 3);
    lua_getfield(L, -1, "fail_closed");
    lua_rawgeti(L, -1, hook);
    lua_rawgeti(L, -1, idx);
    *fail_closed = lua_toboolean(L, -1);
    lua_pop(L, 4);
}

static void fallback(tg_hookctx_t *ctx, int hook, int fail_closed, const char *saved_model, size_t saved_model_len,
                     const char *saved_group, size_t saved_group_len) {
    switch (hook) {
    case TG_HOOK_ON_REQUEST:
        ctx->reject_status = 0;
        if (fail_closed) {
            ctx->reject_status = 500;
            snprintf(ctx->reject_code, sizeof(ctx->reject_code), "plugin_error");
            snprintf(ctx->reject_message, sizeof(ctx->reject_message), "a policy plugin failed");
        }
        break;
    case TG_HOOK_MAP_MODEL:
        ctx->reject_status = 0;
        memcpy(ctx->model, saved_model, saved_model_len + 1);
        ctx->model_len = saved_model_len;
        memcpy(ctx->group, saved_group, saved_group_len + 1);
        ctx->group_len = saved_group_len;
        break;
    case TG_HOOK_SELECT_ACCOUNT:
        ctx->reject_status = 0;
        ctx->selected = -1;
        break;
    case TG_HOOK_ON_UPSTREAM_ERROR:
        ctx->retry_action = TG_RETRY_GIVE_UP;
        ctx->retry_delay_ms = 0;
        break;
    case TG_HOOK_ON_LIMITER_DOWN:
        /* A plugin that failed: every limit closed (whatever it decided before). */
        for (int i = 0; i < 4; i++)
            ctx->limiter_decision[i] = TG_LIMITER_CLOSED;
        break;
    case TG_HOOK_PRICE:
        ctx->cost_nanousd = -1;
        break;
    default:
        break;
    }
}

/* Runs `hook` of generation g on ctx (the request's, or for shadow plugins a copy). */
static int run_gen(tg_plugins_t *pl, tg_plugin_gen_t *g, int hook, tg_hookctx_t *ctx, int shadow) {
    if (hook == TG_HOOK_ON_UPSTREAM_ERROR) {
        ctx->retry_action = TG_RETRY_GIVE_UP;
        ctx->retry_delay_ms = 0;
    } else if (hook == TG_HOOK_ON_LIMITER_DOWN) {
        /* What no plugin decides takes the configured policy. */
        for (int i = 0; i < 4; i++)
            ctx->limiter_decision[i] = TG_LIMITER_DEFAULT;
    }
    if (pl && g && g->dispatch_ref[hook] != LUA_NOREF) {
        lua_State *L = pl->L;
        char saved_model[sizeof(ctx->model)], saved_group[sizeof(ctx->group)];
        size_t saved_model_len = 0, saved_group_len = 0;
        if (hook == TG_HOOK_MAP_MODEL) {
            saved_model_len = ctx->model_len;
            memcpy(saved_model, ctx->model, saved_model_len + 1);
            saved_group_len = ctx->group_len;
            memcpy(saved_group, ctx->group, saved_group_len + 1);
        }
        int top = lua_gettop(L);
        ctx->hook = hook;
        ctx->decided = 0;
        if (!shadow)
            counter_inc(&pl->calls[hook]);
        pl->cell->ctx = ctx;
        int single = g->single_fn_ref[hook] != LUA_NOREF, rc;
        if (single) {
            /* One plugin implements the hook: call it, no dispatcher in between. */
            lua_rawgeti(L, LUA_REGISTRYINDEX, g->single_fn_ref[hook]);
            lua_rawgeti(L, LUA_REGISTRYINDEX, pl->ctx_ref);
            lua_rawgeti(L, LUA_REGISTRYINDEX, g->single_conf_ref[hook]);
            rc = guarded_pcall(pl, 2, 0, 1);
        } else {
            lua_rawgeti(L, LUA_REGISTRYINDEX, g->dispatch_ref[hook]);
            rc = guarded_pcall(pl, 0, 2, 1);
        }
        int idx = 0;
        const char *err = NULL;
        if (rc != 0) {
            /* A single plugin's error is that plugin's; the dispatcher catches each
             * plugin's own, so one reaching here came from between them (the budget).
             * tostring() as the dispatcher would (under the budget). */
            if (single)
                idx = 1;
            if (!lua_isstring(L, -1)) {
                lua_getglobal(L, "tostring");
                lua_insert(L, -2);
                if (guarded_pcall(pl, 1, 1, 1) != 0 || !lua_isstring(L, -1)) {
                    lua_pop(L, 1);
                    lua_pushstring(L, "(error object is not a string)");
                }
            }
            err = lua_tostring(L, -1);
        } else if (!single && (idx = (int)lua_tointeger(L, -2)) != 0) {
            err = lua_tostring(L, -1);
            if (!err)
                err = "(error object is not a string)";
        }
        if (err) {
            char name[64];
            int fail_closed = 0;
            plugin_at(L, g, hook, idx, name, sizeof(name), &fail_closed);
            counter_inc(shadow ? &pl->shadow_errors[hook] : &pl->errors[hook]);
            ctx->plugin_errors++;
            snprintf(pl->last_hook_error, sizeof(pl->last_hook_error), "plugins.%s.%s: %s", name,
                     tg_ffi_hook_name(hook), err);
            /* A plugin's message is the plugin's (or its input's) size: one log line
             * keeps its first 512 bytes. */
            size_t elen = strlen(err);
            if (!pl->quiet && shadow)
                tg_log_warn("request %.*s: shadow plugin %s failed in %s (generation %llu), the request is not "
                            "affected: %.512s%s",
                            (int)ctx->request_id_len, ctx->request_id, name, tg_ffi_hook_name(hook),
                            (unsigned long long)g->number, err, elen > 512 ? " [cut]" : "");
            else if (!pl->quiet)
                tg_log_warn("request %.*s: plugin %s failed in %s (generation %llu), fallback applied: %.512s%s",
                            (int)ctx->request_id_len, ctx->request_id, name, tg_ffi_hook_name(hook),
                            (unsigned long long)g->number, err, elen > 512 ? " [cut]" : "");
            fallback(ctx, hook, fail_closed, saved_model, saved_model_len, saved_group, saved_group_len);
        }
        pl->cell->ctx = NULL; /* a ctx a plugin kept is refused after its hook call */
        lua_settop(L, top);
        ctx->hook = -1;
    }
    if (hook == TG_HOOK_SELECT_ACCOUNT && ctx->naccounts > 0 && !ctx->reject_status) {
        if (ctx->selected < 0 || ctx->accounts[ctx->selected].excluded)
            ctx->selected = tg_plugins_default_select(ctx);
        /* A cooled account whose cooldown is over gets its one trial request now, whatever
         * the plugins scored (a score pulled down by the error EWMA would otherwise keep
         * it waiting for minutes); a plugin that wants it left out excludes it. */
        for (int i = 0; i < ctx->naccounts; i++)
            if (ctx->accounts[i].trial && !ctx->accounts[i].excluded) {
                ctx->selected = i;
                break;
            }
        if (ctx->selected < 0) {
            ctx->reject_status = 503;
            snprintf(ctx->reject_code, sizeof(ctx->reject_code), "no_available_account");
            snprintf(ctx->reject_message, sizeof(ctx->reject_message),
                     "no upstream account is available for this request");
        }
    }
    if (ctx->reject_status && hook <= TG_HOOK_SELECT_ACCOUNT)
        return TG_DONE;
    return TG_OK;
}

/* Whether a shadow call decided as the live one did (live: the live generation had the
 * hook; otherwise the request kept the core's default). */
static int same_decision(int hook, const tg_hookctx_t *live, const tg_hookctx_t *sh, int has_live) {
    switch (hook) {
    case TG_HOOK_ON_REQUEST:
    case TG_HOOK_MAP_MODEL:
        return live->reject_status == sh->reject_status &&
               (!live->reject_status || !strcmp(live->reject_code, sh->reject_code)) &&
               live->model_len == sh->model_len && !memcmp(live->model, sh->model, live->model_len) &&
               live->group_len == sh->group_len && !memcmp(live->group, sh->group, live->group_len);
    case TG_HOOK_SELECT_ACCOUNT:
        if (live->reject_status || sh->reject_status)
            return live->reject_status == sh->reject_status;
        /* Without a live plugin the request takes the first candidate (the core's order). */
        return (has_live ? live->selected : 0) == sh->selected;
    case TG_HOOK_ON_UPSTREAM_ERROR:
        return live->retry_action == sh->retry_action;
    case TG_HOOK_ON_LIMITER_DOWN:
        for (int k = 0; k < 4; k++)
            if ((live->limits & (1 << k)) && live->limiter_decision[k] != sh->limiter_decision[k])
                return 0;
        return 1;
    case TG_HOOK_PRICE:
        return live->cost_nanousd == sh->cost_nanousd;
    default:
        return 1;
    }
}

/* Copies at most cap - 1 bytes of p and a NUL. */
static void copy_str(char *dst, size_t cap, const char *p, size_t len) {
    size_t n = TG_MIN(len, cap - 1);
    if (n)
        memcpy(dst, p, n);
    dst[n] = '\0';
}

/* A decision as the disagreement samples word it (tg_plugin_global.c, describe), copied
 * raw: only the fields the hook decides. The words are made when the status is read,
 * not on the request. */
static void side_of(int hook, const tg_hookctx_t *c, int has_live, tg_shadow_side_t *s) {
    s->reject_status = c->reject_status && hook <= TG_HOOK_SELECT_ACCOUNT ? c->reject_status : 0;
    if (s->reject_status) {
        copy_str(s->code, sizeof(s->code), c->reject_code, strnlen(c->reject_code, sizeof(c->reject_code)));
        return;
    }
    switch (hook) {
    case TG_HOOK_SELECT_ACCOUNT: {
        int i = has_live ? c->selected : 0;
        if (i >= 0 && i < c->naccounts)
            copy_str(s->what, sizeof(s->what), c->accounts[i].id, c->accounts[i].id_len);
        else
            memcpy(s->what, "none", 5);
        return;
    }
    case TG_HOOK_ON_UPSTREAM_ERROR:
        s->retry_action = c->retry_action;
        return;
    case TG_HOOK_ON_LIMITER_DOWN:
        s->limits = c->limits;
        memcpy(s->limiter_decision, c->limiter_decision, sizeof(s->limiter_decision));
        return;
    case TG_HOOK_PRICE:
        s->cost_nanousd = c->cost_nanousd;
        return;
    default:
        copy_str(s->what, sizeof(s->what), c->model, c->model_len);
        copy_str(s->group, sizeof(s->group), c->group, c->group_len);
        return;
    }
}

/* The name of shadow generation sg's first plugin at `hook`: looked up in Lua once. */
static const char *first_name(tg_plugins_t *pl, tg_plugin_gen_t *sg, int hook) {
    if (!(sg->first_name_known >> hook & 1)) {
        int fc;
        plugin_at(pl->L, sg, hook, 1, sg->first_name[hook], sizeof(sg->first_name[hook]), &fc);
        sg->first_name_known |= 1u << hook;
    }
    return sg->first_name[hook];
}

/*
 * The live plugins, then the group's shadow plugins on a copy of the context as the
 * hook received it: whatever the shadow does (decide, fail, run out of its budget) stays
 * in the copy. Only the comparison leaves it: counted per hook, a disagreement kept as a
 * sample.
 */
/* What a hook no live plugin implements leaves in the context (the callers' defaults
 * stand, but for the limiter's decisions, which the hook call starts from). */
static void no_live_plugin(int hook, tg_hookctx_t *ctx) {
    if (hook == TG_HOOK_ON_LIMITER_DOWN)
        for (int i = 0; i < 4; i++)
            ctx->limiter_decision[i] = TG_LIMITER_DEFAULT;
}

/* Whether the request is in the shadow's sample: a hash of its id, so every hook of a
 * request decides alike. */
static int shadow_sampled(const tg_plugin_gen_t *g, const tg_hookctx_t *ctx) {
    if (g->shadow_cut >= (1ull << 32))
        return 1;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < ctx->request_id_len; i++)
        h = (h ^ (unsigned char)ctx->request_id[i]) * 16777619u;
    return h < g->shadow_cut;
}

/* run_with_shadow sets every field after reject_message itself. */
_Static_assert(offsetof(tg_hookctx_t, resp_headers) > offsetof(tg_hookctx_t, reject_message) &&
                   offsetof(tg_hookctx_t, log_fields_len) > offsetof(tg_hookctx_t, resp_headers_len) &&
                   offsetof(tg_hookctx_t, plugin_errors) > offsetof(tg_hookctx_t, log_fields_len) &&
                   offsetof(tg_hookctx_t, gen_) + sizeof(void *) == sizeof(tg_hookctx_t),
               "tg_hookctx_t: the shadow's copy");

static int run_with_shadow(tg_plugins_t *pl, tg_plugin_gen_t *g, int hook, tg_hookctx_t *ctx) {
    if (!pl->shadow_ctx) {
        pl->shadow_ctx = malloc(sizeof(*pl->shadow_ctx));
        pl->shadow_accts = malloc(64 * sizeof(*pl->shadow_accts));
        if (!pl->shadow_ctx || !pl->shadow_accts)
            abort();
    }
    tg_hookctx_t *sc = pl->shadow_ctx;
    /* The context up to the output buffers a plugin writes whole or appends to from
     * empty (reject_message, resp_headers, log_fields: 1.3 KB nothing reads back). */
    memcpy(sc, ctx, offsetof(tg_hookctx_t, reject_message));
    sc->reject_message[0] = sc->resp_headers[0] = sc->log_fields[0] = '\0';
    int n = TG_MIN(ctx->naccounts, 64);
    if (n > 0)
        memcpy(pl->shadow_accts, ctx->accounts, (size_t)n * sizeof(*ctx->accounts));
    sc->accounts = pl->shadow_accts;
    sc->naccounts = n;
    sc->plugin_errors = 0;
    sc->resp_headers_len = sc->log_fields_len = 0;
    sc->gen_ = g->shadow;
    int has_live = g->live_mask >> hook & 1, rc = TG_OK;
    if (has_live)
        rc = run_gen(pl, g, hook, ctx, 0);
    else
        no_live_plugin(hook, ctx);
    run_gen(pl, g->shadow, hook, sc, 1);
    if (hook == TG_HOOK_ON_LOG)
        return rc;
    if (sc->plugin_errors)
        return rc; /* counted in shadow_errors by run_gen */
    if (same_decision(hook, ctx, sc, has_live)) {
        counter_inc(&pl->shadow_agree[hook]);
    } else {
        counter_inc(&pl->shadow_disagree[hook]);
        tg_shadow_sample_t smp;
        smp.hook = hook;
        copy_str(smp.request_id, sizeof(smp.request_id), ctx->request_id, ctx->request_id_len);
        copy_str(smp.group, sizeof(smp.group), ctx->group, ctx->group_len);
        const char *name = first_name(pl, g->shadow, hook);
        copy_str(smp.plugin, sizeof(smp.plugin), name, strlen(name));
        side_of(hook, ctx, has_live, &smp.live);
        side_of(hook, sc, 1, &smp.shadow);
        tg__plugins_shadow_sample(&smp);
    }
    return rc;
}

int tg_plugins_run(tg_plugins_t *pl, int hook, tg_hookctx_t *ctx) {
    tg_plugin_gen_t *g = ctx->gen_;
    if (hook < 0 || hook >= TG_HOOK__COUNT)
        return TG_ERROR;
    if (g && g->shadow && pl && (g->shadow->live_mask >> hook & 1)) {
        if (shadow_sampled(g, ctx))
            return run_with_shadow(pl, g, hook, ctx);
        if (!(g->live_mask >> hook & 1)) {
            no_live_plugin(hook, ctx);
            return TG_OK;
        }
    }
    return run_gen(pl, g, hook, ctx, 0);
}

void tg_plugins_log_json(const tg_hookctx_t *ctx, tg_buf_t *b) {
    tg_buf_printf(b, ",\"plugins\":{\"generation\":%llu,\"errors\":%d", (unsigned long long)ctx->generation,
                  ctx->plugin_errors);
    if (ctx->log_fields_len)
        tg_buf_append(b, ctx->log_fields, ctx->log_fields_len);
    tg_buf_appends(b, "}");
}

/* ---- validation --------------------------------------------------------------------- */

void tg__plugins_sample_ctx(tg_hookctx_t *ctx, tg_ffi_account_t *accts) {
    static const tg_ffi_header_t headers[] = {
        {"content-type", 12, "application/json", 16},
        {"x-tenant", 8, "sample-tenant", 13},
    };
    static const char *const ids[] = {"sample-a", "sample-b", "sample-c"};
    static const char *const regions[] = {"us", "eu", "us"};
    ctx->request_id = "dry-run";
    ctx->request_id_len = 7;
    ctx->route = "chat";
    ctx->route_len = 4;
    ctx->protocol = "openai_chat";
    ctx->protocol_len = 11;
    ctx->key_id = "sample-key";
    ctx->key_id_len = 10;
    ctx->tenant_id = "sample-tenant";
    ctx->tenant_id_len = 13;
    ctx->headers = headers;
    ctx->nheaders = 2;
    ctx->max_tokens = 256;
    tg_plugins_ctx_set_model(ctx, "gpt-4o-mini", 11);
    memcpy(ctx->group, "default", 8);
    ctx->group_len = 7;
    for (int i = 0; i < 3; i++) {
        accts[i] = (tg_ffi_account_t){
            .id = ids[i], .id_len = strlen(ids[i]), .region = regions[i], .region_len = 2,
            .priority = i == 2 ? 0 : 1, .inflight = i, .max_concurrency = 10, .queued = 0,
            .error_ewma = 0.01 * i, .ttft_ewma_ms = 300 + 100 * i, .reset_in_ms = -1, .cost = 1 + i,
            .headroom = -1, .window_left = -1, .window_reset_in_ms = -1,
        };
    }
    ctx->accounts = accts;
    ctx->naccounts = 3;
    ctx->attempt = 1;
    ctx->upstream_status = 503;
    ctx->elapsed_ms = 120;
    ctx->deadline_ms = 60000;
    ctx->limits = TG_LIMIT_RATE | TG_LIMIT_MONEY;
    ctx->usage_input = 1000;
    ctx->usage_output = 200;
    ctx->usage_cache_read = 100;
    ctx->usage_reasoning = 50;
    ctx->usage_known = 1 | 2 | 4 | 16;
    ctx->status = 200;
    ctx->ttft_ms = 350;
    ctx->total_ms = 1200;
}

int tg__plugins_validate(tg_plugin_src_t *src, char *err, size_t errlen) {
    tg_plugins_t *pl = tg__plugins_new(NULL, 0, 1, src->max_instructions, src->max_hook_ms, err, errlen);
    if (!pl)
        return TG_ERROR;
    pl->quiet = 1;
    int rc = tg__plugins_install(pl, src, err, errlen);
    if (rc == TG_OK) {
        /* A dry call of every hook on a sample request. */
        for (int h = 0; h < TG_HOOK__COUNT && rc == TG_OK; h++) {
            tg_hookctx_t ctx;
            tg_ffi_account_t accts[3];
            tg_plugins_begin(pl, &ctx);
            tg__plugins_sample_ctx(&ctx, accts);
            if (h == TG_HOOK_ON_UPSTREAM_ERROR || h == TG_HOOK_ON_LIMITER_DOWN)
                ctx.now_ms = (double)tg_wall_ms();
            tg_plugins_run(pl, h, &ctx);
            if (ctx.plugin_errors) {
                snprintf(err, errlen, "%s (dry run on a sample request)", pl->last_hook_error);
                rc = TG_ERROR;
            }
            tg_plugins_end(pl, &ctx);
        }
    }
    if (rc == TG_OK) {
        /* Record what each plugin declared, for the status and `tollgate check`. */
        lua_State *L = pl->L;
        lua_rawgeti(L, LUA_REGISTRYINDEX, pl->current->gen_ref);
        lua_getfield(L, -1, "plugins");
        int n = (int)lua_objlen(L, -1);
        for (int i = 1; i <= n; i++) {
            lua_rawgeti(L, -1, i);
            lua_getfield(L, -1, "name");
            const char *name = lua_tostring(L, -1);
            for (size_t k = 0; name && k < src->n; k++) {
                tg_plugin_src_plugin_t *p = &src->p[k];
                if (strcmp(p->name, name) != 0)
                    continue;
                lua_getfield(L, -2, "version");
                free(p->version);
                p->version = strdup(lua_tostring(L, -1) ? lua_tostring(L, -1) : "");
                lua_getfield(L, -3, "priority");
                p->priority = (long)lua_tonumber(L, -1);
                lua_getfield(L, -4, "hooks");
                tg_buf_t b;
                tg_buf_init(&b);
                int nh = (int)lua_objlen(L, -1);
                for (int j = 1; j <= nh; j++) {
                    lua_rawgeti(L, -1, j);
                    if (j > 1)
                        tg_buf_appends(&b, ",");
                    tg_buf_appends(&b, lua_tostring(L, -1));
                    lua_pop(L, 1);
                }
                free(p->hooks);
                p->hooks = strdup(b.data ? b.data : "");
                tg_buf_free(&b);
                lua_pop(L, 3);
            }
            lua_pop(L, 2);
        }
        lua_pop(L, 2);
    }
    tg__plugins_free(pl);
    return rc;
}

/* ---- worker handles ----------------------------------------------------------------- */

/* A destroyed runtime goes once its handles are closed and its last request ended. */
static void maybe_free(tg_plugins_t *pl) {
    if (pl->destroyed && pl->open_handles == 0 && pl->live == 0)
        tg__plugins_free(pl);
}

static void handle_closed(uv_handle_t *h) {
    tg_plugins_t *pl = h->data;
    pl->open_handles--;
    maybe_free(pl);
}

static void on_async(uv_async_t *a) {
    tg_plugins_t *pl = a->data;
    tg_plugin_src_t *src = tg__plugins_current_src();
    if (!src)
        return;
    if (!pl->src || src->number != pl->src->number) {
        char err[512];
        if (tg__plugins_install(pl, src, err, sizeof(err)) != TG_OK) {
            snprintf(pl->last_error, sizeof(pl->last_error), "%s", err);
            tg_log_error("plugins: worker %d: generation %llu refused, keeping %llu: %s", pl->worker,
                         (unsigned long long)src->number, (unsigned long long)atomic_load(&pl->generation), err);
        } else {
            pl->last_error[0] = '\0';
            tg_log_debug("plugins: worker %d: now on generation %llu", pl->worker, (unsigned long long)src->number);
        }
    }
    tg__plugin_src_unref(src);
}

static void reload_from(const char *trigger) {
    char err[512];
    long n = tg__plugins_reload(trigger, err, sizeof(err));
    if (n > 0)
        tg_log_info("plugins: generation %ld loaded (%s)", n, trigger);
}

static void on_sighup(uv_signal_t *s, int signum) {
    TG_UNUSED(s);
    TG_UNUSED(signum);
    reload_from("sighup");
}

static void on_debounce(uv_timer_t *t) {
    TG_UNUSED(t);
    reload_from("watch");
}

static void on_fs_event(uv_fs_event_t *h, const char *filename, int events, int status) {
    TG_UNUSED(filename);
    TG_UNUSED(events);
    tg_plugins_t *pl = h->data;
    if (status < 0)
        return;
    /* Editors write a file in several steps: reload once they have settled. */
    uv_timer_start(&pl->debounce, on_debounce, 50, 0);
}

static void watch_path(tg_plugins_t *pl, const char *path) {
    if (pl->nwatches >= pl->max_watches)
        return;
    uv_fs_event_t *w = &pl->watches[pl->nwatches];
    if (uv_fs_event_init(pl->loop, w) != 0)
        return;
    w->data = pl;
    pl->open_handles++;
    pl->nwatches++;
    int r = uv_fs_event_start(w, on_fs_event, path, 0);
    if (r < 0)
        tg_log_debug("plugins: not watching %s: %s", path, uv_strerror(r));
    uv_unref((uv_handle_t *)w);
}

/* Calls fn(pl, path) for every plugin folder (<dir>/<name>/) of the plugin dirs. */
static int each_plugin_folder(tg_plugins_t *pl, const tg_plugins_config_t *cfg,
                              void (*fn)(tg_plugins_t *pl, const char *path)) {
    int n = 0;
    for (size_t d = 0; d < cfg->ndirs; d++) {
        DIR *dir = opendir(cfg->dirs[d]);
        if (!dir)
            continue;
        struct dirent *de;
        while ((de = readdir(dir)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", cfg->dirs[d], de->d_name);
            struct stat st;
            if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
                continue;
            if (fn)
                fn(pl, path);
            n++;
        }
        closedir(dir);
    }
    return n;
}

static void start_watches(tg_plugins_t *pl, const tg_plugins_config_t *cfg) {
    /* inotify is not recursive: watch each folder and each plugin's folder in it (a
     * group may enable any of them, not only the config file's list). Handles must not
     * move once started: count first, with room for folders created meanwhile. */
    int max = (int)cfg->ndirs + each_plugin_folder(pl, cfg, NULL) + 16;
    pl->watches = calloc((size_t)max, sizeof(uv_fs_event_t));
    pl->max_watches = max;
    for (size_t d = 0; d < cfg->ndirs; d++)
        watch_path(pl, cfg->dirs[d]);
    each_plugin_folder(pl, cfg, watch_path);
}

tg_plugins_t *tg_plugins_create(uv_loop_t *loop, int worker, int nworkers, char *err, size_t errlen) {
    const tg_plugins_config_t *cfg = tg__plugins_global_cfg();
    tg_plugin_src_t *src = tg__plugins_current_src();
    if (!cfg || !src) {
        snprintf(err, errlen, "plugins: tg_plugins_global_init was not called");
        tg_log_error("%s", err);
        return NULL;
    }
    tg_plugins_t *pl = tg__plugins_new(loop, worker, nworkers, src->max_instructions, src->max_hook_ms, err, errlen);
    if (!pl || tg__plugins_install(pl, src, err, errlen) != TG_OK) {
        tg_log_error("plugins: worker %d: %s", worker, err);
        tg__plugins_free(pl);
        tg__plugin_src_unref(src);
        return NULL;
    }
    tg__plugin_src_unref(src);
    uv_async_init(loop, &pl->async, on_async);
    pl->async.data = pl;
    pl->open_handles++;
    pl->has_async = 1;
    uv_unref((uv_handle_t *)&pl->async);
    if (worker == 0) {
        uv_signal_init(loop, &pl->sighup);
        pl->sighup.data = pl;
        pl->open_handles++;
        pl->has_signal = 1;
        uv_signal_start(&pl->sighup, on_sighup, SIGHUP);
        uv_unref((uv_handle_t *)&pl->sighup);
        uv_timer_init(loop, &pl->debounce);
        pl->debounce.data = pl;
        pl->open_handles++;
        pl->has_timer = 1;
        uv_unref((uv_handle_t *)&pl->debounce);
        if (cfg->watch)
            start_watches(pl, cfg);
    }
    /* A reload may have been published between reading src and registering. */
    uv_async_send(&pl->async);
    return pl;
}

void tg_plugins_destroy(tg_plugins_t *pl) {
    if (!pl)
        return;
    pl->destroyed = 1;
    if (!pl->open_handles) {
        maybe_free(pl);
        return;
    }
    if (pl->has_async)
        uv_close((uv_handle_t *)&pl->async, handle_closed);
    if (pl->has_signal)
        uv_close((uv_handle_t *)&pl->sighup, handle_closed);
    if (pl->has_timer)
        uv_close((uv_handle_t *)&pl->debounce, handle_closed);
    for (int i = 0; i < pl->nwatches; i++)
        uv_close((uv_handle_t *)&pl->watches[i], handle_closed);
}
