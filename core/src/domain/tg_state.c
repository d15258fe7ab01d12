/*
 * Per-worker state (see tg_state.h): the Postgres pool, the Redis client with the
 * invalidation subscription, and the API-key cache with single-flight lookups.
 */
#include "tollgate/tg_state.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_pg.h"
#include "tollgate/tg_redis.h"

#define NEGATIVE_TTL_MS 5000
/* How soon a key served stale (its lookup failed) is looked up again. */
#define STALE_RETRY_MS 1000
#define MAX_ENTRIES 200000
#define INVALIDATE_CHANNEL "tollgate:invalidate"

typedef struct entry_s entry_t;

struct tg_auth_wait_s {
    tg_auth_cb cb;
    void *ud;
    entry_t *e;
    tg_auth_wait_t *prev, *next;
};

struct entry_s {
    uint8_t digest[32];
    tg_principal_t *p;     /* NULL: unknown key (negative entry) */
    uint64_t expires_ms;
    /* Stale-if-error: the last principal Postgres gave, kept while it is looked up again,
     * and used when that lookup fails (Postgres down or failing over) until stale_until
     * (its fresh expiry + key_stale_ms). `p_stale`: p is such a copy, not a fresh read. */
    tg_principal_t *stale;
    uint64_t stale_until;
    int p_stale;
    int pending;
    uint64_t gen;          /* st->gen when the query was sent */
    tg_pg_req_t *query;
    tg_auth_wait_t *waiters;
    entry_t *next;
};

struct tg_state_s {
    uv_loop_t *loop;
    const tg_config_t *cfg;
    tg_pg_t *pg;
    tg_redis_t *redis;
    entry_t **buckets;
    size_t nbuckets;
    size_t count;
    uint64_t gen;
    const uint8_t (*static_keys)[32];
    size_t nstatic;
    tg_principal_t static_principal;
    tg_state_stats_t stats;
    void (*listeners[8])(void *ud);
    void *listener_ud[8];
    int nlisteners;
    void (*policies_fn)(void *ud, uint64_t seq);
    void *policies_ud;
};

static const char AUTH_SQL[] =
    "SELECT k.id, k.tenant_id, coalesce(k.group_id, 0), (k.status = 'active' AND t.status = 'active'), "
    "coalesce((extract(epoch FROM k.expires_at) * 1000)::bigint, 0), to_json(k.allowed_models), "
    "to_json(k.ip_allow::text[]), coalesce(k.rpm, -1), coalesce(k.tpm, -1), coalesce(k.concurrency, -1), "
    "coalesce(k.budget::text, ''), coalesce(g.name, ''), to_json(g.models), k.prefix, "
    "coalesce(k.rpm_burst, -1), coalesce(t.rpm, -1), coalesce(t.rpm_burst, -1), coalesce(t.tpm, -1), "
    "coalesce(t.concurrency, -1), coalesce(g.rate_multiplier, 1)::text, coalesce(g.plugins, '{}')::text, "
    /* The periodic budgets that apply (tg_budgets.h), at most TG_BUDGETS_MAX, by id. */
    "(SELECT coalesce(json_agg(json_build_array(b.id, (b.amount * 1000000000)::bigint, b.period, "
    "coalesce(b.period_hours, 0), b.timezone, floor(extract(epoch FROM b.created_at))::bigint, "
    "CASE WHEN b.api_key_id IS NOT NULL THEN 'k' WHEN b.user_id IS NOT NULL THEN 'u' ELSE 't' END, b.name) "
    "ORDER BY b.id), '[]') FROM (SELECT * FROM budgets b WHERE b.tenant_id = k.tenant_id AND (b.api_key_id = k.id "
    "OR b.user_id = k.user_id OR (b.api_key_id IS NULL AND b.user_id IS NULL)) ORDER BY b.id LIMIT 6) b)::text "
    "FROM api_keys k JOIN tenants t ON t.id = k.tenant_id LEFT JOIN groups g ON g.id = k.group_id "
    "WHERE k.key_hash = $1::bytea";

static uint64_t jitter(uint64_t ms) {
    uint32_t r = 0;
    tg_random_bytes(&r, sizeof(r));
    /* ±25% */
    return ms - ms / 4 + (r % (ms / 2 + 1));
}

static size_t bucket_of(const tg_state_t *st, const uint8_t d[32]) {
    uint64_t h;
    memcpy(&h, d, sizeof(h)); /* SHA-256 is already uniformly distributed */
    return (size_t)(h & (st->nbuckets - 1));
}

