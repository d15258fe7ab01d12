/*
 * Unit tests of the plugin runtime (core/src/policy/tg_plugin*.c, tg_ffi.c, core/lua/): the
 * `plugins` config section, hooks and their defaults and fallbacks, API phase checks,
 * the sandbox, the instruction budget against endless loops, generations (a request
 * keeps the one it began with; a broken one is refused whole), the status JSON, and
 * that every shipped plugin and example policy passes validation.
 *
 * Plugin files are written to a fresh temp folder per test. Needs the test binary to
 * export its symbols (spec/plugins.cmake) so LuaJIT's ffi.C finds tg_ffi_*.
 */
#include <jansson.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../core/src/policy/tg_plugin_internal.h"
#include "tg_test.h"
#include "tollgate/tg_plugin.h"

#ifndef TG_SOURCE_DIR
#define TG_SOURCE_DIR "."
#endif

static char dir[256];
static const char *budget = "max_instructions = 100000";

static void write_file(const char *rel, const char *text) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    mkdir(path, 0700);
    *slash = '/';
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    ASSERT(f);
    fputs(text, f);
    fclose(f);
    ASSERT(rename(tmp, path) == 0);
}

static void make_dir(void) {
    snprintf(dir, sizeof(dir), "/tmp/tg-plugin-test-XXXXXX");
    ASSERT(mkdtemp(dir));
}

/* Parses `plugins = <lua>` the way tg_config.c does. */
static int parse(const char *lua, tg_plugins_config_t *cfg, char *err, size_t errlen) {
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    char src[8192];
    snprintf(src, sizeof(src), "return %s", lua);
    ASSERT(luaL_loadstring(L, src) == 0);
    ASSERT(lua_pcall(L, 0, 1, 0) == 0);
    int rc = tg_plugins_config_from_lua(L, -1, cfg, err, errlen);
    lua_close(L);
    return rc;
}

/* A config with the temp dir and the given enabled list (a Lua expression). */
static void init_with(const char *enabled, tg_plugins_config_t *cfg) {
    char lua[4096], err[512];
    snprintf(lua, sizeof(lua), "{dirs = {\"%s\"}, watch = false, %s, enabled = %s}", dir, budget, enabled);
    if (parse(lua, cfg, err, sizeof(err)) != TG_OK) {
        fprintf(stderr, "%s\n", err);
        ASSERT(0);
    }
}

static tg_plugins_t *start(const char *enabled, uv_loop_t *loop) {
    tg_plugins_config_t cfg;
    init_with(enabled, &cfg);
    char err[1024];
    if (tg_plugins_global_init(&cfg, err, sizeof(err)) != TG_OK) {
        fprintf(stderr, "%s\n", err);
        ASSERT(0);
    }
    tg_plugins_config_free(&cfg);
    uv_loop_init(loop);
    tg_plugins_t *pl = tg_plugins_create(loop, 0, 1, err, sizeof(err));
    ASSERT(pl);
    return pl;
}

static void stop(tg_plugins_t *pl, uv_loop_t *loop) {
    tg_plugins_destroy(pl);
    uv_run(loop, UV_RUN_DEFAULT);
    ASSERT(uv_loop_close(loop) == 0);
    tg_plugins_global_shutdown();
}

/* Runs the loop until the async wake-ups sent so far are handled. */
static void timer_cb(uv_timer_t *t) { uv_close((uv_handle_t *)t, NULL); }
static void pump(uv_loop_t *loop) {
    uv_timer_t t;
    uv_timer_init(loop, &t);
    uv_timer_start(&t, timer_cb, 5, 0);
    uv_run(loop, UV_RUN_DEFAULT);
}

static void begin(tg_plugins_t *pl, tg_hookctx_t *ctx, const char *model) {
    tg_plugins_begin(pl, ctx);
    ctx->request_id = "req-1";
    ctx->request_id_len = 5;
    tg_plugins_ctx_set_model(ctx, model, strlen(model));
}

