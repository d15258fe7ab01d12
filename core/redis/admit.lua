-- Admission in Redis (tg_limits.c; release.lua and renew.lua are its other scripts).
--
-- The scripts are written for what Redis charges a script (measured with callgrind on
-- Redis 7.0, see spec/bench/RESULTS-limits.md): every argument costs ~1,300 instructions
-- (parsed, then put into the KEYS / ARGV tables), every redis.call ~6,000 (a fake client,
-- the command table, the reply converted back to Lua), tonumber() parses its string twice
-- (strtod), and a Lua number handed to redis.call is formatted with "%.17g". So:
--
--   - each scope (the key, the tenant) keeps all its token buckets in one string,
--     "<rpm level> <tpm level> <ts ms>", written with one SET PX; both scopes' strings
--     are read with one MGET (one GET when only one scope has buckets);
--     levels are integers in milli-tokens, formatted with string.format('%d');
--   - the gateway sends ready strings: capacities and charges already in milli-tokens,
--     TTLs; a limit of -1 costs one string comparison and no command;
--   - the tenant's keys and arguments are left out when the tenant has no limit;
--   - the request's marker is taken with SET NX up front and given back on refusal.
--
-- KEYS: 1 marker, 2 key buckets, 3 key leases, then when the tenant has a
-- limit 4 tenant buckets, 5 tenant leases.
-- ARGV: 1 id, 2 lease ttl ms, then per scope (key at 3, tenant at 10): +0 rpm, +1 rpm
--       bucket capacity in milli-tokens (burst · 1000), +2 tpm, +3 tpm charge in
--       milli-tokens (min(estimate, tpm) · 1000), +4 concurrency, +5 bucket ttl ms (''
--       when the scope has neither rpm nor tpm), +6 the TPM corrections of earlier
--       requests, in milli-tokens ('' none); -1 = no such limit.
--
-- The corrections: a request that ends gives back (or pays) the difference between its
-- TPM charge and what it really used. The gateway does not send a script for that; it
-- sums a bucket's corrections in memory and sends them with the next admission that
-- reads the bucket (tg_limits.c, fix_take), or alone after a few milliseconds
-- (correct.lua). They are added to the stored level, clamped to [0, capacity], before
-- the charge, like release.lua's correction. A refusal writes nothing, so the gateway
-- keeps them for the next admission; an admission whose answer is lost may have
-- applied them, so they are dropped (the safe side: fewer tokens, never more).
--
-- The lease sets have no TTL: the last ZREM of a set deletes it, a member left by a
-- gateway that died is swept when the set looks full (slot() below), so a set lives
-- only while it holds leases (a PEXPIRE per set per admission cost two commands).
-- Returns 0 (admitted), 1 (already admitted: leases refreshed, nothing charged) or
-- {which, retry_after_ms}, which = 1 key rpm, 2 tenant rpm, 3 key tpm, 4 tenant tpm,
-- 5 key concurrency, 6 tenant concurrency (checked in that order), then the money:
-- 7 balance, 8 key budget, 9 init (the live balance is not in Redis and the gateway did
-- not send it: it loads it from Postgres and admits again), 10 + i periodic budget i.
-- Every admitted return goes through done(), which returns its argument here; in the
-- script "admit+slot" (tg_scripts.c), admit_slot.lua makes it take the chosen account's
-- concurrency slot too (+2: the account is full), so a billed request's first attempt
-- costs Redis one script before its upstream call, not two.
--
-- The money (with billing: the first attempt's reservation, see tg_billing.h) follows
-- the limits' keys and arguments, and the script tells the layouts apart by #ARGV (9 or
-- 16 without money, +3 to +5 with it; 4 to 6 for money alone):
-- KEYS +1 {t:T}:money, +2 {t:T}:res:<id>:1, +3 {t:T}:holds, +4 {t:T}:kmoney:<key> (only
-- when the key has a budget, or periodic budgets follow), then the periodic budgets'
-- keys. ARGV +1 amount (nano-USD), +2 the tenant's available balance to load (''
-- unknown), +3 the hold's value in {t:T}:holds (its field is <id>:1), +4 the key's
-- available budget to load ('' unknown, '-1' none; only with a budget or periodic
-- budgets), +5 the periodic budgets (money.lua's bspec; only when there are some).
-- Without limits (money alone: ARGV 1 id, then the money) there is no marker, no TIME,
-- and the reservation key itself is the duplicate check (1: already reserved). With
-- limits the marker's SET NX stands for it (request ids are random and never reused).
-- The money's two functions come from money.lua (the line "--@money" below is replaced
-- by it, so reserve.lua makes the same writes, key for key) and are made only when the
-- money is sent (two closures per call cost a limits-only admission ~1.6% more in
-- Redis). The money is checked after every limit and written with them, so a refusal
-- (limits or money) writes nothing but the loaded balance; 'init' writes nothing at all.
--
-- A level is refilled by floor(Δms · per_min / 60) milli-tokens, so rounding loses under
-- one milli-token per admission; a level of -1 means "not tracked": the bucket starts
-- full. Strings become numbers by arithmetic (x + 0), which parses once.
local now
local function done(r) return r end
--+slot admit_slot
local id = ARGV[1]
local n = #ARGV
local mk, ma = 0, 1
if n >= 16 then mk, ma = 5, 16 elseif n >= 9 then mk, ma = 3, 9 end
local money, reserve
if n > ma then
  local mkey, rkey, hkey, kkey = KEYS[mk + 1], KEYS[mk + 2], KEYS[mk + 3], KEYS[mk + 4]
  local amt, tinit, hold, kinit = ARGV[ma + 1], ARGV[ma + 2], ARGV[ma + 3], ARGV[ma + 4]
  local field = id .. ':1'
  local bspec, bkeys
  if n > ma + 4 then
    bspec, bkeys = ARGV[ma + 5], {}
    for i = mk + 5, #KEYS do bkeys[#bkeys + 1] = KEYS[i] end
    if kinit == '-1' then kkey = nil end
  end
