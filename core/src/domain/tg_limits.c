/*
 * Admission in Redis (see tg_limits.h): the scripts, the per-worker wait queue for a
 * concurrency slot, lease renewal for long streams, and the fallback when Redis is down.
 */
#include "tollgate/tg_limits.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_redis.h"
#include "tollgate/tg_scripts.h"

/* The scripts are core/redis/admit.lua (with money.lua, billing's reservation),
 * release.lua, correct.lua and renew.lua (tg_scripts.h): their header comments say what
 * each key and argument is and what the script returns; admit_send, release_args,
 * fix_flush and renew_cb build those arguments.
 *
 * The end of a request admitted in Redis is no script (issue #17, goal 4): its leases go
 * back with a plain ZREM each (sent again when the answer is lost, like the script was),
 * and its TPM correction (charged minus used) is summed per bucket in this worker's
 * table (fix_add) and travels with the next admission that reads that bucket
 * (fix_take), or alone by correct.lua FIX_DELAY_MS later (fix_flush). release.lua stays
 * for the ends whose admission may not have run (a cancelled or lost admission): its
 * marker makes that correction conditional and once. */

/* The marker's TTL: admit.lua sets it (SET NX PX 600000), renewal keeps it. */
#define MARKER_TTL_MS 600000

/* TPM corrections waiting for an admission to carry them: at most FIX_MAX buckets (a
 * new one beyond sends the oldest alone), each sent alone after FIX_DELAY_MS at most. */
#define FIX_MAX 64
#define FIX_DELAY_MS 20

typedef struct {
    char key[112];   /* the bucket's key: tg_admit_t.keys[K_KEY_BUCKETS or K_TENANT_BUCKETS] */
    size_t keylen;
    int64_t diff;    /* milli-tokens to add to the TPM level (charged minus used, summed) */
    int64_t cap;     /* the TPM capacity, milli-tokens, of the last request that added */
} fix_t;

/* How long requests of a scope occupied their concurrency slot, for Retry-After (see
 * conc_retry_ms): a small direct-mapped table per worker; a collision just replaces. */
#define OCCUPANCY_SLOTS 256

typedef struct {
    int64_t scope;   /* key id · 2, or tenant id · 2 + 1 */
    uint32_t ewma_ms;
} occupancy_t;

struct tg_limits_s {
    uv_loop_t *loop;
    tg_state_t *st;
    tg_admission_config_t cfg;
    int admit_script, admit_slot_script, release_script, renew_script;
    tg_admit_t *queue_head, *queue_tail;
    int queued;
    occupancy_t occupancy[OCCUPANCY_SLOTS];
    int correct_script;
    fix_t fix[FIX_MAX]; /* the pending corrections, fix[0 .. nfix) */
    int nfix;
    uv_timer_t *fix_timer; /* armed while nfix > 0; allocated (freed by its close) */
    tg_limits_stats_t stats;
};

enum { A_ADMITTING, A_WAITING, A_ADMITTED, A_DONE, A_RELEASING };

struct tg_admit_s {
    tg_limits_t *l;
    char id[72];
    tg_limit_req_t lim;
    tg_admit_cb cb;
    void *ud;
    int state;
    int cancelled;      /* the owner is gone; free when the reply arrives */
    int local;          /* admitted by the local fallback */
    int local_conc[2];  /* holds a local concurrency count: [0] the key's, [1] the tenant's */
    int64_t local_tpm[2]; /* tokens charged to the local TPM buckets (to correct on release) */
    int limited;        /* some limit applies (else only the money is checked) */
    int has_money;      /* `money` is sent with the admission */
    int reserved;       /* the script took the reservation */
    int charged;        /* the script charged the buckets (0, not 1: already admitted) */
    int budget;         /* the periodic budget that refused (TG_ADMIT_PERIOD_BUDGET) */
    tg_limit_money_t money;
    tg_redis_req_t *rq;
    uv_timer_t timer;   /* retry while waiting; lease renewal while admitted */
    int timer_open;
    uint64_t started_ms, deadline_ms;
    int attempts;
    int sent_up;        /* the last admission went out on a live connection */
    int refused_by;     /* 5 key, 6 tenant concurrency (see admit.lua) */
    int queued;         /* it entered the wait queue */
    uint64_t admitted_ms;
    int64_t actual;     /* A_RELEASING: the usage the release corrects to */
    int64_t fixed[2];   /* the corrections the admission in flight carries (key, tenant) */
    int fixing[2];      /* ... for each bucket: 1 when it carries one */
    tg_admit_t *qnext, *qprev;
    /* marker, key buckets, key leases, tenant buckets, tenant leases (see admit.lua) */
    char keys[5][112]; /* the longest: 25 bytes of tag + "a:" + a 71-byte id */
    size_t keylen[5];
    size_t idlen;
    /* The account's slot asked with the admission (lim.slot_key copied; "" none). */
    char slot_key[64];
    size_t slot_keylen;
    int slot_sent;      /* the admission in flight carries it */
    int slot;           /* what its answer said: 1 taken, 0 full, -1 none yet */
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
    const char *v[48];
    size_t len[48];
    int n;
    char buf[400];
    char *p;
} args_t;

static int has_tenant(const tg_limit_req_t *l) {
    return l->tenant_rpm >= 0 || l->tenant_tpm >= 0 || l->tenant_conc >= 0;
}

/* The keys of admit.lua and release.lua: the tenant's only when it has a limit, none
 * when no limit applies (an admission for the money alone). */
