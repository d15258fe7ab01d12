-- The money reservation, written once: this text replaces the line "--@money" of
-- admit.lua (a first attempt, reserved in the admission script with the limits) and of
-- reserve.lua (a retry, or a first attempt the admission did not reserve), so both make
-- the same writes, key for key, and settlement, the reconciler and `tollgate ledger
-- verify` cannot tell which script reserved (see tg_billing.h).
--
-- The including script declares `money` and `reserve` and sets, before this text:
--   mkey   {t:T}:money (the tenant's live balance: avail, reserved)
--   rkey   {t:T}:res:<id>:<attempt> (the reservation: its amount)
--   hkey   {t:T}:holds (the reconciler's index of holds)
--   kkey   {t:T}:kmoney:<key> (the key's budget: avail), nil when the key has none
--   amt    the amount, nano-USD, decimal
--   tinit  the tenant's available balance to load when Redis has none ('' unknown)
--   kinit  the key's, likewise (read only with kkey)
--   field, hold  the hold's field and value in hkey
--
-- money() checks, and returns nil when the reservation fits, else 7 (the balance cannot
-- cover it), 8 (the key's budget cannot) or 9 (a live balance is not in Redis and was
-- not sent: nothing is written; the gateway loads it from Postgres and asks again). A
-- refusal writes nothing but a balance it loaded. reserve() takes it: the balances go
-- down by the amount, the reservation key holds it for 7 days (beyond any
-- reconciliation delay), and the hold is indexed. Amounts are integers below 2^53, so
-- a Lua number holds them exactly; written with string.format('%d').
local kav
money = function()
  local av = redis.call('HGET', mkey, 'avail')
  if kkey then kav = redis.call('HGET', kkey, 'avail') end
  if (not av and tinit == '') or (kkey and not kav and kinit == '') then return 9 end
  if not av then
    av = tinit
    redis.call('HSETNX', mkey, 'avail', av)
    redis.call('HSETNX', mkey, 'reserved', '0')
  end
  if kkey and not kav then kav = kinit; redis.call('HSETNX', kkey, 'avail', kav) end
  if kav and kav + 0 < amt + 0 then return 8 end
  if av + 0 < amt + 0 then return 7 end
end
reserve = function()
  if amt ~= '0' then
    local neg = string.format('%d', -amt)
    redis.call('HINCRBY', mkey, 'avail', neg)
    redis.call('HINCRBY', mkey, 'reserved', amt)
    if kav then redis.call('HINCRBY', kkey, 'avail', neg) end
  end
  redis.call('SET', rkey, amt, 'EX', '604800')
  redis.call('HSET', hkey, field, hold)
end