static void principal_free(tg_principal_t *p) {
    for (int i = 0; i < p->nallowed; i++)
        free(p->allowed_models[i]);
    free(p->allowed_models);
    for (int i = 0; i < p->ngroup_models; i++)
        free(p->group_models[i]);
    free(p->group_models);
    free(p->ip_allow);
    free(p->group_plugins);
    free(p);
}

void tg_principal_release(tg_principal_t *p) {
    if (p && --p->refs == 0)
        principal_free(p);
}

static tg_principal_t *retain(tg_principal_t *p) {
    if (p)
        p->refs++;
    return p;
}

static void entry_drop(tg_state_t *st, entry_t *e) {
    tg_principal_release(e->p);
    tg_principal_release(e->stale);
    free(e);
    st->count--;
}

static void clear_bucket_chain(tg_state_t *st, entry_t **pp, int all) {
    while (*pp) {
        entry_t *e = *pp;
        if (!e->pending && (all || e->expires_ms <= tg_now_ms())) {
            *pp = e->next;
            entry_drop(st, e);
        } else {
            pp = &e->next;
        }
    }
}

void tg_state_invalidate(tg_state_t *st, const char *hex) {
    st->stats.invalidations++;
    if (!hex) {
        st->gen++;
        for (size_t i = 0; i < st->nbuckets; i++)
            clear_bucket_chain(st, &st->buckets[i], 1);
        for (int i = 0; i < st->nlisteners; i++)
            st->listeners[i](st->listener_ud[i]);
        return;
    }
    uint8_t d[32];
    if (strlen(hex) != 64)
        return;
    for (int i = 0; i < 32; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return;
        d[i] = (uint8_t)v;
    }
    st->gen++;
    entry_t **pp = &st->buckets[bucket_of(st, d)];
    while (*pp) {
        entry_t *e = *pp;
        if (!e->pending && memcmp(e->digest, d, 32) == 0) {
            *pp = e->next;
            entry_drop(st, e);
            return;
        }
        pp = &e->next;
    }
}

static void on_invalidate_msg(void *ud, const char *msg, size_t len) {
    tg_state_t *st = ud;
    /* Some instance has just written to Postgres: a pool still waiting out its backoff
     * (this one lost the old primary, say) reconnects now, before the lookups the
     * invalidation causes find it unreachable. */
    if (st->pg && tg_pg_connected(st->pg) == 0)
        tg_pg_reconnect_now(st->pg);
    if (len == 1 && msg[0] == '*') {
        tg_state_invalidate(st, NULL);
    } else if (len == 8 && !memcmp(msg, "accounts", 8)) {
        for (int i = 0; i < st->nlisteners; i++)
            st->listeners[i](st->listener_ud[i]);
    } else if (len > 9 && len < 30 && !memcmp(msg, "policies:", 9) && st->policies_fn) {
        /* The workbench's stores hold change N (tg_policy_store.h): the listener syncs,
         * then drops the key cache, whose group settings may name what it wrote. */
        char num[32];
        memcpy(num, msg + 9, len - 9);
        num[len - 9] = '\0';
        st->policies_fn(st->policies_ud, strtoull(num, NULL, 10));
    } else if (len == 68 && strncmp(msg, "key:", 4) == 0) {
        char hex[65];
        memcpy(hex, msg + 4, 64);
        hex[64] = '\0';
        tg_state_invalidate(st, hex);
    } else {
        tg_state_invalidate(st, NULL);
    }
}

static void publish_done(void *ud, redisReply *r, const char *err) {
    TG_UNUSED(ud);
    TG_UNUSED(r);
    if (err)
        tg_log_warn("state: publishing an invalidation failed (%s); other instances catch up within the cache TTL", err);
}

void tg_state_publish_invalidation(tg_state_t *st, const char *what) {
    if (!what || !strcmp(what, "*"))
        tg_state_invalidate(st, NULL);
    else if (!strncmp(what, "key:", 4))
        tg_state_invalidate(st, what + 4);
    if (st->redis)
        tg_redis_publish(st->redis, INVALIDATE_CHANNEL, what, strlen(what), publish_done, NULL);
}