TG_TEST(plugin, config_parses_and_reports_errors) {
    tg_plugins_config_t cfg;
    char err[512];
    ASSERT_EQ_INT(parse("{enabled = {{name = \"model-map\", config = {aliases = {[\"gpt-4\"] = \"gpt-4o\"}}},"
                        " \"router\"}, max_instructions = 5000}",
                        &cfg, err, sizeof(err)),
                  TG_OK);
    ASSERT_EQ_INT(cfg.nenabled, 2);
    ASSERT_EQ_STR(cfg.enabled[0].name, "model-map");
    ASSERT_EQ_STR(cfg.enabled[0].config_lua, "{[\"aliases\"]={[\"gpt-4\"]=\"gpt-4o\",},}");
    ASSERT_EQ_STR(cfg.enabled[1].config_lua, "{}");
    ASSERT_EQ_INT(cfg.ndirs, 2);
    ASSERT_EQ_STR(cfg.dirs[1], "policies");
    ASSERT_EQ_INT(cfg.max_instructions, 5000);
    ASSERT_EQ_INT(cfg.watch, 1);
    tg_plugins_config_free(&cfg);

    ASSERT_EQ_INT(parse("{enabled = {{name = 3}}}", &cfg, err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "config: plugins.enabled[1]: name: expected string, got number");
    ASSERT_EQ_INT(parse("{enabled = {{name = \"x\", config = \"no\"}}}", &cfg, err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "config: plugins.x.config: expected table, got string");
    ASSERT_EQ_INT(parse("{enabled = {{name = \"x\", config = {f = print}}}}", &cfg, err, sizeof(err)), TG_ERROR);
    ASSERT(strstr(err, "plugins.x.config.f: expected data") != NULL);
    ASSERT_EQ_INT(parse("{enable = {}}", &cfg, err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "config: plugins.enable: unknown key");
    ASSERT_EQ_INT(parse("{enabled = {\"a\", \"a\"}}", &cfg, err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "config: plugins.enabled[2]: name: \"a\" is enabled twice");
}

TG_TEST(plugin, capture_config_parses_and_never_records_credentials) {
    tg_plugins_config_t cfg;
    char err[512];
    ASSERT_EQ_INT(parse("{}", &cfg, err, sizeof(err)), TG_OK);
    ASSERT(cfg.capture.rate == 0); /* off unless asked for */
    ASSERT_EQ_INT(cfg.capture.max_per_s, 50);
    tg_plugins_config_free(&cfg);
    ASSERT_EQ_INT(parse("{capture = {rate = 0.01, max_per_s = 5, file = \"/tmp/c.jsonl\", keep = 1,"
                        " headers = {\"X-Tier\"}, groups = {gold = 1}}}",
                        &cfg, err, sizeof(err)),
                  TG_OK);
    ASSERT(cfg.capture.rate == 0.01);
    ASSERT_EQ_INT(cfg.capture.max_per_s, 5);
    ASSERT_EQ_STR(cfg.capture.file, "/tmp/c.jsonl");
    ASSERT_EQ_INT(cfg.capture.nheaders, 1);
    ASSERT_EQ_STR(cfg.capture.headers[0], "x-tier");
    ASSERT_EQ_INT(cfg.capture.ngroups, 1);
    ASSERT_EQ_STR(cfg.capture.groups[0].name, "gold");
    tg_plugins_config_free(&cfg);
    ASSERT_EQ_INT(parse("{capture = {headers = {\"Authorization\"}}}", &cfg, err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "config: plugins.capture.headers[1]: \"Authorization\" carries a credential and is never "
                       "recorded");
    ASSERT_EQ_INT(parse("{capture = {rate = 2}}", &cfg, err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "config: plugins.capture.rate: expected a number from 0 to 1");
    ASSERT_EQ_INT(parse("{capture = {sample = 1}}", &cfg, err, sizeof(err)), TG_ERROR);
    ASSERT(strstr(err, "config: plugins.capture.sample: unknown key") == err);
    ASSERT_EQ_INT(parse("{capture = {groups = {gold = \"all\"}}}", &cfg, err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "config: plugins.capture.groups.gold: expected a rate from 0 to 1");
}

static const char stamp_plugin[] =
    "local tollgate = require('tollgate')\n"
    "return { name = 'stamp', priority = 10, version = 'V1',\n"
    "  on_request = function(ctx, conf)\n"
    "    if ctx:header('x-block') then return ctx:reject(403, 'blocked', 'no entry') end\n"
    "    ctx:add_header('x-stamp', 'V1')\n"
    "  end,\n"
    "  map_model = function(ctx, conf) ctx:set_model(conf.prefix .. ctx:model()) end,\n"
    "  price = function(ctx) ctx:set_cost(ctx:usage().input or 0) end,\n"
    "}\n";
static const char stamp_schema[] =
    "return { fields = { prefix = { type = 'string', default = 'p/' } } }\n";

/* ctx:limiter from a real plugin: per-limit answers are kept, undecided limits take the
 * configured policy, and a malformed or hostile call (an unknown limit, a bad decision,
 * a local money bucket, a non-table) is a plugin error: every limit closed, counted. */
static const char down_plugin[] =
    "return { name = 'down', priority = 10, version = '1',\n"
    "  on_limiter_down = function(ctx)\n"
    "    local m = ctx:model()\n"
    "    if m == 'per-limit' then ctx:limiter({ rate = 'open', concurrency = 'local' })\n"
    "    elseif m == 'all-local' then ctx:limiter('local')\n"
    "    elseif m == 'money-open' then ctx:limiter('open', 'money')\n"
    "    elseif m == 'money-local' then ctx:limiter('local', 'money')\n"
    "    elseif m == 'money-local-table' then ctx:limiter({ money = 'local' })\n"
    "    elseif m == 'unknown-limit' then ctx:limiter({ bandwidth = 'open' })\n"
    "    elseif m == 'bad-decision' then ctx:limiter('maybe')\n"
    "    elseif m == 'not-a-string' then ctx:limiter(42)\n"
    "    elseif m == 'huge-name' then ctx:limiter('open', string.rep('r', 1000000)) end\n"
    "  end }\n";

TG_TEST(plugin, limiter_decisions_and_bad_calls) {
    make_dir();
    write_file("down.lua", down_plugin);
    uv_loop_t loop;
    tg_plugins_t *pl = start("{'down'}", &loop);
    tg_hookctx_t ctx;
    enum { D = TG_LIMITER_DEFAULT, C = TG_LIMITER_CLOSED, O = TG_LIMITER_OPEN, L = TG_LIMITER_LOCAL };
    static const struct {
        const char *model;
        int want[4]; /* rate, tokens, concurrency, money */
        int error;
    } cases[] = {
        {"per-limit", {O, D, L, D}, 0},
        {"all-local", {L, L, L, D}, 0}, /* money is never local: it keeps its policy */
        {"money-open", {D, D, D, O}, 0},
        {"nothing", {D, D, D, D}, 0},
        {"money-local", {C, C, C, C}, 1},
        {"money-local-table", {C, C, C, C}, 1},
        {"unknown-limit", {C, C, C, C}, 1},
        {"bad-decision", {C, C, C, C}, 1},
        {"not-a-string", {C, C, C, C}, 1},
        {"huge-name", {C, C, C, C}, 1},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        begin(pl, &ctx, cases[k].model);
        ctx.limits = TG_LIMIT_RATE | TG_LIMIT_TOKENS | TG_LIMIT_CONCURRENCY | TG_LIMIT_MONEY;
        ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_LIMITER_DOWN, &ctx), TG_OK);
        for (int i = 0; i < 4; i++) {
            if (ctx.limiter_decision[i] != cases[k].want[i])
                fprintf(stderr, "%s: limit %d decided %d, expected %d\n", cases[k].model, i,
                        ctx.limiter_decision[i], cases[k].want[i]);
            ASSERT_EQ_INT(ctx.limiter_decision[i], cases[k].want[i]);
        }
        ASSERT_EQ_INT(ctx.plugin_errors, cases[k].error);
        tg_plugins_end(pl, &ctx);
    }
    stop(pl, &loop);
}

TG_TEST(plugin, hooks_change_the_context) {
    make_dir();
    write_file("stamp/handler.lua", stamp_plugin);
    write_file("stamp/schema.lua", stamp_schema);
    uv_loop_t loop;
    tg_plugins_t *pl = start("{{name = 'stamp', config = {prefix = 'x/'}}}", &loop);

    tg_hookctx_t ctx;
    begin(pl, &ctx, "gpt-4o");
    ASSERT_EQ_INT(ctx.generation, 1);
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &ctx), TG_OK);
    ASSERT_EQ_STR(ctx.resp_headers, "x-stamp: V1\r\n");
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &ctx), TG_OK);
    ASSERT_EQ_STR(ctx.model, "x/gpt-4o");
    ASSERT_EQ_STR(ctx.original_model, "gpt-4o");
    ctx.usage_input = 1234;
    ctx.usage_known = 1;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_PRICE, &ctx), TG_OK);
    ASSERT_EQ_INT(ctx.cost_nanousd, 1234);
    /* No plugin implements these: the defaults. */
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_LIMITER_DOWN, &ctx), TG_OK);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ_INT(ctx.limiter_decision[i], TG_LIMITER_DEFAULT); /* the configured policies */
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_UPSTREAM_ERROR, &ctx), TG_OK);
    ASSERT_EQ_INT(ctx.retry_action, TG_RETRY_GIVE_UP);
    ASSERT_EQ_INT(ctx.plugin_errors, 0);
    tg_plugins_end(pl, &ctx);

    tg_ffi_header_t h = {"X-Block", 7, "1", 1};
    begin(pl, &ctx, "gpt-4o");
    ctx.headers = &h;
    ctx.nheaders = 1;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &ctx), TG_DONE);
    ASSERT_EQ_INT(ctx.reject_status, 403);
    ASSERT_EQ_STR(ctx.reject_code, "blocked");
    ASSERT_EQ_STR(ctx.reject_message, "no entry");
    tg_plugins_end(pl, &ctx);
    stop(pl, &loop);
}

TG_TEST(plugin, api_outside_its_hook_is_refused_and_falls_back) {
    make_dir();
    write_file("bad.lua",
               "return { name = 'bad', priority = 1, version = '1',\n"
               "  map_model = function(ctx) ctx:set_model('changed'); ctx:set_cost(5) end,\n"
               "  price = function(ctx) error('boom') end,\n"
               "  on_upstream_error = function(ctx) ctx:retry('other', 10) end }\n");
    uv_loop_t loop;
    /* The dry run would refuse this plugin: install it behind validation's back. */
    tg_plugins_config_t cfg;
    init_with("{'bad'}", &cfg);
    char err[1024];
    ASSERT_EQ_INT(tg_plugins_global_init(&cfg, err, sizeof(err)), TG_ERROR);
    ASSERT(strstr(err, "plugins.bad.map_model:") != NULL);
    ASSERT(strstr(err, "API set_cost disabled in the context of map_model") != NULL);
    ASSERT(strstr(err, "dry run") != NULL);
    tg_plugins_config_free(&cfg);

    /* A plugin that fails only on real traffic: falls back, counted. */
    write_file("bad.lua",
               "return { name = 'bad', priority = 1, version = '1',\n"
               "  map_model = function(ctx)\n"
               "    ctx:set_model('changed')\n"
               "    if ctx:model() ~= 'changed' or ctx:original_model() == 'gpt-4o-mini' then return end\n"
               "    ctx:set_cost(5)\n"
               "  end,\n"
               "  price = function(ctx) if ctx:usage().input == 7 then error('boom') end end,\n"
               "  on_upstream_error = function(ctx) ctx:retry('other', 10) end }\n");
    tg_plugins_t *pl = start("{'bad'}", &loop);
    tg_hookctx_t ctx;
    begin(pl, &ctx, "gpt-4o");
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &ctx), TG_OK);
    ASSERT_EQ_STR(ctx.model, "gpt-4o"); /* restored */
    ASSERT_EQ_INT(ctx.plugin_errors, 1);
    ctx.usage_input = 7;
    ctx.usage_known = 1;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_PRICE, &ctx), TG_OK);
    ASSERT_EQ_INT(ctx.cost_nanousd, -1); /* unpriced */
    ASSERT_EQ_INT(ctx.plugin_errors, 2);
    ctx.bytes_sent = 1; /* a retry after bytes reached the client is refused */
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_UPSTREAM_ERROR, &ctx), TG_OK);
    ASSERT_EQ_INT(ctx.retry_action, TG_RETRY_GIVE_UP);
    ctx.bytes_sent = 0;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_UPSTREAM_ERROR, &ctx), TG_OK);
    ASSERT_EQ_INT(ctx.retry_action, TG_RETRY_OTHER);
    ASSERT_EQ_INT(ctx.retry_delay_ms, 10);
    tg_plugins_end(pl, &ctx);

    char *status = tg_plugins_status_json();
    ASSERT(strstr(status, "\"map_model\":{\"calls\":1,\"errors\":1}") != NULL);
    ASSERT(strstr(status, "\"price\":{\"calls\":1,\"errors\":1}") != NULL);
    free(status);
    stop(pl, &loop);
}

