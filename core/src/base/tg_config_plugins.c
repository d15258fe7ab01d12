/*
 * The `plugins = {...}` section of the config file (tg_plugins_config_t, tg_config.h):
 * plugin folders, the enabled plugins with their configs written back as Lua table
 * constructors, the watch flag and the per-hook budgets. Only the parse lives here, with
 * the rest of the config; what the section means at run time is the plugin runtime's
 * (policy/tg_plugin_global.c).
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tollgate/tg_config.h"

/* What a policy may read and a capture may keep by default: nothing that authenticates. */
static const char *const default_headers[] = {"user-agent", "anthropic-version", "anthropic-beta", "x-tenant",
                                              "x-tier", "x-region", NULL};

static void capture_defaults(tg_capture_config_t *c) {
    memset(c, 0, sizeof(*c));
    c->max_per_s = 50;
    c->file = strdup("var/capture.jsonl");
    c->max_bytes = 64L << 20;
    c->keep = 2;
    size_t n = 0;
    while (default_headers[n])
        n++;
    c->headers = calloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        c->headers[i] = strdup(default_headers[i]);
    c->nheaders = n;
}

static void capture_free(tg_capture_config_t *c) {
    free(c->file);
    for (size_t i = 0; i < c->nheaders; i++)
        free(c->headers[i]);
    free(c->headers);
    for (size_t i = 0; i < c->ngroups; i++)
        free(c->groups[i].name);
    free(c->groups);
    memset(c, 0, sizeof(*c));
}

void tg_plugins_config_defaults(tg_plugins_config_t *out) {
    memset(out, 0, sizeof(*out));
    out->dirs = calloc(3, sizeof(char *));
    out->dirs[0] = strdup("plugins");
    out->dirs[1] = strdup("policies");
    out->ndirs = 2;
    out->watch = 1;
    out->max_instructions = 0;
    out->max_hook_ms = 50;
    capture_defaults(&out->capture);
}

void tg_plugins_config_free(tg_plugins_config_t *cfg) {
    for (size_t i = 0; i < cfg->ndirs; i++)
        free(cfg->dirs[i]);
    free(cfg->dirs);
    for (size_t i = 0; i < cfg->nenabled; i++) {
        free(cfg->enabled[i].name);
        free(cfg->enabled[i].config_lua);
    }
    free(cfg->enabled);
    free(cfg->store);
    capture_free(&cfg->capture);
    memset(cfg, 0, sizeof(*cfg));
}

void tg_config_lua_quote(tg_buf_t *b, const char *s, size_t n) {
    tg_buf_appends(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            tg_buf_printf(b, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            tg_buf_printf(b, "\\%03u", c);
        else
            tg_buf_append(b, &s[i], 1);
    }
    tg_buf_appends(b, "\"");
}

/* Writes the Lua value at `idx` as a Lua constructor. Only data: no functions. */
static int serialize(lua_State *L, int idx, tg_buf_t *b, const char *path, int depth, char *err, size_t errlen) {
    idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
    switch (lua_type(L, idx)) {
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        tg_config_lua_quote(b, s, n);
        return TG_OK;
    }
    case LUA_TNUMBER:
        tg_buf_printf(b, "%.17g", lua_tonumber(L, idx));
        return TG_OK;
    case LUA_TBOOLEAN:
        tg_buf_appends(b, lua_toboolean(L, idx) ? "true" : "false");
        return TG_OK;
    case LUA_TTABLE:
        break;
    default:
        return tg_err_at(err, errlen, "config: ", path, "expected data (string, number, boolean, table), got %s",
                     luaL_typename(L, idx));
    }
    if (depth > 32)
        return tg_err_at(err, errlen, "config: ", path, "nested too deeply");
    tg_buf_appends(b, "{");
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        char sub[512];
        int kt = lua_type(L, -2);
        if (kt == LUA_TSTRING) {
            snprintf(sub, sizeof(sub), "%s.%s", path, lua_tostring(L, -2));
        } else if (kt == LUA_TNUMBER) {
            snprintf(sub, sizeof(sub), "%s[%g]", path, lua_tonumber(L, -2));
        } else {
            lua_pop(L, 2);
            return tg_err_at(err, errlen, "config: ", path, "table keys must be strings or numbers");
        }
        tg_buf_appends(b, "[");
        lua_pushvalue(L, -2);
        int rc = serialize(L, -1, b, sub, depth + 1, err, errlen);
        lua_pop(L, 1);
        tg_buf_appends(b, "]=");
        rc = rc ?: serialize(L, -1, b, sub, depth + 1, err, errlen);
        if (rc) {
            lua_pop(L, 2);
            return rc;
        }
        tg_buf_appends(b, ",");
        lua_pop(L, 1);
    }
    tg_buf_appends(b, "}");
    return TG_OK;
}

