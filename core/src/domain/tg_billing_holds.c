/*
 * Holds in Redis (see tg_billing.h): a request's reservation taken against the tenant's
 * live balance and the key's budget (reserve.lua, or the admission's admit.lua with the
 * same money.lua: tg_billing_admission_money), the live balances loaded from Postgres
 * when Redis has none, holds given back (settle.lua, resent by the Redis client when its
 * answer is lost), and top-ups. Each hold's durable row goes to Postgres through the
 * settlement batcher (tg_billing_settle.c).
 */
#include "tg_billing_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_pg.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_scripts.h"

/* The Redis scripts are Lua files in core/redis/ (tg_scripts.h): reserve.lua (with money.lua,
 * which the admission's admit.lua takes the first attempt's reservation with), settle.lua,
 * debit.lua, topup.lua, lock.lua and unlock.lua; their header comments say what each key
 * and argument is. */

/* The live balance loaded into Redis: Postgres's, minus the reservations still open that
 * hold money in Redis (not those made without a hold: those never held any there). */
static const char INIT_SQL[] =
    "SELECT ((t.balance - coalesce((SELECT sum(r.amount) FROM reservations r WHERE r.tenant_id = t.id AND "
    "r.state IN ('reserved', 'pending_reconciliation') AND r.note IS DISTINCT FROM 'unheld'), 0)) * 1000000000)::bigint, "
    "coalesce(((k.budget - k.spend - coalesce((SELECT sum(r.amount) FROM reservations r WHERE r.api_key_id = k.id "
    "AND r.state IN ('reserved', 'pending_reconciliation') AND r.note IS DISTINCT FROM 'unheld'), 0)) * "
    "1000000000)::bigint, -1) "
    /* The periodic budgets' spend in their periods ($3 budget ids, $4 period starts):
     * what Postgres recorded, plus the open holds of their keys taken since the period
     * began (only a Redis that lost its keys mid-period needs them; counting a hold of
     * the period before is the safe side). Space-separated, in $3's order. */
    ", (SELECT coalesce(string_agg(((coalesce(bp.spend, 0) + coalesce(h.held, 0)) * 1000000000)::bigint::text, ' ' "
    "ORDER BY q.ord), '') FROM unnest($3::bigint[], $4::bigint[]) WITH ORDINALITY AS q(bid, ps, ord) "
    "LEFT JOIN budget_periods bp ON bp.budget_id = q.bid AND bp.period_start = to_timestamp(q.ps) "
    "LEFT JOIN LATERAL (SELECT sum(r.amount) AS held FROM budgets b JOIN api_keys kk ON kk.tenant_id = b.tenant_id "
    "AND (kk.id = b.api_key_id OR kk.user_id = b.user_id OR (b.api_key_id IS NULL AND b.user_id IS NULL)) "
    "JOIN reservations r ON r.api_key_id = kk.id AND r.state IN ('reserved', 'pending_reconciliation') "
    "AND r.note IS DISTINCT FROM 'unheld' AND r.created_at >= to_timestamp(q.ps) WHERE b.id = q.bid) h ON true) "
    /* The same open held reservations of the tenant, for restore.lua to put their holds
     * back (a Redis that lost its data lost them): per hold, its request id, attempt,
     * amount (nano-USD), key, instance, start (ms) and model, fields split by \x1f and
     * holds by \x1e (neither is in an id, an instance name or, stripped, a model). The
     * newest RESTORE_MAX: a tenant with more in flight keeps the rest subtracted, as
     * before (low, never above Postgres). */
    ", (SELECT coalesce(string_agg(concat_ws(E'\\x1f', r.request_id, r.attempt, (r.amount * 1000000000)::bigint, "
    "r.api_key_id, coalesce(r.instance, ''), (extract(epoch FROM r.created_at) * 1000)::bigint, "
    "translate(left(coalesce(r.model, ''), 120), E'\\x1e\\x1f', '')), E'\\x1e'), '') FROM (SELECT * FROM reservations r "
    "WHERE r.tenant_id = t.id AND r.state IN ('reserved', 'pending_reconciliation') AND r.note IS DISTINCT FROM "
    "'unheld' ORDER BY r.created_at DESC LIMIT 20000) r) "
    "FROM tenants t JOIN api_keys k ON k.tenant_id = t.id WHERE t.id = $1::bigint AND k.id = $2::bigint";

