/*
 * Reading the Lua config file. The file runs in a fresh LuaJIT state with the standard
 * libraries (so os.getenv works) and must return a table; every key is checked here,
 * unknown keys are refused so a typo never silently falls back to a default.
 */
#include "tollgate/tg_config.h"

#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_valid.h"

typedef struct {
    lua_State *L;
    char *err;
    size_t errlen;
    const char *prefix; /* "" or "upstream." etc. for messages */
} cfg_ctx;

static int fail(cfg_ctx *c, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(cfg_ctx *c, const char *key, const char *fmt, ...) {
    int n = snprintf(c->err, c->errlen, "config: %s%s: ", c->prefix, key);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < c->errlen)
        vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return TG_ERROR;
}

/* Reads t[key] (t at stack top) as a string; absent leaves *out unchanged. */
static int get_str(cfg_ctx *c, const char *key, char **out) {
    lua_getfield(c->L, -1, key);
    int rc = TG_OK;
    if (lua_isnil(c->L, -1)) {
    } else if (lua_type(c->L, -1) == LUA_TSTRING) {
        free(*out);
        *out = strdup(lua_tostring(c->L, -1));
    } else {
        rc = fail(c, key, "must be a string, got %s", luaL_typename(c->L, -1));
    }
    lua_pop(c->L, 1);
    return rc;
}

static int get_int(cfg_ctx *c, const char *key, int *out, long lo, long hi) {
    lua_getfield(c->L, -1, key);
    int rc = TG_OK;
    if (lua_isnil(c->L, -1)) {
    } else if (lua_type(c->L, -1) == LUA_TNUMBER) {
        double v = lua_tonumber(c->L, -1);
        if (v != (double)(long)v || v < lo || v > hi)
            rc = fail(c, key, "must be a whole number from %ld to %ld, got %g", lo, hi, v);
        else
            *out = (int)v;
    } else {
        rc = fail(c, key, "must be a number, got %s", luaL_typename(c->L, -1));
    }
    lua_pop(c->L, 1);
    return rc;
}

static int get_size(cfg_ctx *c, const char *key, size_t *out, double lo, double hi) {
    lua_getfield(c->L, -1, key);
    int rc = TG_OK;
    if (lua_isnil(c->L, -1)) {
    } else if (lua_type(c->L, -1) == LUA_TNUMBER) {
        double v = lua_tonumber(c->L, -1);
        if (v != (double)(long long)v || v < lo || v > hi)
            rc = fail(c, key, "must be a whole number from %.0f to %.0f, got %g", lo, hi, v);
        else
            *out = (size_t)v;
    } else {
        rc = fail(c, key, "must be a number, got %s", luaL_typename(c->L, -1));
    }
    lua_pop(c->L, 1);
    return rc;
}

static int get_bool(cfg_ctx *c, const char *key, int *out) {
    lua_getfield(c->L, -1, key);
    int rc = TG_OK;
    if (lua_isnil(c->L, -1)) {
    } else if (lua_type(c->L, -1) == LUA_TBOOLEAN) {
        *out = lua_toboolean(c->L, -1);
    } else {
        rc = fail(c, key, "must be true or false, got %s", luaL_typename(c->L, -1));
    }
    lua_pop(c->L, 1);
    return rc;
}

/* Refuses keys of the table at stack top that are not in `allowed` (NULL-terminated). */
static int check_keys(cfg_ctx *c, const char *const *allowed) {
    lua_pushnil(c->L);
    while (lua_next(c->L, -2)) {
        lua_pop(c->L, 1);
        if (lua_type(c->L, -1) != LUA_TSTRING) {
            lua_pop(c->L, 1);
            return fail(c, "?", "keys must be strings");
        }
        const char *k = lua_tostring(c->L, -1);
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            ok |= strcmp(*a, k) == 0;
        if (!ok) {
            char key[128];
            snprintf(key, sizeof(key), "%s", k);
            lua_pop(c->L, 1);
            return fail(c, key, "unknown key");
        }
    }
    return TG_OK;
}

