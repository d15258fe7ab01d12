-- The baseline of spec/bench/pipeline_bench.sh (issue 17): a rate-limiting gateway as
-- one would build it with nginx + Lua + Redis from Debian's packages
-- (libnginx-mod-http-lua, lua-resty-core, lua-resty-lrucache, lua-nginx-redis), in front
-- of the same mock upstream as tollgate, with an upstream keepalive pool.
--
-- Per request (access phase): the bearer key is looked up in a per-worker LRU cache (on
-- a miss, one HMGET of lim:key:<key> in Redis: tenant, rate, burst, concurrency); then
-- ONE EVALSHA of the Redis script does a token bucket (rpm) and a concurrency lease (a
-- sorted set of lease ids scored by their expiry) for the key's tenant, atomically. A
-- refusal answers 429. After the response (log phase) a zero-delay timer removes the
-- lease (ZREM), off the request's path. Redis connections come from the cosocket
-- keepalive pool. The script is pipeline_limiter_redis.lua: pipeline_bench.sh loads it
-- (SCRIPT LOAD) and passes its SHA1 and the Redis socket to init() from the generated
-- nginx.conf (pipeline_limiter.conf).
local lrucache = require "resty.lrucache"
local redis = require "nginx.redis"

local M = {}

local SOCK, SHA
local LEASE_TTL_MS = 600000
local cache = lrucache.new(10000)

function M.init(sock, sha)
    SOCK, SHA = "unix:" .. sock, sha
end

local function conn()
    local r = redis:new()
    r:set_timeout(1000)
    local ok, err = r:connect(SOCK)
    if not ok then return nil, err end
    return r
end

local function release(premature, zkey, lease)
    if premature then return end
    local r = conn()
    if not r then return end
    r:zrem(zkey, lease)
    r:set_keepalive(60000, 64)
end

function M.access()
    local auth = ngx.var.http_authorization
    local key = auth and auth:match("^Bearer%s+(.+)$")
    if not key then return ngx.exit(401) end
    local r, err = conn()
    if not r then
        ngx.log(ngx.ERR, "redis: ", err)
        return ngx.exit(503)
    end
    local k = cache:get(key)
    if not k then
        local v = r:hmget("lim:key:" .. key, "tenant", "rate", "burst", "conc")
        if type(v) ~= "table" or v[1] == ngx.null then
            r:set_keepalive(60000, 64)
            return ngx.exit(401)
        end
        k = { bucket = "lim:{" .. v[1] .. "}:b", leases = "lim:{" .. v[1] .. "}:l",
              rate = v[2], burst = v[3], conc = v[4] }
        cache:set(key, k, 60)
    end
    local lease = ngx.var.request_id
    local res
    res, err = r:evalsha(SHA, 2, k.bucket, k.leases, math.floor(ngx.now() * 1000), k.rate, k.burst, k.conc,
        lease, LEASE_TTL_MS)
    if not res then
        ngx.log(ngx.ERR, "redis: ", err)
        return ngx.exit(503)
    end
    r:set_keepalive(60000, 64)
    if res[1] ~= 1 then return ngx.exit(429) end
    ngx.ctx.lease = { k.leases, lease }
end

function M.log()
    local l = ngx.ctx.lease
    if l then ngx.timer.at(0, release, l[1], l[2]) end
end

return M
