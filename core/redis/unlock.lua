-- The reconciler lock given back at shutdown, only by its holder, so another instance
-- takes over within one of its passes instead of after the lock's TTL.
-- KEYS 1 tollgate:reconciler. ARGV 1 the instance's id. Returns 1 when it was released.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
