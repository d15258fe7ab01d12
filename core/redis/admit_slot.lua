-- The account's concurrency slot, taken by the admission that admits (the script
-- "admit+slot": admit.lua with this fragment at its "--+slot" line; tg_limits.c sends it
-- on a single Redis, where keys under two hash tags may meet in one script). It is the
-- last key, KEYS[#KEYS] = {a:<id>}:conc, and the last two arguments, the account's limit
-- and the slot's TTL in ms: taken off here, so the rest reads admit.lua's own layout.
-- A refusal returns before done() and takes no slot. done(r) returns r with the slot
-- taken (or refreshed, for 1: already admitted), r + 2 when the account is full (the
-- request is admitted all the same; the gateway tries its next account). A set below its
-- limit is not swept; expired members (a gateway that died) go when it looks full, as
-- for the leases. The slot set has no TTL either: its last ZREM deletes it.
local sttl = table.remove(ARGV)
local slimit = table.remove(ARGV) + 0
local skey = table.remove(KEYS)
done = function(r)
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000 + math.floor(t[2] / 1000)
  end
  if redis.call('ZCARD', skey) >= slimit then
    redis.call('ZREMRANGEBYSCORE', skey, '-inf', string.format('%d', now))
    if not redis.call('ZSCORE', skey, ARGV[1]) and redis.call('ZCARD', skey) >= slimit then return r + 2 end
  end
  redis.call('ZADD', skey, string.format('%d', now + sttl), ARGV[1])
  return r
end