static int parse_enabled(lua_State *L, int t, tg_plugins_config_t *out, char *err, size_t errlen) {
    if (!lua_istable(L, t))
        return tg_err_at(err, errlen, "config: ", "plugins.enabled", "expected a list of {name=..., config={...}}, got %s",
                     luaL_typename(L, t));
    size_t n = lua_objlen(L, t);
    out->enabled = calloc(n + 1, sizeof(*out->enabled));
    for (size_t i = 1; i <= n; i++) {
        char path[64];
        snprintf(path, sizeof(path), "plugins.enabled[%zu]", i);
        lua_rawgeti(L, t, (int)i);
        int e = lua_gettop(L);
        if (lua_type(L, e) == LUA_TSTRING) {
            /* Shorthand: "model-map" means {name = "model-map"}. */
            for (size_t k = 0; k < out->nenabled; k++)
                if (!strcmp(out->enabled[k].name, lua_tostring(L, e))) {
                    int rc = tg_err_at(err, errlen, "config: ", path, "name: \"%s\" is enabled twice", lua_tostring(L, e));
                    lua_pop(L, 1);
                    return rc;
                }
            out->enabled[out->nenabled].name = strdup(lua_tostring(L, e));
            out->enabled[out->nenabled++].config_lua = strdup("{}");
            lua_pop(L, 1);
            continue;
        }
        if (!lua_istable(L, e)) {
            lua_pop(L, 1);
            return tg_err_at(err, errlen, "config: ", path, "expected {name=..., config={...}}, got %s", luaL_typename(L, e));
        }
        lua_pushnil(L);
        while (lua_next(L, e)) {
            lua_pop(L, 1);
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?";
            if (strcmp(k, "name") != 0 && strcmp(k, "config") != 0) {
                char key[128];
                snprintf(key, sizeof(key), "%s", k);
                lua_pop(L, 2);
                return tg_err_at(err, errlen, "config: ", path, "unknown key \"%s\" (expected name, config)", key);
            }
        }
        lua_getfield(L, e, "name");
        if (lua_type(L, -1) != LUA_TSTRING) {
            const char *tn = luaL_typename(L, -1);
            lua_pop(L, 2);
            return tg_err_at(err, errlen, "config: ", path, "name: expected string, got %s", tn);
        }
        const char *name = lua_tostring(L, -1);
        for (const char *c = name; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_')) {
                lua_pop(L, 2);
                return tg_err_at(err, errlen, "config: ", path, "name: \"%s\" may hold only a-z, 0-9, - and _", name);
            }
        for (size_t k = 0; k < out->nenabled; k++)
            if (!strcmp(out->enabled[k].name, name)) {
                lua_pop(L, 2);
                return tg_err_at(err, errlen, "config: ", path, "name: \"%s\" is enabled twice", name);
            }
        tg_plugin_enable_t *pe = &out->enabled[out->nenabled++];
        pe->name = strdup(name);
        lua_pop(L, 1);
        lua_getfield(L, e, "config");
        tg_buf_t b;
        tg_buf_init(&b);
        char cpath[160];
        snprintf(cpath, sizeof(cpath), "plugins.%s.config", name);
        int rc = TG_OK;
        if (lua_isnil(L, -1))
            tg_buf_appends(&b, "{}");
        else if (!lua_istable(L, -1))
            rc = tg_err_at(err, errlen, "config: ", cpath, "expected table, got %s", luaL_typename(L, -1));
        else
            rc = serialize(L, -1, &b, cpath, 0, err, errlen);
        pe->config_lua = strdup(b.data ? b.data : "{}");
        tg_buf_free(&b);
        lua_pop(L, 2);
        if (rc)
            return rc;
    }
    return TG_OK;
}

/* A number field of the capture table: absent keeps *out; else within [lo, hi]. */
static int capture_num(lua_State *L, int t, const char *k, double lo, double hi, int whole, double *out, char *err,
                       size_t errlen) {
    lua_getfield(L, t, k);
    int rc = TG_OK;
    if (!lua_isnil(L, -1)) {
        double v = lua_tonumber(L, -1);
        char path[64];
        snprintf(path, sizeof(path), "plugins.capture.%s", k);
        if (lua_type(L, -1) != LUA_TNUMBER || v < lo || v > hi || (whole && v != (double)(long)v))
            rc = tg_err_at(err, errlen, "config: ", path, "expected a %s from %g to %g", whole ? "whole number" : "number",
                           lo, hi);
        else
            *out = v;
    }
    lua_pop(L, 1);
    return rc;
}

/* Headers that carry credentials are never recorded, whatever the allow list says. */
static int secret_header(const char *h) {
    static const char *const secrets[] = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie",
                                          "set-cookie", "x-goog-api-key", NULL};
    for (const char *const *s = secrets; *s; s++)
        if (!strcasecmp(h, *s))
            return 1;
    return 0;
}

