-- fail-policy: closed for money, open / closed / local bucket for the rest.
local F = require("fake_ctx")

local function decide(limits, cfg, f)
    local p, conf = F.load("plugins/fail-policy", cfg or {})
    f = f or {}
    f.limits = limits
    local ctx = F.new("on_limiter_down", f)
    p.on_limiter_down(ctx, conf)
    return ctx.out.limiter, ctx.out.log.limiter_down, p, conf
end

describe("fail-policy", function()
    it("fails closed when a money limit cannot be checked", function()
        local d, why = decide({ money = true, rate = true })
        eq(d, "closed"); eq(why, "closed:money")
    end)

    it("opens rate limits when configured open", function()
        eq(decide({ rate = true }, { rate = "open" }), "open")
    end)

    it("closes when any checked limit is configured closed", function()
        eq(decide({ rate = true, concurrency = true }, { rate = "open", concurrency = "closed" }), "closed")
    end)

    it("admits a trickle through the local bucket, per tenant", function()
        local p, conf = F.load("plugins/fail-policy",
            { local_bucket = { rate_per_s = 1, burst = 3 } })
        p._reset()
        local function one(tenant, now)
            local ctx = F.new("on_limiter_down", { limits = { rate = true }, tenant_id = tenant, now_ms = now })
            p.on_limiter_down(ctx, conf)
            return ctx.out.limiter
        end
        eq(one("a", 0), "open"); eq(one("a", 0), "open"); eq(one("a", 0), "open")
        eq(one("a", 0), "closed")          -- burst of 3 spent
        eq(one("b", 0), "open")            -- another tenant has its own bucket
        eq(one("a", 999), "closed")        -- not yet a whole token back
        eq(one("a", 1000), "open")         -- one token per second
        eq(one("a", 1000), "closed")
    end)

    it("splits the bucket over the workers", function()
        local p, conf = F.load("plugins/fail-policy", { local_bucket = { rate_per_s = 4, burst = 4 } })
        p._reset()
        local n = 0
        for _ = 1, 10 do
            local ctx = F.new("on_limiter_down", { limits = { rate = true }, nworkers = 2, now_ms = 0 })
            p.on_limiter_down(ctx, conf)
            if ctx.out.limiter == "open" then n = n + 1 end
        end
        eq(n, 2)
    end)

    it("refuses an unknown mode", function()
        local ok, err = pcall(F.load, "plugins/fail-policy", { money = "local" })
        eq(ok, false)
        has(err, "plugins.fail-policy.config.money: expected one of \"closed\", \"open\", got \"local\"")
    end)
end)