struct tg_reserve_s {
    tg_billing_t *b;
    tg_reserve_req_t r;
    char request_id[72];
    char model[128];
    tg_reserve_cb cb;
    void *ud;
    int detached;
    tg_balance_cb load_cb; /* tg_billing_load: only the live balance is wanted */
    int inits;
    char tenant_init[32], key_init[32];
    char keys[4][128];
    char field[96];
    char hold[256];
    tg_budget_use_t budgets[TG_BUDGETS_MAX];
    char budget_init[TG_BUDGETS_MAX * 24]; /* tg_billing_load's third answer */
};



static void reserve_send(tg_reserve_t *x);
static void reserved_row(tg_billing_t *b, const tg_reserve_req_t *r, int unheld);

static void reserve_finish(tg_reserve_t *x, int status, const char *code, const char *msg) {
    if (!x->detached)
        x->cb(x->ud, status, code, msg);
    free(x);
}

static void loaded(tg_reserve_t *x);

static void restored(void *ud, redisReply *r, const char *err) {
    tg_reserve_t *x = ud;
    if (err || !r || r->type != REDIS_REPLY_INTEGER)
        tg_log_warn("billing: putting back the holds of tenant %lld failed (%s); their settlements give nothing "
                    "back, so its live balance stays below Postgres' by what they held above their cost",
                    (long long)x->r.tenant_id, err ? err : r && r->type == REDIS_REPLY_ERROR ? r->str : "no answer");
    else if (r->integer > 0)
        tg_log_info("billing: tenant %lld's live balance loaded from Postgres with %lld hold(s) of requests in "
                    "flight put back (Redis had lost them)",
                    (long long)x->r.tenant_id, (long long)r->integer);
    loaded(x);
}

/* The tenant's open held reservations as INIT_SQL lists them, put back into Redis with
 * the balance by restore.lua (one call, before the reservation or admission that asked
 * for the balance goes on). Returns 1 when restored() will go on, 0 when there is
 * nothing to put back (or no Redis). */
static int restore_holds(tg_reserve_t *x, const char *list) {
    tg_redis_t *redis = tg_state_redis(x->b->st);
    if (!redis || !list || !*list || x->b->restore_script < 0)
        return 0;
    size_t n = 1;
    for (const char *p = list; *p; p++)
        n += *p == '\x1e';
    /* Per hold: its reservation key, its field, amount and index value (sizes of
     * tg__billing_hold_keys and reserve()'s value). */
    typedef struct {
        char keys[4][128];
        char field[96];
        char amount[24];
        char value[256];
    } one_t;
    one_t *h = malloc(n * sizeof(*h));
    const char **argv = malloc((2 * n + 4 + 3 * n) * sizeof(*argv));
    char *copy = strdup(list);
    if (!h || !argv || !copy)
        abort();
    size_t m = 0;
    for (char *rec = copy, *next; rec && m < n; rec = next) {
        next = strchr(rec, '\x1e');
        if (next)
            *next++ = '\0';
        char *f[7] = {0};
        int nf = 0;
        for (char *q = rec; q && nf < 7; nf++) {
            f[nf] = q;
            q = strchr(q, '\x1f');
            if (q)
                *q++ = '\0';
        }
        if (nf < 7 || !*f[0])
            continue;
        int attempt = atoi(f[1]);
        int64_t key = strtoll(f[3], NULL, 10);
        tg__billing_hold_keys(h[m].keys, h[m].field, x->r.tenant_id, key, f[0], attempt);
        snprintf(h[m].amount, sizeof(h[m].amount), "%s", f[2]);
        snprintf(h[m].value, sizeof(h[m].value), "%lld|%s|%s|%s|%.120s", (long long)key, f[4], f[5], f[2], f[6]);
        m++;
    }
    int ok = 0;
    if (m > 0) {
        int argc = 0;
        argv[argc++] = h[0].keys[0]; /* {t:T}:money */
        argv[argc++] = h[0].keys[3]; /* {t:T}:holds */
        for (size_t i = 0; i < m; i++)
            argv[argc++] = h[i].keys[1];
        int nkeys = argc;
        argv[argc++] = x->tenant_init;
        for (size_t i = 0; i < m; i++) {
            argv[argc++] = h[i].field;
            argv[argc++] = h[i].amount;
            argv[argc++] = h[i].value;
        }
        /* The arguments are copied into the request's buffer when it is sent. */
        ok = tg_redis_eval(redis, x->b->restore_script, nkeys, argc, argv, NULL, restored, x) != NULL;
    }
    free(copy);
    free(argv);
    free(h);
    return ok;
}

