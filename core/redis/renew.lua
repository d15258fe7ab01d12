-- Renewal, every third of the lease TTL while a request with a concurrency limit runs
-- (every third of the marker's TTL, MARKER_TTL_MS in tg_limits.c, when it has only a
-- TPM limit). KEYS: 1 the request's marker, then its lease sets (the key's, the
-- tenant's: those with a limit). ARGV: 1 id, 2 lease ttl ms, 3 marker ttl ms. The sets
-- have no TTL (see admit.lua).
--
--   - The lease is re-acquired, not just extended (plain ZADD, idempotent): after a Redis
--     restart or failover that lost it, or when it expired while Redis was unreachable,
--     the running stream is counted again from its next renewal (a third of the TTL
--     after Redis answers). It is not refused: the request already runs, so a set may
--     hold more members than the limit for a while; new admissions wait (slot() counts
--     every member) until enough requests end.
--   - The marker's TTL is pushed out again, so a stream longer than the marker's first
--     TTL keeps its one TPM correction and its idempotency. A lost marker is not made
--     again: the charge it stands for was lost with it, so no correction is owed.
--
-- Returns the number of leases that had to be added back.
local t = redis.call('TIME')
local exp = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local added = 0
for i = 2, #KEYS do
  added = added + redis.call('ZADD', KEYS[i], exp, ARGV[1])
end
return added
