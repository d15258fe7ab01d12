-- fail-policy: decides on_limiter_down, when the shared limiter cannot be asked.
--
-- Money limits fail closed by default: a budget that cannot be checked is not spent.
-- Rate, token and concurrency limits may fail open, closed, or through a small local
-- token bucket (the default) that admits a trickle per tenant while Redis is away.
-- The bucket lives in this worker's Lua state; the configured rate is for the whole
-- instance and split evenly over the workers. A request that checks several limits is
-- admitted only if every one of them admits it.
local M = { name = "fail-policy", priority = 500, version = "1.0.0" }

local min = math.min
local buckets, nbuckets = {}, 0

-- Takes one token from the bucket of `id`; true when there was one.
function M._take(conf, id, now_ms, nworkers)
    local b = conf.local_bucket
    local rate = b.rate_per_s / (nworkers > 0 and nworkers or 1)
    local burst = b.burst / (nworkers > 0 and nworkers or 1)
    if burst < 1 then burst = 1 end
    local e = buckets[id]
    if not e then
        if nbuckets >= b.max_keys then buckets, nbuckets = {}, 0 end
        e = { tokens = burst, at = now_ms }
        buckets[id] = e
        nbuckets = nbuckets + 1
    end
    e.tokens = min(burst, e.tokens + (now_ms - e.at) / 1000 * rate)
    e.at = now_ms
    if e.tokens >= 1 then
        e.tokens = e.tokens - 1
        return true
    end
    return false
end

function M._reset() buckets, nbuckets = {}, 0 end

local LOCAL_LIMITS = { "rate", "tokens", "concurrency" }
-- Bucket ids by tenant or key: built once per name, not per request (bounded).
local ids, nids = { t = {}, k = {} }, 0

local function bucket_id(kind, name)
    local id = ids[kind][name]
    if not id then
        if nids >= 4096 then ids, nids = { t = {}, k = {} }, 0 end
        id = kind .. ":" .. name
        ids[kind][name] = id
        nids = nids + 1
    end
    return id
end

-- Returns "open" or "closed" and the reason.
function M._decide(ctx, conf)
    local limits = ctx:limits()
    if limits.money and conf.money == "closed" then return "closed", "money" end
    local need_local = false
    for i = 1, 3 do
        local name = LOCAL_LIMITS[i]
        if limits[name] then
            local m = conf[name]
            if m == "closed" then return "closed", name end
            if m == "local" then need_local = true end
        end
    end
    if need_local then
        local by, id = conf.local_bucket.by, "*"
        if by == "tenant" then id = bucket_id("t", ctx:tenant_id())
        elseif by == "key" then id = bucket_id("k", ctx:key_id()) end
        if not M._take(conf, id, ctx:now_ms(), ctx:nworkers()) then return "closed", "local_bucket" end
        return "open", "local_bucket"
    end
    return "open", "configured"
end

-- The log value "decision:reason", made once per pair.
local LOG = { open = {}, closed = {} }

function M.on_limiter_down(ctx, conf)
    local decision, reason = M._decide(ctx, conf)
    local log = LOG[decision][reason]
    if not log then
        log = decision .. ":" .. reason
        LOG[decision][reason] = log
    end
    ctx:log_field("limiter_down", log)
    ctx:limiter(decision)
end

return M
