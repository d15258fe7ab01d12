-- Holds given back (tg_billing_settle once a batch is durable, tg_billing_release_attempt,
-- the reconciler, `tollgate ledger reconcile`): the part of each reservation above its
-- actual cost goes back to the balances, exactly once: the script deletes the
-- reservation key and finds nothing the second time, so it is idempotent and the Redis
-- client sends it again when its answer is lost.
--
-- One call gives back any number of one tenant's holds (a settlement batch sends one
-- call per tenant, not one per request): the index entries go in one HDEL, the
-- reservations are read in one MGET and deleted in one DEL, and the balances move by
-- the sums (one HINCRBY per field, one per key budget), not per hold.
--
-- KEYS 1 {t:T}:money, 2 {t:T}:holds, then per hold i (from 1): 2i+1 its reservation
-- {t:T}:res:<id>:<attempt>, 2i+2 its key's budget {t:T}:kmoney:<key>.
-- ARGV per hold i: 2i-1 the actual cost of this attempt (nano-USD), 2i its field in
-- {t:T}:holds.
-- A reservation key's value is its amount, then the periodic budgets' keys it counted
-- in ("|<key>" each, see money.lua; same hash tag): their period's spend goes down by
-- the same unused part (one DECRBY of the sum per budget key, when the key still exists).
-- An actual cost written "k<n>" keeps the hold: its part above n goes back now, and the
-- reservation stays, at n, with its index entry, until its request settles (a failed
-- attempt's hold, tg_billing_release_attempt: the request's settlement, or the
-- reconciler's when its gateway dies first, gives it back at the cost it decides, and
-- Redis and Postgres move by the same amount).
-- Returns how many holds were given back (0 when all were already settled).
--
-- A hold whose reservation key is missing (Redis lost its data since it was taken) gives
-- nothing back; its key is set to "s<cost>" for 10 minutes instead, so that restore.lua,
-- putting back the holds of a balance read from Postgres before this settlement
-- committed, gives back the part above the cost rather than a hold nobody would settle.
--
-- A hold named twice in one call (the same settlement queued twice, e.g. by two
-- reconciler passes) is given back once: later copies are skipped. A reservation whose
-- value is not a number (never written so) is left alone, with its index entry, for an
-- operator; a key budget that cannot be incremented does not stop the rest. The index
-- entries go last, so an error before them leaves every hold findable by the
-- reconciler.
--
-- Amounts are integers of at most 2^53 (TG_MONEY_REQUEST_MAX), exact in a Lua number; a
-- sum that would pass 2^53 is written out first, so every HINCRBY argument stays exact.
local n = #ARGV / 2
if n < 1 then return 0 end
local rkeys = {}
for i = 1, n do rkeys[i] = KEYS[2 * i + 1] end
local amts = redis.call('MGET', unpack(rkeys))
local LIM = 9007199254740992
local seen, gone, fields, avail, reserved, kback, korder = {}, {}, {}, 0, 0, {}, {}
local bback, border = {}, {}
local function flush(key, field, v)
  if v ~= 0 then redis.call('HINCRBY', key, field, string.format('%d', v)) end
end
local function bflush(key, v)
  if v ~= 0 and redis.pcall('EXISTS', key) == 1 then
    redis.pcall('DECRBY', key, string.format('%d', v))
  end
end
local function kflush(key, v)
  if v ~= 0 and redis.pcall('EXISTS', key) == 1 then
    redis.pcall('HINCRBY', key, 'avail', string.format('%d', v))
  end
end
for i = 1, n do
  local rk = rkeys[i]
  local amt, budgets
  if amts[i] then
    amt, budgets = string.match(amts[i], '^(%d+)(.*)$')
    amt = amt and tonumber(amt)
  end
  if not seen[rk] and (amt or not amts[i]) then
    seen[rk] = true
    local actual = ARGV[2 * i - 1]
    local keep = string.byte(actual, 1) == 107 -- 'k'
    if keep then actual = string.sub(actual, 2) end
    if not (keep and amt) then fields[#fields + 1] = ARGV[2 * i] end
    if amt then
      local back = amt - tonumber(actual)
      if keep then
        redis.call('SET', rk, actual .. budgets, 'KEEPTTL')
        amt = amt - tonumber(actual)
      else
        gone[#gone + 1] = rk
      end
      if math.abs(avail + back) >= LIM then flush(KEYS[1], 'avail', avail); avail = 0 end
      if reserved + amt >= LIM then flush(KEYS[1], 'reserved', -reserved); reserved = 0 end
      avail = avail + back
      reserved = reserved + amt
      local kk = KEYS[2 * i + 2]
      local kb = kback[kk]
      if kb == nil then korder[#korder + 1] = kk; kb = 0 end
      if math.abs(kb + back) >= LIM then kflush(kk, kb); kb = 0 end
      kback[kk] = kb + back
      for bk in string.gmatch(budgets, '|([^|]+)') do
        local bb = bback[bk]
        if bb == nil then border[#border + 1] = bk; bb = 0 end
        if math.abs(bb + back) >= LIM then bflush(bk, bb); bb = 0 end
        bback[bk] = bb + back
      end
    elseif not keep then
      -- No hold: Redis lost its data since it was taken. A balance being loaded from
      -- Postgres may still count it (restore.lua): this says it settled, at this cost.
      redis.call('SET', rk, 's' .. actual, 'EX', '600')
    end
  end
end
flush(KEYS[1], 'avail', avail)
flush(KEYS[1], 'reserved', -reserved)
if #gone > 0 then redis.call('DEL', unpack(gone)) end
for _, kk in ipairs(korder) do kflush(kk, kback[kk]) end
for _, bk in ipairs(border) do bflush(bk, bback[bk]) end
if #fields > 0 then redis.call('HDEL', KEYS[2], unpack(fields)) end
return #gone