static void init_loaded(void *ud, const PGresult *res, const char *err) {
    tg_reserve_t *x = ud;
    if (err || PQntuples(res) != 1) {
        if (x->load_cb) {
            if (!x->detached)
                x->load_cb(x->ud, 503, "billing_unavailable", "the balance could not be loaded; try again", NULL, NULL,
                          NULL);
            free(x);
            return;
        }
        reserve_finish(x, 503, "billing_unavailable", "the balance could not be loaded; try again");
        return;
    }
    snprintf(x->tenant_init, sizeof(x->tenant_init), "%s", PQgetvalue(res, 0, 0));
    snprintf(x->key_init, sizeof(x->key_init), "%s", PQgetvalue(res, 0, 1));
    snprintf(x->budget_init, sizeof(x->budget_init), "%s", PQgetvalue(res, 0, 2));
    if (restore_holds(x, PQgetvalue(res, 0, 3)))
        return; /* restored() goes on */
    loaded(x);
}

static void loaded(tg_reserve_t *x) {
    if (x->load_cb) {
        if (!x->detached)
            x->load_cb(x->ud, 0, NULL, NULL, x->tenant_init, x->key_init, x->budget_init);
        free(x);
        return;
    }
    tg_billing_budget_inits(x->budgets, x->r.nbudgets, x->budget_init);
    reserve_send(x);
}

/* The live balance's load, for a reservation or for an admission that asked for it. */
static void load_balance(tg_reserve_t *x) {
    char t[24], k[24], ids[TG_BUDGETS_MAX * 24 + 4] = "{", starts[TG_BUDGETS_MAX * 24 + 4] = "{";
    snprintf(t, sizeof(t), "%lld", (long long)x->r.tenant_id);
    snprintf(k, sizeof(k), "%lld", (long long)x->r.key_id);
    for (int i = 0; i < x->r.nbudgets; i++) {
        snprintf(ids + strlen(ids), sizeof(ids) - strlen(ids), "%s%lld", i ? "," : "", (long long)x->budgets[i].id);
        snprintf(starts + strlen(starts), sizeof(starts) - strlen(starts), "%s%lld", i ? "," : "",
                 (long long)x->budgets[i].start);
    }
    strcat(ids, "}");
    strcat(starts, "}");
    const char *params[4] = {t, k, ids, starts};
    tg_pg_query(tg_state_pg(x->b->st), INIT_SQL, 4, params, init_loaded, x);
}

void tg_billing_budget_inits(tg_budget_use_t *u, int n, const char *spend) {
    const char *p = spend ? spend : "";
    for (int i = 0; i < n; i++) {
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, " ");
        snprintf(u[i].init, sizeof(u[i].init), "%.*s", (int)TG_MIN(len, sizeof(u[i].init) - 1), p);
        p += len;
    }
}

/* The periodic budgets' keys and money.lua's bspec: per budget "<limit> <expire at>
 * <spend to load or '-'> ". A period's key lives a week past its period's end, longer
 * than any hold taken in it (7 days), so a late settlement still finds it. */
static void budget_args(int64_t tenant, const tg_budget_use_t *u, int n, char keys[][96], char *spec, size_t len) {
    spec[0] = '\0';
    for (int i = 0; i < n; i++) {
        snprintf(keys[i], 96, "{t:%lld}:bud:%lld:%lld", (long long)tenant, (long long)u[i].id, (long long)u[i].start);
        size_t at = strlen(spec);
        snprintf(spec + at, len - at, "%lld %lld %s ", (long long)u[i].limit, (long long)(u[i].end + 8 * 86400),
                 u[i].init[0] ? u[i].init : "-");
    }
}

/* The reservation's durable Postgres row goes with the next settlement batch, in order,
 * or to the local spool when Postgres is unreachable: no request waits on Postgres. */