TG_TEST(plugin, endless_loop_is_stopped_by_the_budget) {
    make_dir();
    write_file("spin.lua",
               "return { name = 'spin', priority = 1, version = '1',\n"
               "  on_request = function(ctx)\n"
               "    if ctx:header('x-spin') then\n"
               "      while true do pcall(function() while true do end end) end\n"
               "    end\n"
               "  end }\n");
    uv_loop_t loop;
    tg_plugins_t *pl = start("{'spin'}", &loop);
    tg_ffi_header_t h = {"x-spin", 6, "1", 1};
    for (int i = 0; i < 3; i++) {
        tg_hookctx_t ctx;
        begin(pl, &ctx, "m");
        ctx.headers = &h;
        ctx.nheaders = 1;
        uint64_t t0 = tg_now_ns();
        ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &ctx), TG_OK); /* fallback: pass */
        ASSERT(tg_now_ns() - t0 < 2000000000ull);
        ASSERT_EQ_INT(ctx.plugin_errors, 1);
        tg_plugins_end(pl, &ctx);
    }
    stop(pl, &loop);
}

/* Runs on_request with `x-spin: value`, which must fail in the plugin (one error), then
 * map_model, which must work at once; returns on_request's time in ms. */
static uint64_t spin_once(tg_plugins_t *pl, const char *value) {
    tg_ffi_header_t h = {"x-spin", 6, value, strlen(value)};
    tg_hookctx_t ctx;
    begin(pl, &ctx, "m");
    ctx.headers = &h;
    ctx.nheaders = 1;
    uint64_t t0 = tg_now_ns();
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &ctx), TG_OK);
    uint64_t took_ms = (tg_now_ns() - t0) / 1000000;
    ASSERT_EQ_INT(ctx.plugin_errors, 1);
    /* The state is usable afterwards, at full speed (no hook left behind). */
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &ctx), TG_OK);
    ASSERT_EQ_STR(ctx.model, "after");
    ASSERT_EQ_INT(ctx.plugin_errors, 1);
    tg_plugins_end(pl, &ctx);
    return took_ms;
}

/* Without instruction counting, the watchdog stops the loop after max_hook_ms. */
TG_TEST(plugin, endless_loop_is_stopped_by_the_watchdog) {
    make_dir();
    budget = "max_instructions = 0, max_hook_ms = 20";
    write_file("spin.lua",
               "return { name = 'spin', priority = 1, version = '1',\n"
               "  on_request = function(ctx)\n"
               "    if ctx:header('x-spin') then\n"
               "      while true do pcall(function() while true do end end) end\n"
               "    end\n"
               "  end,\n"
               "  map_model = function(ctx) ctx:set_model('after') end }\n");
    uv_loop_t loop;
    tg_plugins_t *pl = start("{'spin'}", &loop);
    for (int i = 0; i < 3; i++) {
        uint64_t took_ms = spin_once(pl, "1");
        ASSERT(took_ms >= 20 && took_ms < 1000);
    }
    stop(pl, &loop);

    /* A loop at load time: the generation is refused, nothing hangs. */
    write_file("spin.lua", "while true do end");
    tg_plugins_config_t cfg;
    init_with("{'spin'}", &cfg);
    char err[1024];
    ASSERT_EQ_INT(tg_plugins_global_init(&cfg, err, sizeof(err)), TG_ERROR);
    ASSERT(strstr(err, "plugin budget exceeded: ran longer than") != NULL);
    tg_plugins_config_free(&cfg);
}

/*
 * Module plugin_jit (label `policy`): plugin functions without a loop, a backward jump or
 * a tail call run compiled when max_instructions is off (core/lua/tg_runtime.lua,
 * M.compile), and compiled code cannot escape max_hook_ms.
 */

/* Records, in the runtime's own globals, the start of every trace the JIT finishes:
 * tg_test_traces["<file>:<linedefined>"] = true. */
static void watch_traces(tg_plugins_t *pl) {
    lua_State *L = pl->L;
    ASSERT(luaL_dostring(L, "local util = require('jit.util')\n"
                            "local starts = {}\n"
                            "tg_test_traces = {}\n"
                            "jit.attach(function(what, tr, func)\n"
                            "  if what == 'start' then\n"
                            "    local i = util.funcinfo(func)\n"
                            "    starts[tr] = (i.source or '?'):match('[^/]*$') .. ':' .. tostring(i.linedefined)\n"
                            "  elseif what == 'stop' and starts[tr] then\n"
                            "    tg_test_traces[starts[tr]] = true\n"
                            "  end\n"
                            "end, 'trace')\n") == 0);
}

static int traced(tg_plugins_t *pl, const char *where) {
    lua_State *L = pl->L;
    lua_getglobal(L, "tg_test_traces");
    lua_getfield(L, -1, where);
    int yes = lua_toboolean(L, -1);
    lua_pop(L, 2);
    return yes;
}

static void run_hot(int with_instruction_budget, int *twice, int *sum, int *hook) {
    make_dir();
    budget = with_instruction_budget ? "max_instructions = 10000000, max_hook_ms = 1000"
                                     : "max_instructions = 0, max_hook_ms = 1000";
    write_file("hot.lua", "local function twice(x) return x * 2 end\n"
                          "local function sum(n) local s = 0 for i = 1, n do s = s + i end return s end\n"
                          "return { name = 'hot', priority = 1, version = '1',\n"
                          "  on_request = function(ctx)\n"
                          "    local v = 0\n"
                          "    for i = 1, 300 do v = v + twice(i) + sum(3) end\n"
                          "    if v < 0 then ctx:reject(500, 'never', 'never') end\n"
                          "  end }\n");
    uv_loop_t loop;
    tg_plugins_t *pl = start("{'hot'}", &loop);
    watch_traces(pl);
    for (int i = 0; i < 3; i++) {
        tg_hookctx_t ctx;
        begin(pl, &ctx, "m");
        ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &ctx), TG_OK);
        ASSERT_EQ_INT(ctx.plugin_errors, 0);
        tg_plugins_end(pl, &ctx);
    }
    *twice = traced(pl, "hot.lua:1");
    *sum = traced(pl, "hot.lua:2");
    *hook = traced(pl, "hot.lua:4");
    stop(pl, &loop);
}

TG_TEST(plugin_jit, loop_free_functions_run_compiled) {
    int twice, sum, hook;
    run_hot(0, &twice, &sum, &hook);
    ASSERT(twice);            /* no loop: compiled */
    ASSERT(!sum && !hook);    /* a loop: interpreted, so the hook can stop it */
    /* max_instructions counts every instruction: everything stays interpreted. */
    run_hot(1, &twice, &sum, &hook);
    ASSERT(!twice && !sum && !hook);
}

/* Endless runs built from compiled pieces: each is stopped at max_hook_ms, and the
 * state serves the next hook at once. */
