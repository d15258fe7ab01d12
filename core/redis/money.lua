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
--   bspec  the periodic budgets (tg_budgets.h), nil when none: per budget "<limit nano>
--          <expire-at s> <spend to load, '-' unknown> " (one string)
--   bkeys  their keys, {t:T}:bud:<budget>:<period start s>, in bspec's order
--
-- money() checks, and returns nil when the reservation fits, else 7 (the balance cannot
-- cover it), 8 (the key's budget cannot), 9 (a live balance or a period's spend is not in
-- Redis and was not sent: nothing is written; the gateway loads it from Postgres and
-- asks again) or 10 + i (periodic budget i cannot: its period's spend plus the amount
-- would pass its limit). A refusal writes nothing but a balance or spend it loaded (a
-- period's spend key expires a week after its period, after any hold taken in it). reserve() takes it: the balances go
-- down by the amount, each periodic budget's spend goes up by it, the reservation key
-- holds it (and, after a '|', the budget keys it counted in, for settle.lua) for 7 days (beyond any
-- reconciliation delay), and the hold is indexed. Amounts are integers below 2^53, so
-- a Lua number holds them exactly; written with string.format('%d').
local kav, bsp
local bsuf = ''
money = function()
  local av = redis.call('HGET', mkey, 'avail')
  if kkey then kav = redis.call('HGET', kkey, 'avail') end
  if (not av and tinit == '') or (kkey and not kav and kinit == '') then return 9 end
  if bspec then
    bsp = {}
    for lim, exat, init in string.gmatch(bspec, '(%d+) (%d+) (%S+)') do
      local i = #bsp + 1
      local v = redis.call('GET', bkeys[i])
      if not v and init == '-' then return 9 end
      bsp[i] = {v, lim, exat, init}
      bsuf = bsuf .. '|' .. bkeys[i]
    end
  end
  if not av then
    av = tinit
    redis.call('HSETNX', mkey, 'avail', av)
    redis.call('HSETNX', mkey, 'reserved', '0')
  end
  if kkey and not kav then kav = kinit; redis.call('HSETNX', kkey, 'avail', kav) end
  if kav and kav + 0 < amt + 0 then return 8 end
  if av + 0 < amt + 0 then return 7 end
  if bsp then
    for i = 1, #bsp do
      local b = bsp[i]
      if not b[1] then b[1] = b[4]; redis.call('SET', bkeys[i], b[4], 'NX', 'EXAT', b[3]) end
      if b[1] + amt > b[2] + 0 then return 10 + i end
    end
  end
end
reserve = function()
  if amt ~= '0' then
    local neg = string.format('%d', -amt)
    redis.call('HINCRBY', mkey, 'avail', neg)
    redis.call('HINCRBY', mkey, 'reserved', amt)
    if kav then redis.call('HINCRBY', kkey, 'avail', neg) end
    if bsp then for i = 1, #bsp do redis.call('INCRBY', bkeys[i], amt) end end
  end
  redis.call('SET', rkey, amt .. bsuf, 'EX', '604800')
  redis.call('HSET', hkey, field, hold)
end
