-- The release of an admission (tg_admit_release): leases back, TPM corrected.
--
-- KEYS as for admission (admit.lua). ARGV: 1 id, then per scope (key at 2, tenant at 5 when
-- the tenant has a limit): +0 '1' to give back the lease, +1 the TPM correction in
-- milli-tokens (charged minus used; '' for none), +2 that bucket's capacity in
-- milli-tokens. The correction is made once: the marker turns from '1' into '2'. So the
-- script is idempotent, and the Redis client sends it again when its answer is lost (see
-- release_send), and sends it after an admission that timed out and so may have run
-- (see admit_reply): ZREM of an absent member and a marker that is absent or '2' change
-- nothing.
local tenant = KEYS[4] ~= nil
if ARGV[2] == '1' then redis.call('ZREM', KEYS[3], ARGV[1]) end
if tenant and ARGV[5] == '1' then redis.call('ZREM', KEYS[5], ARGV[1]) end
local kfix, tfix = ARGV[3] ~= '', tenant and ARGV[6] ~= ''
if not kfix and not tfix then return 0 end
if redis.call('SET', KEYS[1], '2', 'XX', 'KEEPTTL', 'GET') ~= '1' then return 0 end
local function fix(key, diff, cap)
  local v = redis.call('GET', key)
  if not v then return end
  local r, m, ts = string.match(v, '^(%-?%d+) (%-?%d+) (%d+)$')
  if not ts or m == '-1' then return end
  m = m + diff
  if m < 0 then m = 0 elseif m > cap then m = cap end
  redis.call('SET', key, r .. string.format(' %d ', m) .. ts, 'KEEPTTL')
end
if kfix then fix(KEYS[2], ARGV[3] + 0, ARGV[4] + 0) end
if tfix then fix(KEYS[4], ARGV[6] + 0, ARGV[7] + 0) end
return 1
