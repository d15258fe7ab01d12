-- pricing: turns the normalized usage of a request into its cost (price hook).
--
-- Cost is in nano-USD (1e-9 USD), an integer: 1 USD per million tokens is 1000
-- nano-USD per token, so prices stay exact enough without floating money downstream.
-- OpenAI-style usage counts cached prompt tokens inside input, Anthropic's does not;
-- and output includes reasoning tokens. Each token is billed once, at its own price:
--   (input - cache_read*) * input + cache_read * cache_read + cache_write * cache_write
--   + (output - reasoning) * output + reasoning * reasoning,   times the group's multiplier
-- (* only for protocols whose input includes the cached tokens). A model without a price
-- stays unpriced: billing records it for reconciliation, never as free.
local M = { name = "pricing", priority = 500, version = "1.0.0" }

local INPUT_INCLUDES_CACHE = { openai_chat = true, responses = true, embeddings = true }

local function compile(pattern)
    local literal = pattern:gsub("%*", "")
    local lua = "^" .. pattern:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", ".-") .. "$"
    return { pattern = pattern, lua = lua, weight = #literal }
end

function M.init(conf)
    local list = {}
    for name, p in pairs(conf.models) do
        p.cache_read = p.cache_read or p.input
        p.cache_write = p.cache_write or p.input
        p.reasoning = p.reasoning or p.output
        if name:find("*", 1, true) then list[#list + 1] = compile(name) end
    end
    table.sort(list, function(a, b)
        if a.weight ~= b.weight then return a.weight > b.weight end
        return a.pattern < b.pattern
    end)
    conf._patterns = list
    conf._found, conf._nfound = {}, 0
    conf._by_group = next(conf.group_multipliers) ~= nil
end

-- The prices of `model` by name, else by the pattern with the most literal characters.
local function find(conf, model)
    local p = conf.models[model]
    if p then return p end
    for _, pat in ipairs(conf._patterns) do
        if model:match(pat.lua) then return conf.models[pat.pattern] end
    end
    return nil
end

-- What find() gave for a model name is cached (false: no price), so the pattern scan
-- runs once per name; at most 512 names, then the cache starts over.
function M._prices(conf, model)
    local p = conf._found[model]
    if p == nil then
        p = find(conf, model) or false
        if conf._nfound >= 512 then conf._found, conf._nfound = {}, 0 end
        conf._found[model] = p
        conf._nfound = conf._nfound + 1
    end
    return p or nil
end

-- The cost in nano-USD of usage `u` at prices `p`.
local function cost(conf, p, protocol, group, u)
    local input, output = u.input or 0, u.output or 0
    local cr, cw, rs = u.cache_read or 0, u.cache_write or 0, u.reasoning or 0
    if INPUT_INCLUDES_CACHE[protocol] then input = input - cr end
    if input < 0 then input = 0 end
    local plain_out = output - rs
    if plain_out < 0 then plain_out = 0 end
    local usd_per_mtok = input * p.input + cr * p.cache_read + cw * p.cache_write
        + plain_out * p.output + rs * p.reasoning
    local mult = conf.group_multipliers[group] or conf.default_multiplier
    return usd_per_mtok * 1000 * mult
end

-- Returns the cost in nano-USD, or nil for a model without a price.
function M._cost(conf, model, protocol, group, u)
    local p = M._prices(conf, model)
    if not p then return nil end
    return cost(conf, p, protocol, group, u)
end

function M.price(ctx, conf)
    local model = ctx:model()
    local p = M._prices(conf, model)
    if not p then
        ctx:log_field("pricing", "no price for " .. model)
        return
    end
    local u = ctx:usage()
    -- The protocol matters only with cached tokens, the group only with group
    -- multipliers: each is asked for only then (every ctx call costs, see router).
    local cr = u.cache_read
    local protocol = cr and cr ~= 0 and ctx:protocol() or nil
    local group = conf._by_group and ctx:group() or nil
    ctx:set_cost(cost(conf, p, protocol, group, u))
end

return M