tg_state_t *tg_state_create(uv_loop_t *loop, const tg_config_t *cfg, const uint8_t (*static_keys)[32], size_t nstatic) {
    tg_state_t *st = calloc(1, sizeof(*st));
    st->loop = loop;
    st->cfg = cfg;
    st->nbuckets = 4096;
    st->buckets = calloc(st->nbuckets, sizeof(*st->buckets));
    st->static_keys = static_keys;
    st->nstatic = nstatic;
    st->static_principal.refs = 1 << 30; /* never freed */
    st->static_principal.active = 1;
    tg_principal_t *sp = &st->static_principal;
    sp->rpm = sp->tpm = sp->concurrency = sp->rpm_burst = -1;
    sp->tenant_rpm = sp->tenant_rpm_burst = sp->tenant_tpm = sp->tenant_concurrency = -1;
    sp->rate_multiplier_micro = 1000000;
    snprintf(st->static_principal.key_prefix, sizeof(st->static_principal.key_prefix), "static");
    if (cfg->pg_conninfo) {
        st->pg = tg_pg_create(loop, cfg->pg_conninfo, cfg->pg_pool_size, cfg->pg_timeout_ms);
        if (st->pg)
            tg_pg_prepare(st->pg, "auth_key", AUTH_SQL, 1);
    }
    if (cfg->redis_url) {
        st->redis = tg_redis_create(loop, cfg->redis_url, cfg->redis_timeout_ms);
        if (st->redis)
            tg_redis_subscribe(st->redis, INVALIDATE_CHANNEL, on_invalidate_msg, st);
    }
    return st;
}

void tg_state_destroy(tg_state_t *st) {
    if (!st)
        return;
    for (size_t i = 0; i < st->nbuckets; i++) {
        entry_t *e = st->buckets[i];
        while (e) {
            entry_t *next = e->next;
            if (e->query)
                tg_pg_cancel(e->query);
            while (e->waiters) {
                tg_auth_wait_t *w = e->waiters;
                e->waiters = w->next;
                free(w);
            }
            tg_principal_release(e->p);
            free(e);
            e = next;
        }
    }
    free(st->buckets);
    if (st->pg)
        tg_pg_destroy(st->pg);
    if (st->redis)
        tg_redis_destroy(st->redis);
    free(st);
}

void tg_state_on_invalidate(tg_state_t *st, void (*fn)(void *ud), void *ud) {
    if (st->nlisteners < 8) {
        st->listeners[st->nlisteners] = fn;
        st->listener_ud[st->nlisteners++] = ud;
    }
}

void tg_state_on_policies(tg_state_t *st, void (*fn)(void *ud, uint64_t seq), void *ud) {
    st->policies_fn = fn;
    st->policies_ud = ud;
}

void tg_state_publish_accounts(tg_state_t *st) {
    if (st->redis)
        tg_redis_publish(st->redis, INVALIDATE_CHANNEL, "accounts", 8, publish_done, NULL);
    else
        for (int i = 0; i < st->nlisteners; i++)
            st->listeners[i](st->listener_ud[i]);
}

tg_pg_t *tg_state_pg(tg_state_t *st) { return st->pg; }
tg_redis_t *tg_state_redis(tg_state_t *st) { return st->redis; }
const tg_state_stats_t *tg_state_stats(const tg_state_t *st) { return &st->stats; }

static void state_collect(const void *const *stats, int n, tg_buf_t *out) {
    tg_state_stats_t s;
    tg_metrics_sum_u64(stats, n, TG_METRICS_NFIELDS(tg_state_stats_t), (uint64_t *)&s);
    tg_buf_printf(out,
                  "# HELP tollgate_auth_cache_total API-key cache lookups by result.\n"
                  "# TYPE tollgate_auth_cache_total counter\n"
                  "tollgate_auth_cache_total{result=\"hit\"} %llu\ntollgate_auth_cache_total{result=\"miss\"} %llu\n"
                  "tollgate_auth_cache_total{result=\"negative_hit\"} %llu\n"
                  "tollgate_auth_cache_total{result=\"stale\"} %llu\n"
                  "# HELP tollgate_auth_db_lookups_total Key lookups that reached Postgres.\n"
                  "# TYPE tollgate_auth_db_lookups_total counter\ntollgate_auth_db_lookups_total %llu\n",
                  (unsigned long long)s.hits, (unsigned long long)s.misses, (unsigned long long)s.negative_hits,
                  (unsigned long long)s.stale, (unsigned long long)s.db_lookups);
}

void tg_state_metrics(tg_metrics_t *m, const tg_state_t *st) {
    if (st)
        tg_metrics_collector_add(m, state_collect, &st->stats);
}

