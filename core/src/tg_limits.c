/*
 * Admission in Redis (see tg_limits.h): the scripts, the per-worker wait queue for a
 * concurrency slot, lease renewal for long streams, and the fallback when Redis is down.
 */
#include "tollgate/tg_limits.h"

#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_redis.h"

/* KEYS: 1 marker, 2 key rpm, 3 tenant rpm, 4 key tpm, 5 tenant tpm, 6 key conc, 7 tenant conc
 * ARGV: 1 id, 2 key_rpm, 3 key_burst, 4 tenant_rpm, 5 tenant_burst, 6 key_tpm, 7 tenant_tpm,
 *       8 est_tokens, 9 key_conc, 10 tenant_conc, 11 lease_ttl_ms, 12 marker_ttl_ms
 * Returns {1, "ok"|"duplicate", 0} or {0, which, retry_after_ms}. */
static const char ADMIT_LUA[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local id = ARGV[1]\n"
    "local ttl = tonumber(ARGV[11])\n"
    "if redis.call('EXISTS', KEYS[1]) == 1 then\n"
    "  for i = 6, 7 do\n"
    "    if redis.call('ZSCORE', KEYS[i], id) then redis.call('ZADD', KEYS[i], now + ttl, id) end\n"
    "  end\n"
    "  return {1, 'duplicate', 0}\n"
    "end\n"
    "local function peek(key, per_min, burst, cost)\n"
    "  if per_min < 0 then return true, 0, 0 end\n"
    "  if burst <= 0 then return false, 0, 60000 end\n"
    "  if cost > burst then cost = burst end\n"
    "  local b = redis.call('HMGET', key, 't', 'ts')\n"
    "  local tokens, ts = tonumber(b[1]), tonumber(b[2])\n"
    "  if tokens == nil or ts == nil then tokens, ts = burst, now end\n"
    "  local rate = per_min / 60000.0\n"
    "  if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate) end\n"
    "  if tokens >= cost then return true, tokens, cost end\n"
    "  if rate <= 0 then return false, tokens, 60000 end\n"
    "  return false, tokens, math.ceil((cost - tokens) / rate)\n"
    "end\n"
    "local function take(key, per_min, burst, tokens, cost)\n"
    "  if per_min < 0 then return end\n"
    "  local left = tokens - cost\n"
    "  if left < 0 then left = 0 end\n"
    "  redis.call('HSET', key, 't', tostring(left), 'ts', now)\n"
    "  local full = per_min > 0 and math.ceil(burst * 60000 / per_min) or 60000\n"
    "  redis.call('PEXPIRE', key, full + 1000)\n"
    "end\n"
    "local function slot(key, limit)\n"
    "  if limit < 0 then return true end\n"
    "  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)\n"
    "  if redis.call('ZSCORE', key, id) then return true end\n"
    "  return redis.call('ZCARD', key) < limit\n"
    "end\n"
    "local krpm, kb, trpm, tb = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "local ktpm, ttpm, est = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])\n"
    "local kc, tc = tonumber(ARGV[9]), tonumber(ARGV[10])\n"
    "local ok1, t1, c1 = peek(KEYS[2], krpm, kb, 1)\n"
    "if not ok1 then return {0, 'key rpm', c1} end\n"
    "local ok2, t2, c2 = peek(KEYS[3], trpm, tb, 1)\n"
    "if not ok2 then return {0, 'tenant rpm', c2} end\n"
    "local ok3, t3, c3 = peek(KEYS[4], ktpm, ktpm, est)\n"
    "if not ok3 then return {0, 'key tpm', c3} end\n"
    "local ok4, t4, c4 = peek(KEYS[5], ttpm, ttpm, est)\n"
    "if not ok4 then return {0, 'tenant tpm', c4} end\n"
    "if not slot(KEYS[6], kc) then return {0, 'key concurrency', 1000} end\n"
    "if not slot(KEYS[7], tc) then return {0, 'tenant concurrency', 1000} end\n"
    "take(KEYS[2], krpm, kb, t1, c1)\n"
    "take(KEYS[3], trpm, tb, t2, c2)\n"
    "take(KEYS[4], ktpm, ktpm, t3, c3)\n"
    "take(KEYS[5], ttpm, ttpm, t4, c4)\n"
    "if kc >= 0 then redis.call('ZADD', KEYS[6], now + ttl, id); redis.call('PEXPIRE', KEYS[6], ttl * 2) end\n"
    "if tc >= 0 then redis.call('ZADD', KEYS[7], now + ttl, id); redis.call('PEXPIRE', KEYS[7], ttl * 2) end\n"
    "redis.call('HSET', KEYS[1], 'est', est, 'k', c3, 't', c4)\n"
    "redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[12]))\n"
    "return {1, 'ok', 0}\n";

