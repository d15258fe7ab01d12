/*
 * Admission in Redis (see tg_limits.h): the scripts, the per-worker wait queue for a
 * concurrency slot, lease renewal for long streams, and the fallback when Redis is down.
 */
#include "tollgate/tg_limits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_redis.h"

/*
 * The scripts are written for what Redis charges a script (measured with callgrind on
 * Redis 7.0, see spec/bench/RESULTS-limits.md): every argument costs ~1,300 instructions
 * (parsed, then put into the KEYS / ARGV tables), every redis.call ~6,000 (a fake client,
 * the command table, the reply converted back to Lua), tonumber() parses its string twice
 * (strtod), and a Lua number handed to redis.call is formatted with "%.17g". So:
 *
 *   - each scope (the key, the tenant) keeps all its token buckets in one string,
 *     "<rpm level> <tpm level> <ts ms>", read with one GET and written with one SET PX;
 *     levels are integers in milli-tokens, formatted with string.format('%d');
 *   - the gateway sends ready strings: capacities and charges already in milli-tokens,
 *     TTLs; a limit of -1 costs one string comparison and no command;
 *   - the tenant's keys and arguments are left out when the tenant has no limit;
 *   - the request's marker is taken with SET NX up front and given back on refusal.
 *
 * Admission. KEYS: 1 marker, 2 key buckets, 3 key leases, then when the tenant has a
 * limit 4 tenant buckets, 5 tenant leases.
 * ARGV: 1 id, 2 lease ttl ms, 3 lease set ttl ms, then per scope (key at 4, tenant at
 *       10): +0 rpm, +1 rpm bucket capacity in milli-tokens (burst · 1000), +2 tpm, +3
 *       tpm charge in milli-tokens (min(estimate, tpm) · 1000), +4 concurrency, +5
 *       bucket ttl ms ('' when the scope has neither rpm nor tpm); -1 = no such limit.
 * Returns 0 (admitted), 1 (already admitted: leases refreshed, nothing charged) or
 * {which, retry_after_ms}, which = 1 key rpm, 2 tenant rpm, 3 key tpm, 4 tenant tpm,
 * 5 key concurrency, 6 tenant concurrency (checked in that order).
 *
 * A level is refilled by floor(Δms · per_min / 60) milli-tokens, so rounding loses under
 * one milli-token per admission; a level of -1 means "not tracked": the bucket starts
 * full. Strings become numbers by arithmetic (x + 0), which parses once.
 */