static char **json_strings(const char *text, int *n) {
    *n = 0;
    json_t *j = json_loads(text, 0, NULL);
    if (!json_is_array(j)) {
        json_decref(j);
        return NULL;
    }
    size_t len = json_array_size(j);
    char **out = calloc(len + 1, sizeof(char *));
    for (size_t i = 0; i < len; i++) {
        const char *s = json_string_value(json_array_get(j, i));
        if (s)
            out[(*n)++] = strdup(s);
    }
    json_decref(j);
    return out;
}

/* The periodic budgets of AUTH_SQL's last column: [[id, nano, period, hours, zone,
 * created s, scope, name], ...]. */
static void budgets_from_json(tg_principal_t *p, const char *text) {
    json_t *j = json_loads(text, 0, NULL);
    size_t i;
    json_t *e;
    json_array_foreach(j, i, e) {
        if (p->nbudgets >= TG_BUDGETS_MAX)
            break;
        tg_budget_t *b = &p->budgets[p->nbudgets];
        memset(b, 0, sizeof(*b));
        b->id = json_integer_value(json_array_get(e, 0));
        b->amount = json_integer_value(json_array_get(e, 1));
        const char *kind = json_string_value(json_array_get(e, 2));
        b->kind = tg_budget_kind(kind ? kind : "");
        b->hours = (int)json_integer_value(json_array_get(e, 3));
        snprintf(b->tz, sizeof(b->tz), "%s", json_string_value(json_array_get(e, 4)) ?: "UTC");
        b->anchor_s = json_integer_value(json_array_get(e, 5));
        const char *scope = json_string_value(json_array_get(e, 6));
        b->scope = scope ? scope[0] : 't';
        snprintf(b->name, sizeof(b->name), "%s", json_string_value(json_array_get(e, 7)) ?: "");
        if (b->id > 0 && b->kind >= 0)
            p->nbudgets++;
    }
    json_decref(j);
}

static tg_principal_t *principal_from_row(const PGresult *res) {
    tg_principal_t *p = calloc(1, sizeof(*p));
    p->refs = 1;
    p->key_id = atoll(PQgetvalue(res, 0, 0));
    p->tenant_id = atoll(PQgetvalue(res, 0, 1));
    p->group_id = atoll(PQgetvalue(res, 0, 2));
    p->active = PQgetvalue(res, 0, 3)[0] == 't';
    p->expires_at_ms = atoll(PQgetvalue(res, 0, 4));
    if (!PQgetisnull(res, 0, 5))
        p->allowed_models = json_strings(PQgetvalue(res, 0, 5), &p->nallowed);
    if (!PQgetisnull(res, 0, 6)) {
        int n = 0;
        char **ips = json_strings(PQgetvalue(res, 0, 6), &n);
        p->ip_allow = calloc((size_t)n + 1, sizeof(tg_cidr_t));
        for (int i = 0; i < n; i++) {
            if (tg_cidr_parse(ips[i], &p->ip_allow[p->nip]) == TG_OK)
                p->nip++;
            free(ips[i]);
        }
        free(ips);
    }
    p->rpm = atoll(PQgetvalue(res, 0, 7));
    p->tpm = atoll(PQgetvalue(res, 0, 8));
    p->concurrency = atoll(PQgetvalue(res, 0, 9));
    snprintf(p->budget, sizeof(p->budget), "%s", PQgetvalue(res, 0, 10));
    snprintf(p->group_name, sizeof(p->group_name), "%s", PQgetvalue(res, 0, 11));
    if (!PQgetisnull(res, 0, 12))
        p->group_models = json_strings(PQgetvalue(res, 0, 12), &p->ngroup_models);
    snprintf(p->key_prefix, sizeof(p->key_prefix), "%s", PQgetvalue(res, 0, 13));
    p->rpm_burst = atoll(PQgetvalue(res, 0, 14));
    p->tenant_rpm = atoll(PQgetvalue(res, 0, 15));
    p->tenant_rpm_burst = atoll(PQgetvalue(res, 0, 16));
    p->tenant_tpm = atoll(PQgetvalue(res, 0, 17));
    p->tenant_concurrency = atoll(PQgetvalue(res, 0, 18));
    {
        /* numeric(12,6) as text: at most 6 fractional digits, so millionths are exact. */
        const char *m = PQgetvalue(res, 0, 19);
        int64_t whole = atoll(m), frac = 0;
        const char *dot = strchr(m, '.');
        int digits = 0;
        if (dot)
            for (const char *d = dot + 1; *d >= '0' && *d <= '9' && digits < 6; d++, digits++)
                frac = frac * 10 + (*d - '0');
        while (digits++ < 6)
            frac *= 10;
        p->rate_multiplier_micro = whole * 1000000 + frac;
    }
    /* jsonb prints an empty object as "{}": no setting, the config file's plugins. */
    if (strcmp(PQgetvalue(res, 0, 20), "{}") != 0)
        p->group_plugins = strdup(PQgetvalue(res, 0, 20));
    budgets_from_json(p, PQgetvalue(res, 0, 21));
    return p;
}