static void reserved_row(tg_billing_t *b, const tg_reserve_req_t *r, int unheld) {
    /* Written as text (one per request: no jansson tree), read by tg_settle_batch. */
    char amount[32];
    tg_money_format(r->amount, amount);
    tg_buf_t j;
    tg_buf_init(&j);
    tg_buf_reserve(&j, 256);
    tg_buf_appends(&j, "{\"op\":\"reserve\",\"request_id\":\"");
    tg_buf_append_json_escaped(&j, r->request_id, strlen(r->request_id));
    tg_buf_appends(&j, "\",\"attempt\":");
    tg__buf_i64(&j, r->attempt);
    tg_buf_appends(&j, ",\"tenant_id\":");
    tg__buf_i64(&j, r->tenant_id);
    tg_buf_appends(&j, ",\"api_key_id\":");
    tg__buf_i64(&j, r->key_id);
    tg_buf_appends(&j, ",\"amount\":\"");
    tg_buf_appends(&j, amount);
    tg_buf_appends(&j, "\",\"model\":\"");
    if (r->model)
        tg_buf_append_json_escaped(&j, r->model, strlen(r->model));
    tg_buf_appends(&j, "\",\"instance\":\"");
    tg_buf_appends(&j, tg__billing_instance);
    /* "unheld": no hold in Redis (INIT_SQL) */
    tg_buf_appends(&j, unheld ? "\",\"note\":\"unheld\"}" : "\"}");
    tg__elem_t e;
    tg__elem_init(&e, &j, r->request_id, TG__OP_RESERVE);
    e.tenant_id = r->tenant_id;
    e.key_id = r->key_id;
    e.mergeable = !unheld && r->attempt == 1;
    e.amount = r->amount;
    tg__billing_enqueue(b, &e);
}

static void redis_reserved(void *ud, redisReply *r, const char *err) {
    tg_reserve_t *x = ud;
    tg_billing_t *b = x->b;
    if (err || !r || r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
        /* The script may have run even though its reply did not come (a timeout): give
         * back whatever it held. Sent on the same connection, so Redis runs it after the
         * script; when the script did not run it finds nothing to return. */
        if (tg_state_redis(b->st))
            tg__billing_hold_return(b, x->r.tenant_id, x->r.key_id, x->r.request_id, x->r.attempt, 0);
        if (!x->detached && x->r.money_open && x->r.money_open(x->ud)) {
            /* Money fails open: no hold, but the reservation row goes to Postgres as
             * usual (a fresh Redis loads the balance minus it) and the request settles
             * as usual; the settlement finds no hold to give back. */
            b->stats.unheld++;
            reserved_row(b, &x->r, 1);
            reserve_finish(x, 0, "unheld", NULL);
            return;
        }
        reserve_finish(x, 503, "billing_unavailable",
                       "the balance could not be checked (the limiter store is unavailable); try again");
        return;
    }
    long long ok = r->element[0]->integer;
    const char *what = r->element[1]->str ? r->element[1]->str : "";
    if (ok == -1) {
        if (x->inits++ > 2) {
            reserve_finish(x, 503, "billing_unavailable", "the balance could not be initialised");
            return;
        }
        load_balance(x);
        return;
    }
    if (ok == 0 && !strncmp(what, "budget ", 7)) {
        /* A periodic budget: the caller names it (its index in r->budgets, 0-based). */
        char which[24];
        snprintf(which, sizeof(which), "budget %d", atoi(what + 7) - 1);
        tg_billing_refused_budget(b);
        reserve_finish(x, 402, "budget_exceeded", which);
        return;
    }
    if (ok == 0) {
        const char *code, *msg;
        tg_billing_refused(b, !strcmp(what, "key budget"), &code, &msg);
        reserve_finish(x, 402, code, msg);
        return;
    }
    if (x->detached) {
        /* The client left while we reserved: the upstream is never called, so the hold
         * goes straight back and nothing is recorded. */
        tg__billing_hold_return(b, x->r.tenant_id, x->r.key_id, x->r.request_id, x->r.attempt, 0);
        reserve_finish(x, 0, NULL, NULL);
        return;
    }
    /* The hold is in Redis (atomic, before the upstream call). */
    reserved_row(b, &x->r, 0);
    b->stats.reserved++;
    reserve_finish(x, 0, NULL, NULL);
}

static void unsent_cb(uv_timer_t *t) {
    tg_reserve_t *x = t->data;
    uv_close((uv_handle_t *)t, (uv_close_cb)free);
    redis_reserved(x, NULL, "the Redis client is closing");
}

