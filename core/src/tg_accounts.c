/*
 * The account snapshot (see tg_accounts.h).
 */
#include "tollgate/tg_accounts.h"

#include <libpq-fe.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_billing.h"
#include "tollgate/tg_crypto.h"
#include "tollgate/tg_pg.h"
#include "tollgate/tg_tls.h"

typedef struct {
    int64_t group_id;
    tg_account_t **accounts;
    int n;
} group_t;

typedef struct {
    char *model;
    tg_price_t price;
} model_price_t;

struct tg_snapshot_s {
    int refs;
    model_price_t *prices; /* sorted by model */
    size_t nprices;
    uint64_t generation;
    tg_account_t *accounts;
    size_t naccounts;
    group_t *groups;
    size_t ngroups;
};

typedef struct upstream_entry_s {
    char *url;
    tg_upstream_config_t cfg; /* the client keeps a pointer to it */
    tg_upstream_t *up;
    struct upstream_entry_s *next;
} upstream_entry_t;

struct tg_accounts_s {
    uv_loop_t *loop;
    tg_state_t *st;
    const tg_config_t *cfg;
    SSL_CTX *client_tls;
    SSL_CTX *own_tls;
    tg_snapshot_t *current;
    upstream_entry_t *upstreams;
    tg_pg_req_t *loading;
    int reload_again;
    model_price_t *pending_prices;
    size_t npending_prices;
    uint64_t generation;
    uv_timer_t retry;
};

static const char LOAD_SQL[] =
    "SELECT a.id, a.name, a.provider, a.base_url, a.credential, a.kind, a.concurrency, a.priority, a.weight, "
    "to_json(a.models), a.model_map::text, a.cost_multiplier::text, a.status, "
    "coalesce((extract(epoch FROM a.cooldown_until) * 1000)::bigint, 0), "
    "coalesce((extract(epoch FROM a.reset_at) * 1000)::bigint, 0), "
    "coalesce((SELECT json_agg(ag.group_id) FROM account_groups ag WHERE ag.account_id = a.id), '[]') "
    "FROM accounts a ORDER BY a.id";

static void snapshot_free(tg_snapshot_t *s) {
    for (size_t i = 0; i < s->naccounts; i++) {
        tg_account_t *a = &s->accounts[i];
        free(a->name);
        free(a->provider);
        if (a->credential) {
            OPENSSL_cleanse(a->credential, strlen(a->credential));
            free(a->credential);
        }
        for (int k = 0; k < a->nmodels; k++)
            free(a->models[k]);
        free(a->models);
        json_decref(a->model_map);
    }
    free(s->accounts);
    for (size_t i = 0; i < s->ngroups; i++)
        free(s->groups[i].accounts);
    free(s->groups);
    for (size_t i = 0; i < s->nprices; i++)
        free(s->prices[i].model);
    free(s->prices);
    free(s);
}

void tg_snapshot_release(tg_snapshot_t *s) {
    if (s && --s->refs == 0)
        snapshot_free(s);
}

tg_snapshot_t *tg_accounts_snapshot(tg_accounts_t *a) {
    if (a && a->current)
        a->current->refs++;
    return a ? a->current : NULL;
}

size_t tg_snapshot_size(const tg_snapshot_t *s) { return s ? s->naccounts : 0; }

static tg_upstream_t *upstream_for(tg_accounts_t *a, const char *url) {
    for (upstream_entry_t *e = a->upstreams; e; e = e->next)
        if (!strcmp(e->url, url))
            return e->up;
    upstream_entry_t *e = calloc(1, sizeof(*e));
    e->url = strdup(url);
    e->cfg = a->cfg->upstream; /* timeouts and pool sizes from the config */
    e->cfg.url = e->url;
    e->cfg.api_key = NULL;
    SSL_CTX *tls = NULL;
    if (!strncmp(url, "https://", 8)) {
        if (!a->client_tls && !a->own_tls) {
            char err[256];
            a->own_tls = tg_tls_client_ctx(a->cfg->upstream.ca_file, a->cfg->upstream.tls_verify, err, sizeof(err));
        }
        tls = a->client_tls ? a->client_tls : a->own_tls;
    }
    char err[256];
    e->up = tg_upstream_create(a->loop, &e->cfg, tls, err, sizeof(err));
    if (!e->up) {
        tg_log_error("accounts: %s", err);
        free(e->url);
        free(e);
        return NULL;
    }
    e->next = a->upstreams;
    a->upstreams = e;
    return e->up;
}