typedef struct {
    tg_state_t *st;
    entry_t *e;
} query_ctx_t;

static void auth_query_cb(void *ud, const PGresult *res, const char *err) {
    query_ctx_t *q = ud;
    tg_state_t *st = q->st;
    entry_t *e = q->e;
    free(q);
    e->query = NULL;
    e->pending = 0;
    tg_principal_t *p = NULL;
    uint64_t now = tg_now_ms();
    if (!err && res && PQntuples(res) == 1)
        p = principal_from_row(res);
    int stale = 0;
    if (err && e->stale && now < e->stale_until && e->gen == st->gen) {
        /* Postgres cannot answer, and nothing changed this key meanwhile (a change is
         * published as an invalidation, which bumps gen): the key keeps working as it was
         * last read, and is tried again in a second. */
        if (st->stats.stale++ % 1000 == 0)
            tg_log_warn("auth: Postgres cannot answer (%s): keys read before keep working for up to %d ms past "
                        "their cache time (key_stale_ms)",
                        err, st->cfg->key_stale_ms);
        p = retain(e->stale);
        err = NULL;
        stale = 1;
    } else if (!err) {
        tg_principal_release(e->stale);
        e->stale = NULL;
    }
    /* Hand the answer to every waiter, then keep it (unless invalidated meanwhile or
     * the database failed: errors are never cached). */
    tg_auth_wait_t *w = e->waiters;
    e->waiters = NULL;
    int keep = !err && e->gen == st->gen;
    e->p = p;
    e->p_stale = stale;
    e->expires_ms = now + jitter(stale ? STALE_RETRY_MS : p ? (uint64_t)st->cfg->key_cache_ms : NEGATIVE_TTL_MS);
    if (!keep) {
        entry_t **pp = &st->buckets[bucket_of(st, e->digest)];
        while (*pp && *pp != e)
            pp = &(*pp)->next;
        if (*pp)
            *pp = e->next;
        retain(p);   /* survives entry_drop for the waiters below */
        entry_drop(st, e);
        e = NULL;
    }
    while (w) {
        tg_auth_wait_t *next = w->next;
        w->cb(w->ud, retain(p), err);
        free(w);
        w = next;
    }
    if (!keep)
        tg_principal_release(p);
}

static void maybe_grow(tg_state_t *st) {
    if (st->count > MAX_ENTRIES) {
        for (size_t i = 0; i < st->nbuckets; i++)
            clear_bucket_chain(st, &st->buckets[i], 0);
        if (st->count > MAX_ENTRIES)
            tg_state_invalidate(st, NULL);
        return;
    }
    if (st->count < st->nbuckets)
        return;
    size_t nb = st->nbuckets * 2;
    entry_t **b = calloc(nb, sizeof(*b));
    for (size_t i = 0; i < st->nbuckets; i++) {
        entry_t *e = st->buckets[i];
        while (e) {
            entry_t *next = e->next;
            uint64_t h;
            memcpy(&h, e->digest, sizeof(h));
            size_t k = (size_t)(h & (nb - 1));
            e->next = b[k];
            b[k] = e;
            e = next;
        }
    }
    free(st->buckets);
    st->buckets = b;
    st->nbuckets = nb;
}

