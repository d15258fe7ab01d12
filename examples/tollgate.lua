-- tollgate configuration: a Lua file that returns a table. os.getenv works here.
-- Check it with:  build/tollgate check -c examples/tollgate.lua
-- Environment variables override these keys: TOLLGATE_PG, TOLLGATE_REDIS,
-- TOLLGATE_ADMIN_TOKEN, TOLLGATE_SECRET_KEY.
return {
  -- Where clients connect (HTTP/1.1, keep-alive, pipelining).
  listen = "127.0.0.1:8080",
  -- Worker threads, each with its own event loop, sharing the port (SO_REUSEPORT).
  -- 0 = one per CPU core.
  workers = 0,

  -- An optional TLS listener next to the plain one.
  -- tls = { listen = "127.0.0.1:8443", cert = "/etc/tollgate/cert.pem", key = "/etc/tollgate/key.pem" },

  -- Virtual keys accepted on the data plane (Authorization: Bearer <key> or x-api-key).
  -- Only their SHA-256 is kept in memory. Keys managed in Postgres come with the state issue.
  keys = { os.getenv("TOLLGATE_DEMO_KEY") or "tg-demo-change-me" },

  admin_token = os.getenv("TOLLGATE_ADMIN_TOKEN"),
  postgres = os.getenv("TOLLGATE_PG"),      -- libpq conninfo
  redis = os.getenv("TOLLGATE_REDIS"),      -- redis://host:port or unix:///path

  log_level = "info",   -- error | warn | info | debug (stderr)
  access_log = true,    -- one JSON line per request on stdout

  limits = {
    max_header_bytes = 16384,        -- request line + headers; more gets 431
    max_body_bytes = 4 * 1024 * 1024, -- more gets 413 (refused before reading when declared)
    header_timeout_ms = 10000,       -- slowloris: headers must arrive within this
    body_timeout_ms = 30000,
    idle_timeout_ms = 60000,         -- keep-alive idle time between requests
    write_timeout_ms = 60000,        -- a client that reads nothing for this long is dropped
    max_write_buffer = 262144,       -- bytes queued to a slow client before the upstream read pauses
    shutdown_timeout_ms = 10000,     -- SIGTERM: in-flight requests get this long to finish
  },

  -- The upstream provider (database-driven account pools come with later issues).
  upstream = {
    url = os.getenv("TOLLGATE_UPSTREAM") or "http://127.0.0.1:9001/v1",
    api_key = os.getenv("TOLLGATE_UPSTREAM_KEY") or "sk-mock",
    provider = "openai",            -- openai | anthropic
    -- ca_file = "/etc/ssl/certs/ca-certificates.crt",  -- default: the system store
    tls_verify = true,
    connect_timeout_ms = 5000,
    first_byte_timeout_ms = 120000, -- until the response head arrives; then 504
    idle_timeout_ms = 120000,       -- between two reads of a response
    pool_idle_ms = 30000,           -- idle keep-alive connections are kept this long
    max_idle_conns = 256,           -- per worker
  },

  -- How an OpenAI chat upstream gets the output cap the gateway sends (billing's
  -- default, or a translated max_tokens): max_completion_tokens, which every current
  -- OpenAI model takes and the o-series and gpt-5 family require; or max_tokens for the
  -- models listed here (names, or prefixes ending in '*': older OpenAI-compatible servers).
  -- max_tokens_models = { "legacy-*" },
}
