/*
 * The gateway's configuration: a Lua file that returns a table, read once at start-up
 * into an immutable tg_config_t shared read-only by every worker.
 *
 * Environment variables override the file: TOLLGATE_PG, TOLLGATE_REDIS,
 * TOLLGATE_ADMIN_TOKEN, TOLLGATE_SECRET_KEY. A bad value produces one line naming the
 * key and what is wrong (`tollgate check` prints it and exits 2).
 */
#ifndef TOLLGATE_TG_CONFIG_H
#define TOLLGATE_TG_CONFIG_H

#include "tollgate/tg_common.h"

typedef struct lua_State lua_State;

typedef struct {
    char *url;          /* e.g. "https://api.openai.com/v1" */
    char *api_key;      /* credential sent upstream (Bearer or x-api-key) */
    char *provider;     /* "openai" or "anthropic" */
    char *ca_file;      /* CA bundle for HTTPS; NULL = system default */
    int tls_verify;     /* 1 = verify certificate and host name (default) */
    int connect_timeout_ms;
    int first_byte_timeout_ms;
    int idle_timeout_ms;   /* between two reads of the response */
    int pool_idle_ms;      /* how long an idle pooled connection is kept */
    int max_idle_conns;    /* idle pooled connections kept per worker */
} tg_upstream_config_t;

/* The HTTP server's own limits (config key `limits`): sizes and timeouts of a client
 * connection. Not admission control, which is tg_limits.h (config key `limiter`). */
typedef struct {
    size_t max_header_bytes;
    size_t max_body_bytes;
    int header_timeout_ms;
    int body_timeout_ms;
    int idle_timeout_ms;     /* keep-alive idle time between requests */
    int shutdown_timeout_ms;
    int drain_delay_ms;      /* SIGTERM: /readyz answers 503 this long before the listeners close */
    int write_timeout_ms;    /* a client that reads nothing for this long is dropped */
    size_t max_write_buffer; /* per-connection bytes queued to a slow client before the
                                upstream read pauses */
} tg_http_limits_t;

/** One enabled plugin: its name and its config as a Lua table constructor. */
typedef struct {
    char *name;
    char *config_lua; /* e.g. "{aliases={[\"gpt-4\"]=\"gpt-4o\"}}"; "{}" when absent */
} tg_plugin_enable_t;

/** A group's own capture rate (`plugins.capture.groups`). */
typedef struct {
    char *name;
    double rate;
} tg_capture_group_t;

/** `plugins.capture = {...}`: the sampled recorder of live decisions (policy/tg_capture.c). */
typedef struct {
    double rate;          /* fraction of requests recorded, 0..1; 0 = off (default) */
    int max_per_s;        /* cap: requests recorded per second by the instance (default 50) */
    char *file;           /* JSON lines, appended; default "var/capture.jsonl" */
    long max_bytes;       /* rotated past this size (default 64 MiB) */
    int keep;             /* rotated files kept: file.1 .. file.keep (default 2) */
    char **headers;       /* request headers recorded (lower case; never credentials) */
    size_t nheaders;
    tg_capture_group_t *groups; /* per group name, overrides rate */
    size_t ngroups;
} tg_capture_config_t;

/** The `plugins = {...}` section of the config file (tg_config_plugins.c), owned by
 *  tg_config_t; the plugin runtime (tg_plugin.h) copies what it uses. */
typedef struct {
    char **dirs;   /* searched in order; default {"plugins", "policies"} */
    size_t ndirs;
    tg_plugin_enable_t *enabled;
    size_t nenabled;
    int watch;               /* reload when a file in dirs changes (default 1) */
    long max_instructions;   /* per hook call, Lua VM instructions; 0 = not counted (default) */
    int max_hook_ms;         /* per hook call, wall clock, enforced by a watchdog (default 50) */
    tg_capture_config_t capture; /* `capture = {...}` (off unless rate > 0 somewhere) */
    char *store;             /* the policy workbench's folder (policies from Postgres), the gateway's
                                own; also the last of dirs. NULL: no workbench */
} tg_plugins_config_t;

/**
 * Parses the `plugins` table at stack index `idx` of L (the config file's state) into
 * *out. Returns TG_OK, or TG_ERROR with one line in err naming the key
 * ("config: plugins.enabled[2].name: expected string, got number").
 * Free with tg_plugins_config_free.
 */
int tg_plugins_config_from_lua(lua_State *L, int idx, tg_plugins_config_t *out, char *err, size_t errlen);
/** Fills *out with the defaults (no plugin enabled). */
void tg_plugins_config_defaults(tg_plugins_config_t *out);
void tg_plugins_config_free(tg_plugins_config_t *cfg);

/** Appends s[0..n) to b as a Lua string literal (decimal escapes for anything that is
 *  not printable ASCII), as the plugins section writes configs back. */