static int parse_capture(lua_State *L, int t, tg_capture_config_t *c, char *err, size_t errlen) {
    if (!lua_istable(L, t))
        return tg_err_at(err, errlen, "config: ", "plugins.capture", "expected table, got %s", luaL_typename(L, t));
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?";
        static const char *const capture_keys[] = {"rate", "max_per_s", "file", "max_bytes",
                                                   "keep", "headers", "groups", NULL};
        int ok = 0;
        for (const char *const *a = capture_keys; *a; a++)
            ok |= strcmp(*a, k) == 0;
        if (!ok) {
            char path[160];
            snprintf(path, sizeof(path), "plugins.capture.%s", k);
            lua_pop(L, 1);
            return tg_err_at(err, errlen, "config: ", path, "unknown key (expected rate, max_per_s, file, max_bytes, "
                                                           "keep, headers, groups)");
        }
    }
    double v;
    v = c->rate;
    if (capture_num(L, t, "rate", 0, 1, 0, &v, err, errlen))
        return TG_ERROR;
    c->rate = v;
    v = c->max_per_s;
    if (capture_num(L, t, "max_per_s", 1, 100000, 1, &v, err, errlen))
        return TG_ERROR;
    c->max_per_s = (int)v;
    v = (double)c->max_bytes;
    if (capture_num(L, t, "max_bytes", 4096, 1e12, 1, &v, err, errlen))
        return TG_ERROR;
    c->max_bytes = (long)v;
    v = c->keep;
    if (capture_num(L, t, "keep", 0, 100, 1, &v, err, errlen))
        return TG_ERROR;
    c->keep = (int)v;
    lua_getfield(L, t, "file");
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING || !lua_objlen(L, -1)) {
            lua_pop(L, 1);
            return tg_err_at(err, errlen, "config: ", "plugins.capture.file", "expected a file name");
        }
        free(c->file);
        c->file = strdup(lua_tostring(L, -1));
    }
    lua_pop(L, 1);
    lua_getfield(L, t, "headers");
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1)) {
            lua_pop(L, 1);
            return tg_err_at(err, errlen, "config: ", "plugins.capture.headers", "expected a list of header names");
        }
        for (size_t i = 0; i < c->nheaders; i++)
            free(c->headers[i]);
        free(c->headers);
        size_t n = lua_objlen(L, -1);
        c->headers = calloc(n + 1, sizeof(char *));
        c->nheaders = 0;
        for (size_t i = 1; i <= n; i++) {
            lua_rawgeti(L, -1, (int)i);
            char path[64];
            snprintf(path, sizeof(path), "plugins.capture.headers[%zu]", i);
            if (lua_type(L, -1) != LUA_TSTRING || !lua_objlen(L, -1) || lua_objlen(L, -1) > 64) {
                lua_pop(L, 2);
                return tg_err_at(err, errlen, "config: ", path, "expected a header name");
            }
            if (secret_header(lua_tostring(L, -1))) {
                int rc = tg_err_at(err, errlen, "config: ", path,
                                   "\"%s\" carries a credential and is never recorded", lua_tostring(L, -1));
                lua_pop(L, 2);
                return rc;
            }
            char *h = strdup(lua_tostring(L, -1));
            for (char *x = h; *x; x++)
                *x = (char)(*x >= 'A' && *x <= 'Z' ? *x + 32 : *x);
            c->headers[c->nheaders++] = h;
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    lua_getfield(L, t, "groups");
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1)) {
            lua_pop(L, 1);
            return tg_err_at(err, errlen, "config: ", "plugins.capture.groups", "expected {<group name> = rate, ...}");
        }
        int g = lua_gettop(L);
        size_t cap = 0;
        lua_pushnil(L);
        while (lua_next(L, g)) {
            char path[160];
            snprintf(path, sizeof(path), "plugins.capture.groups.%.64s",
                     lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?");
            double r = lua_tonumber(L, -1);
            if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TNUMBER || r < 0 || r > 1) {
                lua_pop(L, 3);
                return tg_err_at(err, errlen, "config: ", path, "expected a rate from 0 to 1");
            }
            if (c->ngroups == cap) {
                cap = cap ? cap * 2 : 4;
                c->groups = realloc(c->groups, cap * sizeof(*c->groups));
            }
            c->groups[c->ngroups].name = strdup(lua_tostring(L, -2));
            c->groups[c->ngroups++].rate = r;
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    return TG_OK;
}

