-- fail-policy: an answer per limit; money closed by default, never local.
local F = require("fake_ctx")

local function decide(limits, cfg, f)
    local p, conf = F.load("plugins/fail-policy", cfg or {})
    p._reset()
    f = f or {}
    f.limits = limits
    local ctx = F.new("on_limiter_down", f)
    p.on_limiter_down(ctx, conf)
    return ctx.out.limiter, ctx.out.log.limiter_down, p, conf
end

describe("fail-policy", function()
    it("fails money closed by default, and decides the other limits apart", function()
        local d, why = decide({ money = true, rate = true }, { rate = "open" })
        eq(d.money, "closed"); eq(d.rate, "open"); eq(why, "closed:money")
    end)

    it("opens money when configured open", function()
        local d, why = decide({ money = true }, { money = "open" })
        eq(d.money, "open"); eq(why, "open:configured")
    end)

    it("answers each limit with its own mode", function()
        local d, why = decide({ rate = true, tokens = true, concurrency = true },
            { rate = "open", tokens = "local_limit", concurrency = "closed" })
        eq(d.rate, "open"); eq(d.tokens, "local"); eq(d.concurrency, "closed")
        eq(why, "closed:concurrency")
    end)

    it("hands local_limit to the core's per-instance bucket", function()
        local d, why = decide({ rate = true, concurrency = true }, { rate = "local_limit", concurrency = "open" })
        eq(d.rate, "local"); eq(d.concurrency, "open"); eq(why, "local:limit")
    end)

    it("decides only the limits the request has", function()
        local d = decide({ concurrency = true }, { rate = "closed", concurrency = "open" })
        eq(d.rate, nil); eq(d.money, nil); eq(d.concurrency, "open")
    end)

    it("spends no bucket token on a request refused anyway", function()
        local p, conf = F.load("plugins/fail-policy", { rate = "local", concurrency = "closed",
            local_bucket = { rate_per_s = 0, burst = 1 } })
        p._reset()
        local ctx = F.new("on_limiter_down", { limits = { rate = true, concurrency = true }, tenant_id = "a", now_ms = 0 })
        p.on_limiter_down(ctx, conf)
        eq(ctx.out.limiter.rate, "closed")
        ctx = F.new("on_limiter_down", { limits = { rate = true }, tenant_id = "a", now_ms = 0 })
        p.on_limiter_down(ctx, conf)
        eq(ctx.out.limiter.rate, "open") -- the one token is still there
    end)

    it("admits a trickle through the local bucket, per tenant", function()
        local p, conf = F.load("plugins/fail-policy",
            { local_bucket = { rate_per_s = 1, burst = 3 } })
        p._reset()
        local function one(tenant, now)
            local ctx = F.new("on_limiter_down", { limits = { rate = true, tokens = true }, tenant_id = tenant, now_ms = now })
            p.on_limiter_down(ctx, conf)
            eq(ctx.out.limiter.tokens, ctx.out.limiter.rate) -- one token per request, for both
            return ctx.out.limiter.rate
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
            if ctx.out.limiter.rate == "open" then n = n + 1 end
        end
        eq(n, 2)
    end)

    it("refuses an unknown mode, and local for money", function()
        local ok, err = pcall(F.load, "plugins/fail-policy", { money = "local" })
        eq(ok, false)
        has(err, "plugins.fail-policy.config.money: expected one of \"closed\", \"open\", got \"local\"")
        ok, err = pcall(F.load, "plugins/fail-policy", { rate = "sometimes" })
        eq(ok, false)
        has(err, "plugins.fail-policy.config.rate: expected one of")
    end)
end)