int tg_state_auth(tg_state_t *st, const uint8_t digest[32], tg_auth_cb cb, void *ud, tg_principal_t **out,
                  tg_auth_wait_t **wait) {
    *out = NULL;
    *wait = NULL;
    for (size_t i = 0; i < st->nstatic; i++)
        if (memcmp(st->static_keys[i], digest, 32) == 0) {
            *out = &st->static_principal;
            st->stats.hits++;
            return TG_OK;
        }
    if (!st->pg)
        return TG_OK; /* static keys only: unknown */
    entry_t **head = &st->buckets[bucket_of(st, digest)];
    entry_t *e = *head;
    while (e && memcmp(e->digest, digest, 32) != 0)
        e = e->next;
    uint64_t now = tg_now_ms();
    if (e && !e->pending && e->expires_ms > now) {
        st->stats.hits++;
        if (!e->p)
            st->stats.negative_hits++;
        *out = retain(e->p);
        return TG_OK;
    }
    st->stats.misses++;
    if (!e) {
        maybe_grow(st);
        head = &st->buckets[bucket_of(st, digest)];
        e = calloc(1, sizeof(*e));
        memcpy(e->digest, digest, 32);
        e->next = *head;
        *head = e;
        st->count++;
    }
    tg_auth_wait_t *w = calloc(1, sizeof(*w));
    w->cb = cb;
    w->ud = ud;
    w->e = e;
    w->next = e->waiters;
    if (w->next)
        w->next->prev = w;
    e->waiters = w;
    *wait = w;
    if (!e->pending) {
        /* Expired or new: one query for everyone who asks meanwhile. A key it had is
         * kept aside for the query failing (stale-if-error), bounded by the expiry of
         * its last fresh read. */
        if (e->p && !e->p_stale) {
            tg_principal_release(e->stale);
            e->stale = e->p;
            e->stale_until = e->expires_ms + (uint64_t)st->cfg->key_stale_ms;
        } else {
            tg_principal_release(e->p);
        }
        e->p = NULL;
        e->p_stale = 0;
        e->pending = 1;
        e->gen = st->gen;
        st->stats.db_lookups++;
        static const char hex[] = "0123456789abcdef";
        char param[67] = "\\x";
        for (int i = 0; i < 32; i++) {
            param[2 + 2 * i] = hex[digest[i] >> 4];
            param[3 + 2 * i] = hex[digest[i] & 15];
        }
        param[66] = '\0';
        const char *params[1] = {param};
        query_ctx_t *q = malloc(sizeof(*q));
        q->st = st;
        q->e = e;
        e->query = tg_pg_exec(st->pg, "auth_key", 1, params, auth_query_cb, q);
    }
    return TG_AGAIN;
}

void tg_state_auth_cancel(tg_auth_wait_t *w) {
    if (!w)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else
        w->e->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    free(w);
}

int tg_principal_allows_model(const tg_principal_t *p, const char *model) {
    if (p->allowed_models) {
        int ok = 0;
        for (int i = 0; i < p->nallowed && !ok; i++)
            ok = strcmp(p->allowed_models[i], model) == 0;
        if (!ok)
            return 0;
    }
    if (p->group_models && p->ngroup_models > 0) {
        for (int i = 0; i < p->ngroup_models; i++)
            if (strcmp(p->group_models[i], model) == 0)
                return 1;
        return 0;
    }
    return 1;
}

int tg_cidr_parse(const char *s, tg_cidr_t *out) {
    char addr[64];
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    if (n >= sizeof(addr))
        return TG_ERROR;
    memcpy(addr, s, n);
    addr[n] = '\0';
    memset(out, 0, sizeof(*out));
    if (inet_pton(AF_INET, addr, out->addr) == 1) {
        out->family = 4;
        out->bits = 32;
    } else if (inet_pton(AF_INET6, addr, out->addr) == 1) {
        out->family = 6;
        out->bits = 128;
    } else {
        return TG_ERROR;
    }
    if (slash) {
        int b = atoi(slash + 1);
        if (b < 0 || b > out->bits)
            return TG_ERROR;
        out->bits = b;
    }
    return TG_OK;
}

int tg_cidr_match(const tg_cidr_t *c, const char *ip) {
    uint8_t a[16];
    int fam;
    if (inet_pton(AF_INET, ip, a) == 1)
        fam = 4;
    else if (inet_pton(AF_INET6, ip, a) == 1)
        fam = 6;
    else
        return 0;
    if (fam == 6 && c->family == 4 && !memcmp(a, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12)) {
        memmove(a, a + 12, 4); /* IPv4-mapped */
        fam = 4;
    }
    if (fam != c->family)
        return 0;
    int full = c->bits / 8, rest = c->bits % 8;
    if (memcmp(a, c->addr, (size_t)full) != 0)
        return 0;
    if (rest) {
        uint8_t mask = (uint8_t)(0xff << (8 - rest));
        return (a[full] & mask) == (c->addr[full] & mask);
    }
    return 1;
}

int tg_principal_allows_ip(const tg_principal_t *p, const char *ip) {
    if (!p->ip_allow)
        return 1;
    for (int i = 0; i < p->nip; i++)
        if (tg_cidr_match(&p->ip_allow[i], ip))
            return 1;
    return 0;
}