static void args_init(args_t *g, const tg_admit_t *a) {
    g->n = 0;
    g->p = g->buf;
    for (int i = 0; a->limited && i < (has_tenant(&a->lim) ? 5 : 3); i++) {
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
    /* waited_ms: from the admission's start, for one that entered the wait queue. */
    int waited = a->queued ? (int)(tg_now_ms() - a->started_ms) : 0;
    tg_admit_outcome_t out = {r,         which,     retry_ms, degraded, waited, a->reserved,
                              a->budget, a->queued, r == TG_ADMIT_OK ? a->slot : -1};
    tg_limits_stats_t *s = &a->l->stats;
    switch (r) {
    case TG_ADMIT_OK: s->admitted += (uint64_t)a->limited; break;
    case TG_ADMIT_RATE: s->refused_rate++; break;
    case TG_ADMIT_TOKENS: s->refused_tokens++; break;
    case TG_ADMIT_CONCURRENCY: s->refused_concurrency++; break;
    case TG_ADMIT_QUEUE_FULL: s->queue_full++; break;
    case TG_ADMIT_UNAVAILABLE:
    case TG_ADMIT_BALANCE:
    case TG_ADMIT_BUDGET:
    case TG_ADMIT_PERIOD_BUDGET:
    case TG_ADMIT_MONEY_INIT: break; /* the money's refusals are billing's to count */
    }
    a->state = r == TG_ADMIT_OK ? A_ADMITTED : A_DONE;
    a->cb(a->ud, &out);
}

/* ---- the local fallback -------------------------------------------------------------- */

/*
 * One table per instance (this process), shared by its workers under a mutex, so that
 * `local` over-admits N (instances) times a limit, not N × W: it is only touched while
 * Redis cannot be asked, never on the normal path. An entry is a key (id > 0) or a tenant
 * (-id): its RPM bucket (capacity = burst, refill rpm / 60 s), its TPM bucket (capacity =
 * tpm, refill tpm / 60 s, charged min(estimate, tpm) and corrected on release), and the
 * requests it admitted that are still running. A new entry starts full, like a Redis
 * bucket never seen. The table is bounded: an entry whose buckets are full again and
 * that holds nothing is dropped when space is needed (dropping it loses nothing: a new
 * one starts full too); when no entry can go, the request fails closed.
 */
typedef struct local_entry_s {
    int64_t id;
    double rpm_tokens, tpm_tokens;
    uint64_t ts_ms;
    uint64_t full_at_ms; /* both buckets are full again from then on */
    int64_t inflight;
    struct local_entry_s *next;
} local_entry_t;

enum { LOCAL_SLOTS = 4096, LOCAL_MAX = 65536 };

static struct {
    pthread_mutex_t mu;
    local_entry_t *slot[LOCAL_SLOTS];
    size_t n;
    uint64_t swept_ms;
} local_tab = {.mu = PTHREAD_MUTEX_INITIALIZER};
static int local_users; /* tg_limits_t alive (under the mutex): the last one frees the table */

static unsigned local_hash(int64_t id) { return (unsigned)(((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 52); }

/* Drops the entries that hold nothing and are full again (at most once a second). */
static void local_sweep(uint64_t now) {
    if (now - local_tab.swept_ms < 1000)
        return;
    local_tab.swept_ms = now;
    for (unsigned i = 0; i < LOCAL_SLOTS; i++) {
        local_entry_t **pp = &local_tab.slot[i];
        while (*pp) {
            local_entry_t *e = *pp;
            if (e->inflight == 0 && now >= e->full_at_ms) {
                *pp = e->next;
                free(e);
                local_tab.n--;
            } else {
                pp = &e->next;
            }
        }
    }
}

/* The entry of `id` (created full when `create`), or NULL. Under the mutex. */
static local_entry_t *local_find(int64_t id, int create, uint64_t now) {
    unsigned h = local_hash(id);
    for (local_entry_t *e = local_tab.slot[h]; e; e = e->next)
        if (e->id == id)
            return e;
    if (!create)
        return NULL;
    if (local_tab.n >= LOCAL_MAX)
        local_sweep(now);
    if (local_tab.n >= LOCAL_MAX)
        return NULL;
    local_entry_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->id = id;
    e->rpm_tokens = e->tpm_tokens = -1; /* full at the first use */
    e->ts_ms = now;
    e->next = local_tab.slot[h];
    local_tab.slot[h] = e;
    local_tab.n++;
    return e;
}

/* One scope's limits that the local table enforces (-1: not enforced locally). */
typedef struct {
    int64_t id, rpm, burst, tpm, conc;
} local_scope_t;

static double refill(double tokens, double cap, int64_t per_min, uint64_t dt_ms) {
    if (tokens < 0)
        return cap;
    return TG_MIN(cap, tokens + (double)dt_ms * (double)per_min / 60000.0);
}

/* Refills e and checks s against it: 0 when it admits, else the refusing TG_ADMIT_* with
 * *retry_ms set. */
static tg_admit_result_t local_check(local_entry_t *e, const local_scope_t *s, int64_t est, uint64_t now,
                                     int64_t *retry_ms) {
    uint64_t dt = now > e->ts_ms ? now - e->ts_ms : 0;
    if (s->rpm >= 0)
        e->rpm_tokens = refill(e->rpm_tokens, (double)s->burst, s->rpm, dt);
    if (s->tpm >= 0)
        e->tpm_tokens = refill(e->tpm_tokens, (double)s->tpm, s->tpm, dt);
    e->ts_ms = now;
    if (s->rpm >= 0 && e->rpm_tokens < 1) {
        *retry_ms = s->rpm > 0 ? (int64_t)((1 - e->rpm_tokens) * 60000.0 / (double)s->rpm) + 1 : 60000;
        return TG_ADMIT_RATE;
    }
    double charge = (double)TG_MIN(est, s->tpm);
    if (s->tpm >= 0 && e->tpm_tokens < charge) {
        *retry_ms = s->tpm > 0 ? (int64_t)((charge - e->tpm_tokens) * 60000.0 / (double)s->tpm) + 1 : 60000;
        return TG_ADMIT_TOKENS;
    }
    if (s->conc >= 0 && e->inflight >= s->conc) {
        *retry_ms = 1000;
        return TG_ADMIT_CONCURRENCY;
    }
    return TG_ADMIT_OK;
}

static void local_charge(local_entry_t *e, const local_scope_t *s, int64_t est, uint64_t now) {
    uint64_t full = now;
    if (s->rpm >= 0) {
        e->rpm_tokens -= 1;
        full = s->rpm > 0 ? now + (uint64_t)(((double)s->burst - e->rpm_tokens) * 60000.0 / (double)s->rpm) + 1
                          : UINT64_MAX;
    }
    if (s->tpm >= 0) {
        e->tpm_tokens -= (double)TG_MIN(est, s->tpm);
        uint64_t f = s->tpm > 0 ? now + (uint64_t)(((double)s->tpm - e->tpm_tokens) * 60000.0 / (double)s->tpm) + 1
                                : UINT64_MAX;
        full = TG_MAX(full, f);
    }
    e->full_at_ms = TG_MAX(e->full_at_ms, full);
    if (s->conc >= 0)
        e->inflight++;
}

/* Both scopes admit, and then both are charged, or neither is. */
static tg_admit_result_t local_take(tg_admit_t *a, const local_scope_t s[2], const char **which, int64_t *retry_ms) {
    static const char *const names[][2] = {
        [TG_ADMIT_RATE] = {"key rpm (local: limiter unavailable)", "tenant rpm (local: limiter unavailable)"},
        [TG_ADMIT_TOKENS] = {"key tpm (local: limiter unavailable)", "tenant tpm (local: limiter unavailable)"},
        [TG_ADMIT_CONCURRENCY] = {"key concurrency (local: limiter unavailable)",
                                  "tenant concurrency (local: limiter unavailable)"},
    };
    int64_t est = TG_MAX(a->lim.est_tokens, 0);
    uint64_t now = tg_now_ms();
    local_entry_t *e[2] = {NULL, NULL};
    tg_admit_result_t r = TG_ADMIT_OK;
    a->local_tpm[0] = a->local_tpm[1] = -1; /* nothing charged: nothing to correct */
    pthread_mutex_lock(&local_tab.mu);
    for (int i = 0; i < 2 && r == TG_ADMIT_OK; i++) {
        if (s[i].rpm < 0 && s[i].tpm < 0 && s[i].conc < 0)
            continue;
        e[i] = local_find(s[i].id, 1, now);
        if (!e[i]) {
            r = TG_ADMIT_UNAVAILABLE;
            *which = "limiter unavailable (local table full)";
            *retry_ms = 1000;
            break;
        }
        r = local_check(e[i], &s[i], est, now, retry_ms);
        if (r != TG_ADMIT_OK)
            *which = names[r][i];
    }
    if (r == TG_ADMIT_OK) {
        for (int i = 0; i < 2; i++) {
            if (!e[i])
                continue;
            local_charge(e[i], &s[i], est, now);
            a->local_conc[i] = s[i].conc >= 0;
            a->local_tpm[i] = s[i].tpm >= 0 ? TG_MIN(est, s[i].tpm) : -1;
        }
    }
    pthread_mutex_unlock(&local_tab.mu);
    return r;
}

/* A locally admitted request ended: its concurrency counts go back, its TPM charge is
 * corrected by the actual usage (as release.lua does in Redis). */
static void local_release(tg_admit_t *a, int64_t actual) {
    int64_t ids[2] = {a->lim.key_id, -a->lim.tenant_id}, tpm[2] = {a->lim.key_tpm, a->lim.tenant_tpm};
    pthread_mutex_lock(&local_tab.mu);
    for (int i = 0; i < 2; i++) {
        local_entry_t *e = local_find(ids[i], 0, 0);
        if (!e)
            continue;
        if (a->local_conc[i] && e->inflight > 0)
            e->inflight--;
        if (a->local_tpm[i] >= 0 && actual >= 0 && e->tpm_tokens >= 0) {
            double back = (double)(a->local_tpm[i] - TG_MIN(actual, tpm[i]));
            e->tpm_tokens = TG_MAX(0.0, TG_MIN((double)tpm[i], e->tpm_tokens + back));
        }
    }
    pthread_mutex_unlock(&local_tab.mu);
}

/* The limits of the request, as TG_DOWN_* bits. */
static int limit_bits(const tg_limit_req_t *m) {
    return (m->key_rpm >= 0 || m->tenant_rpm >= 0 ? 1 << TG_DOWN_RATE : 0) |
           (m->key_tpm >= 0 || m->tenant_tpm >= 0 ? 1 << TG_DOWN_TOKENS : 0) |
           (m->key_conc >= 0 || m->tenant_conc >= 0 ? 1 << TG_DOWN_CONCURRENCY : 0);
}

/* Redis could not be asked: each limit of the request goes by its policy (the
 * on_limiter_down hook's, else the configured one). Any closed limit refuses (503); the
 * local ones are checked in the instance's table; open ones are not checked. */
static void local_admit(tg_admit_t *a) {
    tg_limits_t *l = a->l;
    int bits = limit_bits(&a->lim);
    tg_fail_policy_t pol[TG_DOWN__COUNT] = {l->cfg.fail_rate, l->cfg.fail_tokens, l->cfg.fail_concurrency,
                                            TG_FAIL_CLOSED};
    if (a->lim.on_down)
        a->lim.on_down(a->ud, bits, pol);
    int closed = 0, local = 0;
    for (int k = 0; k < TG_DOWN__COUNT; k++) {
        if (!(bits & (1 << k)))
            continue;
        if (pol[k] != TG_FAIL_OPEN && pol[k] != TG_FAIL_LOCAL)
            pol[k] = TG_FAIL_CLOSED;
        l->stats.down[k][pol[k]]++;
        closed |= pol[k] == TG_FAIL_CLOSED;
        local |= pol[k] == TG_FAIL_LOCAL;
    }
    if (closed) {
        l->stats.redis_down_closed++;
        deliver(a, TG_ADMIT_UNAVAILABLE, "limiter unavailable", 1000, 1);
        return;
    }
    if (!local) {
        l->stats.redis_down_open++;
        deliver(a, TG_ADMIT_OK, NULL, 0, 1);
        return;
    }
    l->stats.redis_down_local++;
    const tg_limit_req_t *m = &a->lim;
    int lr = pol[TG_DOWN_RATE] == TG_FAIL_LOCAL, lt = pol[TG_DOWN_TOKENS] == TG_FAIL_LOCAL,
        lc = pol[TG_DOWN_CONCURRENCY] == TG_FAIL_LOCAL;
    local_scope_t s[2] = {
        {m->key_id, lr ? m->key_rpm : -1, m->key_burst, lt ? m->key_tpm : -1, lc ? m->key_conc : -1},
        {-m->tenant_id, lr ? m->tenant_rpm : -1, m->tenant_burst, lt ? m->tenant_tpm : -1, lc ? m->tenant_conc : -1},
    };
    const char *which = NULL;
    int64_t retry_ms = 0;
    tg_admit_result_t r = local_take(a, s, &which, &retry_ms);
    if (r != TG_ADMIT_OK) {
        deliver(a, r, which, retry_ms, 1);
        return;
    }
    a->local = 1;
    deliver(a, TG_ADMIT_OK, NULL, 0, 1);
}

/* Redis did not answer (or there is none). The money, if it was asked, was not reserved
 * (tg_admit_outcome_t.reserved 0): the caller's separate reservation follows, with
 * billing's own Redis-down rule for money (closed unless the on_limiter_down hook opens
 * it). A request with no limit has nothing for the fallback to decide. */
static void without_redis(tg_admit_t *a) {
    if (!a->limited) {
        deliver(a, TG_ADMIT_OK, NULL, 0, 1);
        return;
    }
    local_admit(a);
}

/* Decides without Redis on the next loop turn: the callback never runs from inside
 * tg_limits_admit (the caller stores the handle after it returns), and a decision made
 * while the caller is still inside admit_send would reach freed memory. */
static void down_cb(uv_timer_t *t) {
    tg_admit_t *a = t->data;
    if (a->state == A_WAITING)
        queue_remove(a->l, a);
    without_redis(a);
}

static void down_later(tg_admit_t *a) {
    if (!a->timer_open) {
        uv_timer_init(a->l->loop, &a->timer);
        a->timer.data = a;
        a->timer_open = 1;
    }
    uv_timer_start(&a->timer, down_cb, 0, 0);
}

/* ---- waiting for a slot -------------------------------------------------------------- */

static occupancy_t *occupancy_slot(tg_limits_t *l, int64_t scope) {
    return &l->occupancy[((uint64_t)scope * 0x9E3779B97F4A7C15ull) >> 56 & (OCCUPANCY_SLOTS - 1)];
}

/* A request with a concurrency limit ended: how long it occupied its slot(s), as an
 * exponentially weighted average (weight 1/4) per scope. */
static void occupancy_note(tg_limits_t *l, const tg_admit_t *a) {
    uint64_t ms = tg_now_ms() - a->admitted_ms;
    uint32_t v = (uint32_t)TG_MIN(TG_MAX(ms, 1u), 3600000u);
    int64_t scopes[2] = {a->lim.key_conc >= 0 ? a->lim.key_id * 2 : -1,
                         a->lim.tenant_conc >= 0 ? a->lim.tenant_id * 2 + 1 : -1};
    for (int i = 0; i < 2; i++) {
        if (scopes[i] < 0)
            continue;
        occupancy_t *h = occupancy_slot(l, scopes[i]);
        if (h->scope != scopes[i] || !h->ewma_ms)
            *h = (occupancy_t){scopes[i], v};
        else
            h->ewma_ms = (3 * h->ewma_ms + v) / 4;
    }
}

/*
 * Retry-After of a concurrency refusal (the wait queue timed out or is full): with n slots
 * occupied by requests that each occupy one for D on average, one frees every D / n on average,
 * so that is the answer, D being how long this worker's recent requests of the refusing
 * scope occupied theirs. Without such a request yet, the queue timeout: at least that long no
 * slot came free for a waiter. Always between 1 s and 60 s.
 */
static int64_t conc_retry_ms(tg_limits_t *l, const tg_admit_t *a) {
    int tenant = a->refused_by == 6;
    int64_t scope = tenant ? a->lim.tenant_id * 2 + 1 : a->lim.key_id * 2;
    int64_t limit = tenant ? a->lim.tenant_conc : a->lim.key_conc;
    const occupancy_t *h = occupancy_slot(l, scope);
    int64_t ms = h->scope == scope && h->ewma_ms ? (int64_t)h->ewma_ms / TG_MAX(limit, 1) : l->cfg.queue_timeout_ms;
    if (limit == 0)
        ms = 60000; /* no slot ever frees */
    return TG_MIN(TG_MAX(ms, 1000), 60000);
}

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
            deliver(a, TG_ADMIT_QUEUE_FULL, which, conc_retry_ms(l, a), 0);
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
        a->queued = 1;
    }
    if (now >= a->deadline_ms) {
        queue_remove(l, a);
        deliver(a, TG_ADMIT_CONCURRENCY, which, conc_retry_ms(l, a), 0);
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
    tg_limits_t *l = ud;
    if (err) {
        tg_log_debug("limits: lease renewal failed: %s", err);
        return;
    }
    if (r && r->type == REDIS_REPLY_INTEGER && r->integer > 0)
        l->stats.leases_reacquired += (uint64_t)r->integer;
}

static void renew_cb(uv_timer_t *t) {
    tg_admit_t *a = t->data;
    tg_redis_t *redis = tg_state_redis(a->l->st);
    if (!redis || a->local)
        return;
    args_t g;
    g.n = 0;
    g.p = g.buf;
    arg_s(&g, a->keys[K_MARKER], a->keylen[K_MARKER]);
    if (a->lim.key_conc >= 0)
        arg_s(&g, a->keys[K_KEY_LEASES], a->keylen[K_KEY_LEASES]);
    if (a->lim.tenant_conc >= 0)
        arg_s(&g, a->keys[K_TENANT_LEASES], a->keylen[K_TENANT_LEASES]);
    int nkeys = g.n;
    arg_s(&g, a->id, a->idlen);
    arg_i(&g, a->l->cfg.lease_ttl_ms);
    arg_i(&g, MARKER_TTL_MS);
    tg_redis_eval(redis, a->l->renew_script, nkeys, g.n, g.v, g.len, renew_done, a->l);
}

static int has_tpm(const tg_limit_req_t *l) { return l->key_tpm >= 0 || l->tenant_tpm >= 0; }

/* ---- TPM corrections, carried by the next admission ------------------------------------ */

static int fix_find(const tg_limits_t *l, const char *key, size_t keylen) {
    for (int i = 0; i < l->nfix; i++)
        if (l->fix[i].keylen == keylen && !memcmp(l->fix[i].key, key, keylen))
            return i;
    return -1;
}

static void fix_remove(tg_limits_t *l, int i) { l->fix[i] = l->fix[--l->nfix]; }

/* Sends correction i alone (correct.lua) and forgets it: once, never again (see there). */
static void fix_send(tg_limits_t *l, int i) {
    tg_redis_t *redis = tg_state_redis(l->st);
    const fix_t *f = &l->fix[i];
    if (redis && f->diff) {
        char n[2][24];
        const char *v[3] = {f->key, n[0], n[1]};
        size_t len[3] = {f->keylen, (size_t)(put_i64(n[0], f->diff) - n[0]), (size_t)(put_i64(n[1], f->cap) - n[1])};
        l->stats.round_trips++;
        l->stats.corrections_alone++;
        tg_redis_eval(redis, l->correct_script, 1, 3, v, len, NULL, NULL);
    }
    fix_remove(l, i);
}

static void fix_flush(uv_timer_t *t) {
    tg_limits_t *l = t->data;
    while (l->nfix)
        fix_send(l, l->nfix - 1);
}

/* Adds `diff` milli-tokens to bucket `key`'s pending correction. */
static void fix_add(tg_limits_t *l, const char *key, size_t keylen, int64_t diff, int64_t cap) {
    if (!diff)
        return;
    int i = fix_find(l, key, keylen);
    if (i < 0) {
        if (l->nfix == FIX_MAX)
            fix_send(l, 0);
        i = l->nfix++;
        fix_t *f = &l->fix[i];
        memcpy(f->key, key, keylen);
        f->keylen = keylen;
        f->diff = 0;
    }
    l->fix[i].diff += diff;
    l->fix[i].cap = cap;
    if (!l->fix_timer) {
        l->fix_timer = malloc(sizeof(*l->fix_timer));
        uv_timer_init(l->loop, l->fix_timer);
        l->fix_timer->data = l;
    }
    if (!uv_is_active((uv_handle_t *)l->fix_timer))
        uv_timer_start(l->fix_timer, fix_flush, FIX_DELAY_MS, 0);
}

/* The correction admission a carries for bucket `k` (K_KEY_BUCKETS or K_TENANT_BUCKETS),
 * taken out of the table: its argument, or "" for none. */
static void fix_take(tg_admit_t *a, args_t *g, int k) {
    tg_limits_t *l = a->l;
    int s = k == K_KEY_BUCKETS ? 0 : 1;
    int i = (s ? a->lim.tenant_tpm : a->lim.key_tpm) >= 0 && l->nfix ? fix_find(l, a->keys[k], a->keylen[k]) : -1;
    a->fixing[s] = i >= 0;
    if (i < 0) {
        arg_s(g, "", 0);
        return;
    }
    a->fixed[s] = l->fix[i].diff;
    fix_remove(l, i);
    arg_i(g, a->fixed[s]);
}

/* The admission's reply came: what it carried was applied (`applied`), or certainly not
 * (a refusal writes nothing), or perhaps (a lost answer: dropped, the safe side). */
static void fix_settle(tg_admit_t *a, int put_back) {
    for (int s = 0; s < 2; s++) {
        if (!a->fixing[s])
            continue;
        a->fixing[s] = 0;
        if (put_back)
            fix_add(a->l, a->keys[s ? K_TENANT_BUCKETS : K_KEY_BUCKETS], a->keylen[s ? K_TENANT_BUCKETS : K_KEY_BUCKETS],
                    a->fixed[s], (s ? a->lim.tenant_tpm : a->lim.key_tpm) * 1000);
    }
}

/* Leases are renewed at a third of their TTL; a request with only a TPM limit renews
 * its marker (which its correction needs) at a third of the marker's TTL. */
static void start_renewal(tg_admit_t *a) {
    if ((!has_conc(&a->lim) && !has_tpm(&a->lim)) || a->local)
        return;
    if (!a->timer_open) {
        uv_timer_init(a->l->loop, &a->timer);
        a->timer.data = a;
        a->timer_open = 1;
    }
    uint64_t every = (uint64_t)TG_MAX((has_conc(&a->lim) ? a->l->cfg.lease_ttl_ms : MARKER_TTL_MS) / 3, 100);
    uv_timer_start(&a->timer, renew_cb, every, every);
}

/* ---- the admission round trip -------------------------------------------------------- */

static void release_begin(tg_limits_t *l, tg_admit_t *a, int64_t actual);
static void release_by_script(tg_limits_t *l, tg_admit_t *a, int64_t actual);

/* The command went out and no answer came: it may have run in Redis. */
static int maybe_ran(const tg_admit_t *a, const char *err) {
    /* A timeout always may have: a command accepted before the first connection was up
     * waits in hiredis's buffer and goes out when it is (one that failed fast is told
     * "disconnected", never "timeout"). Undoing one that never ran finds nothing. */
    return err == tg_redis_err_timeout || (a->sent_up && err == tg_redis_err_disconnected);
}

/* Gives back the reservation the script took, or may have taken (its answer was lost:
 * a timeout). Sent on the same connection as the script, so Redis runs it after. */
static void money_undo(tg_admit_t *a) {
    if (a->has_money && a->money.undo)
        a->money.undo(a->money.undo_ud, a->id, a->lim.tenant_id, a->lim.key_id);
    a->reserved = 0;
}

/* Gives back the account's slot the admission took, or may have taken (no answer came):
 * a ZREM on the script's connection, so Redis runs it after the script. */
static void slot_undo(tg_admit_t *a) {
    tg_redis_t *redis = tg_state_redis(a->l->st);
    if (redis && a->slot_sent) {
        const char *argv[3] = {"ZREM", a->slot_key, a->id};
        size_t len[3] = {4, a->slot_keylen, a->idlen};
        tg_redis_command(redis, NULL, NULL, 3, argv, len);
    }
    a->slot = -1;
}

/* The admission script's reply: 0 or 1 (admitted), or {which, retry_after_ms}; for a
 * concurrency refusal (5, 6) the request waits, and if it is refused in the end the wait
 * it is told comes from conc_retry_ms, not from the script. */
static void admit_reply(void *ud, redisReply *r, const char *err) {
    tg_admit_t *a = ud;
    tg_limits_t *l = a->l;
    a->rq = NULL;
    /* With the account's slot ("admit+slot"), 2 and 3 are 0 and 1 with the account full. */
    long long v = !err && r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (a->slot_sent && v >= 0 && v <= 3) {
        a->slot = v < 2;
        v &= 1;
    }
    int admitted = v == 0 || v == 1;
    int refused = !err && r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                  r->element[0]->type == REDIS_REPLY_INTEGER && r->element[1]->type == REDIS_REPLY_INTEGER &&
                  r->element[0]->integer >= 1 && r->element[0]->integer <= 10 + 6;
    /* 1 (already admitted) took nothing: the caller reserves separately. */
    a->reserved = admitted && a->has_money && v == 0;
    a->charged = admitted && v == 0;
    /* Only 0 applied the corrections it carried; a refusal, 1, or a command that never
     * went out applied none; a lost answer perhaps (dropped). */
    fix_settle(a, !(admitted && v == 0) && !maybe_ran(a, err));
    if (a->cancelled) {
        /* The client left while we asked: give back whatever was taken (its lease, and its
         * TPM estimate: nothing was used, and its money), also when the answer did not
         * come in time. */
        if (a->reserved || maybe_ran(a, err))
            money_undo(a);
        if (a->slot == 1 || maybe_ran(a, err))
            slot_undo(a);
        if (admitted)
            release_begin(l, a, 0);
        else if (maybe_ran(a, err))
            release_by_script(l, a, 0);
        else
            admit_free(a);
        return;
    }
    if (!admitted && !refused) {
        if (a->state == A_WAITING)
            queue_remove(l, a);
        tg_log_warn("limits: admission for %s without Redis (%s)", a->id, err ? err : "bad reply");
        if (maybe_ran(a, err)) {
            /* The script may still run (a Redis that stalls runs it when it wakes): undo
             * it with a release of a copy, sent now behind the admission on the same
             * connection (and retried), so its lease and TPM charge do not stay for the
             * lease TTL while the request goes on under the fallback policy. */
            tg_admit_t *c = malloc(sizeof(*c));
            memcpy(c, a, sizeof(*c));
            c->timer_open = 0;
            c->local = 0;
            c->cb = NULL;
            c->ud = NULL;
            release_by_script(l, c, 0);
        }
        if (maybe_ran(a, err)) {
            money_undo(a); /* its money too; the separate reservation follows */
            slot_undo(a);  /* and the account's slot: the caller asks for it again */
        }
        without_redis(a);
        return;
    }
    if (admitted) {
        if (a->state == A_WAITING)
            queue_remove(l, a);
        a->admitted_ms = tg_now_ms();
        start_renewal(a);
        deliver(a, TG_ADMIT_OK, NULL, 0, 0);
        return;
    }
    static const char *const names[] = {"key rpm",         "tenant rpm", "key tpm",    "tenant tpm",
                                        "key concurrency", "tenant concurrency", "balance", "key budget", "init"};
    long long which = r->element[0]->integer;
    if (which > 10) { /* a periodic budget (money.lua: 10 + its index) */
        if (a->state == A_WAITING)
            queue_remove(l, a);
        a->budget = (int)(which - 11);
        deliver(a, TG_ADMIT_PERIOD_BUDGET, "budget", 0, 0);
        return;
    }
    if (which == 10)
        which = 9; /* not sent: a reply no script makes */
    const char *name = names[which - 1];
    if (which >= 7) {
        if (a->state == A_WAITING)
            queue_remove(l, a);
        deliver(a, which == 7 ? TG_ADMIT_BALANCE : which == 8 ? TG_ADMIT_BUDGET : TG_ADMIT_MONEY_INIT, name, 0, 0);
        return;
    }
    if (which >= 5) {
        a->attempts++;
        a->refused_by = (int)which;
        wait_for_slot(a, name);
        return;
    }
    if (a->state == A_WAITING)
        queue_remove(l, a);
    deliver(a, which >= 3 ? TG_ADMIT_TOKENS : TG_ADMIT_RATE, name, r->element[1]->integer, 0);
}

/* One scope's first six arguments (see admit.lua; fix_take adds the seventh). */
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
        down_later(a);
        return;
    }
    const tg_limit_req_t *m = &a->lim;
    const tg_limit_money_t *money = &a->money;
    int64_t est = TG_MAX(m->est_tokens, 0);
    args_t g;
    args_init(&g, a);
    for (int i = 0; a->has_money && i < money->nkeys; i++)
        arg_s(&g, money->keys[i], strlen(money->keys[i]));
    for (int i = 0; a->has_money && i < money->nbudgets; i++)
        arg_s(&g, money->bkeys[i], strlen(money->bkeys[i]));
    a->slot_sent = a->slot_keylen && tg_redis_one_keyspace(redis);
    a->slot = -1;
    if (a->slot_sent)
        arg_s(&g, a->slot_key, a->slot_keylen); /* admit_slot.lua: the last key */
    int nkeys = g.n;
    arg_s(&g, a->id, a->idlen);
    if (a->limited) {
        arg_i(&g, l->cfg.lease_ttl_ms);
        scope_args(&g, m->key_rpm, m->key_burst, m->key_tpm, m->key_conc, est);
        fix_take(a, &g, K_KEY_BUCKETS);
        if (has_tenant(m)) {
            scope_args(&g, m->tenant_rpm, m->tenant_burst, m->tenant_tpm, m->tenant_conc, est);
            fix_take(a, &g, K_TENANT_BUCKETS);
        }
    }
    if (a->has_money) {
        arg_s(&g, money->amount, strlen(money->amount));
        arg_s(&g, money->tenant_init, strlen(money->tenant_init));
        arg_s(&g, money->hold, strlen(money->hold));
        if (money->nkeys == 4)
            arg_s(&g, money->key_init, strlen(money->key_init));
        if (money->nbudgets)
            arg_s(&g, money->bspec, strlen(money->bspec));
    }
    if (a->slot_sent) { /* ... and the last two arguments */
        arg_i(&g, a->lim.slot_limit);
        arg_i(&g, a->lim.slot_ttl_ms);
    }
    a->sent_up = tg_redis_connected(redis);
    a->rq = tg_redis_eval(redis, a->slot_sent ? l->admit_slot_script : l->admit_script, nkeys, g.n, g.v, g.len,
                          admit_reply, a);
    if (a->rq)
        l->stats.round_trips++;
    else
        down_later(a); /* no callback will come (client closing, script not registered) */
}