TG_TEST(plugin_jit, compiled_code_cannot_escape_the_watchdog) {
    make_dir();
    budget = "max_instructions = 0, max_hook_ms = 20";
    write_file("spin.lua",
               "local function inc(x) return x + 1 end\n"
               "local function tail(n) return tail(n + 1) end\n"
               "local other\n"
               "local function mutual(n) return other(n + 1) end\n"
               "other = function(n) return mutual(n + 1) end\n"
               "local function back(n) ::top:: n = n + 1 if n > 0 then goto top end return n end\n"
               "local function fork() pcall(fork) pcall(fork) end\n"
               "local meta = setmetatable({}, { __index = function(t, k) local v = t[k] return v end })\n"
               "local function lookup() local v = meta.x return v end\n"
               "return { name = 'spin', priority = 1, version = '1',\n"
               "  on_request = function(ctx)\n"
               "    local how = ctx:header('x-spin')\n"
               "    for i = 1, 1000 do inc(i) end\n"
               "    if how == 'hot' then local x = 0 while true do x = inc(x) end\n"
               "    elseif how == 'tail' then tail(0)\n"
               "    elseif how == 'mutual' then mutual(0)\n"
               "    elseif how == 'goto' then back(0)\n"
               "    elseif how == 'fork' then fork()\n"
               "    elseif how == 'meta' then while true do pcall(lookup) end end\n"
               "  end,\n"
               "  map_model = function(ctx) ctx:set_model('after') end }\n");
    uv_loop_t loop;
    tg_plugins_t *pl = start("{'spin'}", &loop);
    static const char *const hows[] = {"hot", "tail", "mutual", "goto", "fork", "meta"};
    for (size_t w = 0; w < sizeof(hows) / sizeof(hows[0]); w++) {
        for (int i = 0; i < 2; i++) {
            uint64_t took_ms = spin_once(pl, hows[w]);
            if (took_ms >= 1000)
                fprintf(stderr, "x-spin: %s took %llu ms\n", hows[w], (unsigned long long)took_ms);
            ASSERT(took_ms < 1000);
        }
    }
    stop(pl, &loop);
}

/* ctx:score_accounts (core/lua/tg_runtime.lua): the per-account loop in the runtime.
 * Scores every account not excluded (nil: unscored), returns the best k highest first
 * (ties in account order), only in select_account; a scoring function with an endless
 * loop is still stopped at max_hook_ms (it runs interpreted inside the runtime's loop). */
TG_TEST(plugin_jit, score_accounts_ranks_and_stays_under_the_budget) {
    make_dir();
    budget = "max_instructions = 0, max_hook_ms = 20";
    write_file("rank.lua",
               "local function score(a, bonus)\n"
               "  if a.id == 'skip' then return nil end\n"
               "  return a.priority * 10 - a.inflight + (a.id == 'b' and bonus or 0)\n"
               "end\n"
               "local function spin(a) while true do end end\n"
               "local function bad(a) return 'high' end\n"
               "return { name = 'rank', priority = 1, version = '1',\n"
               "  on_request = function(ctx)\n"
               "    if ctx:header('x-how') == 'outside' then ctx:score_accounts(score) end\n"
               "  end,\n"
               "  select_account = function(ctx)\n"
               "    local how = ctx:header('x-how')\n"
               "    if how == 'spin' then ctx:score_accounts(spin) end\n"
               "    if how == 'bad' then ctx:score_accounts(bad) end\n"
               "    ctx:exclude(4)\n"
               "    local n, idx, scores = ctx:score_accounts(score, tonumber(how) or 0, 3)\n"
               "    local out = {}\n"
               "    for j = 1, n do out[j] = idx[j] .. '=' .. scores[j] end\n"
               "    ctx:add_header('x-rank', table.concat(out, ','))\n"
               "    ctx:select(idx[n])\n"
               "  end }\n");
    uv_loop_t loop;
    tg_plugins_t *pl = start("{'rank'}", &loop);
    static const char *const hows[] = {"0", "5", "outside", "spin", "bad"};
    for (int round = 0; round < 100; round++) {
        for (size_t w = 0; w < sizeof(hows) / sizeof(hows[0]); w++) {
            if (round > 1 && w >= 2)
                continue; /* the failing ones twice; the good ones hot (compiled) */
            tg_ffi_account_t a[5] = {
                {.id = "a", .id_len = 1, .priority = 1, .inflight = 2},
                {.id = "b", .id_len = 1, .priority = 1, .inflight = 4},
                {.id = "skip", .id_len = 4, .priority = 9},
                {.id = "x", .id_len = 1, .priority = 9},
                {.id = "c", .id_len = 1, .priority = 1, .inflight = 2},
            };
            tg_ffi_header_t h = {"x-how", 5, hows[w], strlen(hows[w])};
            tg_hookctx_t ctx;
            begin(pl, &ctx, "m");
            ctx.headers = &h;
            ctx.nheaders = 1;
            ctx.accounts = a;
            ctx.naccounts = 5;
            int hook = w == 2 ? TG_HOOK_ON_REQUEST : TG_HOOK_SELECT_ACCOUNT;
            uint64_t t0 = tg_now_ns();
            ASSERT_EQ_INT(tg_plugins_run(pl, hook, &ctx), TG_OK);
            ASSERT((tg_now_ns() - t0) / 1000000 < 1000);
            if (w == 0) {
                /* 8, 6, unscored, excluded, 8: the two 8s in account order. */
                ASSERT_EQ_INT(ctx.plugin_errors, 0);
                ASSERT(strstr(ctx.resp_headers, "x-rank: 1=8,5=8,2=6\r\n") != NULL);
                ASSERT_EQ_INT(ctx.selected, 1);
                ASSERT(a[0].score == 8 && a[1].score == 6 && a[2].score == 0 && a[3].score == 0);
            } else if (w == 1) {
                ASSERT_EQ_INT(ctx.plugin_errors, 0);
                ASSERT(strstr(ctx.resp_headers, "x-rank: 2=11,1=8,5=8\r\n") != NULL);
                ASSERT_EQ_INT(ctx.selected, 4);
            } else {
                /* Outside select_account, an endless scoring function, a score that is
                 * not a number: the plugin's error, the hook's fallback. */
                ASSERT_EQ_INT(ctx.plugin_errors, 1);
                if (w == 2)
                    ASSERT(strstr(pl->last_hook_error, "score_accounts disabled in the context of on_request"));
                else if (w == 3)
                    ASSERT(strstr(pl->last_hook_error, "plugin budget exceeded"));
                else
                    ASSERT(strstr(pl->last_hook_error, "returned high for account 1"));
            }
            tg_plugins_end(pl, &ctx);
        }
    }
    stop(pl, &loop);
}

TG_TEST(plugin, sandbox_has_no_io_os_ffi_or_require) {
    make_dir();
    static const char *const probes[] = {
        "local _ = io.open('/etc/passwd')", "os.execute('true')", "require('ffi')", "require('io')",
        "load('return 1')", "string.dump(print)", "getmetatable('').__index.x = 1", "debug.getinfo(1)",
        "jit.off()", "local _ = package.loaded", "setfenv(1, {})", "collectgarbage()",
    };
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        char src[512];
        snprintf(src, sizeof(src),
                 "local ok = pcall(function() %s end)\n"
                 "return { name = 'probe', priority = 1, version = '1',\n"
                 "  on_request = function(ctx) if ok then ctx:reject(500, 'escaped', %s) end end }\n",
                 probes[i], "'x'");
        write_file("probe.lua", src);
        uv_loop_t loop;
        tg_plugins_t *pl = start("{'probe'}", &loop);
        tg_hookctx_t ctx;
        begin(pl, &ctx, "m");
        if (tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &ctx) != TG_OK) {
            fprintf(stderr, "sandbox allowed: %s\n", probes[i]);
            ASSERT(0);
        }
        tg_plugins_end(pl, &ctx);
        stop(pl, &loop);
    }
}