static void reserve_send(tg_reserve_t *x) {
    tg_redis_t *redis = tg_state_redis(x->b->st);
    char amt[24], bkeys[TG_BUDGETS_MAX][96], bspec[TG_BUDGETS_MAX * 72];
    snprintf(amt, sizeof(amt), "%lld", (long long)x->r.amount);
    int nb = x->r.nbudgets;
    budget_args(x->r.tenant_id, x->budgets, nb, bkeys, bspec, sizeof(bspec));
    const char *argv[4 + TG_BUDGETS_MAX + 6] = {x->keys[0], x->keys[1], x->keys[2], x->keys[3]};
    for (int i = 0; i < nb; i++)
        argv[4 + i] = bkeys[i];
    const char *args[6] = {amt, x->tenant_init, x->key_init, x->field, x->hold, bspec};
    for (int i = 0; i < (nb ? 6 : 5); i++)
        argv[4 + nb + i] = args[i];
    if (!tg_redis_eval(redis, x->b->reserve_script, 4 + nb, 4 + nb + (nb ? 6 : 5), argv, NULL, redis_reserved, x)) {
        /* No callback will come (the client is closing): a failed round trip, on the
         * next loop turn (this may run inside tg_billing_reserve). */
        uv_timer_t *t = malloc(sizeof(*t));
        uv_timer_init(x->b->loop, t);
        t->data = x;
        uv_timer_start(t, unsent_cb, 0, 0);
    }
}

/* The keys of one attempt's hold (all under the tenant's hash tag) and its field in
 * {t:T}:holds, the index the reconciler scans for holds whose gateway died before
 * Postgres had their row. */
/* Appends s (cut to fit the 128-byte key) at *n. */
static void kput(char *k, size_t *n, const char *s, size_t len) {
    len = TG_MIN(len, 127 - *n);
    memcpy(k + *n, s, len);
    *n += len;
}

static void kput_i64(char *k, size_t *n, int64_t v) {
    char d[24];
    kput(k, n, d, tg__fmt_i64(d, v));
}

void tg__billing_hold_keys(char keys[4][128], char field[96], int64_t tenant, int64_t key, const char *id, int attempt) {
    /* Twice per billed request: formatted by hand (snprintf cost ~1,000 instructions each). */
    char tag[32];
    size_t t = 0;
    kput(tag, &t, "{t:", 3);
    kput_i64(tag, &t, tenant);
    kput(tag, &t, "}:", 2);
    size_t idl = strlen(id), n;
    n = 0, kput(keys[0], &n, tag, t), kput(keys[0], &n, "money", 5), keys[0][n] = '\0';
    n = 0, kput(keys[1], &n, tag, t), kput(keys[1], &n, "res:", 4), kput(keys[1], &n, id, idl), kput(keys[1], &n, ":", 1);
    kput_i64(keys[1], &n, attempt), keys[1][n] = '\0';
    n = 0, kput(keys[2], &n, tag, t), kput(keys[2], &n, "kmoney:", 7), kput_i64(keys[2], &n, key), keys[2][n] = '\0';
    n = 0, kput(keys[3], &n, tag, t), kput(keys[3], &n, "holds", 5), keys[3][n] = '\0';
    /* field: "<id>:<attempt>" in 96 bytes */
    char f[128];
    n = 0, kput(f, &n, id, idl), kput(f, &n, ":", 1), kput_i64(f, &n, attempt);
    n = TG_MIN(n, (size_t)95); /* as snprintf(field, 96, "%s:%d") cut it */
    memcpy(field, f, n);
    field[n] = '\0';
}

/* The last answer of holds given back: the Redis client sent it again while its answer
 * was lost (while this gateway lives nobody else returns its holds: the reconciler only
 * returns a dead gateway's, so a lost one would keep the tenant's money reserved). */
typedef struct {
    tg_billing_t *b;
    int n;
    char field[96]; /* the first hold's */
} settle_send_t;

static void settle_done(void *ud, redisReply *r, const char *err) {
    settle_send_t *s = ud;
    TG_UNUSED(r);
    if (err)
        tg_log_warn("billing: returning %d hold(s) (%s%s) failed (%s); the reconciler returns them once this "
                    "gateway is gone",
                    s->n, s->field, s->n > 1 ? ", ..." : "", err);
    s->b->returning--;
    free(s);
}

/* Gives back n holds of one tenant in one settle.lua call: `actual` of each is spent,
 * the rest returns to the balances. settle.lua is idempotent (it deletes the
 * reservation keys and gives nothing back the second time), so it goes through
 * tg_redis_eval_idempotent. */