tg_admit_t *tg_limits_admit(tg_limits_t *l, const char *request_id, const tg_limit_req_t *lim, tg_admit_cb cb,
                            void *ud) {
    tg_admit_t *a = calloc(1, sizeof(*a));
    a->l = l;
    a->idlen = tg_copy(a->id, sizeof(a->id), request_id);
    a->lim = *lim;
    if (a->lim.key_burst < 0)
        a->lim.key_burst = a->lim.key_rpm;
    if (a->lim.tenant_burst < 0)
        a->lim.tenant_burst = a->lim.tenant_rpm;
    a->cb = cb;
    a->ud = ud;
    a->started_ms = tg_now_ms();
    a->limited = lim->key_rpm >= 0 || lim->key_tpm >= 0 || lim->key_conc >= 0 || has_tenant(lim);
    if (lim->money) {
        a->money = *lim->money;
        a->has_money = 1;
    }
    a->lim.money = NULL;
    a->slot = -1;
    if (lim->slot_key && strlen(lim->slot_key) < sizeof(a->slot_key))
        a->slot_keylen = tg_copy(a->slot_key, sizeof(a->slot_key), lim->slot_key);
    a->lim.slot_key = NULL;
    fmt_keys(a);
    admit_send(a);
    return a;
}

/* One scope's release arguments (see release.lua): give back its lease, and its TPM
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

/* The release's last answer: a release that got none (timeout, disconnected) may or may
 * not have run; it is idempotent, so the Redis client has sent it again (a bounded
 * number of times) before this runs. */
