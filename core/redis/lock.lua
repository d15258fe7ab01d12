-- The reconciler's election: one per deployment holds this lock (SET NX PX) and renews
-- it on each pass. KEYS 1 tollgate:reconciler. ARGV 1 the instance's id, 2 the lock's
-- TTL in ms. Returns 1 when this instance holds the lock, else 0.
local v = redis.call('GET', KEYS[1])
if v == false then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