TG_TEST(plugin, generations_swap_and_requests_keep_theirs) {
    make_dir();
    write_file("stamp/handler.lua", stamp_plugin);
    write_file("stamp/schema.lua", stamp_schema);
    uv_loop_t loop;
    tg_plugins_t *pl = start("{'stamp'}", &loop);

    tg_hookctx_t old;
    begin(pl, &old, "m");
    ASSERT_EQ_INT(old.generation, 1);

    /* Generation 2 changes the stamp. */
    char v2[sizeof(stamp_plugin)];
    snprintf(v2, sizeof(v2), "%s", stamp_plugin);
    char *p;
    while ((p = strstr(v2, "V1")) != NULL)
        p[1] = '2';
    write_file("stamp/handler.lua", v2);
    char err[512];
    ASSERT_EQ_INT(tg_plugins_request_reload(err, sizeof(err)), 2);
    pump(&loop);

    tg_hookctx_t fresh;
    begin(pl, &fresh, "m");
    ASSERT_EQ_INT(fresh.generation, 2);
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &fresh), TG_OK);
    ASSERT_EQ_STR(fresh.resp_headers, "x-stamp: V2\r\n");
    /* The request that began on generation 1 is still decided by it. */
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &old), TG_OK);
    ASSERT_EQ_STR(old.resp_headers, "x-stamp: V1\r\n");
    tg_plugins_end(pl, &old);

    /* A syntax error is refused whole; generation 2 keeps serving. */
    write_file("stamp/handler.lua", "return { name = 'stamp', priority = ");
    ASSERT_EQ_INT(tg_plugins_request_reload(err, sizeof(err)), TG_ERROR);
    ASSERT(strstr(err, "plugins.stamp:") != NULL);
    ASSERT(strstr(err, "handler.lua:1:") != NULL);
    pump(&loop);
    tg_hookctx_t after;
    begin(pl, &after, "m");
    ASSERT_EQ_INT(after.generation, 2);
    tg_plugins_end(pl, &after);
    tg_plugins_end(pl, &fresh);

    /* A schema violation too, with a message naming the field. */
    write_file("stamp/handler.lua", stamp_plugin);
    write_file("stamp/schema.lua", "return { fields = { prefix = { type = 'number', default = 'x' } } }");
    ASSERT_EQ_INT(tg_plugins_request_reload(err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "plugins.stamp.schema.prefix (default): expected number, got string");

    char *status = tg_plugins_status_json();
    ASSERT(strstr(status, "\"generation\":2") != NULL);
    ASSERT(strstr(status, "\"ok\":false") != NULL);
    ASSERT(strstr(status, "\"name\":\"stamp\",\"version\":\"V2\"") != NULL);
    free(status);
    stop(pl, &loop);
}

TG_TEST(plugin, select_account_default_and_rejection) {
    make_dir();
    write_file("pin.lua",
               "return { name = 'pin', priority = 1, version = '1',\n"
               "  select_account = function(ctx)\n"
               "    for i = 1, ctx:naccounts() do\n"
               "      if ctx:account(i).region ~= 'eu' then ctx:exclude(i) end\n"
               "    end\n"
               "  end }\n");
    uv_loop_t loop;
    tg_plugins_t *pl = start("{'pin'}", &loop);
    tg_ffi_account_t a[3] = {
        {.id = "a", .id_len = 1, .region = "us", .region_len = 2, .priority = 5},
        {.id = "b", .id_len = 1, .region = "eu", .region_len = 2, .priority = 1, .inflight = 3},
        {.id = "c", .id_len = 1, .region = "eu", .region_len = 2, .priority = 1, .inflight = 1},
    };
    tg_hookctx_t ctx;
    begin(pl, &ctx, "m");
    ctx.accounts = a;
    ctx.naccounts = 3;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_SELECT_ACCOUNT, &ctx), TG_OK);
    ASSERT_EQ_INT(ctx.selected, 2); /* eu only, then least loaded */
    ASSERT_EQ_INT(a[0].excluded, 1);
    tg_plugins_end(pl, &ctx);

    a[0].excluded = 0;
    a[1].region = a[2].region = "us";
    begin(pl, &ctx, "m");
    ctx.accounts = a;
    ctx.naccounts = 3;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_SELECT_ACCOUNT, &ctx), TG_DONE);
    ASSERT_EQ_INT(ctx.reject_status, 503);
    ASSERT_EQ_STR(ctx.reject_code, "no_available_account");
    tg_plugins_end(pl, &ctx);
    stop(pl, &loop);
}

TG_TEST(plugin, missing_plugin_is_named) {
    make_dir();
    tg_plugins_config_t cfg;
    init_with("{'nope'}", &cfg);
    char err[1024];
    ASSERT_EQ_INT(tg_plugins_global_init(&cfg, err, sizeof(err)), TG_ERROR);
    ASSERT(strncmp(err, "plugins.nope: not found in ", 27) == 0);
    tg_plugins_config_free(&cfg);
}

TG_TEST(plugin, shipped_plugins_and_policies_validate) {
    char lua[2048], err[1024];
    snprintf(lua, sizeof(lua),
             "{dirs = {'%s/plugins', '%s/policies'}, enabled = {'model-map', 'router', 'retry-budget',"
             " 'fail-policy', 'pricing', 'cheapest-fast', 'tenant-region', 'business-hours-model'}}",
             TG_SOURCE_DIR, TG_SOURCE_DIR);
    tg_plugins_config_t cfg;
    ASSERT_EQ_INT(parse(lua, &cfg, err, sizeof(err)), TG_OK);
    FILE *out = tmpfile();
    int rc = tg_plugins_check(&cfg, out);
    rewind(out);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof(line), out)) {
        fputs(line, stderr);
        n++;
    }
    fclose(out);
    ASSERT_EQ_INT(rc, 0);
    ASSERT_EQ_INT(n, 8);
    tg_plugins_config_free(&cfg);
}