static void settle_many(tg_billing_t *b, int64_t tenant, const tg__hold_t *h, int n) {
    tg_redis_t *redis = tg_state_redis(b->st);
    if (!redis || n <= 0)
        return;
    int nkeys = 2 + 2 * n, argc = nkeys + 2 * n;
    /* One block: the argument pointers, then the strings (settle.lua's layout). */
    size_t per = 3 * 128 + 24 + 96;
    char *mem = malloc((size_t)argc * sizeof(char *) + (size_t)n * per + 2 * 128);
    if (!mem)
        abort();
    const char **argv = (const char **)mem;
    char *str = mem + (size_t)argc * sizeof(char *);
    char keys[4][128], field[96];
    for (int i = 0; i < n; i++) {
        tg__billing_hold_keys(keys, field, tenant, h[i].key_id, h[i].request_id, h[i].attempt);
        if (i == 0) {
            memcpy(str, keys[0], 128); /* {t:T}:money */
            memcpy(str + 128, keys[3], 128); /* {t:T}:holds */
            argv[0] = str;
            argv[1] = str + 128;
            str += 2 * 128;
        }
        char *res = str, *km = str + 128, *amt = str + 256, *fld = str + 256 + 24;
        memcpy(res, keys[1], 128);
        memcpy(km, keys[2], 128);
        if (h[i].keep)
            amt[0] = 'k';
        tg_fmt_i64z(amt + (h[i].keep != 0), h[i].actual);
        memcpy(fld, field, 96);
        argv[2 + 2 * i] = res;
        argv[3 + 2 * i] = km;
        argv[nkeys + 2 * i] = amt;
        argv[nkeys + 2 * i + 1] = fld;
        str += per;
    }
    settle_send_t *s = calloc(1, sizeof(*s));
    if (!s)
        abort();
    s->b = b;
    s->n = n;
    tg_copy(s->field, sizeof(s->field), argv[nkeys + 1]);
    if (tg_redis_eval_idempotent(redis, b->settle_script, nkeys, argc, argv, NULL, settle_done, s) != TG_OK)
        free(s);
    else
        b->returning++;
    free(mem);
}

/* Returns an attempt's hold (the part above `actual` goes back), exactly once. */
void tg__billing_hold_return(tg_billing_t *b, int64_t tenant, int64_t key, const char *id, int attempt, int64_t actual) {
    tg__hold_t h = {.request_id = id, .key_id = key, .attempt = attempt, .actual = actual};
    settle_many(b, tenant, &h, 1);
}

static int hold_by_tenant(const void *x, const void *y) {
    const tg__hold_t *a = x, *c = y;
    return a->tenant_id < c->tenant_id ? -1 : a->tenant_id > c->tenant_id;
}

void tg__billing_holds_return(tg_billing_t *b, tg__hold_t *h, size_t n) {
    /* One call per tenant (its keys share its hash tag), at most HOLDS_PER_CALL holds a
     * call so that no single script holds Redis long. */
    enum { HOLDS_PER_CALL = 128 };
    qsort(h, n, sizeof(*h), hold_by_tenant);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && j - i < HOLDS_PER_CALL && h[j].tenant_id == h[i].tenant_id)
            j++;
        settle_many(b, h[i].tenant_id, h + i, (int)(j - i));
        i = j;
    }
}

static void fail_async_cb(uv_timer_t *t) {
    tg_reserve_t *x = t->data;
    uv_close((uv_handle_t *)t, (uv_close_cb)free);
    if (x->load_cb) {
        if (!x->detached)
            x->load_cb(x->ud, 503, "billing_unavailable", "billing needs Postgres and Redis", NULL, NULL, NULL);
        free(x);
        return;
    }
    reserve_finish(x, 503, "billing_unavailable", "billing needs Postgres and Redis");
}

