-- TPM corrections sent alone (tg_limits.c, fix_flush): the sums a gateway kept for a
-- bucket that no admission of its own read within a few milliseconds (admit.lua says
-- how the corrections usually travel). KEYS: 1 a scope's buckets ("<rpm level> <tpm
-- level> <ts ms>", admit.lua). ARGV: 1 the correction in milli-tokens (charged minus
-- used, summed), 2 the TPM capacity in milli-tokens. The level moves by it, clamped to
-- [0, capacity]; a bucket that is gone (expired: full again) or untracked is left
-- alone. Not idempotent: the gateway never sends it twice (a lost answer loses the
-- correction, which errs on the safe side: fewer tokens, never more).
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local r, m, ts = string.match(v, '^(%-?%d+) (%-?%d+) (%d+)$')
if not ts or m == '-1' then return 0 end
m = m + ARGV[1]
if m < 0 then m = 0 elseif m > ARGV[2] + 0 then m = ARGV[2] + 0 end
redis.call('SET', KEYS[1], r .. string.format(' %d ', m) .. ts, 'KEEPTTL')
return 1
