/*
 * Account health (see tg_health.h): an open-addressing map from account id to entry,
 * owned by one worker, so no locks.
 */
#include "tollgate/tg_health.h"

#include <stdlib.h>

#define EWMA_ALPHA 0.2

struct tg_health_s {
    tg_health_entry_t *slots;
    size_t cap, count;
};

tg_health_t *tg_health_create(void) {
    tg_health_t *h = calloc(1, sizeof(*h));
    h->cap = 64;
    h->slots = calloc(h->cap, sizeof(tg_health_entry_t));
    return h;
}

void tg_health_destroy(tg_health_t *h) {
    if (!h)
        return;
    for (size_t i = 0; i < h->cap; i++)
        free(h->slots[i].quota);
    free(h->slots);
    free(h);
}

static size_t slot_of(size_t cap, int64_t id) {
    uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 17) & (cap - 1);
}

static void grow(tg_health_t *h) {
    size_t cap = h->cap * 2;
    tg_health_entry_t *s = calloc(cap, sizeof(*s));
    for (size_t i = 0; i < h->cap; i++) {
        if (!h->slots[i].account_id)
            continue;
        size_t k = slot_of(cap, h->slots[i].account_id);
        while (s[k].account_id)
            k = (k + 1) & (cap - 1);
        s[k] = h->slots[i];
    }
    free(h->slots);
    h->slots = s;
    h->cap = cap;
}

tg_health_entry_t *tg_health_get(tg_health_t *h, int64_t id) {
    size_t k = slot_of(h->cap, id);
    while (h->slots[k].account_id) {
        if (h->slots[k].account_id == id)
            return &h->slots[k];
        k = (k + 1) & (h->cap - 1);
    }
    if ((h->count + 1) * 2 > h->cap) {
        grow(h);
        return tg_health_get(h, id);
    }
    tg_health_entry_t *e = &h->slots[k];
    memset(e, 0, sizeof(*e));
    e->account_id = id;
    e->ttft_ewma_ms = -1;
    h->count++;
    return e;
}

void tg_health_prefetch(const tg_health_t *h, int64_t id) { __builtin_prefetch(&h->slots[slot_of(h->cap, id)]); }

size_t tg_health_count(const tg_health_t *h) { return h->count; }

void tg_health_foreach(const tg_health_t *h, void (*fn)(const tg_health_entry_t *e, void *ud), void *ud) {
    for (size_t i = 0; h && i < h->cap; i++)
        if (h->slots[i].account_id)
            fn(&h->slots[i], ud);
}

int tg_health_available(tg_health_entry_t *e, int64_t now_ms) {
    if (e->cooldown_until_ms > now_ms)
        return 0;
    if (e->cooldown_until_ms) {
        /* The cooldown ended: half-open, one trial at a time. */
        e->half_open = 1;
    }
    return !(e->half_open && e->probing);
}

void tg_health_learn(tg_health_entry_t *e, const tg_quota_t *q) {
    if (!e->quota) {
        e->quota = malloc(sizeof(*e->quota));
        tg_quota_init(e->quota, q->at_ms);
    }
    tg_quota_merge(e->quota, q);
}

const tg_quota_t *tg_health_quota(const tg_health_entry_t *e, int64_t now_ms, int64_t stale_ms) {
    if (!e->quota || (stale_ms > 0 && now_ms - e->quota->at_ms > stale_ms))
        return NULL;
    return e->quota;
}

int tg_health_trial_due(const tg_health_entry_t *e, int64_t now_ms) {
    return e->half_open && !e->probing && e->cooldown_until_ms && e->cooldown_until_ms <= now_ms;
}

void tg_health_begin(tg_health_entry_t *e) {
    e->inflight++;
    if (e->half_open)
        e->probing = 1;
}

void tg_health_end(tg_health_entry_t *e, int ok, double ttft_ms) {
    if (e->inflight > 0)
        e->inflight--;
    e->err_ewma = (1 - EWMA_ALPHA) * e->err_ewma + EWMA_ALPHA * (ok ? 0.0 : 1.0);
    if (ok && ttft_ms >= 0)
        e->ttft_ewma_ms = e->ttft_ewma_ms < 0 ? ttft_ms : (1 - EWMA_ALPHA) * e->ttft_ewma_ms + EWMA_ALPHA * ttft_ms;
    if (ok) {
        e->successes++;
        if (e->half_open) {
            /* The trial succeeded: healthy again. */
            e->half_open = 0;
            e->cooldown_until_ms = 0;
            e->cooldown_ms = 0;
            e->err_ewma = 0;
        }
    } else {
        e->failures++;
    }
    e->probing = 0;
}

int64_t tg_health_cool(tg_health_entry_t *e, int64_t now_ms, int64_t ms) {
    /* A failed trial doubles the last cooldown; cooling never shortens. */
    if (e->half_open && e->cooldown_ms > 0)
        ms = TG_MAX(ms, TG_MIN(e->cooldown_ms * 2, (int64_t)3600000));
    int64_t until = now_ms + ms;
    if (until > e->cooldown_until_ms) {
        e->cooldown_until_ms = until;
        e->cooldown_ms = ms;
    }
    e->half_open = 0;
    e->probing = 0;
    return e->cooldown_until_ms;
}