static const char ADMIT_LUA[] =
    "local id = ARGV[1]\n"
    "local t = redis.call('TIME')\n"
    "local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"
    "local trpm, ttpm, tconc, tttl = '-1', '-1', '-1', ''\n"
    "if KEYS[4] then trpm, ttpm, tconc, tttl = ARGV[10], ARGV[12], ARGV[14], ARGV[15] end\n"
    "if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', '600000') then\n"
    "  local exp = string.format('%d', now + ARGV[2])\n"
    "  if ARGV[8] ~= '-1' then redis.call('ZADD', KEYS[3], 'XX', exp, id) end\n"
    "  if tconc ~= '-1' then redis.call('ZADD', KEYS[5], 'XX', exp, id) end\n"
    "  return 1\n"
    "end\n"
    "local function refuse(which, ms)\n"
    "  redis.call('DEL', KEYS[1])\n"
    "  return {which, ms}\n"
    "end\n"
    "local function load(key, ttl)\n"
    "  if ttl == '' then return -1, -1, 0 end\n"
    "  local v = redis.call('GET', key)\n"
    "  if not v then return -1, -1, 0 end\n"
    "  local r, m, ts = string.match(v, '^(%-?%d+) (%-?%d+) (%d+)$')\n"
    "  if not ts then return -1, -1, 0 end\n"
    "  ts = ts + 0\n"
    "  return r + 0, m + 0, ts < now and now - ts or 0\n"
    "end\n"
    "local function take(level, per_min, cap, cost, dt)\n"
    "  if cap <= 0 then return nil, 60000 end\n"
    "  if cost > cap then cost = cap end\n"
    "  if level < 0 then level = cap else level = math.min(cap, level + math.floor(dt * per_min / 60)) end\n"
    "  if level >= cost then return level - cost end\n"
    "  if per_min <= 0 then return nil, 60000 end\n"
    "  return nil, math.ceil((cost - level) * 60 / per_min)\n"
    "end\n"
    "local kr, km, kdt = load(KEYS[2], ARGV[9])\n"
    "local tr, tm, tdt = load(KEYS[4], tttl)\n"
    "local ms\n"
    "if ARGV[4] == '-1' then kr = -1 else\n"
    "  kr, ms = take(kr, ARGV[4] + 0, ARGV[5] + 0, 1000, kdt)\n"
    "  if not kr then return refuse(1, ms) end\n"
    "end\n"
    "if trpm == '-1' then tr = -1 else\n"
    "  tr, ms = take(tr, trpm + 0, ARGV[11] + 0, 1000, tdt)\n"
    "  if not tr then return refuse(2, ms) end\n"
    "end\n"
    "if ARGV[6] == '-1' then km = -1 else\n"
    "  local per_min = ARGV[6] + 0\n"
    "  km, ms = take(km, per_min, per_min * 1000, ARGV[7] + 0, kdt)\n"
    "  if not km then return refuse(3, ms) end\n"
    "end\n"
    "if ttpm == '-1' then tm = -1 else\n"
    "  local per_min = ttpm + 0\n"
    "  tm, ms = take(tm, per_min, per_min * 1000, ARGV[13] + 0, tdt)\n"
    "  if not tm then return refuse(4, ms) end\n"
    "end\n"
    "local function slot(key, limit)\n"
    "  limit = limit + 0\n"
    "  if redis.call('ZCARD', key) < limit then return true end\n"
    "  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now))\n"
    "  return redis.call('ZSCORE', key, id) or redis.call('ZCARD', key) < limit\n"
    "end\n"
    "if ARGV[8] ~= '-1' and not slot(KEYS[3], ARGV[8]) then return refuse(5, 1000) end\n"
    "if tconc ~= '-1' and not slot(KEYS[5], tconc) then return refuse(6, 1000) end\n"
    "if ARGV[9] ~= '' then redis.call('SET', KEYS[2], string.format('%d %d %d', kr, km, now), 'PX', ARGV[9]) end\n"
    "if tttl ~= '' then redis.call('SET', KEYS[4], string.format('%d %d %d', tr, tm, now), 'PX', tttl) end\n"
    "if ARGV[8] ~= '-1' or tconc ~= '-1' then\n"
    "  local exp = string.format('%d', now + ARGV[2])\n"
    "  if ARGV[8] ~= '-1' then redis.call('ZADD', KEYS[3], exp, id); redis.call('PEXPIRE', KEYS[3], ARGV[3]) end\n"
    "  if tconc ~= '-1' then redis.call('ZADD', KEYS[5], exp, id); redis.call('PEXPIRE', KEYS[5], ARGV[3]) end\n"
    "end\n"
    "return 0\n";

/* Release. KEYS as for admission. ARGV: 1 id, then per scope (key at 2, tenant at 5 when
 * the tenant has a limit): +0 '1' to give back the lease, +1 the TPM correction in
 * milli-tokens (charged minus used; '' for none), +2 that bucket's capacity in
 * milli-tokens. The correction is made once: the marker turns from '1' into '2'. */
