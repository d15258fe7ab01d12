/*
 * The account snapshot (see tg_accounts.h).
 */
#include "tollgate/tg_accounts.h"
#include "tollgate/tg_aws.h"

#include <libpq-fe.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_crypto.h"
#include "tollgate/tg_identity.h"
#include "tollgate/tg_money.h"
#include "tollgate/tg_pg.h"
#include "tollgate/tg_tls.h"
#include "tollgate/tg_valid.h"

/* The accounts of one group that list or map one model (the any-model ones are apart). */
typedef struct {
    const char *model; /* points into an account's models or model_map (the snapshot owns it) */
    const tg_account_t **acc;
    int n;
} model_pool_t;

/* One group, indexed for tg_select: nothing on the request path scans all its members. */
typedef struct {
    int64_t group_id;
    const tg_account_t **by_id; /* every member, by id (sticky lookups) */
    int n;
    const tg_account_t **any;   /* members that list no models, by priority then id */
    int nany;
    model_pool_t *models;       /* by model name; each pool by priority then id */
    int nmodels;
    const tg_account_t **listed; /* storage of models[].acc */
} group_t;

typedef struct {
    char *model;
    tg_price_t price;
} model_price_t;

typedef struct {
    int64_t id;
    char *why;
} broken_t;

struct tg_snapshot_s {
    int refs;
    model_price_t *prices; /* sorted by model */
    size_t nprices;
    uint64_t generation;
    tg_account_t *accounts;
    size_t naccounts;
    group_t *groups;
    size_t ngroups;
    broken_t *broken; /* accounts left out, by id, with the reason (the admin API shows it) */
    size_t nbroken;
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
    "coalesce((SELECT json_agg(ag.group_id) FROM account_groups ag WHERE ag.account_id = a.id), '[]'), "
    "a.settings::text, a.auth, a.auth_error "
    "FROM accounts a ORDER BY a.id";

static void snapshot_free(tg_snapshot_t *s) {
    for (size_t i = 0; i < s->naccounts; i++) {
        tg_account_t *a = &s->accounts[i];
        free(a->name);
        free(a->provider);
        free(a->auth_error);
        if (a->credential) {
            OPENSSL_cleanse(a->credential, strlen(a->credential));
            free(a->credential);
        }
        for (int k = 0; k < a->nmodels; k++)
            free(a->models[k]);
        free(a->models);
        json_decref(a->model_map);
        json_decref(a->settings);
    }
    free(s->accounts);
    for (size_t i = 0; i < s->ngroups; i++) {
        free(s->groups[i].by_id);
        free(s->groups[i].any);
        free(s->groups[i].models);
        free(s->groups[i].listed);
    }
    free(s->groups);
    for (size_t i = 0; i < s->nbroken; i++)
        free(s->broken[i].why);
    free(s->broken);
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

const tg_account_t *tg_snapshot_account_at(const tg_snapshot_t *s, size_t i) {
    return s && i < s->naccounts ? &s->accounts[i] : NULL;
}

uint64_t tg_snapshot_generation(const tg_snapshot_t *s) { return s ? s->generation : 0; }

static const tg_account_t *account_by_id(const tg_snapshot_t *s, int64_t id);

const tg_account_t *tg_snapshot_account(const tg_snapshot_t *s, int64_t id) { return s ? account_by_id(s, id) : NULL; }

const char *tg_snapshot_broken(const tg_snapshot_t *s, int64_t id) {
    for (size_t i = 0; s && i < s->nbroken; i++)
        if (s->broken[i].id == id)
            return s->broken[i].why;
    return NULL;
}

/* Records why account `id` is left out of snapshot s (printf-style), and logs it. */
static void snapshot_skip(tg_snapshot_t *s, int64_t id, const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    tg_log_error("accounts: account %lld: %s; the account is skipped", (long long)id, why);
    s->broken = realloc(s->broken, (s->nbroken + 1) * sizeof(*s->broken));
    s->broken[s->nbroken++] = (broken_t){id, strdup(why)};
}

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

tg_upstream_t *tg_accounts_upstream(tg_accounts_t *a, const char *url) { return a ? upstream_for(a, url) : NULL; }

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

/* ---- the group index ------------------------------------------------------------------ */

/* Priority first (highest first), then id: a tier is a contiguous run. */
static int prio_cmp(const void *x, const void *y) {
    const tg_account_t *a = *(const tg_account_t *const *)x, *b = *(const tg_account_t *const *)y;
    if (a->priority != b->priority)
        return a->priority > b->priority ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int memb_cmp(const void *x, const void *y) {
    const tg_membership_t *a = x, *b = y;
    if (a->group_id != b->group_id)
        return a->group_id < b->group_id ? -1 : 1;
    return a->account_id < b->account_id ? -1 : a->account_id > b->account_id;
}

typedef struct {
    const char *model;
    const tg_account_t *acc;
} listing_t;

static int listing_cmp(const void *x, const void *y) {
    const listing_t *a = x, *b = y;
    int c = strcmp(a->model, b->model);
    return c ? c : prio_cmp(&a->acc, &b->acc);
}

static const tg_account_t *account_by_id(const tg_snapshot_t *s, int64_t id) {
    size_t lo = 0, hi = s->naccounts;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->accounts[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->naccounts && s->accounts[lo].id == id ? &s->accounts[lo] : NULL;
}

/* Indexes one group from its members (by id): the any-model pool by priority, and a
 * pool per model name that some member lists or maps. */
static void group_index(group_t *g) {
    g->any = malloc((size_t)g->n * sizeof(*g->any) + 1);
    size_t nlist = 0;
    for (int i = 0; i < g->n; i++) {
        const tg_account_t *acc = g->by_id[i];
        if (acc->nmodels == 0)
            g->any[g->nany++] = acc;
        else
            nlist += (size_t)acc->nmodels + (json_is_object(acc->model_map) ? json_object_size(acc->model_map) : 0);
    }
    qsort(g->any, (size_t)g->nany, sizeof(*g->any), prio_cmp);
    listing_t *l = malloc(nlist * sizeof(*l) + 1);
    size_t k = 0;
    for (int i = 0; i < g->n; i++) {
        const tg_account_t *acc = g->by_id[i];
        if (acc->nmodels == 0)
            continue;
        for (int m = 0; m < acc->nmodels; m++)
            l[k++] = (listing_t){acc->models[m], acc};
        if (json_is_object(acc->model_map)) {
            const char *key;
            json_t *v;
            json_object_foreach(acc->model_map, key, v) l[k++] = (listing_t){key, acc};
        }
    }
    qsort(l, k, sizeof(*l), listing_cmp);
    g->listed = malloc(k * sizeof(*g->listed) + 1);
    g->models = malloc(k * sizeof(*g->models) + 1);
    size_t nl = 0;
    for (size_t i = 0; i < k; i++) {
        if (i > 0 && l[i].acc == l[i - 1].acc && !strcmp(l[i].model, l[i - 1].model))
            continue; /* listed and mapped: once */
        if (i == 0 || strcmp(l[i].model, l[i - 1].model) != 0)
            g->models[g->nmodels++] = (model_pool_t){l[i].model, &g->listed[nl], 0};
        g->listed[nl++] = l[i].acc;
        g->models[g->nmodels - 1].n++;
    }
    free(l);
}

/* Builds s->groups (sorted by id) from the memberships; m is sorted in place. */
static void snapshot_index(tg_snapshot_t *s, tg_membership_t *m, size_t nm) {
    if (nm)
        qsort(m, nm, sizeof(*m), memb_cmp);
    size_t ngroups = 0;
    for (size_t i = 0; i < nm; i++)
        ngroups += i == 0 || m[i].group_id != m[i - 1].group_id;
    s->groups = calloc(ngroups + 1, sizeof(group_t));
    for (size_t i = 0; i < nm; i++) {
        const tg_account_t *acc = account_by_id(s, m[i].account_id);
        if (!acc || (i > 0 && !memb_cmp(&m[i], &m[i - 1])))
            continue;
        group_t *g = s->ngroups ? &s->groups[s->ngroups - 1] : NULL;
        if (!g || g->group_id != m[i].group_id) {
            g = &s->groups[s->ngroups++];
            g->group_id = m[i].group_id;
            size_t j = i;
            while (j < nm && m[j].group_id == g->group_id)
                j++;
            g->by_id = malloc((j - i) * sizeof(*g->by_id));
        }
        g->by_id[g->n++] = acc;
    }
    for (size_t i = 0; i < s->ngroups; i++)
        group_index(&s->groups[i]);
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
    tg_membership_t *memb = NULL;
    size_t nmemb = 0, capmemb = 0;
    for (int r = 0; r < rows; r++) {
        tg_account_t *acc = &s->accounts[s->naccounts];
        acc->id = atoll(PQgetvalue(res, r, 0));
        /* Written some other way than the admin API or apply (which refuse it): a
         * base_url that is not a clean http(s) URL never gets an upstream. */
        const char *why = tg_valid_base_url(PQgetvalue(res, r, 3), (size_t)PQgetlength(res, r, 3));
        if (why) {
            snapshot_skip(s, acc->id, "base_url %s", why);
            continue;
        }
        /* A model_map the proxy cannot read (not an object of strings): left out too,
         * rather than answering 503 to every request of its groups. */
        json_t *map = json_loads(PQgetvalue(res, r, 10), 0, NULL);
        const char *mk = NULL;
        json_t *mv;
        if (map && !json_is_object(map))
            why = "model_map is not an object";
        else
            json_object_foreach(map, mk, mv) if (!json_is_string(mv) || tg_valid_model(json_string_value(mv), json_string_length(mv)) || tg_valid_model(mk, strlen(mk))) {
                why = "model_map maps a model to something other than a model name";
                break;
            }
        if (why) {
            snapshot_skip(s, acc->id, "%s", why);
            json_decref(map);
            continue;
        }
        /* The provider's settings (api_version, region, ...) go into URLs and headers:
         * an object of clean strings, or the account is left out. */
        json_t *settings = json_loads(PQgetvalue(res, r, 16), 0, NULL);
        if (!json_is_object(settings))
            why = "settings is not an object";
        else
            json_object_foreach(settings, mk, mv) if (!json_is_string(mv) || tg_valid_model(json_string_value(mv), json_string_length(mv))) {
                why = "settings holds a value that is not a plain string";
                break;
            }
        if (!why && !strcmp(PQgetvalue(res, r, 2), "bedrock")) {
            why = tg_bedrock_check(settings);
            if (!why && PQgetisnull(res, r, 4))
                why = "a bedrock account needs its secret access key as the credential";
        }
        if (why) {
            snapshot_skip(s, acc->id, "%s", why);
            json_decref(map);
            json_decref(settings);
            continue;
        }
        acc->settings = settings;
        acc->auth = tg_auth_parse(PQgetvalue(res, r, 17));
        if (acc->auth < 0)
            acc->auth = 0;
        acc->auth_error = PQgetisnull(res, r, 18) ? NULL : strdup(PQgetvalue(res, r, 18));
        acc->name = strdup(PQgetvalue(res, r, 1));
        acc->provider = strdup(PQgetvalue(res, r, 2));
        acc->upstream = upstream_for(a, PQgetvalue(res, r, 3));
        if (!PQgetisnull(res, r, 4)) {
            size_t n = 0;
            unsigned char *raw = PQunescapeBytea((const unsigned char *)PQgetvalue(res, r, 4), &n);
            tg_buf_t plain;
            tg_buf_init(&plain);
            int opened = have_key && raw && tg_crypto_open(key, raw, n, &plain) == TG_OK;
            /* An identity's secret (a client secret, a service account key, a refresh
             * token) is read by tg_identity when it refreshes: never kept here. */
            const char *bad = opened && !acc->auth ? tg_valid_no_ctl(plain.data, plain.len) : NULL;
            if (opened && acc->auth) {
                OPENSSL_cleanse(plain.data ? plain.data : "", plain.len);
                tg_buf_free(&plain);
            } else if (opened && !bad) {
                acc->credential = plain.data;
            } else if (opened) {
                /* It would be a header of the upstream request: never sent. */
                snapshot_skip(s, acc->id, "the credential %s", bad);
                OPENSSL_cleanse(plain.data, plain.len);
                tg_buf_free(&plain);
            } else {
                snapshot_skip(s, acc->id, "the credential cannot be opened (%s)",
                              have_key ? "was it sealed with another TOLLGATE_SECRET_KEY? store it again"
                                       : "the gateway has no TOLLGATE_SECRET_KEY");
                tg_buf_free(&plain);
            }
            PQfreemem(raw);
            if (!acc->credential && !(opened && acc->auth)) {
                free(acc->auth_error);
                acc->auth_error = NULL;
                free(acc->name);
                free(acc->provider);
                json_decref(map);
                json_decref(acc->settings);
                acc->settings = NULL;
                continue;
            }
        }
        acc->kind_subscription = !strcmp(PQgetvalue(res, r, 5), "subscription");
        acc->concurrency = atoi(PQgetvalue(res, r, 6));
        acc->priority = atoi(PQgetvalue(res, r, 7));
        acc->weight = atoi(PQgetvalue(res, r, 8));
        acc->models = json_string_list(PQgetvalue(res, r, 9), &acc->nmodels);
        acc->model_map = map;
        snprintf(acc->cost_multiplier, sizeof(acc->cost_multiplier), "%s", PQgetvalue(res, r, 11));
        acc->active = !strcmp(PQgetvalue(res, r, 12), "active") && acc->upstream;
        if (!acc->upstream)
            snapshot_skip(s, acc->id, "no upstream client for its base_url (see the gateway's error log)");
        acc->cooldown_until_ms = atoll(PQgetvalue(res, r, 13));
        acc->reset_at_ms = atoll(PQgetvalue(res, r, 14));
        json_t *groups = json_loads(PQgetvalue(res, r, 15), 0, NULL);
        size_t gi;
        json_t *g;
        json_array_foreach(groups, gi, g) {
            if (nmemb == capmemb) {
                capmemb = capmemb ? capmemb * 2 : 64;
                memb = realloc(memb, capmemb * sizeof(*memb));
            }
            memb[nmemb++] = (tg_membership_t){json_integer_value(g), acc->id};
        }
        json_decref(groups);
        s->naccounts++;
    }
    OPENSSL_cleanse(key, sizeof(key));
    snapshot_index(s, memb, nmemb);
    free(memb);
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

const char *tg_account_setting(const tg_account_t *acc, const char *key, const char *dflt) {
    const char *v = json_string_value(json_object_get(acc->settings, key));
    return v && *v ? v : dflt;
}

const char *tg_account_map_model(const tg_account_t *acc, const char *model) {
    json_t *v = acc->model_map ? json_object_get(acc->model_map, model) : NULL;
    return json_is_string(v) ? json_string_value(v) : model;
}

static const group_t *group_of(const tg_snapshot_t *s, int64_t group_id) {
    size_t lo = 0, hi = s ? s->ngroups : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->groups[mid].group_id < group_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return s && lo < s->ngroups && s->groups[lo].group_id == group_id ? &s->groups[lo] : NULL;
}

int tg_snapshot_pool(const tg_snapshot_t *s, int64_t group_id, const char *model, tg_pool_t *out) {
    memset(out, 0, sizeof(*out));
    const group_t *g = group_of(s, group_id);
    if (!g)
        return 0;
    out->acc[0] = g->any;
    out->n[0] = g->nany;
    int lo = 0, hi = g->nmodels;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(g->models[mid].model, model);
        if (c == 0) {
            out->acc[1] = g->models[mid].acc;
            out->n[1] = g->models[mid].n;
            break;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 1;
}

const tg_account_t *tg_snapshot_member(const tg_snapshot_t *s, int64_t group_id, int64_t account_id) {
    const group_t *g = group_of(s, group_id);
    int lo = 0, hi = g ? g->n : 0;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (g->by_id[mid]->id < account_id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return g && lo < g->n && g->by_id[lo]->id == account_id ? g->by_id[lo] : NULL;
}

int tg_snapshot_members(const tg_snapshot_t *s, int64_t group_id, const tg_account_t *const **out) {
    const group_t *g = group_of(s, group_id);
    *out = g ? g->by_id : NULL;
    return g ? g->n : 0;
}

int tg_account_serves(const tg_account_t *acc, const char *model) {
    if (acc->nmodels == 0 || (json_is_object(acc->model_map) && json_object_get(acc->model_map, model)))
        return 1;
    for (int k = 0; k < acc->nmodels; k++)
        if (!strcmp(acc->models[k], model))
            return 1;
    return 0;
}

static int account_id_cmp(const void *x, const void *y) {
    const tg_account_t *a = x, *b = y;
    return a->id < b->id ? -1 : a->id > b->id;
}

tg_snapshot_t *tg_snapshot_build(const tg_account_t *accounts, size_t n, const tg_membership_t *m, size_t nm) {
    tg_snapshot_t *s = calloc(1, sizeof(*s));
    s->refs = 1;
    s->generation = 1;
    s->accounts = calloc(n + 1, sizeof(tg_account_t));
    for (size_t i = 0; i < n; i++) {
        tg_account_t *acc = &s->accounts[i];
        *acc = accounts[i];
        acc->name = strdup(accounts[i].name ? accounts[i].name : "");
        acc->provider = strdup(accounts[i].provider ? accounts[i].provider : "openai");
        acc->credential = accounts[i].credential ? strdup(accounts[i].credential) : NULL;
        acc->auth_error = accounts[i].auth_error ? strdup(accounts[i].auth_error) : NULL;
        acc->models = calloc((size_t)acc->nmodels + 1, sizeof(char *));
        for (int k = 0; k < acc->nmodels; k++)
            acc->models[k] = strdup(accounts[i].models[k]);
        json_incref(acc->model_map);
        json_incref(acc->settings);
    }
    s->naccounts = n;
    qsort(s->accounts, n, sizeof(tg_account_t), account_id_cmp);
    tg_membership_t *copy = malloc((nm + 1) * sizeof(*copy));
    if (nm)
        memcpy(copy, m, nm * sizeof(*copy));
    snapshot_index(s, copy, nm);
    free(copy);
    return s;
}