int tg_plugins_config_from_lua(lua_State *L, int idx, tg_plugins_config_t *out, char *err, size_t errlen) {
    tg_plugins_config_defaults(out);
    int t = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
    int rc = TG_OK;
    if (!lua_istable(L, t)) {
        rc = tg_err_at(err, errlen, "config: ", "plugins", "expected table, got %s", luaL_typename(L, t));
        goto done;
    }
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "?";
        static const char *const keys[] = {"dirs",        "enabled", "watch", "max_instructions",
                                           "max_hook_ms", "capture", "store",   NULL};
        int ok = 0;
        for (const char *const *a = keys; *a; a++)
            ok |= strcmp(*a, k) == 0;
        if (!ok) {
            char path[160];
            snprintf(path, sizeof(path), "plugins.%s", k);
            lua_pop(L, 1);
            rc = tg_err_at(err, errlen, "config: ", path, "unknown key");
            goto done;
        }
    }
    lua_getfield(L, t, "dirs");
    if (!lua_isnil(L, -1)) {
        if (!lua_istable(L, -1)) {
            rc = tg_err_at(err, errlen, "config: ", "plugins.dirs", "expected a list of folders, got %s", luaL_typename(L, -1));
            lua_pop(L, 1);
            goto done;
        }
        for (size_t i = 0; i < out->ndirs; i++)
            free(out->dirs[i]);
        free(out->dirs);
        size_t n = lua_objlen(L, -1);
        out->dirs = calloc(n + 1, sizeof(char *));
        out->ndirs = 0;
        for (size_t i = 1; i <= n; i++) {
            lua_rawgeti(L, -1, (int)i);
            if (lua_type(L, -1) != LUA_TSTRING) {
                char path[64];
                snprintf(path, sizeof(path), "plugins.dirs[%zu]", i);
                rc = tg_err_at(err, errlen, "config: ", path, "expected string, got %s", luaL_typename(L, -1));
                lua_pop(L, 2);
                goto done;
            }
            out->dirs[out->ndirs++] = strdup(lua_tostring(L, -1));
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    lua_getfield(L, t, "watch");
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TBOOLEAN)
            rc = tg_err_at(err, errlen, "config: ", "plugins.watch", "expected boolean, got %s", luaL_typename(L, -1));
        out->watch = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    if (rc)
        goto done;
    lua_getfield(L, t, "max_instructions");
    if (!lua_isnil(L, -1)) {
        double v = lua_tonumber(L, -1);
        if (lua_type(L, -1) != LUA_TNUMBER || v != (double)(long)v || (v != 0 && v < 1000) || v > 1e10)
            rc = tg_err_at(err, errlen, "config: ", "plugins.max_instructions", "expected 0 (off) or a whole number from 1000 to 1e10");
        out->max_instructions = (long)v;
    }
    lua_pop(L, 1);
    if (rc)
        goto done;
    lua_getfield(L, t, "max_hook_ms");
    if (!lua_isnil(L, -1)) {
        double v = lua_tonumber(L, -1);
        if (lua_type(L, -1) != LUA_TNUMBER || v != (double)(int)v || v < 1 || v > 60000)
            rc = tg_err_at(err, errlen, "config: ", "plugins.max_hook_ms", "expected a whole number from 1 to 60000");
        out->max_hook_ms = (int)v;
    }
    lua_pop(L, 1);
    if (rc)
        goto done;
    lua_getfield(L, t, "enabled");
    if (!lua_isnil(L, -1))
        rc = parse_enabled(L, lua_gettop(L), out, err, errlen);
    lua_pop(L, 1);
    if (rc)
        goto done;
    lua_getfield(L, t, "capture");
    if (!lua_isnil(L, -1))
        rc = parse_capture(L, lua_gettop(L), &out->capture, err, errlen);
    lua_pop(L, 1);
    if (rc)
        goto done;
    /* The workbench's folder: written by the gateway from Postgres, searched last. */
    lua_getfield(L, t, "store");
    if (!lua_isnil(L, -1)) {
        size_t n = 0;
        const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &n) : NULL;
        if (!s || !n || n > 1024) {
            rc = tg_err_at(err, errlen, "config: ", "plugins.store", "expected a folder name (a string)");
        } else {
            int listed = 0;
            for (size_t i = 0; i < out->ndirs; i++)
                listed |= !strcmp(out->dirs[i], s);
            if (listed) {
                /* The gateway removes the files there that Postgres does not hold. */
                rc = tg_err_at(err, errlen, "config: ", "plugins.store",
                               "must be a folder of its own, not one of plugins.dirs (the gateway writes it from "
                               "Postgres and removes what is not stored there)");
            } else {
                out->store = strdup(s);
                out->dirs = realloc(out->dirs, (out->ndirs + 2) * sizeof(char *));
                out->dirs[out->ndirs++] = strdup(s);
                out->dirs[out->ndirs] = NULL;
            }
        }
    }
    lua_pop(L, 1);
done:
    if (rc)
        tg_plugins_config_free(out);
    return rc;
}