/* KEYS: 1 marker, 2 key tpm, 3 tenant tpm, 4 key conc, 5 tenant conc
 * ARGV: 1 id, 2 actual tokens or -1, 3 key_tpm, 4 tenant_tpm
 * Releases the leases; corrects the TPM buckets by what was charged minus the actual,
 * once (the marker's field c). */
static const char RELEASE_LUA[] =
    "redis.call('ZREM', KEYS[4], ARGV[1])\n"
    "redis.call('ZREM', KEYS[5], ARGV[1])\n"
    "local actual = tonumber(ARGV[2])\n"
    "if actual < 0 or redis.call('HSETNX', KEYS[1], 'c', 1) == 0 then return 0 end\n"
    "local m = redis.call('HMGET', KEYS[1], 'k', 't')\n"
    "local function fix(key, per_min, charged)\n"
    "  if per_min < 0 or charged == nil then return end\n"
    "  local b = redis.call('HMGET', key, 't')\n"
    "  local tokens = tonumber(b[1])\n"
    "  if tokens == nil then return end\n"
    "  local diff = charged - math.min(actual, per_min)\n"
    "  tokens = math.max(0, math.min(per_min, tokens + diff))\n"
    "  redis.call('HSET', key, 't', tostring(tokens))\n"
    "end\n"
    "fix(KEYS[2], tonumber(ARGV[3]), tonumber(m[1]))\n"
    "fix(KEYS[3], tonumber(ARGV[4]), tonumber(m[2]))\n"
    "return 1\n";

/* KEYS: 1 key conc, 2 tenant conc. ARGV: 1 id, 2 lease_ttl_ms */
static const char RENEW_LUA[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "for i = 1, 2 do\n"
    "  if redis.call('ZSCORE', KEYS[i], ARGV[1]) then\n"
    "    redis.call('ZADD', KEYS[i], now + tonumber(ARGV[2]), ARGV[1])\n"
    "    redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[2]) * 2)\n"
    "  end\n"
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
    char keys[7][96];
};

static void admit_send(tg_admit_t *a);

/* ---- helpers ------------------------------------------------------------------------ */