static void release_done(void *ud, redisReply *r, const char *err) {
    tg_admit_t *a = ud;
    TG_UNUSED(r);
    if (err)
        tg_log_warn("limits: release of %s failed (%s); its leases expire by their TTL", a->id, err);
    admit_free(a);
}

static void release_send(tg_admit_t *a) {
    tg_limits_t *l = a->l;
    tg_redis_t *redis = tg_state_redis(l->st);
    const tg_limit_req_t *m = &a->lim;
    int64_t est = TG_MAX(m->est_tokens, 0);
    args_t g;
    args_init(&g, a);
    int nkeys = g.n;
    arg_s(&g, a->id, a->idlen);
    release_args(&g, m->key_conc, m->key_tpm, est, a->actual);
    if (has_tenant(m))
        release_args(&g, m->tenant_conc, m->tenant_tpm, est, a->actual);
    l->stats.round_trips++;
    if (tg_redis_eval_idempotent(redis, l->release_script, nkeys, g.n, g.v, g.len, release_done, a) != TG_OK)
        admit_free(a);
}

/* release.lua: gives back a's leases and corrects its TPM charge to `actual` (< 0:
 * unknown, no correction) if its admission ran (its marker says so, and is spent); for
 * an admission that may not have run. a belongs to the release from here on and is freed
 * when it is done. */