tg_reserve_t *tg_billing_reserve(tg_billing_t *b, const tg_reserve_req_t *r, tg_reserve_cb cb, void *ud) {
    tg_reserve_t *x = calloc(1, sizeof(*x));
    x->b = b;
    x->r = *r;
    snprintf(x->request_id, sizeof(x->request_id), "%s", r->request_id);
    snprintf(x->model, sizeof(x->model), "%s", r->model ? r->model : "");
    x->r.request_id = x->request_id;
    x->r.model = x->model;
    x->cb = cb;
    x->ud = ud;
    x->r.nbudgets = TG_MIN(TG_MAX(r->nbudgets, 0), TG_BUDGETS_MAX);
    for (int i = 0; i < x->r.nbudgets; i++)
        x->budgets[i] = r->budgets[i];
    x->r.budgets = x->budgets;
    /* A key without a budget needs no live key balance: "-1" tells the script so, and no
     * request of such a key ever waits on Postgres. */
    snprintf(x->key_init, sizeof(x->key_init), "%s", r->key_budget ? "" : "-1");
    tg__billing_hold_keys(x->keys, x->field, r->tenant_id, r->key_id, x->request_id, r->attempt);
    snprintf(x->hold, sizeof(x->hold), "%lld|%s|%llu|%lld|%.120s", (long long)r->key_id, tg__billing_instance,
             (unsigned long long)tg_wall_ms(), (long long)r->amount, x->model);
    if (!tg_state_redis(b->st) || !tg_state_pg(b->st)) {
        uv_timer_t *t = malloc(sizeof(*t));
        uv_timer_init(b->loop, t);
        t->data = x;
        uv_timer_start(t, fail_async_cb, 0, 0);
        return x;
    }
    reserve_send(x);
    return x;
}

void tg_reserve_detach(tg_reserve_t *r) {
    if (r)
        r->detached = 1;
}

void tg_billing_refused_budget(tg_billing_t *b) {
    b->stats.refused++;
    b->stats.refused_budget++;
}

void tg_billing_refused(tg_billing_t *b, int key_budget, const char **code, const char **msg) {
    b->stats.refused++;
    if (key_budget) {
        *code = "budget_exceeded";
        *msg = "this API key's budget cannot cover the request's maximum cost";
    } else {
        *code = "insufficient_balance";
        *msg = "the balance cannot cover the request's maximum cost";
    }
}

static void admission_undo(void *ud, const char *request_id, int64_t tenant_id, int64_t key_id) {
    tg_billing_release_attempt(ud, request_id, tenant_id, key_id, 1);
}

void tg_billing_admission_money(tg_billing_t *b, const tg_reserve_req_t *r, const char *tenant_init,
                                const char *key_init, tg_limit_money_t *m) {
    char keys[4][128], field[96];
    tg__billing_hold_keys(keys, field, r->tenant_id, r->key_id, r->request_id, 1);
    /* admit.lua's order: money, reservation, holds, then the key's budget if any. */
    memcpy(m->keys[0], keys[0], sizeof(m->keys[0]));
    memcpy(m->keys[1], keys[1], sizeof(m->keys[1]));
    memcpy(m->keys[2], keys[3], sizeof(m->keys[2]));
    memcpy(m->keys[3], keys[2], sizeof(m->keys[3]));
    /* "-1" loaded: the key has no budget after all (tg_billing_reserve skips it too). */
    m->nkeys = r->key_budget && !(key_init && !strcmp(key_init, "-1")) ? 4 : 3;
    size_t n = 0;
    kput_i64(m->amount, &n, r->amount); /* (the amount's buffer is smaller than 128: 20 digits fit) */
    m->amount[n] = '\0';
    tg_copy(m->tenant_init, sizeof(m->tenant_init), tenant_init ? tenant_init : "");
    tg_copy(m->key_init, sizeof(m->key_init), key_init ? key_init : "");
    /* "<key>|<instance>|<ms>|<amount>|<model, at most 120 bytes>" */
    _Static_assert(sizeof(m->hold) >= 24 + 40 + 24 + 24 + 120 + 1, "hold");
    char *h = m->hold;
    const char *model = r->model ? r->model : "";
    n = 0;
    kput_i64(h, &n, r->key_id), h[n++] = '|';
    memcpy(h + n, tg__billing_instance, strlen(tg__billing_instance)), n += strlen(tg__billing_instance), h[n++] = '|';
    n += tg_fmt_u64(h + n, tg_wall_ms()), h[n++] = '|';
    kput_i64(h, &n, r->amount), h[n++] = '|';
    size_t ml = TG_MIN(strlen(model), (size_t)120);
    memcpy(h + n, model, ml), n += ml, h[n] = '\0';
    m->undo = admission_undo;
    m->undo_ud = b;
    /* Periodic budgets: the key's budget slot and key_init ("-1": none) always go with
     * them, so admit.lua tells the layouts apart by the number of arguments. */
    m->nbudgets = TG_MIN(TG_MAX(r->nbudgets, 0), TG_BUDGETS_MAX);
    if (m->nbudgets) {
        if (m->nkeys == 3)
            snprintf(m->key_init, sizeof(m->key_init), "-1");
        memcpy(m->keys[3], keys[2], sizeof(m->keys[3]));
        m->nkeys = 4;
        budget_args(r->tenant_id, r->budgets, m->nbudgets, m->bkeys, m->bspec, sizeof(m->bspec));
    }
}

