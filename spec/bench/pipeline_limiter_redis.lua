-- The Redis script of spec/bench/pipeline_limiter.lua (the nginx + Lua + Redis baseline
-- of pipeline_bench.sh): a token bucket (KEYS[1], a hash: tokens, timestamp ms) and a
-- concurrency lease (KEYS[2], a sorted set of lease ids scored by expiry), atomically.
-- ARGV: now_ms, rate (tokens per ms), burst, concurrency, lease id, lease ttl ms.
-- Answers {1} (admitted, lease taken) or {0, reason}.
local now = tonumber(ARGV[1])
local rate, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local conc, ttl = tonumber(ARGV[4]), tonumber(ARGV[6])
local b = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + (now - ts) * rate)
if tokens < 1 then return {0, 'rate'} end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) >= conc then return {0, 'concurrency'} end
redis.call('HSET', KEYS[1], 't', tokens - 1, 'ts', now)
redis.call('PEXPIRE', KEYS[1], 120000)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[5])
redis.call('PEXPIRE', KEYS[2], ttl * 2)
return {1}
