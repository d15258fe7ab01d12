-- A tenant's live balance loaded from Postgres (tg_billing_holds.c, INIT_SQL), with the
-- holds of its requests still in flight put back: after Redis lost its data (restarted
-- empty, flushed) their reservation keys and index entries are gone, and without them
-- their settlement would give nothing back, leaving the live balance below Postgres' by
-- what they held above their cost. Runs only while the balance is not in Redis: the
-- first load wins, a second (another request, another gateway) changes nothing.
--
-- KEYS 1 {t:T}:money, 2 {t:T}:holds, then per hold i (from 1): 2+i its reservation
-- {t:T}:res:<id>:<attempt>.
-- ARGV 1 the available balance Postgres gave (its balance minus every open held
-- reservation, these included), then per hold i: 3i-1 its field in {t:T}:holds, 3i its
-- amount (nano-USD), 3i+1 its index value (as reserve() wrote it, see money.lua).
--
-- Per hold, what the reservation key says now:
--   nothing: the hold is put back (amount, 7 days, as money.lua writes it; index entry);
--   "s<cost>": settle.lua found no hold for it since Redis lost its data (its request
--     settled after Postgres' answer was read, before this ran): the part above its cost
--     goes back to the balance now, as settle.lua would have done;
--   an amount: the hold survived (only the balance was lost): counted as reserved.
-- Then the balance is written: avail and reserved (the sum of the holds in Redis).
-- Returns how many holds were put back, or -1 when the balance was already there.
if redis.call('HEXISTS', KEYS[1], 'avail') == 1 then return -1 end
local avail = tonumber(ARGV[1])
local reserved, n = 0, 0
for i = 3, #KEYS do
  local j = 3 * (i - 2) - 1
  local amt = tonumber(ARGV[j + 1])
  local cur = redis.call('GET', KEYS[i])
  if not cur then
    redis.call('SET', KEYS[i], ARGV[j + 1], 'EX', '604800')
    redis.call('HSETNX', KEYS[2], ARGV[j], ARGV[j + 2])
    reserved = reserved + amt
    n = n + 1
  elseif string.byte(cur, 1) == 115 then -- 's'
    local cost = tonumber(string.sub(cur, 2))
    if cost and amt > cost then avail = avail + amt - cost end
  else
    local a = tonumber(string.match(cur, '^(%d+)'))
    if a then reserved = reserved + a end
  end
end
redis.call('HSET', KEYS[1], 'avail', string.format('%d', avail), 'reserved', string.format('%d', reserved))
return n
