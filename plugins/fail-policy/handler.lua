-- fail-policy: decides on_limiter_down, per limit, when the shared limiter (Redis) cannot
-- be asked.
--
-- Each limit the request has gets its own answer (README "Limits" gives the bound each
-- allows):
--   money        closed (default: a budget that cannot be checked is not spent) | open
--   rate, tokens, concurrency:
--     closed       refuse (503 limiter_unavailable)
--     open         not checked
--     local_limit  the core's bucket / counter of the key's and tenant's own limit, kept
--                  by this instance for all its workers
--     local        (default) this plugin's trickle bucket: local_bucket.rate_per_s with
--                  local_bucket.burst, per tenant (or key, or one for all), for the whole
--                  instance and split evenly over its workers; when it has a token the
--                  limits set to local are open, else closed.
-- A limit closed anywhere refuses the request; no bucket token is spent for a request
-- refused anyway.
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

local LIMITS = { "rate", "tokens", "concurrency" }
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

-- Returns the decisions (limit -> "closed" | "open" | "local"), the request's overall
-- outcome ("closed", "open" or "local") and the reason.
function M._decide(ctx, conf)
    local limits = ctx:limits()
    local d, closed_by, need_bucket, any_local = {}, nil, false, false
    if limits.money then
        d.money = conf.money
        if conf.money == "closed" then closed_by = "money" end
    end
    for i = 1, 3 do
        local name = LIMITS[i]
        if limits[name] then
            local m = conf[name]
            if m == "local" then
                need_bucket = true
            elseif m == "local_limit" then
                d[name] = "local"
                any_local = true
            else
                d[name] = m
                if m == "closed" and not closed_by then closed_by = name end
            end
        end
    end
    if need_bucket then
        local v = "closed"
        if not closed_by then
            local by, id = conf.local_bucket.by, "*"
            if by == "tenant" then id = bucket_id("t", ctx:tenant_id())
            elseif by == "key" then id = bucket_id("k", ctx:key_id()) end
            if M._take(conf, id, ctx:now_ms(), ctx:nworkers()) then v = "open" else closed_by = "local_bucket" end
        end
        for i = 1, 3 do
            local name = LIMITS[i]
            if limits[name] and conf[name] == "local" then d[name] = v end
        end
    end
    if closed_by then return d, "closed", closed_by end
    if any_local then return d, "local", "limit" end
    return d, "open", need_bucket and "local_bucket" or "configured"
end

-- The log value "outcome:reason", made once per pair.
local LOG = { open = {}, closed = {}, ["local"] = {} }

function M.on_limiter_down(ctx, conf)
    local d, outcome, reason = M._decide(ctx, conf)
    local log = LOG[outcome][reason]
    if not log then
        log = outcome .. ":" .. reason
        LOG[outcome][reason] = log
    end
    ctx:log_field("limiter_down", log)
    ctx:limiter(d)
end

return M