static char **json_string_list(const char *text, int *n) {
    *n = 0;
    json_t *j = json_loads(text, 0, NULL);
    if (!json_is_array(j)) {
        json_decref(j);
        return NULL;
    }
    char **out = calloc(json_array_size(j) + 1, sizeof(char *));
    size_t i;
    json_t *v;
    json_array_foreach(j, i, v) if (json_is_string(v)) out[(*n)++] = strdup(json_string_value(v));
    json_decref(j);
    return out;
}

static void schedule_retry(tg_accounts_t *a);

static void load_cb(void *ud, const PGresult *res, const char *err) {
    tg_accounts_t *a = ud;
    a->loading = NULL;
    if (err) {
        tg_log_warn("accounts: loading the account snapshot failed: %s (keeping the previous one)", err);
        schedule_retry(a);
        return;
    }
    uint8_t key[32];
    int have_key = tg_crypto_key(a->cfg->secret_key, key) == TG_OK;
    tg_snapshot_t *s = calloc(1, sizeof(*s));
    s->refs = 1;
    s->generation = ++a->generation;
    s->prices = a->pending_prices;
    s->nprices = a->npending_prices;
    a->pending_prices = NULL;
    a->npending_prices = 0;
    int rows = PQntuples(res);
    s->accounts = calloc((size_t)rows + 1, sizeof(tg_account_t));
    json_t *memberships = json_array();
    for (int r = 0; r < rows; r++) {
        tg_account_t *acc = &s->accounts[s->naccounts];
        acc->id = atoll(PQgetvalue(res, r, 0));
        acc->name = strdup(PQgetvalue(res, r, 1));
        acc->provider = strdup(PQgetvalue(res, r, 2));
        acc->upstream = upstream_for(a, PQgetvalue(res, r, 3));
        if (!PQgetisnull(res, r, 4)) {
            size_t n = 0;
            unsigned char *raw = PQunescapeBytea((const unsigned char *)PQgetvalue(res, r, 4), &n);
            tg_buf_t plain;
            tg_buf_init(&plain);
            if (have_key && raw && tg_crypto_open(key, raw, n, &plain) == TG_OK)
                acc->credential = plain.data;
            else {
                tg_log_error("accounts: %s: the credential cannot be opened (%s); the account is skipped", acc->name,
                             have_key ? "wrong TOLLGATE_SECRET_KEY?" : "no TOLLGATE_SECRET_KEY");
                tg_buf_free(&plain);
            }
            PQfreemem(raw);
            if (!acc->credential) {
                free(acc->name);
                free(acc->provider);
                continue;
            }
        }
        acc->kind_subscription = !strcmp(PQgetvalue(res, r, 5), "subscription");
        acc->concurrency = atoi(PQgetvalue(res, r, 6));
        acc->priority = atoi(PQgetvalue(res, r, 7));
        acc->weight = atoi(PQgetvalue(res, r, 8));
        acc->models = json_string_list(PQgetvalue(res, r, 9), &acc->nmodels);
        acc->model_map = json_loads(PQgetvalue(res, r, 10), 0, NULL);
        snprintf(acc->cost_multiplier, sizeof(acc->cost_multiplier), "%s", PQgetvalue(res, r, 11));
        acc->active = !strcmp(PQgetvalue(res, r, 12), "active") && acc->upstream;
        acc->cooldown_until_ms = atoll(PQgetvalue(res, r, 13));
        acc->reset_at_ms = atoll(PQgetvalue(res, r, 14));
        json_t *groups = json_loads(PQgetvalue(res, r, 15), 0, NULL);
        size_t gi;
        json_t *g;
        json_array_foreach(groups, gi, g) {
            json_t *pair = json_pack("[II]", (json_int_t)json_integer_value(g), (json_int_t)s->naccounts);
            json_array_append_new(memberships, pair);
        }
        json_decref(groups);
        s->naccounts++;
    }
    OPENSSL_cleanse(key, sizeof(key));
    /* Index by group. */
    size_t mi;
    json_t *m;
    json_array_foreach(memberships, mi, m) {
        int64_t gid = json_integer_value(json_array_get(m, 0));
        tg_account_t *acc = &s->accounts[json_integer_value(json_array_get(m, 1))];
        group_t *grp = NULL;
        for (size_t k = 0; k < s->ngroups; k++)
            if (s->groups[k].group_id == gid)
                grp = &s->groups[k];
        if (!grp) {
            s->groups = realloc(s->groups, (s->ngroups + 1) * sizeof(group_t));
            grp = &s->groups[s->ngroups++];
            memset(grp, 0, sizeof(*grp));
            grp->group_id = gid;
        }
        grp->accounts = realloc(grp->accounts, (size_t)(grp->n + 1) * sizeof(tg_account_t *));
        grp->accounts[grp->n++] = acc;
    }
    json_decref(memberships);
    tg_snapshot_t *old = a->current;
    a->current = s;
    tg_snapshot_release(old);
    tg_log_debug("accounts: snapshot %llu with %zu accounts in %zu groups", (unsigned long long)s->generation,
                 s->naccounts, s->ngroups);
    if (a->reload_again) {
        a->reload_again = 0;
        tg_accounts_refresh(a);
    }
}

