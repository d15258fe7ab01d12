-- tollgate configuration: a Lua file that returns a table. os.getenv works here.
-- Check it with:  build/tollgate check -c examples/tollgate.lua
--
-- This file lists every key the loader accepts (core/src/base/tg_config.c and
-- tg_config_plugins.c), each with its default and what it means; a key left out takes
-- its default. The commented-out lines are keys without a default worth writing down
-- (uncomment to use them). Unknown keys are refused, so a typo never silently falls
-- back to a default. A bad value: one line naming the key and what is wrong, exit 2.
-- The test integration.newcomer_config checks this file against the loader.
--
-- Environment variables override these keys: TOLLGATE_PG (postgres), TOLLGATE_REDIS
-- (redis), TOLLGATE_ADMIN_TOKEN (admin_token), TOLLGATE_SECRET_KEY (secret_key).
-- Tenants, keys, groups, accounts and prices are not configuration: they live in
-- Postgres (the admin API, the console, or `tollgate apply` with a state file such as
-- examples/state.lua).
return {
  -- Where clients connect (HTTP/1.1, keep-alive, pipelining). Default "127.0.0.1:8080".
  listen = "127.0.0.1:8080",
  -- Worker threads, each with its own event loop, sharing the port (SO_REUSEPORT).
  -- 0 = one per CPU core. Default 0.
  workers = 0,

  -- An optional TLS listener next to the plain one; listen, cert and key are then
  -- all required. Default: none.
  -- tls = {
  --   listen = "127.0.0.1:8443",         -- host:port of the TLS listener
  --   cert = "/etc/tollgate/cert.pem",   -- PEM certificate chain
  --   key = "/etc/tollgate/key.pem",     -- PEM private key
  -- },

  -- The admin API (/admin/api/v1/) and the console (/admin/) take this bearer token;
  -- unset, both answer 403 admin_disabled. Default: none.
  admin_token = os.getenv("TOLLGATE_ADMIN_TOKEN"),
  -- The master key that seals upstream credentials (AES-256-GCM): 64 hex digits, or any
  -- text (its SHA-256 is used). Needed to store or use an account's credential.
  secret_key = os.getenv("TOLLGATE_SECRET_KEY"),

  -- Postgres (libpq conninfo): tenants, keys, accounts, prices, usage, the ledger.
  -- Unset: only the static keys below work, nothing is billed. Default: none. With a
  -- primary and standbys, list every host and ask for the writable one; each reconnect
  -- finds the primary again after a failover, e.g.
  -- "host=pg-a,pg-b dbname=tollgate target_session_attrs=read-write connect_timeout=2".
  postgres = os.getenv("TOLLGATE_PG"),
  postgres_pool = 4,            -- Postgres connections per worker
  postgres_timeout_ms = 5000,   -- a Postgres query slower than this fails
  key_cache_ms = 30000,         -- an API key read from Postgres is used this long (±25%) before it is read again
  key_stale_ms = 600000,        -- past that, while Postgres cannot answer (down, failing over), it is still used this long
  -- Redis (redis://[[user]:password@]host[:port][/db] or unix:///path): limits,
  -- balances, leases, cache invalidation. A Redis Cluster: its seed nodes,
  -- redis-cluster://[[user]:password@]host:port[,host:port...] (examples/README.md).
  -- Over TLS: rediss://... and rediss-cluster://..., set up by `redis_tls` below.
  -- Default: none (limits then follow `limiter`'s Redis-down policies).
  redis = os.getenv("TOLLGATE_REDIS"),
  redis_timeout_ms = 250,       -- a Redis command slower than this counts as Redis down
  -- TLS to Redis, for a rediss:// or rediss-cluster:// URL (examples/README.md):
  -- redis_tls = {
  --   ca_file = "/etc/redis/ca.pem",   -- CA bundle; default: the system store
  --   cert = "/etc/tollgate/redis-client.pem", key = "/etc/tollgate/redis-client.key", -- mutual TLS (both or neither)
  --   server_name = "redis.internal",  -- SNI and the name checked; default: each node's host (an IP: its IP SAN)
  --   verify = true,                   -- verify the certificate and the name (false: a warning at start)
  -- },

  log_level = "info",   -- error | warn | info | debug (stderr)
  access_log = true,    -- one JSON line per request on stdout

  -- Static virtual keys (Authorization: Bearer <key> or x-api-key), at least 8
  -- characters each: no tenant, no limits, no billing, served by `upstream` below. Only
  -- their SHA-256 is kept in memory. Keys of tenants live in Postgres. Default: none.
  keys = { os.getenv("TOLLGATE_DEMO_KEY") or "tg-demo-change-me" },

  -- The HTTP server's limits.
  limits = {
    max_header_bytes = 16384,         -- request line + headers; more gets 431
    max_body_bytes = 4 * 1024 * 1024, -- more gets 413 (refused before reading when declared)
    header_timeout_ms = 10000,        -- slowloris: headers must arrive within this (408)
    body_timeout_ms = 30000,          -- the body must arrive within this (408)
    idle_timeout_ms = 60000,          -- keep-alive idle time between requests
    write_timeout_ms = 60000,         -- a client that reads nothing for this long is dropped
    max_write_buffer = 262144,        -- bytes queued to a slow client before the upstream read pauses
    shutdown_timeout_ms = 10000,      -- SIGTERM: in-flight requests get this long to finish
    drain_delay_ms = 0,               -- SIGTERM: /readyz answers 503 this long before the listeners close
  },

  -- The upstream of static keys and of keys without a group (required; keys in a group
  -- use their group's accounts instead). The timeouts and the pool apply to every
  -- upstream call, accounts' included.
  upstream = {
    url = os.getenv("TOLLGATE_UPSTREAM") or "http://127.0.0.1:9001/v1", -- http(s) base URL (required)
    api_key = os.getenv("TOLLGATE_UPSTREAM_KEY") or "sk-mock", -- sent upstream as the credential
    provider = "openai",            -- openai | anthropic: the protocol it speaks
    -- ca_file = "/etc/ssl/certs/ca-certificates.crt", -- CA bundle for https; default: the system store
    tls_verify = true,              -- verify the upstream's certificate and host name
    connect_timeout_ms = 5000,      -- TCP + TLS connect; past it the attempt failed to connect
    first_byte_timeout_ms = 120000, -- until the response head arrives; then 504
    idle_timeout_ms = 120000,       -- between two reads of a response
    pool_idle_ms = 30000,           -- idle keep-alive connections are kept this long
    max_idle_conns = 256,           -- idle keep-alive connections per worker
  },

  -- Rate, token and concurrency limits (Redis): what happens around them.
  limiter = {
    lease_ttl_ms = 30000,       -- a concurrency lease expires this long after its last renewal (a crashed gateway's)
    queue_max = 16,             -- requests per worker that may wait for a concurrency slot
    queue_timeout_ms = 8000,    -- how long one may wait; then 429
    -- When Redis cannot be reached: closed (503), open (not checked), or local (an
    -- in-process bucket per instance). Money is always closed unless a plugin opens it.
    on_redis_down_rate = "local",        -- rpm
    on_redis_down_tokens = "local",      -- tpm; default: on_redis_down_rate's value
    on_redis_down_concurrency = "local", -- concurrency
  },

  -- Account pools: retries, failover and cooldowns.
  routing = {
    max_attempts = 3,           -- upstream attempts per request, the first included (1-8)
    deadline_ms = 120000,       -- no new attempt once a request is this old
    cooldown_429_ms = 30000,    -- an account answering 429 without Retry-After rests this long
    cooldown_529_ms = 10000,    -- an account answering 529 (overloaded) rests this long
    cooldown_auth_ms = 300000,  -- an account answering 401/403 rests this long
    cooldown_5xx_ms = 15000,    -- a failing account (error EWMA >= 0.5) rests this long
    quota_stale_ms = 600000,    -- quota learned from provider headers is trusted this long
  },

  -- Money: reservations before the call, settlement after it (needs postgres and redis).
  billing = {
    enabled = true,             -- false: nothing is reserved, priced or settled
    default_max_tokens = 4096,  -- the output bound of a request that sets none (reserved, and sent upstream)
    spool_dir = "var/spool",    -- settlements wait here (fsync'd) while Postgres is unreachable
    reconcile_after_ms = 600000, -- a dead gateway's reservation this old is settled by the reconciler
    unknown_usage = "charge",   -- charge | release: settle unknown usage at the reserved bound, or at 0
    queue_max = 20000,          -- settlements queued per worker before they spill to the spool
    test_clock = false,         -- tests only: TOLLGATE_TEST_CLOCK_OFFSET (s) shifts the budgets' periods' clock
    usage_retention_days = 0,   -- `tollgate usage drop` drops usage days older than this (0 = keep all; else >= 3)
    ledger_retention_days = 0,  -- ... and ledger months that ended longer ago (0 = keep all; else >= 3); totals are carried
  },

  -- Plugins and policies (plugins/README.md): folders, the enabled list, budgets.
  plugins = {
    dirs = { "plugins", "policies" }, -- folders searched for <name>/handler.lua, in order
    -- Each entry: a plugin folder's name and its config, checked against its
    -- schema.lua; a bare "name" string is short for { name = "name" }. Default: none.
    enabled = {
      -- { name = "model-map", config = { aliases = { ["gpt-4o"] = "gpt-4o-2024-08-06" } } },
    },
    watch = true,               -- reload when a file in these folders changes
    max_instructions = 0,       -- a deterministic instruction budget per hook call (0 = off; else >= 1000)
    max_hook_ms = 50,           -- CPU time one hook call may use (a watchdog)
    -- The policy workbench's folder (plugins/README.md, "The policy workbench"): the
    -- gateway writes the policies stored in Postgres here and searches it after dirs.
    -- Give each instance its own (no shared disk). Default: none (the workbench is off).
    -- store = "var/policies",
    -- The capture of live policy decisions, for `tollgate policy test --compare`
    -- (plugins/README.md, "Changing a live router safely"). Default: off.
    -- capture = {
    --   rate = 0.01,                -- share of requests recorded, 0..1 (0 = off)
    --   max_per_s = 50,             -- cap: requests recorded per second by the instance
    --   file = "var/capture.jsonl", -- JSON lines, one request each
    --   max_bytes = 67108864,       -- the file is rotated past this size (64 MiB)
    --   keep = 2,                   -- rotated files kept: file.1 .. file.keep
    --   headers = { "user-agent", "x-tier" }, -- request headers recorded (never credentials)
    --   groups = {},                -- a group's own rate, e.g. { canary = 1 }
    -- },
  },

  -- OpenTelemetry traces (core/README.md, "Traces"): a server span per sampled request,
  -- children for admission, account selection, each upstream attempt and settlement,
  -- sent as OTLP/HTTP JSON; W3C traceparent continued and passed upstream. Default: off.
  -- tracing = {
  --   endpoint = "http://127.0.0.1:4318/v1/traces", -- the collector's OTLP/HTTP traces URL (http or https)
  --   sample_ratio = 1,           -- share of new traces sampled, 0..1 (a client's sampled flag is followed)
  --   batch_size = 512,           -- requests (a server span and its children each) per POST
  --   batch_interval_ms = 1000,   -- the longest a finished request waits to be sent
  --   queue_size = 4096,          -- requests recorded and not yet sent; past it a request is not traced (counted)
  --   timeout_ms = 5000,          -- one POST to the collector, connect included
  --   headers = {},               -- sent with each POST, e.g. { ["x-honeycomb-team"] = "..." }
  --   service_name = "tollgate",  -- the resource's service.name
  --   ca_file = "/etc/ssl/certs/ca-certificates.crt", -- https: a CA bundle (absent: the system's)
  -- },

  -- How an OpenAI chat upstream gets the output cap the gateway sends (billing's
  -- default, or a translated max_tokens): max_completion_tokens, which every current
  -- OpenAI model takes and the o-series and gpt-5 family require; or max_tokens for the
  -- models listed here (names, or prefixes ending in '*': older OpenAI-compatible servers).
  -- Default: none.
  -- max_tokens_models = { "legacy-*" },
}
