-- The declarative state the quickstart applies:
--   build/tollgate apply -c var/tollgate.lua examples/state.lua [--dry-run]
-- Rows are matched by name (keys by tenant + name, prices by model); applying the same
-- file again changes nothing. A tenant's balance is its opening balance, used on
-- creation only; add money later with POST /admin/api/v1/tenants/{id}/topup.
local upstream = os.getenv("TOLLGATE_UPSTREAM") or "http://127.0.0.1:9001/v1"
local demo_key = os.getenv("TOLLGATE_DEMO_KEY")

return {
  tenants = {
    { name = "demo", balance = "100.00" },
  },
  groups = {
    -- models = {} offers every model its accounts serve.
    { name = "default", models = {}, rate_multiplier = 1 },
  },
  accounts = {
    {
      name = "primary",
      provider = "openai",
      base_url = upstream,
      -- Sealed with AES-256-GCM under TOLLGATE_SECRET_KEY before it is stored.
      credential = os.getenv("TOLLGATE_UPSTREAM_KEY") or "sk-mock-primary",
      concurrency = 64,
      priority = 10,
      groups = { "default" },
    },
  },
  keys = {
    -- key = a plain key (stored as SHA-256 only); leave it out to have one generated
    -- and printed once.
    { name = "demo", tenant = "demo", group = "default", key = demo_key, rpm = 600, concurrency = 16 },
  },
  prices = {
    -- USD per one million tokens.
    { model = "mock-gpt", input = "0.15", output = "0.60", cache_read = "0.075" },
    { model = "mock-claude", input = "3.00", output = "15.00", cache_read = "0.30", cache_write = "3.75" },
  },
}
