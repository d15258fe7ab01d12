-- A hold given back (tg_billing_settle, tg_billing_release_attempt, the reconciler,
-- `tollgate ledger reconcile`): the part of the reservation above the actual cost goes
-- back to the balances, exactly once: the script deletes the reservation key and finds
-- nothing the second time, so it is idempotent and the Redis client sends it again when
-- its answer is lost.
--
-- KEYS 1 {t:T}:money, 2 {t:T}:res:<id>:<attempt>, 3 {t:T}:kmoney:<key>, 4 {t:T}:holds.
-- ARGV 1 the actual cost of this attempt (nano-USD), 2 the hold's field in {t:T}:holds.
-- The reservation key's value is the amount, then the periodic budgets' keys it
-- counted in ("|<key>" each, see money.lua).
-- Returns the amount credited back, or nil when it was already settled.
redis.call('HDEL', KEYS[4], ARGV[2])
local amt = redis.call('GET', KEYS[2])
if not amt then return false end
redis.call('DEL', KEYS[2])
local budgets
amt, budgets = string.match(amt, '^(%d+)(.*)$')
amt = tonumber(amt)
local back = string.format('%d', amt - tonumber(ARGV[1]))
redis.call('HINCRBY', KEYS[1], 'avail', back)
redis.call('HINCRBY', KEYS[1], 'reserved', string.format('%d', -amt))
if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('HINCRBY', KEYS[3], 'avail', back) end
-- The periodic budgets the hold counted in (money.lua wrote their keys after the amount,
-- each after a '|'; same hash tag): their period's spend goes down by the same part.
if budgets ~= '' then
  for bk in string.gmatch(budgets, '|([^|]+)') do
    if redis.call('EXISTS', bk) == 1 then redis.call('DECRBY', bk, back) end
  end
end
return back