int tg_config_parse_hostport(const char *s, char **host, int *port) {
    const char *colon;
    const char *h = s;
    size_t hlen;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':')
            return TG_ERROR;
        h = s + 1;
        hlen = (size_t)(end - h);
        colon = end + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return TG_ERROR;
        hlen = (size_t)(colon - s);
    }
    char *endp;
    errno = 0;
    long p = strtol(colon + 1, &endp, 10);
    if (errno || *endp || colon[1] == '\0' || p < 0 || p > 65535 || hlen == 0)
        return TG_ERROR;
    *host = strndup(h, hlen);
    *port = (int)p;
    return TG_OK;
}

static int get_listen(cfg_ctx *c, const char *key, char **host, int *port) {
    char *s = NULL;
    if (get_str(c, key, &s) != TG_OK)
        return TG_ERROR;
    if (!s)
        return TG_OK;
    free(*host);
    *host = NULL;
    int rc = tg_config_parse_hostport(s, host, port);
    if (rc != TG_OK)
        fail(c, key, "must be \"host:port\", got \"%s\"", s);
    free(s);
    return rc;
}

static int load_upstream(cfg_ctx *c, tg_upstream_config_t *u) {
    static const char *const keys[] = {"url", "api_key", "provider", "ca_file", "tls_verify",
                                       "connect_timeout_ms", "first_byte_timeout_ms",
                                       "idle_timeout_ms", "pool_idle_ms", "max_idle_conns", NULL};
    c->prefix = "upstream.";
    int rc = check_keys(c, keys);
    rc = rc ?: get_str(c, "url", &u->url);
    rc = rc ?: get_str(c, "api_key", &u->api_key);
    rc = rc ?: get_str(c, "provider", &u->provider);
    rc = rc ?: get_str(c, "ca_file", &u->ca_file);
    rc = rc ?: get_bool(c, "tls_verify", &u->tls_verify);
    rc = rc ?: get_int(c, "connect_timeout_ms", &u->connect_timeout_ms, 1, 600000);
    rc = rc ?: get_int(c, "first_byte_timeout_ms", &u->first_byte_timeout_ms, 1, 3600000);
    rc = rc ?: get_int(c, "idle_timeout_ms", &u->idle_timeout_ms, 1, 3600000);
    rc = rc ?: get_int(c, "pool_idle_ms", &u->pool_idle_ms, 1, 3600000);
    rc = rc ?: get_int(c, "max_idle_conns", &u->max_idle_conns, 0, 100000);
    if (rc)
        return rc;
    if (!u->url)
        return fail(c, "url", "is required");
    const char *why = tg_valid_base_url(u->url, strlen(u->url));
    if (why)
        return fail(c, "url", "must be an http:// or https:// URL with a host: it %s", why);
    if (u->api_key && (why = tg_valid_no_ctl(u->api_key, strlen(u->api_key))) != NULL)
        return fail(c, "api_key", "%s", why);
    if (strcmp(u->provider, "openai") != 0 && strcmp(u->provider, "anthropic") != 0)
        return fail(c, "provider", "must be \"openai\" or \"anthropic\", got \"%s\"", u->provider);
    c->prefix = "";
    return TG_OK;
}

static int load_http_limits(cfg_ctx *c, tg_http_limits_t *l) {
    static const char *const keys[] = {"max_header_bytes", "max_body_bytes", "header_timeout_ms",
                                       "body_timeout_ms", "idle_timeout_ms", "shutdown_timeout_ms",
                                       "drain_delay_ms", "write_timeout_ms", "max_write_buffer", NULL};
    c->prefix = "limits.";
    int rc = check_keys(c, keys);
    rc = rc ?: get_size(c, "max_header_bytes", &l->max_header_bytes, 1024, 1048576);
    rc = rc ?: get_size(c, "max_body_bytes", &l->max_body_bytes, 1024, 1073741824.0);
    rc = rc ?: get_int(c, "header_timeout_ms", &l->header_timeout_ms, 1, 3600000);
    rc = rc ?: get_int(c, "body_timeout_ms", &l->body_timeout_ms, 1, 3600000);
    rc = rc ?: get_int(c, "idle_timeout_ms", &l->idle_timeout_ms, 1, 3600000);
    rc = rc ?: get_int(c, "shutdown_timeout_ms", &l->shutdown_timeout_ms, 0, 3600000);
    rc = rc ?: get_int(c, "drain_delay_ms", &l->drain_delay_ms, 0, 3600000);
    rc = rc ?: get_int(c, "write_timeout_ms", &l->write_timeout_ms, 1, 3600000);
    rc = rc ?: get_size(c, "max_write_buffer", &l->max_write_buffer, 4096, 1073741824.0);
    if (rc == TG_OK)
        c->prefix = "";
    return rc;
}