static void fmt_keys(tg_admit_t *a) {
    int64_t t = a->lim.tenant_id, k = a->lim.key_id;
    snprintf(a->keys[0], sizeof(a->keys[0]), "{t:%lld}:adm:%s", (long long)t, a->id);
    snprintf(a->keys[1], sizeof(a->keys[1]), "{t:%lld}:rpm:k:%lld", (long long)t, (long long)k);
    snprintf(a->keys[2], sizeof(a->keys[2]), "{t:%lld}:rpm:t", (long long)t);
    snprintf(a->keys[3], sizeof(a->keys[3]), "{t:%lld}:tpm:k:%lld", (long long)t, (long long)k);
    snprintf(a->keys[4], sizeof(a->keys[4]), "{t:%lld}:tpm:t", (long long)t);
    snprintf(a->keys[5], sizeof(a->keys[5]), "{t:%lld}:conc:k:%lld", (long long)t, (long long)k);
    snprintf(a->keys[6], sizeof(a->keys[6]), "{t:%lld}:conc:t", (long long)t);
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
    char ttl[24];
    snprintf(ttl, sizeof(ttl), "%d", a->l->cfg.lease_ttl_ms);
    const char *argv[4] = {a->keys[5], a->keys[6], a->id, ttl};
    tg_redis_eval(redis, a->l->renew_script, 2, 4, argv, NULL, renew_done, NULL);
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

static void admit_reply(void *ud, redisReply *r, const char *err) {
    tg_admit_t *a = ud;
    tg_limits_t *l = a->l;
    a->rq = NULL;
    if (a->cancelled) {
        /* The client left while we asked: give back whatever was taken. */
        if (!err && r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 && r->element[0]->integer == 1)
            release_send(l, a, -1);
        admit_free(a);
        return;
    }
    if (err || !r || r->type != REDIS_REPLY_ARRAY || r->elements < 3) {
        if (a->state == A_WAITING)
            queue_remove(l, a);
        tg_log_warn("limits: admission for %s without Redis (%s)", a->id, err ? err : "bad reply");
        local_admit(a);
        return;
    }
    long long ok = r->element[0]->integer;
    const char *which = r->element[1]->str ? r->element[1]->str : "";
    long long retry = r->element[2]->integer;
    if (ok == 1) {
        if (a->state == A_WAITING)
            queue_remove(l, a);
        start_renewal(a);
        deliver(a, TG_ADMIT_OK, NULL, 0, 0);
        return;
    }
    static const char *const names[] = {"key rpm", "tenant rpm", "key tpm", "tenant tpm", "key concurrency",
                                        "tenant concurrency"};
    const char *stable = "limit";
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(which, names[i]))
            stable = names[i];
    if (strstr(stable, "concurrency")) {
        a->attempts++;
        wait_for_slot(a, stable);
        return;
    }
    if (a->state == A_WAITING)
        queue_remove(l, a);
    deliver(a, strstr(stable, "tpm") ? TG_ADMIT_TOKENS : TG_ADMIT_RATE, stable, retry, 0);
}

static void fmt_i(char *buf, int64_t v) { snprintf(buf, 24, "%lld", (long long)v); }

static void admit_send(tg_admit_t *a) {
    tg_limits_t *l = a->l;
    tg_redis_t *redis = tg_state_redis(l->st);
    if (!redis) {
        local_admit(a);
        return;
    }
    char v[11][24];
    fmt_i(v[0], a->lim.key_rpm);
    fmt_i(v[1], a->lim.key_burst);
    fmt_i(v[2], a->lim.tenant_rpm);
    fmt_i(v[3], a->lim.tenant_burst);
    fmt_i(v[4], a->lim.key_tpm);
    fmt_i(v[5], a->lim.tenant_tpm);
    fmt_i(v[6], TG_MAX(a->lim.est_tokens, 0));
    fmt_i(v[7], a->lim.key_conc);
    fmt_i(v[8], a->lim.tenant_conc);
    fmt_i(v[9], l->cfg.lease_ttl_ms);
    fmt_i(v[10], 600000); /* the admission marker lives 10 minutes */
    const char *argv[19] = {a->keys[0], a->keys[1], a->keys[2], a->keys[3], a->keys[4], a->keys[5], a->keys[6],
                            a->id,      v[0],       v[1],       v[2],       v[3],       v[4],       v[5],
                            v[6],       v[7],       v[8],       v[9],       v[10]};
    l->stats.round_trips++;
    a->rq = tg_redis_eval(redis, l->admit_script, 7, 19, argv, NULL, admit_reply, a);
}

tg_admit_t *tg_limits_admit(tg_limits_t *l, const char *request_id, const tg_limit_req_t *lim, tg_admit_cb cb,
                            void *ud) {
    tg_admit_t *a = calloc(1, sizeof(*a));
    a->l = l;
    snprintf(a->id, sizeof(a->id), "%s", request_id);
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

static void release_send(tg_limits_t *l, tg_admit_t *a, int64_t actual) {
    tg_redis_t *redis = tg_state_redis(l->st);
    if (!redis)
        return;
    char v[3][24];
    fmt_i(v[0], actual);
    fmt_i(v[1], a->lim.key_tpm);
    fmt_i(v[2], a->lim.tenant_tpm);
    const char *argv[9] = {a->keys[0], a->keys[3], a->keys[4], a->keys[5], a->keys[6], a->id, v[0], v[1], v[2]};
    l->stats.round_trips++;
    tg_redis_eval(redis, l->release_script, 5, 9, argv, NULL, release_done, NULL);
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
