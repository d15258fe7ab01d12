-- router: the score's factors each move the choice the right way; top-K weighted
-- random draws only among the best K; excluded accounts are never chosen.
local F = require("fake_ctx")

local function pick(accounts, cfg, seed)
    math.randomseed(seed or 1)
    local p, conf = F.load("plugins/router", cfg or {})
    local ctx = F.new("select_account", { accounts = accounts })
    p.select_account(ctx, conf)
    return ctx.out.selected, ctx
end

-- Deterministic: top_k = 1 always takes the best score.
local BEST = { top_k = 1 }

describe("router", function()
    it("prefers higher priority", function()
        eq(pick({ { priority = 1 }, { priority = 2 } }, BEST), 2)
    end)

    it("prefers the less loaded account", function()
        eq(pick({ { inflight = 8, max_concurrency = 10 }, { inflight = 2, max_concurrency = 10 } }, BEST), 2)
    end)

    it("prefers a shorter queue", function()
        eq(pick({ { queued = 5 }, { queued = 0 } }, BEST), 2)
    end)

    it("avoids a failing account", function()
        eq(pick({ { error_ewma = 0.5 }, { error_ewma = 0.01 } }, BEST), 2)
    end)

    it("avoids a slow account", function()
        eq(pick({ { ttft_ewma_ms = 4000 }, { ttft_ewma_ms = 400 } }, BEST), 2)
    end)

    it("prefers an account whose rate window resets soon", function()
        eq(pick({ { reset_in_ms = -1 }, { reset_in_ms = 1000 } }, BEST), 2)
    end)

    it("avoids an account with little quota left, as its provider said", function()
        eq(pick({ { headroom = 0.05 }, { headroom = 0.9 } }, BEST), 2)
        eq(pick({ { headroom = -1 }, { headroom = 0.1 } }, BEST), 1) -- unknown is not penalised
    end)

    it("prefers a plan window that resets soon with quota left (use it or lose it)", function()
        eq(pick({ { window_left = 0.6, window_reset_in_ms = 86400000 },
                  { window_left = 0.6, window_reset_in_ms = 600000 } }, BEST), 2)
        eq(pick({ { window_left = 0, window_reset_in_ms = 60000 },
                  { window_left = 0.5, window_reset_in_ms = 60000 } }, BEST), 2)
        -- the weight is the plugin's config: 0 turns it off (the earlier account stays)
        eq(pick({ { window_left = 0.5, window_reset_in_ms = 7200000 }, { window_left = 0.5, window_reset_in_ms = 60000 } },
            { top_k = 1, weights = { use_it_or_lose_it = 0 } }), 1)
    end)

    it("prefers the cheaper account, all else equal", function()
        eq(pick({ { cost = 15 }, { cost = 3 } }, BEST), 2)
    end)

    it("keeps the sticky account while healthy and leaves it when it fails", function()
        eq(pick({ { sticky = true }, { inflight = 0 } }, BEST), 1)
        eq(pick({ { sticky = true, error_ewma = 0.6 }, {} }, BEST), 2)
        eq(pick({ { sticky = true, inflight = 5, max_concurrency = 5 }, {} }, BEST), 2)
    end)

    it("moves a retry away from the account already tried", function()
        eq(pick({ { tried = 1 }, {} }, BEST), 2)
    end)

    it("takes a saturated account only when all are saturated", function()
        eq(pick({ { inflight = 4, max_concurrency = 4, priority = 9 }, { priority = 0 } }, BEST), 2)
        eq(pick({ { inflight = 4, max_concurrency = 4 }, { inflight = 9, max_concurrency = 4 } }, BEST), 1)
    end)

    it("never chooses an excluded account", function()
        eq(pick({ { priority = 9, excluded = true }, { priority = 0 } }, BEST), 2)
        eq(pick({ { excluded = true } }, BEST), nil)
    end)

    it("draws only among the top K, weighted toward the best", function()
        local accts = {}
        for i = 1, 6 do accts[i] = { priority = i } end -- 6 is best, then 5, 4
        local counts = {}
        for seed = 1, 3000 do
            local s = pick(accts, { top_k = 3, temperature = 1 }, seed)
            counts[s] = (counts[s] or 0) + 1
        end
        eq(counts[1], nil); eq(counts[2], nil); eq(counts[3], nil)
        assert(counts[6] > counts[5] and counts[5] > counts[4], "weights not ordered")
        -- exp(0) : exp(-1) : exp(-2) = 0.665 : 0.245 : 0.090
        near(counts[6] / 3000, 0.665, 0.04, "share of the best")
        near(counts[4] / 3000, 0.090, 0.03, "share of the third")
    end)

    it("records each account's score", function()
        local _, ctx = pick({ { priority = 2 }, { priority = 1 } }, BEST)
        assert(ctx:account(1).score > ctx:account(2).score)
    end)
end)
