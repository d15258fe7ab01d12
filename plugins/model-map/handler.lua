-- model-map: rewrites the requested model by aliases with wildcards.
--
-- An exact alias wins; otherwise the pattern with the most literal characters that
-- matches (longest match), ties broken by the pattern text so the choice never
-- depends on table order. '*' matches any run of characters; a '*' in the target is
-- replaced by what the first '*' of the pattern matched:
--   ["gpt-4"] = "gpt-4o", ["claude-*"] = "claude-3-5-sonnet-latest",
--   ["openai/*"] = "*"   (strip a vendor prefix)
local M = { name = "model-map", priority = 900, version = "1.0.0" }

local function compile(pattern)
    local literal = pattern:gsub("%*", "")
    local lua = "^" .. pattern:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", "(.-)") .. "$"
    return { pattern = pattern, lua = lua, weight = #literal }
end

-- Returns the target for `model`, or nil when no alias matches.
function M._resolve(conf, model)
    local exact = conf.aliases[model]
    if exact and not model:find("*", 1, true) then return exact end
    local list = conf._patterns
    for i = 1, #list do
        local p = list[i]
        local cap = model:match(p.lua)
        if cap then
            local target = conf.aliases[p.pattern]
            if target:find("*", 1, true) then
                target = target:gsub("%*", function() return cap end, 1)
            end
            return target
        end
    end
    return nil
end

-- Resolutions are cached per model name (the same few names arrive again and again):
-- a hit costs one table lookup instead of the pattern scan, the '*' substitution and
-- the log string. At most CACHE_MAX names; past that the cache starts over.
local CACHE_MAX = 512

function M.init(conf)
    local list = {}
    for pattern in pairs(conf.aliases) do
        if pattern:find("*", 1, true) then list[#list + 1] = compile(pattern) end
    end
    table.sort(list, function(a, b)
        if a.weight ~= b.weight then return a.weight > b.weight end
        return a.pattern < b.pattern
    end)
    conf._patterns = list
    conf._cache, conf._cached = {}, 0
end

-- { target, log } for `model` (target false: no alias matches).
local function lookup(conf, model)
    local hit = conf._cache[model]
    if hit then return hit end
    local target = M._resolve(conf, model)
    if target then
        hit = { target, target ~= model and model .. "->" .. target or false }
    else
        hit = { false, false }
    end
    if conf._cached >= CACHE_MAX then conf._cache, conf._cached = {}, 0 end
    conf._cache[model] = hit
    conf._cached = conf._cached + 1
    return hit
end

function M.map_model(ctx, conf)
    local model = ctx:model()
    local hit = lookup(conf, model)
    local target = hit[1]
    if target then
        if hit[2] then
            ctx:set_model(target)
            ctx:log_field("model_map", hit[2])
        end
    elseif conf.reject_unknown then
        ctx:reject(404, "model_not_found", "the model '" .. model .. "' does not exist")
    end
end

return M