static const char RELEASE_LUA[] =
    "local tenant = KEYS[4] ~= nil\n"
    "if ARGV[2] == '1' then redis.call('ZREM', KEYS[3], ARGV[1]) end\n"
    "if tenant and ARGV[5] == '1' then redis.call('ZREM', KEYS[5], ARGV[1]) end\n"
    "local kfix, tfix = ARGV[3] ~= '', tenant and ARGV[6] ~= ''\n"
    "if not kfix and not tfix then return 0 end\n"
    "if redis.call('SET', KEYS[1], '2', 'XX', 'KEEPTTL', 'GET') ~= '1' then return 0 end\n"
    "local function fix(key, diff, cap)\n"
    "  local v = redis.call('GET', key)\n"
    "  if not v then return end\n"
    "  local r, m, ts = string.match(v, '^(%-?%d+) (%-?%d+) (%d+)$')\n"
    "  if not ts or m == '-1' then return end\n"
    "  m = m + diff\n"
    "  if m < 0 then m = 0 elseif m > cap then m = cap end\n"
    "  redis.call('SET', key, r .. string.format(' %d ', m) .. ts, 'KEEPTTL')\n"
    "end\n"
    "if kfix then fix(KEYS[2], ARGV[3] + 0, ARGV[4] + 0) end\n"
    "if tfix then fix(KEYS[4], ARGV[6] + 0, ARGV[7] + 0) end\n"
    "return 1\n";

/* Renewal. KEYS: the request's lease sets (the key's, the tenant's: those with a limit).
 * ARGV: 1 id, 2 lease ttl ms, 3 lease set ttl ms. Only a lease the request still holds
 * is extended (ZADD XX). */
static const char RENEW_LUA[] =
    "local t = redis.call('TIME')\n"
    "local exp = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + ARGV[2])\n"
    "for i = 1, #KEYS do\n"
    "  if redis.call('ZADD', KEYS[i], 'XX', 'CH', exp, ARGV[1]) == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[3]) end\n"
    "end\n"
    "return 1\n";

typedef struct local_bucket_s {
    int64_t id;      /* key id, or -tenant id */
    double tokens;
    uint64_t ts_ms;
    int64_t inflight;
    struct local_bucket_s *next;
} local_bucket_t;

struct tg_limits_s {
    uv_loop_t *loop;
    tg_state_t *st;
    tg_admission_config_t cfg;
    int admit_script, release_script, renew_script;
    tg_admit_t *queue_head, *queue_tail;
    int queued;
    local_bucket_t *local;
    tg_limits_stats_t stats;
};

enum { A_ADMITTING, A_WAITING, A_ADMITTED, A_DONE };

struct tg_admit_s {
    tg_limits_t *l;
    char id[72];
    tg_limit_req_t lim;
    tg_admit_cb cb;
    void *ud;
    int state;
    int cancelled;      /* the owner is gone; free when the reply arrives */
    int local;          /* admitted by the local fallback */
    tg_redis_req_t *rq;
    uv_timer_t timer;   /* retry while waiting; lease renewal while admitted */
    int timer_open;
    uint64_t started_ms, deadline_ms;
    int attempts;
    tg_admit_t *qnext, *qprev;
    /* marker, key buckets, key leases, tenant buckets, tenant leases (see ADMIT_LUA) */
    char keys[5][112]; /* the longest: 25 bytes of tag + "a:" + a 71-byte id */
    size_t keylen[5];
    size_t idlen;
};

enum { K_MARKER, K_KEY_BUCKETS, K_KEY_LEASES, K_TENANT_BUCKETS, K_TENANT_LEASES };

static void admit_send(tg_admit_t *a);

/* ---- helpers ------------------------------------------------------------------------ */

/* Writes v in decimal at p and returns the end (no NUL). snprintf per number cost more
 * than the rest of building an admission's arguments. */
static char *put_i64(char *p, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *p++ = '-';
    while (n)
        *p++ = tmp[--n];
    return p;
}

static char *put_str(char *p, const char *s, size_t len) {
    memcpy(p, s, len);
    return p + len;
}

/* The keys, all with the hash tag {t:<tenant>} so one script's keys live on one Redis
 * Cluster slot. */