static int load_tls(cfg_ctx *c, tg_config_t *cfg) {
    static const char *const keys[] = {"listen", "cert", "key", NULL};
    c->prefix = "tls.";
    int rc = check_keys(c, keys);
    rc = rc ?: get_listen(c, "listen", &cfg->tls_listen_host, &cfg->tls_listen_port);
    rc = rc ?: get_str(c, "cert", &cfg->tls_cert);
    rc = rc ?: get_str(c, "key", &cfg->tls_key);
    if (rc)
        return rc;
    if (!cfg->tls_listen_host)
        return fail(c, "listen", "is required when tls is set");
    if (!cfg->tls_cert)
        return fail(c, "cert", "is required when tls is set");
    if (!cfg->tls_key)
        return fail(c, "key", "is required when tls is set");
    c->prefix = "";
    return TG_OK;
}

static int load_redis_tls(cfg_ctx *c, tg_config_t *cfg) {
    static const char *const keys[] = {"ca_file", "cert", "key", "server_name", "verify", NULL};
    c->prefix = "redis_tls.";
    int rc = check_keys(c, keys);
    rc = rc ?: get_str(c, "ca_file", &cfg->redis_tls.ca_file);
    rc = rc ?: get_str(c, "cert", &cfg->redis_tls.cert);
    rc = rc ?: get_str(c, "key", &cfg->redis_tls.key);
    rc = rc ?: get_str(c, "server_name", &cfg->redis_tls.server_name);
    rc = rc ?: get_bool(c, "verify", &cfg->redis_tls.verify);
    if (rc)
        return rc;
    if (!cfg->redis_tls.cert != !cfg->redis_tls.key)
        return fail(c, cfg->redis_tls.cert ? "key" : "cert", "is required with a client certificate (cert and key)");
    c->prefix = "";
    return TG_OK;
}

static int load_keys(cfg_ctx *c, tg_config_t *cfg) {
    lua_getfield(c->L, -1, "keys");
    if (lua_isnil(c->L, -1)) {
        lua_pop(c->L, 1);
        return TG_OK;
    }
    if (!lua_istable(c->L, -1)) {
        lua_pop(c->L, 1);
        return fail(c, "keys", "must be a list of strings");
    }
    size_t n = lua_objlen(c->L, -1);
    cfg->keys = calloc(n + 1, sizeof(char *));
    for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(c->L, -1, (int)i);
        if (lua_type(c->L, -1) != LUA_TSTRING || lua_objlen(c->L, -1) < 8) {
            lua_pop(c->L, 2);
            return fail(c, "keys", "entry %zu must be a string of at least 8 characters", i);
        }
        cfg->keys[cfg->nkeys++] = strdup(lua_tostring(c->L, -1));
        lua_pop(c->L, 1);
    }
    lua_pop(c->L, 1);
    return TG_OK;
}