static void release_by_script(tg_limits_t *l, tg_admit_t *a, int64_t actual) {
    tg_redis_t *redis = tg_state_redis(l->st);
    const tg_limit_req_t *m = &a->lim;
    int fix = actual >= 0 && has_tpm(m);
    if (!redis || (!has_conc(m) && !fix)) {
        admit_free(a); /* no lease to give back and nothing to correct: no round trip */
        return;
    }
    if (a->timer_open)
        uv_timer_stop(&a->timer); /* no more renewals */
    a->state = A_RELEASING;
    a->actual = actual;
    a->rq = NULL;
    a->qnext = a->qprev = NULL;
    release_send(a);
}

/* The answer to a command of a request's end: ud says what was not done (a literal). */
static void end_done(void *ud, redisReply *r, const char *err) {
    TG_UNUSED(r);
    if (err)
        tg_log_warn("limits: %s (%s); it expires by its TTL", (const char *)ud, err);
}

/* ZREM of a's lease in set k, sent again when its answer is lost. */
static void zrem_lease(tg_redis_t *redis, const tg_admit_t *a, int k) {
    const char *v[3] = {"ZREM", a->keys[k], a->id};
    size_t len[3] = {4, a->keylen[k], a->idlen};
    tg_redis_command_idempotent(redis, 3, v, len, end_done, (void *)"a lease was not given back");
}