static void fmt_keys(tg_admit_t *a) {
    char tag[40], kid[24];
    char *e = put_i64(put_str(tag, "{t:", 3), a->lim.tenant_id);
    size_t tl = (size_t)(put_str(e, "}:", 2) - tag);
    size_t kl = (size_t)(put_i64(kid, a->lim.key_id) - kid);
    struct {
        const char *mid;
        const char *tail;
        size_t tail_len;
    } k[5] = {{"a:", a->id, a->idlen}, {"b:k:", kid, kl}, {"conc:k:", kid, kl}, {"b:t", "", 0}, {"conc:t", "", 0}};
    for (int i = 0; i < 5; i++) {
        char *p = put_str(a->keys[i], tag, tl);
        p = put_str(p, k[i].mid, strlen(k[i].mid));
        p = put_str(p, k[i].tail, k[i].tail_len);
        *p = '\0';
        a->keylen[i] = (size_t)(p - a->keys[i]);
    }
}

/* An argument vector for tg_redis_eval: the keys, then strings built in buf. */
typedef struct {
    const char *v[24];
    size_t len[24];
    int n;
    char buf[400];
    char *p;
} args_t;

static int has_tenant(const tg_limit_req_t *l) {
    return l->tenant_rpm >= 0 || l->tenant_tpm >= 0 || l->tenant_conc >= 0;
}

/* The keys of ADMIT_LUA and RELEASE_LUA: the tenant's only when it has a limit. */
static void args_init(args_t *g, const tg_admit_t *a) {
    g->n = 0;
    g->p = g->buf;
    for (int i = 0; i < (has_tenant(&a->lim) ? 5 : 3); i++) {
        g->v[g->n] = a->keys[i];
        g->len[g->n++] = a->keylen[i];
    }
}

static void arg_s(args_t *g, const char *s, size_t len) {
    g->v[g->n] = s;
    g->len[g->n++] = len;
}

static void arg_i(args_t *g, int64_t v) {
    char *s = g->p;
    g->p = put_i64(s, v);
    arg_s(g, s, (size_t)(g->p - s));
}

static int has_conc(const tg_limit_req_t *l) { return l->key_conc >= 0 || l->tenant_conc >= 0; }

static void timer_closed(uv_handle_t *h) { free(h->data); }

static void admit_free(tg_admit_t *a) {
    if (a->timer_open) {
        uv_timer_stop(&a->timer);
        a->timer.data = a;
        uv_close((uv_handle_t *)&a->timer, timer_closed);
    } else {
        free(a);
    }
}

static void queue_remove(tg_limits_t *l, tg_admit_t *a) {
    if (a->qprev)
        a->qprev->qnext = a->qnext;
    else if (l->queue_head == a)
        l->queue_head = a->qnext;
    if (a->qnext)
        a->qnext->qprev = a->qprev;
    else if (l->queue_tail == a)
        l->queue_tail = a->qprev;
    a->qnext = a->qprev = NULL;
    l->queued--;
}

static void deliver(tg_admit_t *a, tg_admit_result_t r, const char *which, int64_t retry_ms, int degraded) {
    tg_admit_outcome_t out = {r, which, retry_ms, degraded, (int)(tg_now_ms() - a->started_ms)};
    tg_limits_stats_t *s = &a->l->stats;
    switch (r) {
    case TG_ADMIT_OK: s->admitted++; break;
    case TG_ADMIT_RATE: s->refused_rate++; break;
    case TG_ADMIT_TOKENS: s->refused_tokens++; break;
    case TG_ADMIT_CONCURRENCY: s->refused_concurrency++; break;
    case TG_ADMIT_QUEUE_FULL: s->queue_full++; break;
    case TG_ADMIT_UNAVAILABLE: break;
    }
    a->state = r == TG_ADMIT_OK ? A_ADMITTED : A_DONE;
    a->cb(a->ud, &out);
}

/* ---- the local fallback -------------------------------------------------------------- */

