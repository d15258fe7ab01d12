-- The separate reservation (tg_billing_reserve): a retry (attempt > 1), or a first
-- attempt whose admission did not reserve (Redis did not answer it). A first attempt is
-- normally reserved by the admission script itself (admit.lua); both take the money
-- with money.lua.
--
-- KEYS 1 {t:T}:money, 2 {t:T}:res:<id>:<attempt>, 3 {t:T}:kmoney:<key>, 4 {t:T}:holds.
-- ARGV 1 amount (nano-USD), 2 the tenant's available balance to load ('' unknown), 3
-- the key's ('-1' no budget, '' unknown), 4 the hold's field in {t:T}:holds
-- (<id>:<attempt>), 5 what the reconciler needs to write its row if the gateway dies
-- before Postgres has it (key|instance|created ms|amount|model), 6 the periodic budgets
-- (money.lua's bspec; absent when none), whose keys are KEYS 5 and on.
-- Returns {1, 'ok'} or {1, 'duplicate'} (already reserved), {0, 'balance'} or
-- {0, 'key budget'}, {0, 'budget <i>'} (periodic budget i), or {-1, 'init'} when a live balance must first be loaded from
-- Postgres.
local mkey, rkey, hkey = KEYS[1], KEYS[2], KEYS[4]
local amt, tinit, kinit, field, hold = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local kkey = nil
if kinit ~= '-1' then kkey = KEYS[3] end
local bspec, bkeys = ARGV[6], nil
if bspec then
  bkeys = {}
  for i = 5, #KEYS do bkeys[#bkeys + 1] = KEYS[i] end
end
local money, reserve
--@money
if redis.call('EXISTS', rkey) == 1 then return {1, 'duplicate'} end
local m = money()
if m == 9 then return {-1, 'init'} end
if m and m > 10 then return {0, 'budget ' .. (m - 10)} end
if m then return {0, m == 8 and 'key budget' or 'balance'} end
reserve()
return {1, 'ok'}