/* Runs `tollgate policy test ...` with stdout captured; returns the exit code. */
static int workbench(char *out, size_t outlen, const char *const *args, int nargs) {
    char *argv[16] = {"policy", "test"};
    for (int i = 0; i < nargs; i++)
        argv[2 + i] = (char *)args[i];
    char path[300];
    snprintf(path, sizeof(path), "%s/out.txt", dir);
    fflush(stdout);
    int saved = dup(1);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    dup2(fileno(f), 1);
    int rc = tg_policy_test_main(2 + nargs, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(f);
    f = fopen(path, "r");
    size_t n = fread(out, 1, outlen - 1, f);
    out[n] = '\0';
    fclose(f);
    return rc;
}

TG_TEST(plugin, workbench_replays_requests_through_a_policy) {
    make_dir();
    write_file("reqs.jsonl",
               "# comment\n"
               "{\"id\":\"r1\",\"model\":\"gpt-4o\",\"tenant_id\":\"acme\",\"accounts\":["
               "{\"id\":\"us-1\",\"region\":\"us\",\"priority\":5},{\"id\":\"eu-1\",\"region\":\"eu\"}]}\n"
               "{\"id\":\"r2\",\"model\":\"gpt-4o\",\"tenant_id\":\"acme\",\"accounts\":[{\"id\":\"us-1\",\"region\":\"us\"}]}\n");
    char reqs[300], policy[300], out[8192];
    snprintf(reqs, sizeof(reqs), "%s/reqs.jsonl", dir);
    snprintf(policy, sizeof(policy), "%s/policies/tenant-region.lua", TG_SOURCE_DIR);
    const char *args[] = {policy, "--config", "{tenants = {acme = 'eu'}}", "--requests", reqs};
    ASSERT_EQ_INT(workbench(out, sizeof(out), args, 5), 0);
    ASSERT(strstr(out, "r1  model gpt-4o\n  select_account     eu-1 (built-in pick)  [us-1 excluded, eu-1]") != NULL);
    ASSERT(strstr(out, "r2  model gpt-4o\n  select_account     reject 503 no_account_in_region") != NULL);
    ASSERT(strstr(out, "2 requests, 0 plugin errors, 0 bad lines") != NULL);

    /* A policy that throws: its error and fallback are shown, and the exit code is 1. */
    write_file("thrower.lua", "return { name = 'thrower', priority = 1, version = '1',\n"
                              "  map_model = function(ctx) if ctx:tenant_id() == 'acme' then error('oops') end end }\n");
    snprintf(policy, sizeof(policy), "%s/thrower.lua", dir);
    const char *args2[] = {policy, "--requests", reqs};
    ASSERT_EQ_INT(workbench(out, sizeof(out), args2, 3), 1);
    ASSERT(strstr(out, "map_model          ERROR plugins.thrower.map_model:") != NULL);
    ASSERT(strstr(out, "oops; fallback: pass") != NULL);

    /* A bad config is refused before any request runs. */
    snprintf(policy, sizeof(policy), "%s/policies/tenant-region.lua", TG_SOURCE_DIR);
    const char *args3[] = {policy, "--config", "{strict = 'yes'}", "--requests", reqs};
    ASSERT_EQ_INT(workbench(out, sizeof(out), args3, 5), 2);
}

/* A hook one plugin implements is called without the dispatcher: its error is still
 * that plugin's (its fail_closed applies), as with several plugins on one hook; an
 * error object that is not a string is shown through tostring(). */
TG_TEST(plugin, errors_are_charged_to_their_plugin_with_one_or_several_per_hook) {
    make_dir();
    write_file("guard.lua", "return { name = 'guard', priority = 5, version = '1', fail_closed = true,\n"
                            "  on_request = function(ctx) if ctx:header('x-fail') then error('guard down') end end,\n"
                            "  map_model = function(ctx) ctx:set_model('by-guard') end }\n");
    write_file("open.lua", "return { name = 'open', priority = 1, version = '1',\n"
                           "  map_model = function(ctx)\n"
                           "    if ctx:model() == 'by-guard' and ctx:header('x-fail') then\n"
                           "      error(setmetatable({}, { __tostring = function() return 'open says no' end }))\n"
                           "    end\n"
                           "  end,\n"
                           "  price = function(ctx) if ctx:usage().input == 1 then error({}) end end }\n");
    uv_loop_t loop;
    tg_plugins_t *pl = start("{'guard', 'open'}", &loop);
    tg_ffi_header_t h = {"x-fail", 6, "1", 1};
    tg_hookctx_t ctx;

    /* on_request: guard alone, fail_closed: the request is refused with a 500. */
    begin(pl, &ctx, "m");
    ctx.headers = &h;
    ctx.nheaders = 1;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &ctx), TG_DONE);
    ASSERT_EQ_INT(ctx.reject_status, 500);
    ASSERT_EQ_STR(ctx.reject_code, "plugin_error");
    ASSERT_EQ_INT(ctx.plugin_errors, 1);
    tg_plugins_end(pl, &ctx);

    /* map_model: both, the second (not fail_closed) throws a table: model restored. */
    begin(pl, &ctx, "m");
    ctx.headers = &h;
    ctx.nheaders = 1;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &ctx), TG_OK);
    ASSERT_EQ_STR(ctx.model, "m");
    ASSERT_EQ_INT(ctx.reject_status, 0);
    ASSERT_EQ_INT(ctx.plugin_errors, 1);
    /* price: open alone, a table without __tostring: unpriced, counted. */
    ctx.usage_input = 1;
    ctx.usage_known = 1;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_PRICE, &ctx), TG_OK);
    ASSERT_EQ_INT(ctx.cost_nanousd, -1);
    ASSERT_EQ_INT(ctx.plugin_errors, 2);
    tg_plugins_end(pl, &ctx);
    stop(pl, &loop);

    /* The messages, as `tollgate policy test` shows them. */
    write_file("reqs.jsonl", "{\"id\":\"r1\",\"model\":\"m\",\"tenant_id\":\"acme\"}\n");
    write_file("thrower.lua", "return { name = 'thrower', priority = 1, version = '1',\n"
                              "  map_model = function(ctx)\n"
                              "    if ctx:tenant_id() ~= 'acme' then return end\n"
                              "    error(setmetatable({}, { __tostring = function() return 'thrower says no' end }))\n"
                              "  end }\n");
    char reqs[300], policy[300], out[8192];
    snprintf(reqs, sizeof(reqs), "%s/reqs.jsonl", dir);
    snprintf(policy, sizeof(policy), "%s/thrower.lua", dir);
    const char *args[] = {policy, "--requests", reqs};
    ASSERT_EQ_INT(workbench(out, sizeof(out), args, 3), 1);
    ASSERT(strstr(out, "map_model          ERROR plugins.thrower.map_model: thrower says no; fallback") != NULL);
}

TG_TEST(plugin, admin_writes_are_validated_against_the_schema) {
    char lua[512], err[512];
    snprintf(lua, sizeof(lua), "{dirs = {'%s/plugins'}}", TG_SOURCE_DIR);
    tg_plugins_config_t cfg;
    ASSERT_EQ_INT(parse(lua, &cfg, err, sizeof(err)), TG_OK);
    ASSERT_EQ_INT(tg_plugins_validate_config(&cfg, "router", "{top_k = 2, weights = {load = 3}}", err, sizeof(err)),
                  TG_OK);
    ASSERT_EQ_INT(tg_plugins_validate_config(&cfg, "router", "{top_k = 0}", err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "plugins.router.config.top_k: value must be between 1 and 64, got 0");
    ASSERT_EQ_INT(tg_plugins_validate_config(&cfg, "router", "{weights = {lod = 1}}", err, sizeof(err)), TG_ERROR);
    ASSERT_EQ_STR(err, "plugins.router.config.weights.lod: unknown field");
    ASSERT_EQ_INT(tg_plugins_validate_config(&cfg, "router", "{", err, sizeof(err)), TG_ERROR);
    ASSERT(strncmp(err, "plugins.router.config: ", 23) == 0);
    tg_plugins_config_free(&cfg);
}

static const char extra_policy[] =
    "return { name = 'extra', priority = 5, version = '1',\n"
    "  schema = { fields = { v = { type = 'string', default = 'd' } } },\n"
    "  on_request = function(ctx, conf) ctx:add_header('x-extra', conf.v) end }\n";
static const char closed_policy[] =
    "return { name = 'closed', priority = 50, version = '1', fail_closed = true,\n"
    "  schema = { fields = { need = { type = 'string', required = true } } },\n"
    "  on_request = function(ctx, conf) end }\n";

/* A request of group `gid` with setting `text`, its map_model result in ctx->model. */
static void group_req(tg_plugins_t *pl, tg_hookctx_t *ctx, int64_t gid, const char *text) {
    begin(pl, ctx, "m");
    tg_plugins_use_group(pl, ctx, gid, text);
}

TG_TEST(plugin, groups_get_their_own_plugins_and_configs) {
    make_dir();
    write_file("stamp/handler.lua", stamp_plugin);
    write_file("stamp/schema.lua", stamp_schema);
    write_file("extra.lua", extra_policy);
    write_file("closed.lua", closed_policy);
    uv_loop_t loop;
    tg_plugins_t *pl = start("{{name = 'stamp', config = {prefix = 'g/'}}}", &loop);

    /* No setting, or an empty one: the config file's list. */
    tg_hookctx_t g;
    group_req(pl, &g, 7, "{}");
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &g), TG_OK);
    ASSERT_EQ_STR(g.model, "g/m");
    tg_plugins_end(pl, &g);

    /* Group 7 configures stamp its own way and adds a plugin the config file does not enable. */
    const char *a = "{\"stamp\":{\"config\":{\"prefix\":\"a/\"}},\"extra\":{}}";
    tg_hookctx_t r1, r2, r3;
    group_req(pl, &r1, 7, a);
    ASSERT_EQ_INT(r1.generation, 1);
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &r1), TG_OK);
    ASSERT_EQ_STR(r1.resp_headers, "x-stamp: V1\r\nx-extra: d\r\n"); /* priority 10, then 5 */
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &r1), TG_OK);
    ASSERT_EQ_STR(r1.model, "a/m");

    /* Group 8 turns stamp off: no plugin is left. */
    group_req(pl, &r2, 8, "{\"stamp\":{\"enabled\":false}}");
    ASSERT(!tg_plugins_has_hook(pl, &r2, TG_HOOK_ON_REQUEST));
    ASSERT(!tg_plugins_has_hook(pl, &r2, TG_HOOK_MAP_MODEL));
    tg_plugins_end(pl, &r2);

    /* Group 7's setting changes while r1 is in flight: r1 finishes on what it began with. */
    group_req(pl, &r3, 7, "{\"stamp\":{\"config\":{\"prefix\":\"b/\"}}}");
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &r3), TG_OK);
    ASSERT_EQ_STR(r3.model, "b/m");
    ASSERT(tg_plugins_has_hook(pl, &r3, TG_HOOK_ON_REQUEST)); /* stamp's; extra is gone */
    tg_plugins_ctx_set_model(&r1, "m", 1);
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &r1), TG_OK);
    ASSERT_EQ_STR(r1.model, "a/m");
    tg_plugins_end(pl, &r1);
    tg_plugins_end(pl, &r3);

    /* A setting the plugins no longer accept (written behind validation's back): the
     * plugin fails for that group, counted; a fail_closed one answers 500. */
    tg_hookctx_t bad;
    group_req(pl, &bad, 9, "{\"stamp\":{\"config\":{\"prefix\":5}},\"closed\":{}}");
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &bad), TG_DONE);
    ASSERT_EQ_INT(bad.reject_status, 500);
    ASSERT_EQ_INT(bad.plugin_errors, 1);
    ASSERT(!tg_plugins_has_hook(pl, &bad, TG_HOOK_MAP_MODEL)); /* stamp's instance did not load */
    tg_plugins_end(pl, &bad);
    group_req(pl, &bad, 10, "{nope");
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &bad), TG_OK);
    ASSERT_EQ_STR(bad.resp_headers, "x-stamp: V1\r\n"); /* the config file's plugins ran first */
    ASSERT_EQ_INT(bad.plugin_errors, 1);
    tg_plugins_end(pl, &bad);

    /* A reload builds the groups' variants again, from the new code. */
    char v2[sizeof(stamp_plugin)];
    snprintf(v2, sizeof(v2), "%s", stamp_plugin);
    char *p;
    while ((p = strstr(v2, "V1")) != NULL)
        p[1] = '2';
    write_file("stamp/handler.lua", v2);
    char err[512];
    ASSERT_EQ_INT(tg_plugins_request_reload(err, sizeof(err)), 2);
    pump(&loop);
    group_req(pl, &r1, 7, "{\"stamp\":{\"config\":{\"prefix\":\"b/\"}}}");
    ASSERT_EQ_INT(r1.generation, 2);
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &r1), TG_OK);
    ASSERT_EQ_STR(r1.resp_headers, "x-stamp: V2\r\n");
    tg_plugins_end(pl, &r1);
    stop(pl, &loop);
}

