-- Plugin config schemas: typed fields with defaults, ranges, enums and required
-- fields, checked when a generation is built and on every admin write. Pure Lua, no
-- FFI, so the plugin specs (spec/lua/) use it unchanged.
--
-- A schema is { fields = { name = field, ... } }. A field is a table with `type`, one
-- of: string, number, integer, boolean, array (with `elements`), map (with `keys` and
-- `values`), record (with `fields`), any. Optional: `required`, `default`, `between`
-- = {lo, hi} (numbers; for strings and arrays, the length), `one_of` = {...}, `match`
-- (a Lua pattern for strings), `description`.
--
-- validate(schema, value, path) returns a new table with defaults filled in, or
-- nil and one message naming the path: "plugins.model-map.config.aliases: expected
-- table, got string". Unknown fields are refused, so a typo is never ignored.
local M = {}

local TYPES = {
    string = true, number = true, integer = true, boolean = true,
    array = true, map = true, record = true, any = true,
}
local FIELD_KEYS = {
    type = true, required = true, default = true, between = true, one_of = true,
    match = true, elements = true, keys = true, values = true, fields = true,
    description = true,
}

local function sorted_keys(t)
    local ks = {}
    for k in pairs(t) do ks[#ks + 1] = k end
    table.sort(ks, function(a, b) return tostring(a) < tostring(b) end)
    return ks
end

local function deep_copy(v)
    if type(v) ~= "table" then return v end
    local out = {}
    for k, x in pairs(v) do out[k] = deep_copy(x) end
    return out
end
M.deep_copy = deep_copy

local function show(v)
    if type(v) == "string" then return string.format("%q", v) end
    return tostring(v)
end

local check_field

-- Checks that a schema is itself well formed; returns true or nil, err.
local function check_def(def, path)
    if type(def) ~= "table" then
        return nil, path .. ": expected a field definition table, got " .. type(def)
    end
    for _, k in ipairs(sorted_keys(def)) do
        if not FIELD_KEYS[k] then return nil, path .. ": unknown schema key '" .. tostring(k) .. "'" end
    end
    if not TYPES[def.type] then
        return nil, path .. ": unknown type " .. show(def.type) ..
            " (string, number, integer, boolean, array, map, record, any)"
    end
    if def.type == "array" then
        if not def.elements then return nil, path .. ": array needs 'elements'" end
        local ok, err = check_def(def.elements, path .. ".elements")
        if not ok then return nil, err end
    elseif def.type == "map" then
        if not def.keys or not def.values then return nil, path .. ": map needs 'keys' and 'values'" end
        local ok, err = check_def(def.keys, path .. ".keys")
        if not ok then return nil, err end
        ok, err = check_def(def.values, path .. ".values")
        if not ok then return nil, err end
    elseif def.type == "record" then
        if type(def.fields) ~= "table" then return nil, path .. ": record needs 'fields'" end
        for _, name in ipairs(sorted_keys(def.fields)) do
            local ok, err = check_def(def.fields[name], path .. "." .. tostring(name))
            if not ok then return nil, err end
        end
    end
    if def.between ~= nil and (type(def.between) ~= "table" or type(def.between[1]) ~= "number"
            or type(def.between[2]) ~= "number") then
        return nil, path .. ": 'between' must be {lo, hi}"
    end
    if def.one_of ~= nil and type(def.one_of) ~= "table" then
        return nil, path .. ": 'one_of' must be a list"
    end
    if def.default ~= nil then
        local _, err = check_field(def, deep_copy(def.default), path .. " (default)")
        if err then return nil, err end
    end
    return true
end

-- Validates a schema definition ({fields = {...}}).
function M.check_schema(schema, path)
    if type(schema) ~= "table" or type(schema.fields) ~= "table" then
        return nil, path .. ": a schema is a table with 'fields'"
    end
    return check_def({ type = "record", fields = schema.fields }, path)
end

local function typename(v)
    local t = type(v)
    if t == "number" and v ~= v then return "nan" end
    return t
end

-- Returns the checked value (defaults applied) or nil, err.
check_field = function(def, v, path)
    if v == nil then
        if def.default ~= nil then
            v = deep_copy(def.default)
        elseif def.required then
            return nil, path .. ": required field missing"
        else
            return nil
        end
    end
    local t = def.type
    if t == "any" then return v end
    if t == "integer" then
        if type(v) ~= "number" or v ~= v then return nil, path .. ": expected integer, got " .. typename(v) end
        if v ~= math.floor(v) then return nil, path .. ": expected integer, got " .. tostring(v) end
    elseif t == "array" or t == "map" or t == "record" then
        if type(v) ~= "table" then return nil, path .. ": expected table, got " .. typename(v) end
    elseif type(v) ~= t or (t == "number" and v ~= v) then
        return nil, path .. ": expected " .. t .. ", got " .. typename(v)
    end
    if def.between then
        local lo, hi = def.between[1], def.between[2]
        local n, what = v, "value"
        if t == "string" then n, what = #v, "length" end
        if t == "array" then n, what = #v, "length" end
        if n < lo or n > hi then
            return nil, string.format("%s: %s must be between %s and %s, got %s", path, what,
                tostring(lo), tostring(hi), tostring(n))
        end
    end
    if def.one_of then
        local ok = false
        for _, x in ipairs(def.one_of) do if x == v then ok = true break end end
        if not ok then
            local opts = {}
            for i, x in ipairs(def.one_of) do opts[i] = show(x) end
            return nil, path .. ": expected one of " .. table.concat(opts, ", ") .. ", got " .. show(v)
        end
    end
    if def.match and not string.find(v, def.match) then
        return nil, path .. ": " .. show(v) .. " does not match " .. show(def.match)
    end
    if t == "array" then
        local n = #v
        for k in pairs(v) do
            if type(k) ~= "number" or k < 1 or k > n or k ~= math.floor(k) then
                return nil, path .. ": expected a list, found key " .. show(k)
            end
        end
        local out = {}
        for i = 1, n do
            local x, err = check_field(def.elements, v[i], path .. "[" .. i .. "]")
            if err then return nil, err end
            out[i] = x
        end
        return out
    elseif t == "map" then
        local out = {}
        for _, k in ipairs(sorted_keys(v)) do
            local kp = path .. "[" .. show(k) .. "]"
            local _, err = check_field(def.keys, k, kp .. " (key)")
            if err then return nil, err end
            local x
            x, err = check_field(def.values, v[k], kp)
            if err then return nil, err end
            out[k] = x
        end
        return out
    elseif t == "record" then
        for _, k in ipairs(sorted_keys(v)) do
            if def.fields[k] == nil then
                return nil, path .. "." .. tostring(k) .. ": unknown field"
            end
        end
        local out = {}
        for _, k in ipairs(sorted_keys(def.fields)) do
            local x, err = check_field(def.fields[k], v[k], path .. "." .. k)
            if err then return nil, err end
            out[k] = x
        end
        return out
    end
    return v
end

-- Validates `value` (a config table, nil meaning {}) against `schema`.
function M.validate(schema, value, path)
    if value == nil then value = {} end
    local root = { type = "record", fields = schema.fields }
    local out, err = check_field(root, value, path)
    if err then return nil, err end
    return out
end

return M