static int load_max_tokens_models(cfg_ctx *c, tg_config_t *cfg) {
    lua_getfield(c->L, -1, "max_tokens_models");
    if (lua_isnil(c->L, -1)) {
        lua_pop(c->L, 1);
        return TG_OK;
    }
    if (!lua_istable(c->L, -1)) {
        lua_pop(c->L, 1);
        return fail(c, "max_tokens_models", "must be a list of model names (a trailing * matches a prefix)");
    }
    size_t n = lua_objlen(c->L, -1);
    cfg->max_tokens_models = calloc(n + 1, sizeof(char *));
    for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(c->L, -1, (int)i);
        if (lua_type(c->L, -1) != LUA_TSTRING || lua_objlen(c->L, -1) == 0) {
            lua_pop(c->L, 2);
            return fail(c, "max_tokens_models", "entry %zu must be a non-empty string", i);
        }
        cfg->max_tokens_models[cfg->nmax_tokens_models++] = strdup(lua_tostring(c->L, -1));
        lua_pop(c->L, 1);
    }
    lua_pop(c->L, 1);
    return TG_OK;
}

static int sub_table(cfg_ctx *c, const char *key, int (*fn)(cfg_ctx *, void *), void *arg) {
    lua_getfield(c->L, -1, key);
    int rc = TG_OK;
    if (lua_isnil(c->L, -1)) {
    } else if (!lua_istable(c->L, -1)) {
        rc = fail(c, key, "must be a table, got %s", luaL_typename(c->L, -1));
    } else {
        rc = fn(c, arg);
    }
    lua_pop(c->L, 1);
    return rc;
}

static int get_policy(cfg_ctx *c, const char *key, int *out) {
    char *s = NULL;
    if (get_str(c, key, &s) != TG_OK)
        return TG_ERROR;
    if (!s)
        return TG_OK;
    int rc = TG_OK;
    if (!strcmp(s, "closed"))
        *out = 0;
    else if (!strcmp(s, "open"))
        *out = 1;
    else if (!strcmp(s, "local"))
        *out = 2;
    else
        rc = fail(c, key, "must be \"closed\", \"open\" or \"local\", got \"%s\"", s);
    free(s);
    return rc;
}

static int load_limiter(cfg_ctx *c, tg_config_t *cfg) {
    static const char *const keys[] = {"lease_ttl_ms", "queue_max", "queue_timeout_ms", "on_redis_down_rate",
                                       "on_redis_down_tokens", "on_redis_down_concurrency", NULL};
    c->prefix = "limiter.";
    int rc = check_keys(c, keys);
    rc = rc ?: get_int(c, "lease_ttl_ms", &cfg->limiter.lease_ttl_ms, 1000, 3600000);
    rc = rc ?: get_int(c, "queue_max", &cfg->limiter.queue_max, 0, 100000);
    rc = rc ?: get_int(c, "queue_timeout_ms", &cfg->limiter.queue_timeout_ms, 0, 600000);
    rc = rc ?: get_policy(c, "on_redis_down_rate", &cfg->limiter.fail_rate);
    cfg->limiter.fail_tokens = cfg->limiter.fail_rate; /* unless set apart */
    rc = rc ?: get_policy(c, "on_redis_down_tokens", &cfg->limiter.fail_tokens);
    rc = rc ?: get_policy(c, "on_redis_down_concurrency", &cfg->limiter.fail_concurrency);
    if (rc == TG_OK)
        c->prefix = "";
    return rc;
}

static int limiter_fn(cfg_ctx *c, void *a) { return load_limiter(c, a); }

static int load_routing(cfg_ctx *c, void *arg) {
    tg_config_t *cfg = arg;
    static const char *const keys[] = {"max_attempts", "deadline_ms", "cooldown_429_ms", "cooldown_529_ms",
                                       "cooldown_auth_ms", "cooldown_5xx_ms", "quota_stale_ms", NULL};
    c->prefix = "routing.";
    int rc = check_keys(c, keys);
    rc = rc ?: get_int(c, "max_attempts", &cfg->routing.max_attempts, 1, 8);
    rc = rc ?: get_int(c, "deadline_ms", &cfg->routing.deadline_ms, 1, 3600000);
    rc = rc ?: get_int(c, "cooldown_429_ms", &cfg->routing.cooldown_429_ms, 0, 86400000);
    rc = rc ?: get_int(c, "cooldown_529_ms", &cfg->routing.cooldown_529_ms, 0, 86400000);
    rc = rc ?: get_int(c, "cooldown_auth_ms", &cfg->routing.cooldown_auth_ms, 0, 86400000);
    rc = rc ?: get_int(c, "cooldown_5xx_ms", &cfg->routing.cooldown_5xx_ms, 0, 86400000);
    rc = rc ?: get_int(c, "quota_stale_ms", &cfg->routing.quota_stale_ms, 1000, 86400000);
    if (rc == TG_OK)
        c->prefix = "";
    return rc;
}

