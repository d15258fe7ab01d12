-- retry-budget: attempt limit, deadline, backoff with jitter, Retry-After, and which
-- failures retry on the same account, another, or not at all.
local F = require("fake_ctx")

local function decide(f, cfg, seed)
    math.randomseed(seed or 7)
    local p, conf = F.load("plugins/retry-budget", cfg or {})
    local ctx = F.new("on_upstream_error", f)
    p.on_upstream_error(ctx, conf)
    return ctx.out.retry.action, ctx.out.retry.delay_ms, ctx.out.log.retry
end

describe("retry-budget", function()
    it("retries a 503 once on the same account, then elsewhere", function()
        eq(decide({ upstream_status = 503, attempt = 1 }), "same")
        eq(decide({ upstream_status = 503, attempt = 2 }), "other")
    end)

    it("sends 429, 529, 401 and 403 to another account at once", function()
        for _, st in ipairs({ 429, 529, 401, 403 }) do
            eq(decide({ upstream_status = st, attempt = 1 }), "other", "status " .. st)
        end
    end)

    it("gives up on client errors", function()
        for _, st in ipairs({ 400, 404, 422 }) do
            local a, _, why = decide({ upstream_status = st })
            eq(a, "give_up"); eq(why, "give_up:status")
        end
    end)

    it("stops at max_attempts", function()
        local a, _, why = decide({ upstream_status = 503, attempt = 3 }, { max_attempts = 3 })
        eq(a, "give_up"); eq(why, "give_up:attempts")
    end)

    it("never retries once bytes reached the client", function()
        local a, _, why = decide({ upstream_status = 503, bytes_sent = true })
        eq(a, "give_up"); eq(why, "give_up:bytes_sent")
    end)

    it("moves connection failures and first-byte timeouts to another account", function()
        eq(decide({ failure = "connect" }), "other")
        eq(decide({ failure = "timeout_connect" }), "other")
        eq(decide({ failure = "timeout_first_byte" }), "other")
        eq(decide({ failure = "timeout_first_byte" }, { retry_first_byte_timeout = false }), "give_up")
        eq(decide({ failure = "reset" }), "give_up")
        eq(decide({ failure = "timeout_idle" }), "give_up")
    end)

    it("backs off exponentially with full jitter", function()
        local cfg = { base_delay_ms = 100, max_delay_ms = 1000, max_attempts = 10, same_account_retries = 10 }
        for attempt = 1, 6 do
            local cap = math.min(1000, 100 * 2 ^ (attempt - 1))
            local lo, hi = math.huge, -1
            for seed = 1, 200 do
                local _, d = decide({ upstream_status = 500, attempt = attempt }, cfg, seed)
                lo, hi = math.min(lo, d), math.max(hi, d)
            end
            assert(lo >= 0 and hi < cap, "attempt " .. attempt .. ": delays outside [0, " .. cap .. ")")
            assert(hi > cap * 0.8 and lo < cap * 0.2, "attempt " .. attempt .. ": not jittered over the range")
        end
    end)

    it("waits at least Retry-After on the same account", function()
        local a, d = decide({ upstream_status = 503, retry_after_ms = 1500 })
        eq(a, "same"); eq(d, 1500)
    end)

    it("goes elsewhere instead of waiting out a long Retry-After", function()
        local a, d = decide({ upstream_status = 503, retry_after_ms = 30000 }, { max_retry_after_ms = 5000 })
        eq(a, "other")
        assert(d < 30000)
    end)

    it("gives up when the retry would start past the deadline", function()
        local a, _, why = decide({ upstream_status = 503, elapsed_ms = 59990, retry_after_ms = 100 },
            { deadline_ms = 60000 })
        eq(a, "give_up"); eq(why, "give_up:deadline")
        -- The request's own, shorter deadline wins.
        a = decide({ upstream_status = 503, elapsed_ms = 900, deadline_ms = 1000, retry_after_ms = 200 })
        eq(a, "give_up")
    end)

    it("honours a configured status table", function()
        eq(decide({ upstream_status = 500 }, { same_account = {}, other_account = { 500 } }), "other")
    end)
end)