static void retry_cb(uv_timer_t *t) { tg_accounts_refresh(t->data); }

static void schedule_retry(tg_accounts_t *a) {
    if (!uv_is_active((uv_handle_t *)&a->retry))
        uv_timer_start(&a->retry, retry_cb, 1000, 0);
}

static int price_cmp(const void *x, const void *y) {
    return strcmp(((const model_price_t *)x)->model, ((const model_price_t *)y)->model);
}

static void prices_cb(void *ud, const PGresult *res, const char *err) {
    tg_accounts_t *a = ud;
    a->loading = NULL;
    if (err) {
        tg_log_warn("accounts: loading model prices failed: %s", err);
        schedule_retry(a);
        return;
    }
    int rows = PQntuples(res);
    model_price_t *p = calloc((size_t)rows + 1, sizeof(*p));
    size_t n = 0;
    for (int r = 0; r < rows; r++) {
        model_price_t *m = &p[n];
        if (tg_money_parse(PQgetvalue(res, r, 1), &m->price.input) || tg_money_parse(PQgetvalue(res, r, 2), &m->price.output) ||
            tg_money_parse(PQgetvalue(res, r, 3), &m->price.cache_read) ||
            tg_money_parse(PQgetvalue(res, r, 4), &m->price.cache_write) ||
            tg_money_parse(PQgetvalue(res, r, 5), &m->price.reasoning))
            continue;
        m->model = strdup(PQgetvalue(res, r, 0));
        n++;
    }
    qsort(p, n, sizeof(*p), price_cmp);
    for (size_t i = 0; i < a->npending_prices; i++)
        free(a->pending_prices[i].model);
    free(a->pending_prices);
    a->pending_prices = p;
    a->npending_prices = n;
    a->loading = tg_pg_query(tg_state_pg(a->st), LOAD_SQL, 0, NULL, load_cb, a);
}

void tg_accounts_refresh(tg_accounts_t *a) {
    tg_pg_t *pg = tg_state_pg(a->st);
    if (!pg)
        return;
    if (a->loading) {
        a->reload_again = 1;
        return;
    }
    a->loading = tg_pg_query(pg,
                             "SELECT model, input::text, output::text, cache_read::text, cache_write::text, "
                             "coalesce(reasoning, output)::text FROM model_prices",
                             0, NULL, prices_cb, a);
}