void tg_config_lua_quote(tg_buf_t *b, const char *s, size_t n);

/** `tracing = {...}`: OpenTelemetry traces (tg_trace.h); off while endpoint is NULL. */
typedef struct {
    char *endpoint;        /* OTLP/HTTP traces URL, http:// or https:// (".../v1/traces") */
    double sample_ratio;   /* 0..1: the share of new traces sampled (default 1) */
    int batch_size;        /* requests (each a server span and its children) per POST */
    int batch_interval_ms; /* the longest a finished request waits to be sent */
    int queue_size;        /* requests recorded and not yet sent, at most */
    int timeout_ms;        /* one POST, connect included */
    char **headers;        /* "Name: value" lines sent with each POST */
    size_t nheaders;
    char *service_name;    /* resource service.name (default "tollgate") */
    char *ca_file;         /* https: CA bundle (NULL = the system's) */
} tg_tracing_config_t;

typedef struct {
    char *listen_host;
    int listen_port;
    int workers;
    char *tls_listen_host; /* NULL when no TLS listener */
    int tls_listen_port;
    char *tls_cert;
    char *tls_key;
    char *admin_token;
    char *secret_key;
    char *pg_conninfo;
    int pg_pool_size;     /* connections per worker */
    int pg_timeout_ms;    /* per query */
    int key_cache_ms;     /* a key read from Postgres is used this long (±25%) before it is read again */
    int key_stale_ms;     /* past that, while Postgres cannot answer, it is still used this long */
    char *redis_url;
    int redis_timeout_ms; /* per command */
    struct { /* redis_tls: for rediss:// and rediss-cluster:// URLs */
        char *ca_file;     /* NULL: the system's CA store */
        char *cert, *key;  /* a client certificate (mutual TLS) */
        char *server_name; /* SNI and the name checked; NULL: each node's host */
        int verify;        /* 1 (default): verify the certificate and the name */
    } redis_tls;
    char *log_level;
    int access_log;
    struct {
        int lease_ttl_ms;       /* concurrency lease TTL (renewed at a third) */
        int queue_max;          /* requests waiting for a slot, per worker */
        int queue_timeout_ms;   /* longest wait for a slot before 429 */
        int fail_rate;          /* when Redis is down: 0 closed, 1 open, 2 local */
        int fail_tokens;        /* default: fail_rate */
        int fail_concurrency;
    } limiter;
    tg_plugins_config_t plugins; /* the `plugins` section (above) */
    struct {
        int max_attempts;      /* upstream calls per request, first one included */
        int deadline_ms;       /* no retry starts after this much time since arrival */
        int cooldown_429_ms;   /* when the provider states no reset time */
        int cooldown_529_ms;
        int cooldown_auth_ms;  /* 401 / 403 */
        int cooldown_5xx_ms;   /* after repeated failures (error EWMA over 0.5) */
        int quota_stale_ms;    /* learned quota older than this is not trusted (the fleet's
                                  copy in Redis expires then too) */
    } routing;
    struct {
        int enabled;             /* meter DB keys (needs Postgres and Redis); default on */
        int default_max_tokens;  /* output cap sent upstream when the client sets none */
        char *spool_dir;         /* settlements Postgres could not take wait here */
        int reconcile_after_ms;  /* unknown-usage reservations are settled after this */
        int charge_unknown;      /* 1: at the reserved bound (default); 0: released */
        int queue_max;           /* settlement elements in memory before they spill to the spool */
        int test_clock;          /* honour TOLLGATE_TEST_CLOCK_OFFSET (seconds) in the budgets' clock: tests only */
        int usage_retention_days;  /* usage day partitions older than this may be dropped (0: kept) */
        int ledger_retention_days; /* ledger month partitions ended longer ago than this (0: kept) */
    } billing;
    char **keys; /* static virtual keys (NULL-terminated), until keys live in Postgres */
    size_t nkeys;
    /* Models (names, or prefixes ending in '*') whose OpenAI chat upstream takes the
     * output cap as max_tokens; every other one gets max_completion_tokens. */
    char **max_tokens_models;
    size_t nmax_tokens_models;
    tg_http_limits_t http_limits; /* config key `limits` */
    tg_tracing_config_t tracing;  /* config key `tracing` */
    tg_upstream_config_t upstream;
} tg_config_t;

/**
 * Loads and validates the config file at `path`. On success returns 0 and fills *out
 * (free with tg_config_free). On failure returns TG_ERROR and writes one line into
 * err[errlen] naming the key and the problem.
 */
int tg_config_load(const char *path, tg_config_t *out, char *err, size_t errlen);
void tg_config_free(tg_config_t *cfg);

/** Splits "host:port" (IPv6 as "[::1]:port"). Returns 0 or TG_ERROR. Caller frees *host. */
int tg_config_parse_hostport(const char *s, char **host, int *port);

#endif