static local_bucket_t *local_get(tg_limits_t *l, int64_t id) {
    for (local_bucket_t *b = l->local; b; b = b->next)
        if (b->id == id)
            return b;
    local_bucket_t *b = calloc(1, sizeof(*b));
    b->id = id;
    b->tokens = -1;
    b->next = l->local;
    l->local = b;
    return b;
}

static int local_take(tg_limits_t *l, int64_t id, int64_t per_min, int64_t burst, int64_t conc) {
    local_bucket_t *b = local_get(l, id);
    uint64_t now = tg_now_ms();
    if (per_min >= 0) {
        if (b->tokens < 0) {
            b->tokens = (double)burst;
            b->ts_ms = now;
        }
        b->tokens = TG_MIN((double)burst, b->tokens + (double)(now - b->ts_ms) * (double)per_min / 60000.0);
        b->ts_ms = now;
        if (b->tokens < 1)
            return 0;
    }
    if (conc >= 0 && b->inflight >= conc)
        return 0;
    if (per_min >= 0)
        b->tokens -= 1;
    return 1;
}

static void local_admit(tg_admit_t *a) {
    tg_limits_t *l = a->l;
    tg_fail_policy_t rate = l->cfg.fail_rate, conc = l->cfg.fail_concurrency;
    int need_rate = a->lim.key_rpm >= 0 || a->lim.tenant_rpm >= 0 || a->lim.key_tpm >= 0 || a->lim.tenant_tpm >= 0;
    int need_conc = has_conc(&a->lim);
    if (a->lim.on_down) {
        int bits = (a->lim.key_rpm >= 0 || a->lim.tenant_rpm >= 0 ? 1 : 0) |
                   (a->lim.key_tpm >= 0 || a->lim.tenant_tpm >= 0 ? 2 : 0) | (need_conc ? 4 : 0);
        int decided = a->lim.on_down(a->ud, bits);
        if (decided >= 0)
            rate = conc = (tg_fail_policy_t)decided;
    }
    if ((need_rate && rate == TG_FAIL_CLOSED) || (need_conc && conc == TG_FAIL_CLOSED)) {
        l->stats.redis_down_closed++;
        deliver(a, TG_ADMIT_UNAVAILABLE, "limiter unavailable", 1000, 1);
        return;
    }
    int local = (need_rate && rate == TG_FAIL_LOCAL) || (need_conc && conc == TG_FAIL_LOCAL);
    if (local) {
        int64_t kr = rate == TG_FAIL_LOCAL ? a->lim.key_rpm : -1, tr = rate == TG_FAIL_LOCAL ? a->lim.tenant_rpm : -1;
        int64_t kc = conc == TG_FAIL_LOCAL ? a->lim.key_conc : -1, tc = conc == TG_FAIL_LOCAL ? a->lim.tenant_conc : -1;
        if (!local_take(l, a->lim.key_id, kr, a->lim.key_burst, kc) ||
            !local_take(l, -a->lim.tenant_id, tr, a->lim.tenant_burst, tc)) {
            l->stats.redis_down_local++;
            deliver(a, TG_ADMIT_RATE, "local limit (limiter unavailable)", 1000, 1);
            return;
        }
        local_get(l, a->lim.key_id)->inflight++;
        local_get(l, -a->lim.tenant_id)->inflight++;
        a->local = 1;
        l->stats.redis_down_local++;
    } else {
        l->stats.redis_down_open++;
    }
    deliver(a, TG_ADMIT_OK, NULL, 0, 1);
}

/* ---- waiting for a slot -------------------------------------------------------------- */

static void retry_cb(uv_timer_t *t) {
    tg_admit_t *a = t->data;
    if (a->state == A_WAITING)
        admit_send(a);
}