static int load_billing(cfg_ctx *c, void *arg) {
    tg_config_t *cfg = arg;
    static const char *const keys[] = {"enabled", "default_max_tokens", "spool_dir", "reconcile_after_ms",
                                       "unknown_usage", "queue_max", "test_clock", "usage_retention_days",
                                       "ledger_retention_days", NULL};
    c->prefix = "billing.";
    int rc = check_keys(c, keys);
    rc = rc ?: get_bool(c, "enabled", &cfg->billing.enabled);
    rc = rc ?: get_int(c, "default_max_tokens", &cfg->billing.default_max_tokens, 1, 10000000);
    rc = rc ?: get_str(c, "spool_dir", &cfg->billing.spool_dir);
    rc = rc ?: get_int(c, "reconcile_after_ms", &cfg->billing.reconcile_after_ms, 100, 86400000);
    rc = rc ?: get_int(c, "queue_max", &cfg->billing.queue_max, 1, 10000000);
    rc = rc ?: get_bool(c, "test_clock", &cfg->billing.test_clock);
    rc = rc ?: get_int(c, "usage_retention_days", &cfg->billing.usage_retention_days, 0, 36500);
    rc = rc ?: get_int(c, "ledger_retention_days", &cfg->billing.ledger_retention_days, 0, 36500);
    if (rc == TG_OK && cfg->billing.usage_retention_days > 0 && cfg->billing.usage_retention_days < 3)
        rc = fail(c, "usage_retention_days", "must be 0 (keep every day) or at least 3, got %d",
                  cfg->billing.usage_retention_days);
    if (rc == TG_OK && cfg->billing.ledger_retention_days > 0 && cfg->billing.ledger_retention_days < 3)
        rc = fail(c, "ledger_retention_days", "must be 0 (keep every month) or at least 3, got %d",
                  cfg->billing.ledger_retention_days);
    char *u = NULL;
    rc = rc ?: get_str(c, "unknown_usage", &u);
    if (rc == TG_OK && u) {
        if (!strcmp(u, "charge"))
            cfg->billing.charge_unknown = 1;
        else if (!strcmp(u, "release"))
            cfg->billing.charge_unknown = 0;
        else
            rc = fail(c, "unknown_usage", "must be \"charge\" or \"release\", got \"%s\"", u);
    }
    free(u);
    if (rc == TG_OK)
        c->prefix = "";
    return rc;
}
/* `tracing = { endpoint, sample_ratio, batch_size, batch_interval_ms, queue_size,
 * timeout_ms, headers = { [name] = value }, service_name, ca_file }`. */