/* The end of a request whose admission ran: its leases back (a ZREM each), its marker
 * deleted, its TPM correction (charged minus `actual`; < 0: unknown, none) to the table,
 * to go with the next admission that reads the bucket. No script. An admission answered
 * 1 (the same id admitted before) charged nothing, so it corrects nothing: the
 * correction is made once, by the handle that charged. a is freed.
 *
 * The marker answers an admission sent again after a lost answer and makes release.lua's
 * correction once; both happen only before this point (this end runs on an answer, and
 * ids are the gateway's own), so it is deleted here rather than left to its 10-minute
 * TTL: left, every request kept a key that long (6 million at 10,000 req/s). */
static void release_begin(tg_limits_t *l, tg_admit_t *a, int64_t actual) {
    tg_redis_t *redis = tg_state_redis(l->st);
    const tg_limit_req_t *m = &a->lim;
    if (redis && a->limited) { /* has_conc(m) implies it */
        l->stats.round_trips++;
        if (m->key_conc >= 0)
            zrem_lease(redis, a, K_KEY_LEASES);
        if (m->tenant_conc >= 0)
            zrem_lease(redis, a, K_TENANT_LEASES);
        const char *v[2] = {"DEL", a->keys[K_MARKER]};
        size_t len[2] = {3, a->keylen[K_MARKER]};
        tg_redis_command_idempotent(redis, 2, v, len, end_done, (void *)"a request's marker was not deleted");
    }
    if (redis && actual >= 0 && a->charged) {
        int64_t est = TG_MAX(m->est_tokens, 0);
        if (m->key_tpm >= 0)
            fix_add(l, a->keys[K_KEY_BUCKETS], a->keylen[K_KEY_BUCKETS],
                    (TG_MIN(est, m->key_tpm) - TG_MIN(actual, m->key_tpm)) * 1000, m->key_tpm * 1000);
        if (m->tenant_tpm >= 0)
            fix_add(l, a->keys[K_TENANT_BUCKETS], a->keylen[K_TENANT_BUCKETS],
                    (TG_MIN(est, m->tenant_tpm) - TG_MIN(actual, m->tenant_tpm)) * 1000, m->tenant_tpm * 1000);
    }
    admit_free(a);
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
    int conc = has_conc(&a->lim);
    if (a->local) {
        local_release(a, actual_tokens);
        admit_free(a);
    } else {
        if (conc && a->admitted_ms) /* 0: admitted open while Redis was down */
            occupancy_note(l, a);
        release_begin(l, a, actual_tokens);
    }
    if (conc)
        wake_waiter(l);
}

