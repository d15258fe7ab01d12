-- The cost of a request that went ahead without a hold (money open while Redis was
-- down), sent once its settlement is in Postgres: it comes off the live balances that
-- are loaded; one not loaded yet is loaded from Postgres later, which has it.
--
-- KEYS 1 {t:T}:money, 2 {t:T}:kmoney:<key>. ARGV 1 the cost (nano-USD). Returns 1.
local neg = string.format('%d', -tonumber(ARGV[1]))
if redis.call('HEXISTS', KEYS[1], 'avail') == 1 then redis.call('HINCRBY', KEYS[1], 'avail', neg) end
if redis.call('HEXISTS', KEYS[2], 'avail') == 1 then redis.call('HINCRBY', KEYS[2], 'avail', neg) end
return 1