static int load_tracing(cfg_ctx *c, void *arg) {
    tg_tracing_config_t *t = arg;
    static const char *const keys[] = {"endpoint", "sample_ratio", "batch_size", "batch_interval_ms", "queue_size",
                                       "timeout_ms", "headers", "service_name", "ca_file", NULL};
    c->prefix = "tracing.";
    int rc = check_keys(c, keys);
    rc = rc ?: get_str(c, "endpoint", &t->endpoint);
    rc = rc ?: get_int(c, "batch_size", &t->batch_size, 1, 65536);
    rc = rc ?: get_int(c, "batch_interval_ms", &t->batch_interval_ms, 1, 600000);
    rc = rc ?: get_int(c, "queue_size", &t->queue_size, 1, 1000000);
    rc = rc ?: get_int(c, "timeout_ms", &t->timeout_ms, 1, 600000);
    rc = rc ?: get_str(c, "service_name", &t->service_name);
    rc = rc ?: get_str(c, "ca_file", &t->ca_file);
    if (rc == TG_OK) {
        lua_getfield(c->L, -1, "sample_ratio");
        if (lua_type(c->L, -1) == LUA_TNUMBER) {
            double v = lua_tonumber(c->L, -1);
            if (!(v >= 0 && v <= 1))
                rc = fail(c, "sample_ratio", "must be a number from 0 to 1, got %g", v);
            else
                t->sample_ratio = v;
        } else if (!lua_isnil(c->L, -1)) {
            rc = fail(c, "sample_ratio", "must be a number, got %s", luaL_typename(c->L, -1));
        }
        lua_pop(c->L, 1);
    }
    if (rc == TG_OK && t->endpoint && strncmp(t->endpoint, "http://", 7) && strncmp(t->endpoint, "https://", 8))
        rc = fail(c, "endpoint", "must be an http:// or https:// URL, got \"%s\"", t->endpoint);
    if (rc == TG_OK && t->endpoint && tg_valid_no_ctl(t->endpoint, strlen(t->endpoint)))
        rc = fail(c, "endpoint", "holds a control character");
    if (rc == TG_OK && t->service_name && (!*t->service_name || tg_valid_no_ctl(t->service_name, strlen(t->service_name))))
        rc = fail(c, "service_name", "must be a non-empty string without control characters");
    if (rc == TG_OK) {
        lua_getfield(c->L, -1, "headers");
        if (lua_istable(c->L, -1)) {
            lua_pushnil(c->L);
            while (rc == TG_OK && lua_next(c->L, -2)) {
                if (lua_type(c->L, -2) != LUA_TSTRING || lua_type(c->L, -1) != LUA_TSTRING) {
                    rc = fail(c, "headers", "must map header names to string values");
                    lua_pop(c->L, 2);
                    break;
                }
                size_t kn, vn;
                const char *k = lua_tolstring(c->L, -2, &kn), *v = lua_tolstring(c->L, -1, &vn);
                int name_ok = kn > 0;
                for (size_t i = 0; i < kn; i++)
                    name_ok &= (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z') ||
                               (k[i] >= '0' && k[i] <= '9') || k[i] == '-' || k[i] == '_';
                if (!name_ok || tg_valid_no_ctl(v, vn)) {
                    rc = fail(c, "headers", "\"%.64s\": a header name of letters, digits, '-' or '_' and a value "
                              "without control characters", k);
                    lua_pop(c->L, 2);
                    break;
                }
                t->headers = realloc(t->headers, (t->nheaders + 1) * sizeof(*t->headers));
                size_t ln = kn + vn + 3;
                t->headers[t->nheaders] = malloc(ln);
                snprintf(t->headers[t->nheaders++], ln, "%s: %s", k, v);
                lua_pop(c->L, 1);
            }
        } else if (!lua_isnil(c->L, -1)) {
            rc = fail(c, "headers", "must be a table, got %s", luaL_typename(c->L, -1));
        }
        lua_pop(c->L, 1);
    }
    if (rc == TG_OK)
        c->prefix = "";
    return rc;
}

static int upstream_fn(cfg_ctx *c, void *a) { return load_upstream(c, a); }
static int http_limits_fn(cfg_ctx *c, void *a) { return load_http_limits(c, a); }
static int tls_fn(cfg_ctx *c, void *a) { return load_tls(c, a); }
static int redis_tls_fn(cfg_ctx *c, void *a) { return load_redis_tls(c, a); }

static void defaults(tg_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen_host = strdup("127.0.0.1");
    cfg->listen_port = 8080;
    cfg->workers = 0;
    cfg->log_level = strdup("info");
    cfg->access_log = 1;
    cfg->pg_pool_size = 4;
    cfg->pg_timeout_ms = 5000;
    cfg->key_cache_ms = 30000;
    cfg->key_stale_ms = 600000;
    cfg->redis_timeout_ms = 250;
    cfg->redis_tls.verify = 1;
    tg_plugins_config_defaults(&cfg->plugins);
    cfg->routing.max_attempts = 3;
    cfg->routing.deadline_ms = 120000;
    cfg->routing.cooldown_429_ms = 30000;
    cfg->routing.cooldown_529_ms = 10000;
    cfg->routing.cooldown_auth_ms = 300000;
    cfg->routing.cooldown_5xx_ms = 15000;
    cfg->routing.quota_stale_ms = 600000;
    cfg->billing.enabled = 1;
    cfg->billing.default_max_tokens = 4096;
    cfg->billing.spool_dir = strdup("var/spool");
    cfg->billing.reconcile_after_ms = 600000;
    cfg->billing.charge_unknown = 1;
    cfg->billing.queue_max = 20000;
    cfg->tracing = (tg_tracing_config_t){.sample_ratio = 1,
                                         .batch_size = 512,
                                         .batch_interval_ms = 1000,
                                         .queue_size = 4096,
                                         .timeout_ms = 5000};
    cfg->limiter.lease_ttl_ms = 30000;
    cfg->limiter.queue_max = 16;
    cfg->limiter.queue_timeout_ms = 8000;
    cfg->limiter.fail_rate = 2;        /* local */
    cfg->limiter.fail_tokens = 2;      /* local */
    cfg->limiter.fail_concurrency = 2; /* local */
    cfg->http_limits = (tg_http_limits_t){
        .max_header_bytes = 16384,
        .max_body_bytes = 4 * 1024 * 1024,
        .header_timeout_ms = 10000,
        .body_timeout_ms = 30000,
        .idle_timeout_ms = 60000,
        .shutdown_timeout_ms = 10000,
        .write_timeout_ms = 60000,
        .max_write_buffer = 256 * 1024,
    };
    cfg->upstream = (tg_upstream_config_t){
        .provider = strdup("openai"),
        .tls_verify = 1,
        .connect_timeout_ms = 5000,
        .first_byte_timeout_ms = 120000,
        .idle_timeout_ms = 120000,
        .pool_idle_ms = 30000,
        .max_idle_conns = 256,
    };
}

static void env_override(char **field, const char *name) {
    const char *v = getenv(name);
    if (v && *v) {
        free(*field);
        *field = strdup(v);
    }
}

int tg_config_load(const char *path, tg_config_t *cfg, char *err, size_t errlen) {
    static const char *const keys[] = {"listen", "workers", "tls", "admin_token", "secret_key",
                                       "postgres", "postgres_pool", "postgres_timeout_ms", "redis",
                                       "redis_timeout_ms", "redis_tls", "log_level", "access_log", "keys",
                                       "limits", "upstream", "limiter", "plugins", "billing", "routing",
                                       "max_tokens_models", "key_cache_ms", "key_stale_ms", "tracing", NULL};
    defaults(cfg);
    lua_State *L = luaL_newstate();
    if (!L) {
        snprintf(err, errlen, "config: out of memory");
        return TG_ERROR;
    }
    luaL_openlibs(L);
    cfg_ctx c = {L, err, errlen, ""};
    int rc = TG_OK;
    if (luaL_loadfile(L, path) != 0 || lua_pcall(L, 0, 1, 0) != 0) {
        snprintf(err, errlen, "config: %s", lua_tostring(L, -1));
        rc = TG_ERROR;
    } else if (!lua_istable(L, -1)) {
        snprintf(err, errlen, "config: %s must return a table, got %s", path, luaL_typename(L, -1));
        rc = TG_ERROR;
    } else {
        rc = check_keys(&c, keys);
        rc = rc ?: get_listen(&c, "listen", &cfg->listen_host, &cfg->listen_port);
        rc = rc ?: get_int(&c, "workers", &cfg->workers, 0, 256);
        rc = rc ?: sub_table(&c, "tls", tls_fn, cfg);
        rc = rc ?: get_str(&c, "admin_token", &cfg->admin_token);
        rc = rc ?: get_str(&c, "secret_key", &cfg->secret_key);
        rc = rc ?: get_str(&c, "postgres", &cfg->pg_conninfo);
        rc = rc ?: get_int(&c, "postgres_pool", &cfg->pg_pool_size, 1, 256);
        rc = rc ?: get_int(&c, "postgres_timeout_ms", &cfg->pg_timeout_ms, 1, 600000);
        rc = rc ?: get_int(&c, "key_cache_ms", &cfg->key_cache_ms, 100, 3600000);
        rc = rc ?: get_int(&c, "key_stale_ms", &cfg->key_stale_ms, 0, 86400000);
        rc = rc ?: get_str(&c, "redis", &cfg->redis_url);
        rc = rc ?: get_int(&c, "redis_timeout_ms", &cfg->redis_timeout_ms, 1, 600000);
        rc = rc ?: sub_table(&c, "redis_tls", redis_tls_fn, cfg);
        rc = rc ?: get_str(&c, "log_level", &cfg->log_level);
        rc = rc ?: get_bool(&c, "access_log", &cfg->access_log);
        rc = rc ?: load_keys(&c, cfg);
        rc = rc ?: load_max_tokens_models(&c, cfg);
        rc = rc ?: sub_table(&c, "limits", http_limits_fn, &cfg->http_limits);
        rc = rc ?: sub_table(&c, "upstream", upstream_fn, &cfg->upstream);
        rc = rc ?: sub_table(&c, "limiter", limiter_fn, cfg);
        rc = rc ?: sub_table(&c, "billing", load_billing, cfg);
        rc = rc ?: sub_table(&c, "routing", load_routing, cfg);
        rc = rc ?: sub_table(&c, "tracing", load_tracing, &cfg->tracing);
        if (rc == TG_OK) {
            lua_getfield(L, -1, "plugins");
            if (!lua_isnil(L, -1)) {
                tg_plugins_config_free(&cfg->plugins);
                rc = tg_plugins_config_from_lua(L, lua_gettop(L), &cfg->plugins, err, errlen);
            }
            lua_pop(L, 1);
        }
        if (rc == TG_OK && tg_log_level_parse(cfg->log_level) < 0)
            rc = fail(&c, "log_level", "must be error, warn, info or debug, got \"%s\"", cfg->log_level);
        if (rc == TG_OK && !cfg->upstream.url)
            rc = fail(&c, "upstream", "is required (a table with at least url)");
    }
    lua_close(L);
    env_override(&cfg->pg_conninfo, "TOLLGATE_PG");
    env_override(&cfg->redis_url, "TOLLGATE_REDIS");
    env_override(&cfg->admin_token, "TOLLGATE_ADMIN_TOKEN");
    env_override(&cfg->secret_key, "TOLLGATE_SECRET_KEY");
    if (rc != TG_OK)
        tg_config_free(cfg);
    return rc;
}

void tg_config_free(tg_config_t *cfg) {
    free(cfg->listen_host);
    free(cfg->tls_listen_host);
    free(cfg->tls_cert);
    free(cfg->tls_key);
    free(cfg->admin_token);
    free(cfg->secret_key);
    free(cfg->pg_conninfo);
    free(cfg->redis_url);
    free(cfg->redis_tls.ca_file);
    free(cfg->redis_tls.cert);
    free(cfg->redis_tls.key);
    free(cfg->redis_tls.server_name);
    free(cfg->log_level);
    for (size_t i = 0; i < cfg->nkeys; i++)
        free(cfg->keys[i]);
    free(cfg->keys);
    for (size_t i = 0; i < cfg->nmax_tokens_models; i++)
        free(cfg->max_tokens_models[i]);
    free(cfg->max_tokens_models);
    free(cfg->upstream.url);
    free(cfg->upstream.api_key);
    free(cfg->upstream.provider);
    free(cfg->upstream.ca_file);
    tg_plugins_config_free(&cfg->plugins);
    free(cfg->billing.spool_dir);
    free(cfg->tracing.endpoint);
    free(cfg->tracing.service_name);
    free(cfg->tracing.ca_file);
    for (size_t i = 0; i < cfg->tracing.nheaders; i++)
        free(cfg->tracing.headers[i]);
    free(cfg->tracing.headers);
    memset(cfg, 0, sizeof(*cfg));
}
