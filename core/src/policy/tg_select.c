/*
 * Account selection (see tg_select.h): a bounded sample of the best priority tier,
 * ranked by fair share. Runs on every request that routes to a group, so it never scans
 * a group and never makes a system call.
 */
#include "tollgate/tg_select.h"

#include <limits.h>
#include <string.h>

typedef struct {
    const tg_account_t *acc;
    int trial;  /* half-open and its cooldown over: its one trial request is due */
    double key; /* picks per unit of effective weight: lowest is furthest below its share */
} cand_t;

/* Once one usable account is found, a scan stops after reading this many: a tier that is
 * mostly cooling or tried yields fewer candidates rather than a longer scan. */
#define SCAN_BUDGET (4 * TG_SELECT_MAX)

static _Thread_local uint64_t rng;

void tg_select_seed(uint64_t seed) { rng = seed ? seed : 0x9E3779B97F4A7C15ull; }

/* xorshift64*: plenty for spreading a sample; seeded once per thread from the OS. */
static uint64_t next_random(void) {
    if (!rng) {
        uint64_t seed = 0;
        tg_random_bytes(&seed, sizeof(seed));
        tg_select_seed(seed ^ (uint64_t)(uintptr_t)&rng);
    }
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

/* The end of the run of `prio` starting at i in a (sorted by priority, highest first). */
static int tier_end(const tg_account_t *const *a, int i, int n, int prio) {
    if (i >= n || a[n - 1]->priority == prio)
        return n; /* the common case, one tier: no binary search over cold accounts */
    int lo = i, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (a[mid]->priority >= prio)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int avoided(const tg_select_t *q, int64_t id) {
    for (int i = 0; i < q->navoid; i++)
        if (q->avoid[i] == id)
            return 1;
    return 0;
}

/* The effective weight shrinks with the error EWMA and the load, so a failing account
 * gets less but not nothing and a recovered one earns its share back. */
static void rank(cand_t *c, const tg_health_entry_t *e, int64_t now) {
    const tg_account_t *acc = c->acc;
    double load = acc->concurrency > 0 ? (double)e->inflight / acc->concurrency : 0;
    double ok = 1 - e->err_ewma;
    double w = (double)TG_MAX(acc->weight, 1) * ok * ok * TG_MAX(1 - load, 0.01);
    c->trial = tg_health_trial_due(e, now);
    c->key = (e->picks + 1) / w;
}

static int before(const cand_t *a, const cand_t *b) {
    if (a->acc->priority != b->acc->priority)
        return a->acc->priority > b->acc->priority;
    if (a->trial != b->trial)
        return a->trial;
    if (a->key != b->key)
        return a->key < b->key;
    return a->acc->id < b->acc->id;
}

/* A priority tier: a0[0..t0) followed by a1[0..t - t0). */
typedef struct {
    const tg_account_t *const *a0, *const *a1;
    unsigned t0, t;
} tier_t;

static const tg_account_t *tier_at(const tier_t *tr, unsigned k) { return k < tr->t0 ? tr->a0[k] : tr->a1[k - tr->t0]; }

/* Usable accounts of the pool, tier by tier, into c[0..max); returns how many. Sets
 * *skipped when an account was passed over only because q->avoid names it. */
/* 1 if the provider said the account cannot take this request before a reset. */
static int quota_spent(const tg_health_entry_t *e, const tg_select_t *q) {
    const tg_quota_t *qt = e->quota ? tg_health_quota(e, q->now_ms, q->quota_stale_ms) : NULL;
    return qt && tg_quota_blocked_until(qt, q->now_ms, q->est_tokens) != 0;
}

static int gather(const tg_pool_t *pool, tg_health_t *h, const tg_select_t *q, int avoid, int quota, cand_t *c,
                  int max, int *skipped, int *spent) {
    const tg_account_t *const *a0 = pool->acc[0], *const *a1 = pool->acc[1];
    int n0 = pool->n[0], n1 = pool->n[1], i0 = 0, i1 = 0, n = 0, read = 0;
    while (n < max && (n == 0 || read < SCAN_BUDGET) && (i0 < n0 || i1 < n1)) {
        int prio = INT_MIN;
        if (i0 < n0)
            prio = a0[i0]->priority;
        if (i1 < n1)
            prio = TG_MAX(prio, a1[i1]->priority);
        int e0 = tier_end(a0, i0, n0, prio), e1 = tier_end(a1, i1, n1, prio);
        /* An empty side has no array at all: no offset from a null pointer (UBSan). */
        tier_t tr = {a0 ? a0 + i0 : NULL, a1 ? a1 + i1 : NULL, (unsigned)(e0 - i0), (unsigned)(e0 - i0 + e1 - i1)};
        /* Read from a random offset when the tier holds more than we still want, so every
         * member has the same chance. */
        unsigned want = (unsigned)(max - n), t = tr.t;
        unsigned start = t > want ? (unsigned)(next_random() % t) : 0;
        /* The sample's accounts and their health entries lie anywhere in memory: ask for
         * all of them first, so the cache misses overlap instead of queueing. */
        for (unsigned j = 0; j < TG_MIN(t, want); j++) {
            const tg_account_t *acc = tier_at(&tr, start + j < t ? start + j : start + j - t);
            __builtin_prefetch(&acc->id); /* the fields read here span at most two lines */
            __builtin_prefetch(&acc->provider);
        }
        for (unsigned j = 0; j < TG_MIN(t, want); j++)
            tg_health_prefetch(h, tier_at(&tr, start + j < t ? start + j : start + j - t)->id);
        for (unsigned j = 0; j < t && n < max && (n == 0 || read < SCAN_BUDGET); j++, read++) {
            const tg_account_t *acc = tier_at(&tr, start + j < t ? start + j : start + j - t);
            if (!acc->active || acc->cooldown_until_ms > q->now_ms)
                continue;
            if (q->openai_only && strcmp(acc->provider, "openai") != 0 && strcmp(acc->provider, "azure") != 0)
                continue;
            if (avoid && avoided(q, acc->id)) {
                *skipped = 1;
                continue;
            }
            tg_health_entry_t *e = tg_health_get(h, acc->id);
            if (!tg_health_available(e, q->now_ms))
                continue;
            if (quota && quota_spent(e, q)) {
                (*spent)++;
                continue;
            }
            c[n].acc = acc;
            rank(&c[n], e, q->now_ms);
            n++;
        }
        i0 = e0;
        i1 = e1;
    }
    return n;
}

/* The bound account, if it may keep the conversation: usable like any candidate, and
 * healthy enough that its prompt cache is worth staying for. */
static const tg_account_t *sticky_ok(const tg_snapshot_t *s, tg_health_t *h, const tg_select_t *q) {
    const tg_account_t *acc = tg_snapshot_member(s, q->group_id, q->sticky);
    if (!acc || !acc->active || acc->cooldown_until_ms > q->now_ms || !tg_account_serves(acc, q->model) ||
        (q->openai_only && strcmp(acc->provider, "openai") != 0 && strcmp(acc->provider, "azure") != 0) ||
        avoided(q, acc->id))
        return NULL;
    tg_health_entry_t *e = tg_health_get(h, acc->id);
    if (!tg_health_available(e, q->now_ms) || quota_spent(e, q))
        return NULL;
    int healthy = e->err_ewma < 0.5 && (e->ttft_ewma_ms < 0 || e->ttft_ewma_ms < 30000) &&
                  (acc->concurrency <= 0 || e->inflight < acc->concurrency);
    return healthy ? acc : NULL;
}

int tg_select(const tg_snapshot_t *s, tg_health_t *h, const tg_select_t *q, const tg_account_t **out, int max,
              int *sticky_first) {
    *sticky_first = 0;
    tg_pool_t pool;
    max = TG_MIN(max, TG_SELECT_MAX);
    if (max <= 0 || !tg_snapshot_pool(s, q->group_id, q->model, &pool))
        return 0;
    cand_t c[TG_SELECT_MAX];
    int skipped = 0, spent = 0;
    int n = gather(&pool, h, q, q->navoid > 0, 1, c, max, &skipped, &spent);
    if (n == 0 && skipped) /* only tried accounts are left: a retry may go back to one */
        n = gather(&pool, h, q, 0, 1, c, max, &skipped, &spent);
    int passed_over = spent;
    if (n == 0 && spent) { /* every account said it is spent: let the providers answer */
        n = gather(&pool, h, q, q->navoid > 0, 0, c, max, &skipped, &spent);
        passed_over = 0;
    }
    if (q->quota_skipped)
        *q->quota_skipped = passed_over;
    if (n == 0)
        return 0;
    for (int i = 1; i < n; i++) { /* insertion sort: n <= TG_SELECT_MAX */
        cand_t x = c[i];
        int j = i;
        for (; j > 0 && before(&x, &c[j - 1]); j--)
            c[j] = c[j - 1];
        c[j] = x;
    }
    int k = 0;
    const tg_account_t *st = q->sticky ? sticky_ok(s, h, q) : NULL;
    if (st) {
        out[k++] = st;
        *sticky_first = 1;
    }
    for (int i = 0; i < n && k < max; i++)
        if (c[i].acc != st)
            out[k++] = c[i].acc;
    return k;
}