static void wait_for_slot(tg_admit_t *a, const char *which) {
    tg_limits_t *l = a->l;
    uint64_t now = tg_now_ms();
    if (a->state != A_WAITING) {
        if (l->queued >= l->cfg.queue_max) {
            deliver(a, TG_ADMIT_QUEUE_FULL, which, 1000, 0);
            return;
        }
        a->state = A_WAITING;
        a->deadline_ms = now + (uint64_t)l->cfg.queue_timeout_ms;
        a->qprev = l->queue_tail;
        if (l->queue_tail)
            l->queue_tail->qnext = a;
        else
            l->queue_head = a;
        l->queue_tail = a;
        l->queued++;
        l->stats.waited++;
    }
    if (now >= a->deadline_ms) {
        queue_remove(l, a);
        deliver(a, TG_ADMIT_CONCURRENCY, which, 1000, 0);
        return;
    }
    /* Poll with backoff and jitter (slots may free on any instance); a slot freed on
     * this worker wakes the first waiter at once. */
    uint32_t r = 0;
    tg_random_bytes(&r, sizeof(r));
    uint64_t delay = TG_MIN(250u, 10u << TG_MIN(a->attempts, 5)) + r % 10;
    delay = TG_MIN(delay, a->deadline_ms - now);
    if (!a->timer_open) {
        uv_timer_init(l->loop, &a->timer);
        a->timer.data = a;
        a->timer_open = 1;
    }
    uv_timer_start(&a->timer, retry_cb, delay, 0);
}

static void wake_waiter(tg_limits_t *l) {
    tg_admit_t *a = l->queue_head;
    if (a && a->state == A_WAITING && !a->rq && a->timer_open)
        uv_timer_start(&a->timer, retry_cb, 0, 0);
}

/* ---- renewal ------------------------------------------------------------------------- */

static void renew_done(void *ud, redisReply *r, const char *err) {
    TG_UNUSED(ud);
    TG_UNUSED(r);
    if (err)
        tg_log_debug("limits: lease renewal failed: %s", err);
}

static void renew_cb(uv_timer_t *t) {
    tg_admit_t *a = t->data;
    tg_redis_t *redis = tg_state_redis(a->l->st);
    if (!redis || a->local)
        return;
    args_t g;
    g.n = 0;
    g.p = g.buf;
    if (a->lim.key_conc >= 0)
        arg_s(&g, a->keys[K_KEY_LEASES], a->keylen[K_KEY_LEASES]);
    if (a->lim.tenant_conc >= 0)
        arg_s(&g, a->keys[K_TENANT_LEASES], a->keylen[K_TENANT_LEASES]);
    int nkeys = g.n;
    arg_s(&g, a->id, a->idlen);
    arg_i(&g, a->l->cfg.lease_ttl_ms);
    arg_i(&g, 2 * (int64_t)a->l->cfg.lease_ttl_ms);
    tg_redis_eval(redis, a->l->renew_script, nkeys, g.n, g.v, g.len, renew_done, NULL);
}

static void start_renewal(tg_admit_t *a) {
    if (!has_conc(&a->lim) || a->local)
        return;
    if (!a->timer_open) {
        uv_timer_init(a->l->loop, &a->timer);
        a->timer.data = a;
        a->timer_open = 1;
    }
    uint64_t every = (uint64_t)TG_MAX(a->l->cfg.lease_ttl_ms / 3, 100);
    uv_timer_start(&a->timer, renew_cb, every, every);
}

/* ---- the admission round trip -------------------------------------------------------- */

static void release_send(tg_limits_t *l, tg_admit_t *a, int64_t actual);