--@money
  if n < 9 then
    if redis.call('EXISTS', rkey) == 1 then return done(1) end
    local m = money()
    if m then return {m, 0} end
    reserve()
    return done(0)
  end
end
local t = redis.call('TIME')
now = t[1] * 1000 + math.floor(t[2] / 1000)
local trpm, ttpm, tconc, tttl = '-1', '-1', '-1', ''
if mk == 5 then trpm, ttpm, tconc, tttl = ARGV[10], ARGV[12], ARGV[14], ARGV[15] end
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', '600000') then
  local exp = string.format('%d', now + ARGV[2])
  if ARGV[7] ~= '-1' then redis.call('ZADD', KEYS[3], 'XX', exp, id) end
  if tconc ~= '-1' then redis.call('ZADD', KEYS[5], 'XX', exp, id) end
  return done(1)
end
local function refuse(which, ms)
  redis.call('DEL', KEYS[1])
  return {which, ms}
end
local function load(v)
  if not v then return -1, -1, 0 end
  local r, m, ts = string.match(v, '^(%-?%d+) (%-?%d+) (%d+)$')
  if not ts then return -1, -1, 0 end
  ts = ts + 0
  return r + 0, m + 0, ts < now and now - ts or 0
end
local function take(level, per_min, cap, cost, dt)
  if cap <= 0 then return nil, 60000 end
  if cost > cap then cost = cap end
  if level < 0 then level = cap else level = math.min(cap, level + math.floor(dt * per_min / 60)) end
  if level >= cost then return level - cost end
  if per_min <= 0 then return nil, 60000 end
  return nil, math.ceil((cost - level) * 60 / per_min)
end
local function fix(level, diff, cap)
  if level < 0 or diff == '' then return level end
  level = level + diff
  if level < 0 then return 0 elseif level > cap then return cap end
  return level
end
-- Both scopes' buckets in one MGET when both are tracked (one command, not two).
local kv, tv
if ARGV[8] ~= '' and tttl ~= '' then
  local v = redis.call('MGET', KEYS[2], KEYS[4])
  kv, tv = v[1], v[2]
elseif ARGV[8] ~= '' then
  kv = redis.call('GET', KEYS[2])
elseif tttl ~= '' then
  tv = redis.call('GET', KEYS[4])
end
local kr, km, kdt = load(kv)
local tr, tm, tdt = load(tv)
local ms
if ARGV[3] == '-1' then kr = -1 else
  kr, ms = take(kr, ARGV[3] + 0, ARGV[4] + 0, 1000, kdt)
  if not kr then return refuse(1, ms) end
end
if trpm == '-1' then tr = -1 else
  tr, ms = take(tr, trpm + 0, ARGV[11] + 0, 1000, tdt)
  if not tr then return refuse(2, ms) end
end
if ARGV[5] == '-1' then km = -1 else
  local per_min = ARGV[5] + 0
  km, ms = take(fix(km, ARGV[9], per_min * 1000), per_min, per_min * 1000, ARGV[6] + 0, kdt)
  if not km then return refuse(3, ms) end
end
if ttpm == '-1' then tm = -1 else
  local per_min = ttpm + 0
  tm, ms = take(fix(tm, ARGV[16], per_min * 1000), per_min, per_min * 1000, ARGV[13] + 0, tdt)
  if not tm then return refuse(4, ms) end
end
local function slot(key, limit)
  limit = limit + 0
  if redis.call('ZCARD', key) < limit then return true end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))
  return redis.call('ZSCORE', key, id) or redis.call('ZCARD', key) < limit
end
if ARGV[7] ~= '-1' and not slot(KEYS[3], ARGV[7]) then return refuse(5, 1000) end
if tconc ~= '-1' and not slot(KEYS[5], tconc) then return refuse(6, 1000) end
if money then
  local m = money()
  if m then return refuse(m, 0) end
end
if ARGV[8] ~= '' then redis.call('SET', KEYS[2], string.format('%d %d %d', kr, km, now), 'PX', ARGV[8]) end
if tttl ~= '' then redis.call('SET', KEYS[4], string.format('%d %d %d', tr, tm, now), 'PX', tttl) end
if ARGV[7] ~= '-1' or tconc ~= '-1' then
  local exp = string.format('%d', now + ARGV[2])
  if ARGV[7] ~= '-1' then redis.call('ZADD', KEYS[3], exp, id) end
  if tconc ~= '-1' then redis.call('ZADD', KEYS[5], exp, id) end
end
if reserve then reserve() end
return done(0)