/* The shadow disagreements counted at `hook`, from the status document. */
static uint64_t shadow_disagreed(const char *hook) {
    char *doc = tg_plugins_status_json();
    json_t *root = json_loads(doc, 0, NULL);
    free(doc);
    json_t *h = json_object_get(json_object_get(json_object_get(root, "shadow"), "hooks"), hook);
    uint64_t n = (uint64_t)json_integer_value(json_object_get(h, "disagree"));
    json_decref(root);
    return n;
}

static const char shadow_policy[] =
    "return { name = 'shadowy', priority = 1, version = '1',\n"
    "  on_limiter_down = function(ctx) ctx:limiter('open') end,\n"
    "  map_model = function(ctx) ctx:set_model('shadow-model') end,\n"
    "  price = function(ctx) ctx:set_cost(7) end }\n";

TG_TEST(plugin, shadow_plugins_decide_nothing_and_run_on_their_sample) {
    make_dir();
    write_file("stamp/handler.lua", stamp_plugin);
    write_file("stamp/schema.lua", stamp_schema);
    write_file("shadowy.lua", shadow_policy);
    uv_loop_t loop;
    tg_plugins_t *pl = start("{{name = 'stamp', config = {prefix = 'g/'}}}", &loop);
    const char *all = "{\"shadowy\":{\"mode\":\"shadow\"}}";
    tg_hookctx_t r;
    group_req(pl, &r, 7, all);
    /* The live plugin maps the model; the shadow's own mapping stays in its copy. */
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &r), TG_OK);
    ASSERT_EQ_STR(r.model, "g/m");
    /* No live plugin decides the limiter: the configured policy stands for every limit
     * (not "closed", which a context fresh from tg_plugins_begin would say). */
    ASSERT(tg_plugins_has_hook(pl, &r, TG_HOOK_ON_LIMITER_DOWN));
    r.limits = TG_LIMIT_RATE | TG_LIMIT_MONEY;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_LIMITER_DOWN, &r), TG_OK);
    for (int k = 0; k < 4; k++)
        ASSERT_EQ_INT(r.limiter_decision[k], TG_LIMITER_DEFAULT);
    r.usage_known = 3;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_PRICE, &r), TG_OK);
    ASSERT_EQ_INT(r.cost_nanousd, 0); /* the live stamp's price (its usage input), not the shadow's 7 */
    ASSERT_EQ_INT(shadow_disagreed("map_model"), 1);
    ASSERT_EQ_INT(shadow_disagreed("on_limiter_down"), 1);
    ASSERT_EQ_INT(shadow_disagreed("price"), 1);
    tg_plugins_end(pl, &r);
    /* On a sample of 10%: about one request in ten, each request wholly in or out. */
    const char *tenth = "{\"shadowy\":{\"mode\":\"shadow\",\"sample\":0.1}}";
    int ran = 0;
    for (int i = 0; i < 1000; i++) {
        char id[32];
        snprintf(id, sizeof(id), "req-%d", i);
        group_req(pl, &r, 8, tenth);
        r.request_id = id;
        r.request_id_len = strlen(id);
        uint64_t before = shadow_disagreed("map_model");
        tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &r);
        ASSERT_EQ_STR(r.model, "g/m");
        int in = shadow_disagreed("map_model") > before;
        uint64_t pb = shadow_disagreed("price");
        r.usage_known = 3;
        tg_plugins_run(pl, TG_HOOK_PRICE, &r);
        ASSERT_EQ_INT(shadow_disagreed("price") > pb, in);
        ran += in;
        tg_plugins_end(pl, &r);
    }
    ASSERT(ran > 50 && ran < 150);
    stop(pl, &loop);
}

/* The newest disagreement sample of the status document, or "". */
static void last_disagreement(char *out, size_t n) {
    char *doc = tg_plugins_status_json();
    json_t *root = json_loads(doc, 0, NULL);
    free(doc);
    json_t *a = json_object_get(json_object_get(root, "shadow"), "disagreements");
    size_t k = json_array_size(a);
    snprintf(out, n, "%s", k ? json_string_value(json_array_get(a, k - 1)) : "");
    json_decref(root);
}

static const char judge_policy[] =
    "return { name = 'judge', priority = 1, version = '1',\n"
    "  on_request = function(ctx) return ctx:reject(429, 'judged', 'no') end,\n"
    "  map_model = function(ctx) ctx:set_model('judge-model') end,\n"
    "  select_account = function(ctx) ctx:select(3) end,\n"
    "  on_upstream_error = function(ctx) ctx:retry('other', 5) end,\n"
    "  on_limiter_down = function(ctx) ctx:limiter('open', 'money') end,\n"
    "  price = function(ctx) ctx:set_cost(7) end }\n";

/* A disagreement is kept in words (request, group, hook, the live decision, the shadow
 * plugin and its decision) for every hook; each is copied raw on the request and worded
 * when the status is read, the newest 32 kept. */