/* The admission script's reply: 0 or 1 (admitted), or {which, retry_after_ms}. */
static void admit_reply(void *ud, redisReply *r, const char *err) {
    tg_admit_t *a = ud;
    tg_limits_t *l = a->l;
    a->rq = NULL;
    int admitted = !err && r && r->type == REDIS_REPLY_INTEGER && (r->integer == 0 || r->integer == 1);
    int refused = !err && r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                  r->element[0]->type == REDIS_REPLY_INTEGER && r->element[1]->type == REDIS_REPLY_INTEGER &&
                  r->element[0]->integer >= 1 && r->element[0]->integer <= 6;
    if (a->cancelled) {
        /* The client left while we asked: give back whatever was taken. */
        if (admitted)
            release_send(l, a, -1);
        admit_free(a);
        return;
    }
    if (!admitted && !refused) {
        if (a->state == A_WAITING)
            queue_remove(l, a);
        tg_log_warn("limits: admission for %s without Redis (%s)", a->id, err ? err : "bad reply");
        local_admit(a);
        return;
    }
    if (admitted) {
        if (a->state == A_WAITING)
            queue_remove(l, a);
        start_renewal(a);
        deliver(a, TG_ADMIT_OK, NULL, 0, 0);
        return;
    }
    static const char *const names[] = {"key rpm", "tenant rpm", "key tpm", "tenant tpm", "key concurrency",
                                        "tenant concurrency"};
    long long which = r->element[0]->integer;
    const char *name = names[which - 1];
    if (which >= 5) {
        a->attempts++;
        wait_for_slot(a, name);
        return;
    }
    if (a->state == A_WAITING)
        queue_remove(l, a);
    deliver(a, which >= 3 ? TG_ADMIT_TOKENS : TG_ADMIT_RATE, name, r->element[1]->integer, 0);
}

/* One scope's six arguments (see ADMIT_LUA). */
static void scope_args(args_t *g, int64_t rpm, int64_t burst, int64_t tpm, int64_t conc, int64_t est) {
    arg_i(g, rpm);
    arg_i(g, rpm >= 0 ? burst * 1000 : -1);
    arg_i(g, tpm);
    arg_i(g, tpm >= 0 ? TG_MIN(est, tpm) * 1000 : -1);
    arg_i(g, conc);
    if (rpm < 0 && tpm < 0) {
        arg_s(g, "", 0);
        return;
    }
    /* The buckets live until both would be full again, plus a second. */
    int64_t full = 60000;
    if (rpm > 0)
        full = TG_MAX(full, (TG_MAX(burst, 0) * 60000 + rpm - 1) / rpm);
    arg_i(g, full + 1000);
}

static void admit_send(tg_admit_t *a) {
    tg_limits_t *l = a->l;
    tg_redis_t *redis = tg_state_redis(l->st);
    if (!redis) {
        local_admit(a);
        return;
    }
    const tg_limit_req_t *m = &a->lim;
    int64_t est = TG_MAX(m->est_tokens, 0);
    args_t g;
    args_init(&g, a);
    int nkeys = g.n;
    arg_s(&g, a->id, a->idlen);
    arg_i(&g, l->cfg.lease_ttl_ms);
    arg_i(&g, 2 * (int64_t)l->cfg.lease_ttl_ms);
    scope_args(&g, m->key_rpm, m->key_burst, m->key_tpm, m->key_conc, est);
    if (has_tenant(m))
        scope_args(&g, m->tenant_rpm, m->tenant_burst, m->tenant_tpm, m->tenant_conc, est);
    l->stats.round_trips++;
    a->rq = tg_redis_eval(redis, l->admit_script, nkeys, g.n, g.v, g.len, admit_reply, a);
}

tg_admit_t *tg_limits_admit(tg_limits_t *l, const char *request_id, const tg_limit_req_t *lim, tg_admit_cb cb,
                            void *ud) {
    tg_admit_t *a = calloc(1, sizeof(*a));
    a->l = l;
    snprintf(a->id, sizeof(a->id), "%s", request_id);
    a->idlen = strlen(a->id);
    a->lim = *lim;
    if (a->lim.key_burst < 0)
        a->lim.key_burst = a->lim.key_rpm;
    if (a->lim.tenant_burst < 0)
        a->lim.tenant_burst = a->lim.tenant_rpm;
    a->cb = cb;
    a->ud = ud;
    a->started_ms = tg_now_ms();
    fmt_keys(a);
    admit_send(a);
    return a;
}

static void release_done(void *ud, redisReply *r, const char *err) {
    TG_UNUSED(ud);
    TG_UNUSED(r);
    if (err)
        tg_log_warn("limits: release failed (%s); the leases expire by their TTL", err);
}

