-- pricing: per-model input/output/cache-read/cache-write/reasoning prices, group
-- multipliers, wildcard models, and each token billed exactly once.
local F = require("fake_ctx")

local CFG = {
    models = {
        ["gpt-4o-mini"] = { input = 0.15, output = 0.6, cache_read = 0.075 },
        ["claude-3-5-sonnet*"] = { input = 3, output = 15, cache_read = 0.3, cache_write = 3.75 },
        ["o1*"] = { input = 15, output = 60, reasoning = 60 },
    },
    group_multipliers = { premium = 1.5 },
}

local function price(f, cfg)
    local p, conf = F.load("plugins/pricing", cfg or CFG)
    local ctx = F.new("price", f)
    p.price(ctx, conf)
    return ctx.out.cost, ctx
end

describe("pricing", function()
    it("prices input and output in nano-USD", function()
        -- 1000 * 0.15 + 200 * 0.6 USD/Mtok = 270 micro-USD... in nano: *1000
        eq(price({ model = "gpt-4o-mini", usage = { input = 1000, output = 200 } }), 270000)
    end)

    it("bills OpenAI cached prompt tokens once, at the cache price", function()
        -- input 1000 includes 400 cached: 600*0.15 + 400*0.075 + 0 output
        eq(price({ model = "gpt-4o-mini", usage = { input = 1000, output = 0, cache_read = 400 } }), 120000)
    end)

    it("adds Anthropic cache reads and writes, which input excludes", function()
        local c = price({ model = "claude-3-5-sonnet-20241022", protocol = "anthropic",
            usage = { input = 100, output = 50, cache_read = 1000, cache_write = 200 } })
        -- 100*3 + 1000*0.3 + 200*3.75 + 50*15 = 300 + 300 + 750 + 750 = 2100
        eq(c, 2100000)
    end)

    it("prices reasoning tokens inside output at the reasoning price", function()
        local cfg = { models = { ["o1"] = { input = 1, output = 2, reasoning = 10 } } }
        -- output 100 includes 60 reasoning: 40*2 + 60*10 = 680
        eq(price({ model = "o1", usage = { input = 0, output = 100, reasoning = 60 } }, cfg), 680000)
    end)

    it("defaults cache prices to input and reasoning to output", function()
        local cfg = { models = { m = { input = 2, output = 4 } } }
        eq(price({ model = "m", protocol = "anthropic",
            usage = { cache_read = 10, cache_write = 10, output = 10, reasoning = 5 } }, cfg),
            (10 * 2 + 10 * 2 + 5 * 4 + 5 * 4) * 1000)
    end)

    it("applies the group multiplier", function()
        eq(price({ model = "gpt-4o-mini", group = "premium", usage = { input = 1000, output = 200 } }), 405000)
    end)

    it("leaves an unknown model unpriced, never free", function()
        local c, ctx = price({ model = "mystery", usage = { input = 10 } })
        eq(c, nil)
        eq(ctx.out.log.pricing, "no price for mystery")
    end)

    it("requires input and output prices", function()
        local ok, err = pcall(F.load, "plugins/pricing", { models = { m = { input = 1 } } })
        eq(ok, false)
        has(err, "plugins.pricing.config.models[\"m\"].output: required field missing")
    end)
end)