int tg_snapshot_price(const tg_snapshot_t *s, const char *model, tg_price_t *out) {
    if (!s || !s->nprices)
        return 0;
    model_price_t key = {(char *)model, {0}};
    const model_price_t *m = bsearch(&key, s->prices, s->nprices, sizeof(key), price_cmp);
    if (!m)
        return 0;
    *out = m->price;
    return 1;
}

static void on_invalidate(void *ud) { tg_accounts_refresh(ud); }

tg_accounts_t *tg_accounts_create(uv_loop_t *loop, tg_state_t *st, const tg_config_t *cfg, SSL_CTX *client_tls) {
    tg_accounts_t *a = calloc(1, sizeof(*a));
    a->loop = loop;
    a->st = st;
    a->cfg = cfg;
    a->client_tls = client_tls;
    uv_timer_init(loop, &a->retry);
    a->retry.data = a;
    tg_state_on_invalidate(st, on_invalidate, a);
    tg_accounts_refresh(a);
    return a;
}

void tg_accounts_destroy(tg_accounts_t *a) {
    if (!a)
        return;
    if (a->loading)
        tg_pg_cancel(a->loading);
    uv_close((uv_handle_t *)&a->retry, NULL);
    tg_snapshot_release(a->current);
    for (size_t i = 0; i < a->npending_prices; i++)
        free(a->pending_prices[i].model);
    free(a->pending_prices);
    upstream_entry_t *e = a->upstreams;
    while (e) {
        upstream_entry_t *next = e->next;
        /* The client frees itself once its connections have closed; it no longer reads
         * e->cfg or the URL after creation. */
        tg_upstream_destroy(e->up);
        free(e->url);
        free(e);
        e = next;
    }
    SSL_CTX_free(a->own_tls);
    free(a);
}

const char *tg_account_map_model(const tg_account_t *acc, const char *model) {
    json_t *v = acc->model_map ? json_object_get(acc->model_map, model) : NULL;
    return json_is_string(v) ? json_string_value(v) : model;
}

int tg_snapshot_candidates(const tg_snapshot_t *s, int64_t group_id, const char *model, int64_t now_ms,
                           const tg_account_t **out, int max) {
    if (!s)
        return 0;
    const group_t *g = NULL;
    for (size_t i = 0; i < s->ngroups; i++)
        if (s->groups[i].group_id == group_id)
            g = &s->groups[i];
    if (!g)
        return 0;
    /* Large groups: start at a rotating offset, so every account gets its turn in the
     * bounded candidate list. */
    static _Thread_local unsigned rot;
    unsigned start = g->n > max ? rot++ % (unsigned)g->n : 0;
    int n = 0;
    for (int j = 0; j < g->n && n < max; j++) {
        const tg_account_t *acc = g->accounts[(start + (unsigned)j) % (unsigned)g->n];
        if (!acc->active || acc->cooldown_until_ms > now_ms)
            continue;
        int serves = acc->nmodels == 0 || (acc->model_map && json_object_get(acc->model_map, model));
        for (int k = 0; k < acc->nmodels && !serves; k++)
            serves = !strcmp(acc->models[k], model);
        if (serves)
            out[n++] = acc;
    }
    return n;
}

const tg_account_t *tg_accounts_pick_default(const tg_account_t *const *c, int n) {
    if (n <= 0)
        return NULL;
    int best = c[0]->priority;
    for (int i = 1; i < n; i++)
        best = TG_MAX(best, c[i]->priority);
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        if (c[i]->priority == best)
            total += (uint64_t)TG_MAX(c[i]->weight, 0) + 1;
    uint64_t r = 0;
    tg_random_bytes(&r, sizeof(r));
    r %= total;
    for (int i = 0; i < n; i++) {
        if (c[i]->priority != best)
            continue;
        uint64_t w = (uint64_t)TG_MAX(c[i]->weight, 0) + 1;
        if (r < w)
            return c[i];
        r -= w;
    }
    return c[0];
}
