-- The demo state examples/quickstart.sh applies (any state file has this shape):
--   build/tollgate apply -c var/tollgate.lua examples/state.lua [--dry-run]
-- Rows are matched by name (keys by tenant + name, prices by model); applying the same
-- file again changes nothing. A tenant's balance is its opening balance, used on
-- creation only; add money later with POST /admin/api/v1/tenants/{id}/topup.
--
-- What it sets up: tenant "demo" with 100 USD, group "demo" over three mock accounts
-- that differ the way real ones do, prices for the mock's models, and key "demo" in
-- that group with a rate limit, a concurrency limit and a budget.
--
-- Environment (the quickstart sets the first two):
--   TOLLGATE_MOCK_URL     the mock upstream's base URL (default http://127.0.0.1:9001/v1)
--   TOLLGATE_DEMO_KEY     the demo key's plain text (stored as SHA-256 only); unset: a key
--                         is generated and printed once
--   TOLLGATE_UPSTREAM     a real OpenAI/Anthropic-compatible base URL: account "upstream"
--                         in group "demo" is then active (any model name passes through)
--                         and the mock accounts are disabled
--   TOLLGATE_UPSTREAM_KEY, TOLLGATE_UPSTREAM_PROVIDER (openai | anthropic)
--                         its credential (sealed under TOLLGATE_SECRET_KEY) and protocol
local mock = os.getenv("TOLLGATE_MOCK_URL") or "http://127.0.0.1:9001/v1"
local upstream = os.getenv("TOLLGATE_UPSTREAM")
if upstream == "" then upstream = nil end
local mock_status = upstream and "disabled" or "active"

-- The mock knows its accounts by their credential: the quickstart installs a fault rule
-- for two of them (POST /_mock/faults), so one answers slowly and one fails now and then.
local function mock_account(name, credential, extra)
  local a = {
    name = name, provider = "openai", base_url = mock,
    credential = credential,   -- sealed with AES-256-GCM under TOLLGATE_SECRET_KEY
    models = { "mock-gpt", "mock-claude", "mock-embed" },
    concurrency = 16, priority = 10, weight = 100, cost_multiplier = "1",
    status = mock_status, groups = { "demo" },
  }
  for k, v in pairs(extra or {}) do a[k] = v end
  return a
end

return {
  tenants = {
    -- Limits on a tenant hold across all of its keys (and all gateway instances).
    { name = "demo", balance = "100.00", rpm = 600, concurrency = 32 },
  },
  groups = {
    -- models = {} offers every model its accounts serve.
    { name = "demo", models = {}, rate_multiplier = 1 },
  },
  accounts = {
    -- Fast and standard price.
    mock_account("mock-us-east", "sk-mock-us-east"),
    -- Cheaper (cost_multiplier: what a request costs you there, a routing signal) but
    -- slow: its first token comes after 700 ms (mock rule ttft_ms=700).
    mock_account("mock-eu-west", "sk-mock-eu-west", { cost_multiplier = "0.6" }),
    -- Fails now and then with a 503 (mock rule, re-armed by the quickstart): the
    -- request is retried on another account before a byte reaches the client.
    mock_account("mock-ap-south", "sk-mock-ap-south", { weight = 50 }),
    -- A real provider, active only when TOLLGATE_UPSTREAM is set. No model list: any
    -- model name is sent as it is.
    {
      name = "upstream",
      provider = os.getenv("TOLLGATE_UPSTREAM_PROVIDER") or "openai",
      base_url = upstream or "https://api.openai.com/v1",
      credential = os.getenv("TOLLGATE_UPSTREAM_KEY") or "sk-unset",
      models = {}, concurrency = 64, priority = 20,
      status = upstream and "active" or "disabled",
      groups = { "demo" },
    },
  },
  keys = {
    -- key = a plain key (stored as SHA-256 only); leave it out to have one generated
    -- and printed once. budget: USD this key may spend in all (402 budget_exceeded after).
    { name = "demo", tenant = "demo", group = "demo", key = os.getenv("TOLLGATE_DEMO_KEY"),
      rpm = 60, rpm_burst = 20, concurrency = 4, budget = "5.00" },
  },
  prices = {
    -- USD per one million tokens.
    { model = "mock-gpt", input = "0.15", output = "0.60", cache_read = "0.075" },
    { model = "mock-claude", input = "3.00", output = "15.00", cache_read = "0.30", cache_write = "3.75" },
    { model = "mock-embed", input = "0.02", output = "0" },
  },
}