TG_TEST(plugin, shadow_disagreements_are_kept_in_words) {
    make_dir();
    write_file("stamp/handler.lua", stamp_plugin);
    write_file("stamp/schema.lua", stamp_schema);
    write_file("judge.lua", judge_policy);
    uv_loop_t loop;
    tg_plugins_t *pl = start("{{name = 'stamp', config = {prefix = 'g/'}}}", &loop);
    const char *setting = "{\"judge\":{\"mode\":\"shadow\"}}";
    char text[600];
    tg_hookctx_t r;
    group_req(pl, &r, 9, setting);
    memcpy(r.group, "blue", 5);
    r.group_len = 4;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_REQUEST, &r), TG_OK);
    last_disagreement(text, sizeof(text));
    ASSERT_EQ_STR(text, "request req-1, group blue, on_request: live model m, group blue; shadow judge: reject 429 judged");
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &r), TG_OK);
    last_disagreement(text, sizeof(text));
    ASSERT_EQ_STR(text, "request req-1, group blue, map_model: live model g/m, group blue; shadow judge: model "
                        "judge-model, group blue");
    tg_ffi_account_t a[3] = {
        {.id = "acct-a", .id_len = 6, .region = "us", .region_len = 2, .priority = 5},
        {.id = "acct-b", .id_len = 6, .region = "eu", .region_len = 2, .priority = 1},
        {.id = "acct-c", .id_len = 6, .region = "eu", .region_len = 2, .priority = 1},
    };
    r.accounts = a;
    r.naccounts = 3;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_SELECT_ACCOUNT, &r), TG_OK);
    ASSERT_EQ_INT(r.selected, -1); /* no live plugin: the core takes its first candidate */
    last_disagreement(text, sizeof(text));
    ASSERT_EQ_STR(text, "request req-1, group blue, select_account: live account acct-a; shadow judge: account acct-c");
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_UPSTREAM_ERROR, &r), TG_OK);
    ASSERT_EQ_INT(r.retry_action, TG_RETRY_GIVE_UP);
    last_disagreement(text, sizeof(text));
    ASSERT_EQ_STR(text, "request req-1, group blue, on_upstream_error: live give up; shadow judge: retry other");
    r.limits = TG_LIMIT_RATE | TG_LIMIT_MONEY;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_ON_LIMITER_DOWN, &r), TG_OK);
    last_disagreement(text, sizeof(text));
    ASSERT_EQ_STR(text, "request req-1, group blue, on_limiter_down: live rate default, money default; shadow judge: "
                        "rate default, money open");
    r.usage_known = 3;
    ASSERT_EQ_INT(tg_plugins_run(pl, TG_HOOK_PRICE, &r), TG_OK);
    last_disagreement(text, sizeof(text));
    ASSERT_EQ_STR(text, "request req-1, group blue, price: live cost 0 nano-USD; shadow judge: cost 7 nano-USD");
    tg_plugins_end(pl, &r);
    /* The newest 32, oldest first. */
    for (int i = 0; i < 40; i++) {
        char id[32];
        snprintf(id, sizeof(id), "req-n%d", i);
        group_req(pl, &r, 9, setting);
        r.request_id = id;
        r.request_id_len = strlen(id);
        tg_plugins_run(pl, TG_HOOK_MAP_MODEL, &r);
        tg_plugins_end(pl, &r);
    }
    char *doc = tg_plugins_status_json();
    json_t *root = json_loads(doc, 0, NULL);
    free(doc);
    json_t *all = json_object_get(json_object_get(root, "shadow"), "disagreements");
    ASSERT_EQ_INT(json_array_size(all), 32);
    ASSERT(strncmp(json_string_value(json_array_get(all, 0)), "request req-n8, ", 16) == 0);
    ASSERT(strncmp(json_string_value(json_array_get(all, 31)), "request req-n39, ", 17) == 0);
    json_decref(root);
    stop(pl, &loop);
}

TG_TEST(plugin, group_settings_are_validated_naming_the_field) {
    make_dir();
    write_file("stamp/handler.lua", stamp_plugin);
    write_file("stamp/schema.lua", stamp_schema);
    tg_plugins_config_t cfg;
    init_with("{'stamp'}", &cfg);
    char err[512];
    static const struct {
        const char *json, *err;
    } cases[] = {
        {"{}", NULL},
        {"{\"stamp\":{\"config\":{\"prefix\":\"x/\"}}}", NULL},
        {"{\"stamp\":{\"enabled\":false}}", NULL},
        {"[]", "plugins: expected an object"},
        {"{\"stamp\":{\"config\":{\"prefix\":5}}}", "plugins.stamp.config.prefix: expected string, got number"},
        {"{\"stamp\":{\"config\":{\"prefix\":null}}}", "plugins.stamp.config.prefix: null is not a value"},
        {"{\"stamp\":{\"config\":[1]}}", "plugins.stamp.config: expected an object"},
        {"{\"stamp\":{\"on\":true}}", "plugins.stamp: unknown key \"on\" (expected enabled, mode, sample, config)"},
        {"{\"ghost\":{\"enabled\":false}}", "plugins.ghost: not found in"},
        {"{\"a.b\":{}}", "plugins.a.b: a plugin name holds only"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = tg_plugins_validate_group(&cfg, cases[i].json, strlen(cases[i].json), err, sizeof(err));
        if (!cases[i].err) {
            if (rc != TG_OK)
                fprintf(stderr, "%s: %s\n", cases[i].json, err);
            ASSERT_EQ_INT(rc, TG_OK);
        } else {
            ASSERT_EQ_INT(rc, TG_ERROR);
            if (strncmp(err, cases[i].err, strlen(cases[i].err)) != 0)
                fprintf(stderr, "%s: got %s\n", cases[i].json, err);
            ASSERT(strncmp(err, cases[i].err, strlen(cases[i].err)) == 0);
        }
    }
    /* 40 levels of arrays: parsed, then refused by the depth bound, naming the path. */
    char deep[256] = "{\"stamp\":{\"config\":{\"prefix\":";
    for (int i = 0; i < 40; i++)
        strcat(deep, "[");
    strcat(deep, "1");
    for (int i = 0; i < 40; i++)
        strcat(deep, "]");
    strcat(deep, "}}}");
    ASSERT_EQ_INT(tg_plugins_validate_group(&cfg, deep, strlen(deep), err, sizeof(err)), TG_ERROR);
    ASSERT(strncmp(err, "plugins.stamp.config.prefix[1][1]", 33) == 0);
    ASSERT(strstr(err, "nested too deeply (more than 32 levels)") != NULL);
    tg_plugins_config_free(&cfg);
}

/* Workers' states are built on the main thread and run on their own: the watchdog
 * must interrupt the thread that runs the call, not the one that built the state. */
static tg_plugins_t *spin_pl;
static int spin_errors;
static void spin_thread(void *arg) {
    TG_UNUSED(arg);
    tg_ffi_header_t h = {"x-spin", 6, "1", 1};
    tg_hookctx_t ctx;
    begin(spin_pl, &ctx, "m");
    ctx.headers = &h;
    ctx.nheaders = 1;
    tg_plugins_run(spin_pl, TG_HOOK_ON_REQUEST, &ctx);
    spin_errors = ctx.plugin_errors;
    tg_plugins_end(spin_pl, &ctx);
}

TG_TEST(plugin, watchdog_interrupts_the_thread_running_the_call) {
    make_dir();
    budget = "max_instructions = 0, max_hook_ms = 20";
    write_file("spin.lua", "return { name = 'spin', priority = 1, version = '1',\n"
                           "  on_request = function(ctx) if ctx:header('x-spin') then while true do end end end }\n");
    uv_loop_t loop;
    spin_pl = start("{'spin'}", &loop);
    uv_thread_t t;
    ASSERT(uv_thread_create(&t, spin_thread, NULL) == 0);
    ASSERT(uv_thread_join(&t) == 0);
    ASSERT_EQ_INT(spin_errors, 1);
    stop(spin_pl, &loop);
}
