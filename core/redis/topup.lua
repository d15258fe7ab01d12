-- A top-up committed in Postgres, added to the tenant's live balance (tg_billing_topup).
-- Only a balance already live in Redis is adjusted; otherwise it loads from Postgres,
-- which has the top-up.
--
-- KEYS 1 {t:T}:money. ARGV 1 the amount (nano-USD). Returns the new available balance,
-- or nil when none is loaded.
if redis.call('HEXISTS', KEYS[1], 'avail') == 1 then return redis.call('HINCRBY', KEYS[1], 'avail', ARGV[1]) end
return false
