-- The example policies in policies/: cheapest account meeting a TTFT floor, a tenant
-- pinned to a region, a different model during business hours.
local F = require("fake_ctx")

describe("policies/cheapest-fast", function()
    local p, conf = F.load("policies/cheapest-fast.lua", { ttft_floor_ms = 1000 })
    it("picks the cheapest account under the TTFT floor", function()
        local ctx = F.new("select_account", { accounts = {
            { id = "fast-dear", cost = 10, ttft_ewma_ms = 300 },
            { id = "slow-cheap", cost = 1, ttft_ewma_ms = 3000 },
            { id = "ok-mid", cost = 4, ttft_ewma_ms = 900 },
            { id = "unknown", cost = 0.5, ttft_ewma_ms = -1 },
        } })
        p.select_account(ctx, conf)
        eq(ctx.out.selected, 3)
    end)
    it("skips failing, saturated and excluded accounts, then leaves it to the router", function()
        local ctx = F.new("select_account", { accounts = {
            { cost = 1, ttft_ewma_ms = 100, error_ewma = 0.9 },
            { cost = 1, ttft_ewma_ms = 100, inflight = 2, max_concurrency = 2 },
            { cost = 1, ttft_ewma_ms = 100, excluded = true },
        } })
        p.select_account(ctx, conf)
        eq(ctx.out.selected, nil)
        eq(ctx.out.decided, nil)
    end)
end)

describe("policies/tenant-region", function()
    local p, conf = F.load("policies/tenant-region.lua", { tenants = { acme = "eu" } })
    local function accts()
        return { { id = "us-1", region = "us" }, { id = "eu-1", region = "eu" }, { id = "eu-2", region = "eu" } }
    end
    it("excludes accounts outside the tenant's region", function()
        local ctx = F.new("select_account", { tenant_id = "acme", accounts = accts() })
        p.select_account(ctx, conf)
        eq(ctx:account(1).excluded, true)
        eq(ctx:account(2).excluded, false)
        eq(ctx.out.reject, nil)
    end)
    it("reads the tenant from a header until tenants live in the state store", function()
        local ctx = F.new("select_account", { headers = { ["X-Tenant"] = "acme" }, accounts = accts() })
        p.select_account(ctx, conf)
        eq(ctx:account(1).excluded, true)
    end)
    it("leaves other tenants alone", function()
        local ctx = F.new("select_account", { tenant_id = "other", accounts = accts() })
        p.select_account(ctx, conf)
        eq(ctx:account(1).excluded, false)
    end)
    it("answers 503 rather than leak to another region", function()
        local ctx = F.new("select_account", { tenant_id = "acme", accounts = { { region = "us" } } })
        p.select_account(ctx, conf)
        eq(ctx.out.reject.status, 503)
        eq(ctx.out.reject.code, "no_account_in_region")
    end)
end)

describe("policies/business-hours-model", function()
    local p, conf = F.load("policies/business-hours-model.lua",
        { models = { ["gpt-4o"] = "gpt-4o-mini" }, utc_offset_hours = 9 })
    -- 2024-01-15 is a Monday. 01:00 UTC = 10:00 in UTC+9.
    local MON_10_JST = 1705280400000
    local function run(now, model)
        local ctx = F.new("map_model", { model = model or "gpt-4o", now_ms = now })
        p.map_model(ctx, conf)
        return ctx.out.model
    end
    it("switches the model during business hours", function()
        eq(run(MON_10_JST), "gpt-4o-mini")
    end)
    it("keeps it outside the hours and on weekends", function()
        eq(run(MON_10_JST + 9 * 3600 * 1000), "gpt-4o")       -- 19:00
        eq(run(MON_10_JST - 2 * 3600 * 1000), "gpt-4o")       -- 08:00
        eq(run(MON_10_JST + 5 * 86400 * 1000), "gpt-4o")      -- Saturday
    end)
    it("leaves unlisted models alone", function()
        eq(run(MON_10_JST, "o1"), "o1")
    end)
end)