/* One scope's release arguments (see RELEASE_LUA): give back its lease, and its TPM
 * correction (charged minus used, in milli-tokens) with the bucket's capacity, unless it
 * has no TPM limit or the usage is unknown. */
static void release_args(args_t *g, int64_t conc, int64_t tpm, int64_t est, int64_t actual) {
    arg_s(g, "1", conc >= 0);
    if (tpm < 0 || actual < 0) {
        arg_s(g, "", 0);
        arg_s(g, "", 0);
        return;
    }
    arg_i(g, (TG_MIN(est, tpm) - TG_MIN(actual, tpm)) * 1000);
    arg_i(g, tpm * 1000);
}

static void release_send(tg_limits_t *l, tg_admit_t *a, int64_t actual) {
    tg_redis_t *redis = tg_state_redis(l->st);
    const tg_limit_req_t *m = &a->lim;
    int fix = actual >= 0 && (m->key_tpm >= 0 || m->tenant_tpm >= 0);
    if (!redis || (!has_conc(m) && !fix))
        return; /* no lease to give back and nothing to correct: no round trip */
    int64_t est = TG_MAX(m->est_tokens, 0);
    args_t g;
    args_init(&g, a);
    int nkeys = g.n;
    arg_s(&g, a->id, a->idlen);
    release_args(&g, m->key_conc, m->key_tpm, est, actual);
    if (has_tenant(m))
        release_args(&g, m->tenant_conc, m->tenant_tpm, est, actual);
    l->stats.round_trips++;
    tg_redis_eval(redis, l->release_script, nkeys, g.n, g.v, g.len, release_done, NULL);
}

void tg_admit_cancel(tg_admit_t *a) {
    if (!a)
        return;
    tg_limits_t *l = a->l;
    if (a->state == A_WAITING)
        queue_remove(l, a);
    if (a->rq) {
        /* The reply is still coming: it releases whatever it took, then frees. */
        a->cancelled = 1;
        if (a->timer_open)
            uv_timer_stop(&a->timer);
        return;
    }
    if (a->state == A_ADMITTED)
        tg_admit_release(a, -1);
    else
        admit_free(a);
}

void tg_admit_release(tg_admit_t *a, int64_t actual_tokens) {
    if (!a)
        return;
    if (a->state != A_ADMITTED && !a->local) {
        /* Still asking Redis (or waiting for a slot): the client left first. The pending
         * reply gives back whatever it took and frees the handle. */
        tg_admit_cancel(a);
        return;
    }
    tg_limits_t *l = a->l;
    if (a->local) {
        local_get(l, a->lim.key_id)->inflight--;
        local_get(l, -a->lim.tenant_id)->inflight--;
    } else if (a->state == A_ADMITTED) {
        release_send(l, a, actual_tokens);
    }
    int conc = has_conc(&a->lim);
    admit_free(a);
    if (conc)
        wake_waiter(l);
}

tg_limits_t *tg_limits_create(uv_loop_t *loop, tg_state_t *st, const tg_admission_config_t *cfg) {
    tg_limits_t *l = calloc(1, sizeof(*l));
    l->loop = loop;
    l->st = st;
    l->cfg = *cfg;
    tg_redis_t *redis = tg_state_redis(st);
    if (redis) {
        l->admit_script = tg_redis_script_register(redis, ADMIT_LUA);
        l->release_script = tg_redis_script_register(redis, RELEASE_LUA);
        l->renew_script = tg_redis_script_register(redis, RENEW_LUA);
    }
    return l;
}

void tg_limits_destroy(tg_limits_t *l) {
    if (!l)
        return;
    local_bucket_t *b = l->local;
    while (b) {
        local_bucket_t *next = b->next;
        free(b);
        b = next;
    }
    free(l);
}

const tg_limits_stats_t *tg_limits_stats(const tg_limits_t *l) { return &l->stats; }
