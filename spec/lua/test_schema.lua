-- The schema validator (core/lua/tg_schema.lua): types, defaults, ranges, enums,
-- required fields, unknown fields, and the messages operators read.
local S = require("tg_schema")

local SCHEMA = { fields = {
    name = { type = "string", required = true, between = { 1, 8 } },
    n = { type = "integer", default = 3, between = { 1, 10 } },
    ratio = { type = "number", default = 0.5 },
    mode = { type = "string", default = "a", one_of = { "a", "b" } },
    on = { type = "boolean", default = true },
    list = { type = "array", default = { 1 }, elements = { type = "integer" } },
    map = { type = "map", default = {}, keys = { type = "string" }, values = { type = "number" } },
    rec = { type = "record", default = {}, fields = { x = { type = "number", default = 1 } } },
} }

local function v(value) return S.validate(SCHEMA, value, "plugins.p.config") end

describe("tg_schema", function()
    it("fills defaults, deeply", function()
        local c = assert(v({ name = "x" }))
        eq(c.n, 3); eq(c.ratio, 0.5); eq(c.mode, "a"); eq(c.on, true)
        eq(c.list[1], 1); eq(c.rec.x, 1)
    end)
    it("does not share default tables between configs", function()
        local a, b = assert(v({ name = "x" })), assert(v({ name = "y" }))
        a.list[1] = 99
        eq(b.list[1], 1)
    end)
    local cases = {
        { {}, "plugins.p.config.name: required field missing" },
        { { name = 5 }, "plugins.p.config.name: expected string, got number" },
        { { name = "" }, "plugins.p.config.name: length must be between 1 and 8, got 0" },
        { { name = "x", n = 1.5 }, "plugins.p.config.n: expected integer, got 1.5" },
        { { name = "x", n = 11 }, "plugins.p.config.n: value must be between 1 and 10, got 11" },
        { { name = "x", mode = "c" }, "plugins.p.config.mode: expected one of \"a\", \"b\", got \"c\"" },
        { { name = "x", on = "yes" }, "plugins.p.config.on: expected boolean, got string" },
        { { name = "x", list = { 1, "2" } }, "plugins.p.config.list[2]: expected integer, got string" },
        { { name = "x", list = { a = 1 } }, "plugins.p.config.list: expected a list, found key \"a\"" },
        { { name = "x", map = { k = "v" } }, "plugins.p.config.map[\"k\"]: expected number, got string" },
        { { name = "x", rec = { y = 1 } }, "plugins.p.config.rec.y: unknown field" },
        { { name = "x", typo = 1 }, "plugins.p.config.typo: unknown field" },
        { { name = "x", ratio = 0 / 0 }, "plugins.p.config.ratio: expected number, got nan" },
    }
    for _, c in ipairs(cases) do
        it("says " .. c[2], function()
            local ok, err = v(c[1])
            eq(ok, nil)
            eq(err, c[2])
        end)
    end
    it("checks the schema itself", function()
        local ok, err = S.check_schema({ fields = { a = { type = "strnig" } } }, "plugins.p.schema")
        eq(ok, nil)
        has(err, "plugins.p.schema.a: unknown type \"strnig\"")
        ok, err = S.check_schema({ fields = { a = { type = "string", defualt = "x" } } }, "plugins.p.schema")
        has(err, "plugins.p.schema.a: unknown schema key 'defualt'")
    end)
end)
