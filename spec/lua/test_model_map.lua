-- model-map: aliases, wildcards, longest match, '*' substitution, reject_unknown.
local F = require("fake_ctx")

local function map(conf_aliases, model, extra)
    local cfg = { aliases = conf_aliases }
    for k, v in pairs(extra or {}) do cfg[k] = v end
    local p, conf = F.load("plugins/model-map", cfg)
    local ctx = F.new("map_model", { model = model })
    p.map_model(ctx, conf)
    return ctx
end

describe("model-map", function()
    it("maps an exact alias and logs it", function()
        local ctx = map({ ["gpt-4"] = "gpt-4o" }, "gpt-4")
        eq(ctx.out.model, "gpt-4o")
        eq(ctx.out.log.model_map, "gpt-4->gpt-4o")
    end)

    it("leaves an unknown model alone by default", function()
        local ctx = map({ ["gpt-4"] = "gpt-4o" }, "llama-3")
        eq(ctx.out.model, "llama-3")
        eq(ctx.out.reject, nil)
    end)

    it("prefers the exact alias over any pattern", function()
        local ctx = map({ ["gpt-4*"] = "wild", ["gpt-4o"] = "exact" }, "gpt-4o")
        eq(ctx.out.model, "exact")
    end)

    it("picks the longest matching pattern, whatever the table order", function()
        local aliases = { ["*"] = "any", ["claude-*"] = "claude-short",
            ["claude-3-5-*"] = "claude-long", ["*-sonnet"] = "sonnet" }
        eq(map(aliases, "claude-3-5-sonnet").out.model, "claude-long")
        eq(map(aliases, "claude-2").out.model, "claude-short")
        eq(map(aliases, "mistral").out.model, "any")
        eq(map(aliases, "x-sonnet").out.model, "sonnet")
    end)

    it("breaks ties between equally long patterns by the pattern text", function()
        local aliases = { ["ab*"] = "first", ["*ab"] = "second" }
        eq(map(aliases, "abab").out.model, "second") -- "*ab" < "ab*"
    end)

    it("substitutes what '*' matched into the target", function()
        local aliases = { ["openai/*"] = "*", ["azure/*-eu"] = "eu-*" }
        eq(map(aliases, "openai/gpt-4o-mini").out.model, "gpt-4o-mini")
        eq(map(aliases, "azure/gpt-4o-eu").out.model, "eu-gpt-4o")
    end)

    it("treats pattern characters literally except '*'", function()
        local aliases = { ["gpt-4.1*"] = "yes" }
        eq(map(aliases, "gpt-4.1-mini").out.model, "yes")
        eq(map(aliases, "gpt-4x1-mini").out.model, "gpt-4x1-mini")
    end)

    it("rejects unknown models with 404 when configured", function()
        local ctx = map({ ["gpt-4"] = "gpt-4o" }, "nope", { reject_unknown = true })
        eq(ctx.out.reject.status, 404)
        eq(ctx.out.reject.code, "model_not_found")
    end)

    it("refuses a config of the wrong type with a clear message", function()
        local ok, err = pcall(F.load, "plugins/model-map", { aliases = "gpt-4" })
        eq(ok, false)
        has(err, "plugins.model-map.config.aliases: expected table, got string")
        ok, err = pcall(F.load, "plugins/model-map", { alias = {} })
        has(err, "plugins.model-map.config.alias: unknown field")
    end)

    it("may not set a model outside map_model/on_request", function()
        local p, conf = F.load("plugins/model-map", { aliases = { a = "b" } })
        local ctx = F.new("price", { model = "a" })
        local ok, err = pcall(p.map_model, ctx, conf)
        eq(ok, false)
        has(err, "API set_model disabled in the context of price")
    end)
end)