tg_limits_t *tg_limits_create(uv_loop_t *loop, tg_state_t *st, const tg_admission_config_t *cfg) {
    tg_limits_t *l = calloc(1, sizeof(*l));
    l->loop = loop;
    l->st = st;
    l->cfg = *cfg;
    pthread_mutex_lock(&local_tab.mu);
    local_users++;
    pthread_mutex_unlock(&local_tab.mu);
    tg_redis_t *redis = tg_state_redis(st);
    if (redis) {
        l->admit_script = tg_redis_script_register(redis, tg_scripts_source("admit"));
        l->admit_slot_script = tg_redis_script_register(redis, tg_scripts_source("admit+slot"));
        l->release_script = tg_redis_script_register(redis, tg_scripts_source("release"));
        l->correct_script = tg_redis_script_register(redis, tg_scripts_source("correct"));
        l->renew_script = tg_redis_script_register(redis, tg_scripts_source("renew"));
    }
    return l;
}

void tg_limits_destroy(tg_limits_t *l) {
    if (!l)
        return;
    /* Called after the state's Redis client is gone, so every release has had its
     * last callback (those still waiting for a resend with tg_redis_err_shutdown: their
     * leases expire by TTL). */
    pthread_mutex_lock(&local_tab.mu);
    if (--local_users == 0) {
        /* The last worker is gone: the instance's local table goes with it. */
        for (unsigned i = 0; i < LOCAL_SLOTS; i++) {
            while (local_tab.slot[i]) {
                local_entry_t *e = local_tab.slot[i];
                local_tab.slot[i] = e->next;
                free(e);
            }
        }
        local_tab.n = 0;
    }
    pthread_mutex_unlock(&local_tab.mu);
    if (l->fix_timer) { /* corrections still waiting are dropped (the safe side) */
        uv_timer_stop(l->fix_timer);
        l->fix_timer->data = l->fix_timer;
        uv_close((uv_handle_t *)l->fix_timer, timer_closed);
    }
    free(l);
}