void tg_billing_admitted(tg_billing_t *b, const tg_reserve_req_t *r) {
    reserved_row(b, r, 0);
    b->stats.reserved++;
}

tg_reserve_t *tg_billing_load(tg_billing_t *b, const tg_reserve_req_t *r, tg_balance_cb cb, void *ud) {
    tg_reserve_t *x = calloc(1, sizeof(*x));
    x->b = b;
    x->r = *r;
    x->r.nbudgets = TG_MIN(TG_MAX(r->nbudgets, 0), TG_BUDGETS_MAX);
    for (int i = 0; i < x->r.nbudgets; i++)
        x->budgets[i] = r->budgets[i];
    x->r.budgets = x->budgets;
    x->r.request_id = x->request_id;
    x->r.model = x->model;
    x->load_cb = cb;
    x->ud = ud;
    if (!tg_state_pg(b->st)) {
        uv_timer_t *t = malloc(sizeof(*t));
        uv_timer_init(b->loop, t);
        t->data = x;
        uv_timer_start(t, fail_async_cb, 0, 0);
        return x;
    }
    load_balance(x);
    return x;
}

void tg_billing_topup(tg_state_t *st, int64_t tenant_id, int64_t nano) {
    tg_redis_t *redis = tg_state_redis(st);
    if (!redis)
        return;
    char key[64], amt[24];
    snprintf(key, sizeof(key), "{t:%lld}:money", (long long)tenant_id);
    snprintf(amt, sizeof(amt), "%lld", (long long)nano);
    /* Only a balance already live in Redis is adjusted; otherwise it loads from Postgres. */
    const char *argv[6] = {"EVAL", tg_scripts_source("topup"), "1", key, amt, NULL};
    tg_redis_command(redis, NULL, NULL, 5, argv, NULL);
}


void tg__billing_release_attempts(tg_billing_t *b, const tg_settlement_t *s, int64_t cost_last) {
    int last = TG_MAX(s->attempts, 1);
    tg__hold_t one[4], *h = last <= 4 ? one : malloc((size_t)last * sizeof(*h));
    if (!h)
        abort();
    size_t n = tg__billing_attempt_holds(s, cost_last, h);
    tg__billing_holds_return(b, h, n);
    if (h != one)
        free(h);
}

size_t tg__billing_attempt_holds(const tg_settlement_t *s, int64_t cost_last, tg__hold_t *out) {
    /* Failed earlier attempts produced nothing billable; the last one carries the cost,
     * unless it went ahead without a hold (money open): then its cost comes off the live
     * balance after the commit (debit_unheld), and a hold an admission took before its
     * answer was lost goes back whole, so the cost is not taken twice. */
    int last = TG_MAX(s->attempts, 1);
    for (int a = 1; a <= last; a++) {
        int unheld = a <= 32 && (s->unheld & (1u << (a - 1)));
        out[a - 1] = (tg__hold_t){.request_id = s->request_id,
                                  .tenant_id = s->tenant_id,
                                  .key_id = s->key_id,
                                  .attempt = a,
                                  .actual = a == last && !unheld ? cost_last : 0};
    }
    return (size_t)last;
}

void tg_billing_release_attempt(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id,
                                int attempt) {
    tg__billing_hold_return(b, tenant_id, key_id, request_id, attempt, 0);
}

/* Its reservation stays, at zero, until the request settles: Postgres learns of the
 * failure only from that settlement. A gateway that dies first leaves the attempt's row
 * `reserved`, and the reconciler then charges its bound — in Redis too, on the
 * reservation kept. Given back whole, the bound would be charged in Postgres only, and
 * the live balance would stay above Postgres' for ever. */
void tg_billing_release_failed(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id,
                               int attempt) {
    tg__hold_t h = {.request_id = request_id, .key_id = key_id, .attempt = attempt, .actual = 0, .keep = 1};
    settle_many(b, tenant_id, &h, 1);
}