const tg_limits_stats_t *tg_limits_stats(const tg_limits_t *l) { return &l->stats; }

static void limits_collect(const void *const *stats, int n, tg_buf_t *out) {
    tg_limits_stats_t s;
    tg_metrics_sum_u64(stats, n, TG_METRICS_NFIELDS(tg_limits_stats_t), (uint64_t *)&s);
    tg_buf_printf(out,
                  "# HELP tollgate_admission_total Admission decisions.\n"
                  "# TYPE tollgate_admission_total counter\n"
                  "tollgate_admission_total{result=\"admitted\"} %llu\n"
                  "tollgate_admission_total{result=\"refused_rate\"} %llu\n"
                  "tollgate_admission_total{result=\"refused_tokens\"} %llu\n"
                  "tollgate_admission_total{result=\"refused_concurrency\"} %llu\n"
                  "tollgate_admission_total{result=\"queue_full\"} %llu\n"
                  "tollgate_admission_total{result=\"waited\"} %llu\n"
                  "# HELP tollgate_limiter_down_total Admissions decided without Redis, by policy.\n"
                  "# TYPE tollgate_limiter_down_total counter\n"
                  "tollgate_limiter_down_total{policy=\"open\"} %llu\n"
                  "tollgate_limiter_down_total{policy=\"local\"} %llu\n"
                  "tollgate_limiter_down_total{policy=\"closed\"} %llu\n",
                  (unsigned long long)s.admitted, (unsigned long long)s.refused_rate,
                  (unsigned long long)s.refused_tokens, (unsigned long long)s.refused_concurrency,
                  (unsigned long long)s.queue_full, (unsigned long long)s.waited,
                  (unsigned long long)s.redis_down_open, (unsigned long long)s.redis_down_local,
                  (unsigned long long)s.redis_down_closed);
    static const char *const kinds[TG_DOWN__COUNT] = {"rate", "tokens", "concurrency", "money"};
    static const char *const pols[3] = {"closed", "open", "local"};
    tg_buf_appends(out, "# HELP tollgate_limiter_down_limits_total Limits decided without Redis, by limit and policy.\n"
                        "# TYPE tollgate_limiter_down_limits_total counter\n");
    for (int k = 0; k < TG_DOWN__COUNT; k++)
        for (int pol = 0; pol < 3; pol++)
            tg_buf_printf(out, "tollgate_limiter_down_limits_total{limit=\"%s\",policy=\"%s\"} %llu\n", kinds[k],
                          pols[pol], (unsigned long long)s.down[k][pol]);
    tg_buf_printf(out,
                  "# HELP tollgate_limiter_lease_total Lease events: added back by a renewal (Redis lost "
                  "them).\n"
                  "# TYPE tollgate_limiter_lease_total counter\n"
                  "tollgate_limiter_lease_total{event=\"reacquired\"} %llu\n"
                  "# HELP tollgate_limiter_corrections_alone_total TPM corrections sent alone (no admission "
                  "carried them within 20 ms).\n"
                  "# TYPE tollgate_limiter_corrections_alone_total counter\n"
                  "tollgate_limiter_corrections_alone_total %llu\n",
                  (unsigned long long)s.leases_reacquired, (unsigned long long)s.corrections_alone);
}

void tg_limits_metrics(tg_metrics_t *m, const tg_limits_t *l) {
    if (l)
        tg_metrics_collector_add(m, limits_collect, &l->stats);
}

void tg_limits_count_down(tg_limits_t *l, int kind, tg_fail_policy_t policy) {
    if (kind >= 0 && kind < TG_DOWN__COUNT && policy >= TG_FAIL_CLOSED && policy <= TG_FAIL_LOCAL)
        l->stats.down[kind][policy]++;
}
