/*
 * Two-phase metering (see tg_billing.h): reservations in Redis and Postgres, batched
 * idempotent settlement, the local spool, and the reconciler.
 */
#include "tollgate/tg_billing.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <pthread.h>
#include <unistd.h>

#include "tollgate/tg_crypto.h"
#include "tollgate/tg_pg.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_scripts.h"

/* Elements per transaction (a request gives two: its reservation and its settlement).
 * tg_settle_batch is set-based, so a bigger batch costs less per element; 400 keeps one
 * transaction around 30 ms on this class of machine. */
#define BATCH_MAX 400
/* Batches of one worker in flight at once (each on its own pool connection). Order
 * between batches does not matter to tg_settle_batch, so they may overlap. */
#define LIVE_INFLIGHT 2
#define QUEUE_MAX_DEFAULT 20000

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
    "FROM tenants t JOIN api_keys k ON k.tenant_id = t.id WHERE t.id = $1::bigint AND k.id = $2::bigint";


/* This process's identity for reservations and the reconciler lock (made once). */
static char instance_id[40];
static pthread_once_t instance_once = PTHREAD_ONCE_INIT;
static void make_instance_id(void) { tg_random_id(instance_id); }

#define ALIVE_KEY "tollgate:alive"
#define ALIVE_TTL_MS 15000

typedef struct pending_s {
    json_t *obj;
    struct pending_s *next;
} pending_t;

struct tg_billing_s {
    uv_loop_t *loop;
    tg_state_t *st;
    tg_billing_config_t cfg;
    char *spool_dir;
    char spool_path[512];
    int reserve_script, settle_script;
    json_t *queue;          /* settlements waiting for the next batch */
    size_t queue_max;       /* beyond this the queue spills to the spool (bounded memory) */
    int live_inflight;      /* batches of the queue at Postgres */
    int replay_inflight;    /* a spooled batch at Postgres (one at a time) */
    long replay_offset;     /* where the replay file's next batch starts */
    uv_timer_t flush_timer;
    uv_timer_t spool_timer;
    uv_timer_t reconcile_timer;
    int replaying;
    int closing; /* timers still closing */
    uint64_t pg_down_until; /* after a failed batch: straight to the spool until then */
    int leader;             /* this worker holds the reconciler lock */
    int stopping;           /* draining for shutdown: no new reconciler pass */
    int lock_released;      /* the lock's release was answered (or failed) */
    int scanning;           /* a scan of {t:*}:holds is under way */
    int returning;          /* holds being given back whose last answer is awaited */
    tg_billing_stats_t stats;
};

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
};

static void settle_send(tg_billing_t *b, char keys[4][128], const char *field, int64_t actual);

/* ---- reservation ---------------------------------------------------------------------- */

static void reserve_send(tg_reserve_t *x);
static void enqueue(tg_billing_t *b, json_t *item);
static void reserved_row(tg_billing_t *b, const tg_reserve_req_t *r, int unheld);

static void reserve_finish(tg_reserve_t *x, int status, const char *code, const char *msg) {
    if (!x->detached)
        x->cb(x->ud, status, code, msg);
    free(x);
}

static void init_loaded(void *ud, const PGresult *res, const char *err) {
    tg_reserve_t *x = ud;
    if (err || PQntuples(res) != 1) {
        if (x->load_cb) {
            if (!x->detached)
                x->load_cb(x->ud, 503, "billing_unavailable", "the balance could not be loaded; try again", NULL, NULL);
            free(x);
            return;
        }
        reserve_finish(x, 503, "billing_unavailable", "the balance could not be loaded; try again");
        return;
    }
    snprintf(x->tenant_init, sizeof(x->tenant_init), "%s", PQgetvalue(res, 0, 0));
    snprintf(x->key_init, sizeof(x->key_init), "%s", PQgetvalue(res, 0, 1));
    if (x->load_cb) {
        if (!x->detached)
            x->load_cb(x->ud, 0, NULL, NULL, x->tenant_init, x->key_init);
        free(x);
        return;
    }
    reserve_send(x);
}

/* The live balance's load, for a reservation or for an admission that asked for it. */
static void load_balance(tg_reserve_t *x) {
    char t[24], k[24];
    snprintf(t, sizeof(t), "%lld", (long long)x->r.tenant_id);
    snprintf(k, sizeof(k), "%lld", (long long)x->r.key_id);
    const char *params[2] = {t, k};
    tg_pg_query(tg_state_pg(x->b->st), INIT_SQL, 2, params, init_loaded, x);
}

/* The reservation's durable Postgres row goes with the next settlement batch, in order,
 * or to the local spool when Postgres is unreachable: no request waits on Postgres. */
static void reserved_row(tg_billing_t *b, const tg_reserve_req_t *r, int unheld) {
    char amount[32];
    tg_money_format(r->amount, amount);
    json_t *o = json_object();
    json_object_set_new(o, "op", json_string("reserve"));
    json_object_set_new(o, "request_id", json_string(r->request_id));
    json_object_set_new(o, "attempt", json_integer(r->attempt));
    json_object_set_new(o, "tenant_id", json_integer(r->tenant_id));
    json_object_set_new(o, "api_key_id", json_integer(r->key_id));
    json_object_set_new(o, "amount", json_string(amount));
    json_object_set_new(o, "model", json_string(r->model ? r->model : ""));
    json_object_set_new(o, "instance", json_string(instance_id));
    if (unheld)
        json_object_set_new(o, "note", json_string("unheld")); /* no hold in Redis (INIT_SQL) */
    enqueue(b, o);
}

static void redis_reserved(void *ud, redisReply *r, const char *err) {
    tg_reserve_t *x = ud;
    tg_billing_t *b = x->b;
    if (err || !r || r->type != REDIS_REPLY_ARRAY || r->elements < 2) {
        /* The script may have run even though its reply did not come (a timeout): give
         * back whatever it held. Sent on the same connection, so Redis runs it after the
         * script; when the script did not run it finds nothing to return. */
        if (tg_state_redis(b->st))
            settle_send(b, x->keys, x->field, 0);
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
    if (ok == 0) {
        const char *code, *msg;
        tg_billing_refused(b, !strcmp(what, "key budget"), &code, &msg);
        reserve_finish(x, 402, code, msg);
        return;
    }
    if (x->detached) {
        /* The client left while we reserved: the upstream is never called, so the hold
         * goes straight back and nothing is recorded. */
        settle_send(b, x->keys, x->field, 0);
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
    char amt[24];
    snprintf(amt, sizeof(amt), "%lld", (long long)x->r.amount);
    const char *argv[9] = {x->keys[0], x->keys[1], x->keys[2], x->keys[3], amt, x->tenant_init, x->key_init,
                           x->field, x->hold};
    if (!tg_redis_eval(redis, x->b->reserve_script, 4, 9, argv, NULL, redis_reserved, x)) {
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
static void fmt_keys(char keys[4][128], char field[96], int64_t tenant, int64_t key, const char *id, int attempt) {
    snprintf(keys[0], 128, "{t:%lld}:money", (long long)tenant);
    snprintf(keys[1], 128, "{t:%lld}:res:%s:%d", (long long)tenant, id, attempt);
    snprintf(keys[2], 128, "{t:%lld}:kmoney:%lld", (long long)tenant, (long long)key);
    snprintf(keys[3], 128, "{t:%lld}:holds", (long long)tenant);
    snprintf(field, 96, "%s:%d", id, attempt);
}

/* The last answer of a hold given back: the Redis client sent it again while its answer
 * was lost (while this gateway lives nobody else returns its holds: the reconciler only
 * returns a dead gateway's, so a lost one would keep the tenant's money reserved). */
typedef struct {
    tg_billing_t *b;
    char field[96];
} settle_send_t;

static void settle_done(void *ud, redisReply *r, const char *err) {
    settle_send_t *s = ud;
    TG_UNUSED(r);
    if (err)
        tg_log_warn("billing: returning the hold %s failed (%s); the reconciler returns it once this gateway "
                    "is gone",
                    s->field, err);
    s->b->returning--;
    free(s);
}

/* Gives back a hold: `actual` of it is spent, the rest returns to the balances. settle.lua
 * is idempotent (it deletes the reservation key and returns nothing the second time), so
 * it goes through tg_redis_eval_idempotent. */
static void settle_send(tg_billing_t *b, char keys[4][128], const char *field, int64_t actual) {
    tg_redis_t *redis = tg_state_redis(b->st);
    char amount[24];
    snprintf(amount, sizeof(amount), "%lld", (long long)actual);
    const char *argv[6] = {keys[0], keys[1], keys[2], keys[3], amount, field};
    settle_send_t *s = calloc(1, sizeof(*s));
    if (!s)
        abort();
    s->b = b;
    snprintf(s->field, sizeof(s->field), "%s", field);
    if (!redis || tg_redis_eval_idempotent(redis, b->settle_script, 4, 6, argv, NULL, settle_done, s) != TG_OK) {
        free(s);
        return;
    }
    b->returning++;
}

/* Returns an attempt's hold (the part above `actual` goes back), exactly once. */
static void settle_hold(tg_billing_t *b, int64_t tenant, int64_t key, const char *id, int attempt, int64_t actual) {
    tg_redis_t *redis = tg_state_redis(b->st);
    if (!redis)
        return;
    char keys[4][128], field[96];
    fmt_keys(keys, field, tenant, key, id, attempt);
    settle_send(b, keys, field, actual);
}

static void fail_async_cb(uv_timer_t *t) {
    tg_reserve_t *x = t->data;
    uv_close((uv_handle_t *)t, (uv_close_cb)free);
    if (x->load_cb) {
        if (!x->detached)
            x->load_cb(x->ud, 503, "billing_unavailable", "billing needs Postgres and Redis", NULL, NULL);
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
    /* A key without a budget needs no live key balance: "-1" tells the script so, and no
     * request of such a key ever waits on Postgres. */
    snprintf(x->key_init, sizeof(x->key_init), "%s", r->key_budget ? "" : "-1");
    fmt_keys(x->keys, x->field, r->tenant_id, r->key_id, x->request_id, r->attempt);
    snprintf(x->hold, sizeof(x->hold), "%lld|%s|%llu|%lld|%.120s", (long long)r->key_id, instance_id,
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
    fmt_keys(keys, field, r->tenant_id, r->key_id, r->request_id, 1);
    /* admit.lua's order: money, reservation, holds, then the key's budget if any. */
    memcpy(m->keys[0], keys[0], sizeof(m->keys[0]));
    memcpy(m->keys[1], keys[1], sizeof(m->keys[1]));
    memcpy(m->keys[2], keys[3], sizeof(m->keys[2]));
    memcpy(m->keys[3], keys[2], sizeof(m->keys[3]));
    /* "-1" loaded: the key has no budget after all (tg_billing_reserve skips it too). */
    m->nkeys = r->key_budget && !(key_init && !strcmp(key_init, "-1")) ? 4 : 3;
    snprintf(m->amount, sizeof(m->amount), "%lld", (long long)r->amount);
    snprintf(m->tenant_init, sizeof(m->tenant_init), "%s", tenant_init ? tenant_init : "");
    snprintf(m->key_init, sizeof(m->key_init), "%s", key_init ? key_init : "");
    snprintf(m->hold, sizeof(m->hold), "%lld|%s|%llu|%lld|%.120s", (long long)r->key_id, instance_id,
             (unsigned long long)tg_wall_ms(), (long long)r->amount, r->model ? r->model : "");
    m->undo = admission_undo;
    m->undo_ud = b;
}

void tg_billing_admitted(tg_billing_t *b, const tg_reserve_req_t *r) {
    reserved_row(b, r, 0);
    b->stats.reserved++;
}

tg_reserve_t *tg_billing_load(tg_billing_t *b, const tg_reserve_req_t *r, tg_balance_cb cb, void *ud) {
    tg_reserve_t *x = calloc(1, sizeof(*x));
    x->b = b;
    x->r = *r;
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

/* ---- settlement ----------------------------------------------------------------------- */

static void flush(tg_billing_t *b);
static void spool_next(tg_billing_t *b);

static void release_durable(tg_billing_t *b, json_t *batch);

/* Appends `batch` to the spool, one line per BATCH_MAX elements (so that replaying it
 * never needs more memory than one batch), and fsyncs. Returns 0, or -1 when it could
 * not be written: then the elements are kept in memory (re-queued) unless `batch` is
 * the queue itself. */
static int spool_append(tg_billing_t *b, json_t *batch, const char *why) {
    size_t n = json_array_size(batch);
    if (!n)
        return 0;
    int fd = open(b->spool_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        tg_log_error("billing: cannot open the spool %s: %s — settlements kept in memory only", b->spool_path,
                     strerror(errno));
        if (batch != b->queue)
            json_array_extend(b->queue, batch);
        return -1;
    }
    tg_buf_t text;
    tg_buf_init(&text);
    for (size_t i = 0; i < n; i += BATCH_MAX) {
        json_t *line = json_array();
        for (size_t k = i; k < n && k < i + BATCH_MAX; k++)
            json_array_append(line, json_array_get(batch, k));
        char *t = json_dumps(line, JSON_COMPACT);
        tg_buf_appends(&text, t);
        tg_buf_appends(&text, "\n");
        free(t);
        json_decref(line);
    }
    ssize_t w = write(fd, text.data, text.len);
    int ok = w == (ssize_t)text.len && fsync(fd) == 0;
    close(fd);
    tg_buf_free(&text);
    if (!ok) {
        tg_log_error("billing: spool write failed: %s", strerror(errno));
        if (batch != b->queue)
            json_array_extend(b->queue, batch);
        return -1;
    }
    b->stats.spooled += n;
    tg_log_warn("billing: %s: %zu settlement(s) spooled to %s", why, n, b->spool_path);
    release_durable(b, batch);
    return 0;
}

typedef struct {
    tg_billing_t *b;
    json_t *batch;
    int from_spool;
} batch_ctx_t;

/* The settlements of `batch` made without a Redis hold that Postgres just billed
 * ("settled", not a duplicate): their cost comes off the live balances now, after the
 * commit, so that a balance loaded from Postgres meanwhile either has it already (loaded
 * after) or gets it now (loaded before). Rare: only after money failed open. */
static void debit_unheld(tg_billing_t *b, json_t *batch, const PGresult *res) {
    tg_redis_t *redis = tg_state_redis(b->st);
    size_t i;
    json_t *e;
    json_array_foreach(batch, i, e) {
        json_t *cost = json_object_get(e, "unheld_cost");
        if (!json_is_integer(cost) || !redis)
            continue;
        const char *rid = json_string_value(json_object_get(e, "request_id"));
        int settled = 0;
        for (int r = 0; rid && r < PQntuples(res) && !settled; r++)
            settled = !strcmp(PQgetvalue(res, r, 0), rid) && !strcmp(PQgetvalue(res, r, 1), "settled");
        if (!settled || json_integer_value(cost) <= 0)
            continue;
        char keys[2][128], amt[24];
        long long tenant = (long long)json_integer_value(json_object_get(e, "tenant_id"));
        snprintf(keys[0], sizeof(keys[0]), "{t:%lld}:money", tenant);
        snprintf(keys[1], sizeof(keys[1]), "{t:%lld}:kmoney:%lld", tenant,
                 (long long)json_integer_value(json_object_get(e, "api_key_id")));
        snprintf(amt, sizeof(amt), "%lld", (long long)json_integer_value(cost));
        /* EVAL with the source, not EVALSHA: a Redis that restarted has no scripts, and a
         * NOSCRIPT answered after the command timed out would not be retried — this
         * debit must run even when Redis answers late. Rare and small. */
        const char *argv[6] = {"EVAL", tg_scripts_source("debit"), "2", keys[0], keys[1], amt};
        tg_redis_command(redis, NULL, NULL, 6, argv, NULL);
    }
}

static int send_batch(tg_billing_t *b, json_t *batch, int from_spool);

/* Postgres refused the batch for what it holds (SQLSTATE class 22, a data exception such
 * as a number out of range; 23, a constraint such as amount >= 0), not because it is
 * unreachable: sent again as it is, it would fail for ever, and everything behind it in
 * the spool with it. */
static int data_error(const PGresult *res) {
    const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    return st && (!strncmp(st, "22", 2) || !strncmp(st, "23", 2));
}

/* One element Postgres refuses on its own: written aside (an fsync'd line in
 * quarantine-w<N>.jsonl beside the spool, with the reason), logged and counted, and
 * never again in the way of a batch. A quarantined settlement's usage is unknown from
 * then on: its reservations become pending_reconciliation and are settled by the
 * reconciliation rule; a quarantined reservation row is written by its request's
 * settlement, or found as an orphaned hold (README, Billing). */
static void quarantine(tg_billing_t *b, json_t *e, const char *why) {
    b->stats.quarantined++;
    char path[600];
    snprintf(path, sizeof(path), "%s/quarantine-w%d.jsonl", b->spool_dir ? b->spool_dir : ".", b->cfg.worker);
    json_t *line = json_pack("{s:s,s:I,s:O}", "error", why, "at_ms", (json_int_t)tg_wall_ms(), "element", e);
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int ok = text && fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text) && write(fd, "\n", 1) == 1 &&
             fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    const char *op = json_string_value(json_object_get(e, "op"));
    const char *rid = json_string_value(json_object_get(e, "request_id"));
    tg_log_error("billing: QUARANTINED a %s element of request %s that Postgres refuses (%s)%s%s", op ? op : "settlement",
                 rid ? rid : "?", why, ok ? ": kept in " : ": could not be written aside: ", ok ? path : text ? text : "");
    free(text);
    json_decref(line);
    if (!op && rid) {
        /* Its usage is unknown now: the reconciliation rule settles it. */
        json_t *o = json_object();
        json_object_set_new(o, "op", json_string("unknown"));
        json_object_set_new(o, "request_id", json_string(rid));
        enqueue(b, o);
    }
}

/* A batch refused for its data is split in halves, each sent again, down to the one
 * element that is refused on its own (quarantined): the others land. */
static void split_batch(tg_billing_t *b, json_t *batch, int from_spool, const char *why) {
    size_t n = json_array_size(batch);
    if (n <= 1) {
        if (n)
            quarantine(b, json_array_get(batch, 0), why);
        return;
    }
    for (int h = 0; h < 2; h++) {
        json_t *half = json_array();
        for (size_t i = h ? n / 2 : 0; i < (h ? n : n / 2); i++)
            json_array_append(half, json_array_get(batch, i));
        send_batch(b, half, from_spool);
    }
}

static void batch_done(void *ud, const PGresult *res, const char *err) {
    batch_ctx_t *c = ud;
    tg_billing_t *b = c->b;
    if (c->from_spool)
        b->replay_inflight--;
    else
        b->live_inflight--;
    if (err && data_error(res)) {
        tg_log_warn("billing: Postgres refused a batch of %zu for its data (%s): finding the element",
                    json_array_size(c->batch), err);
        split_batch(b, c->batch, c->from_spool, err);
        int from_spool = c->from_spool;
        json_decref(c->batch);
        free(c);
        if (from_spool)
            spool_next(b); /* after a quarantine nothing else is in flight: the replay goes on */
        if (json_array_size(b->queue))
            flush(b);
        return;
    }
    if (err) {
        /* Never dropped: a failed batch goes to the spool (a replayed one is still in the
         * replay file, which is kept and tried again by the timer), and so does everything
         * queued behind it; for two seconds new batches skip Postgres. */
        tg_log_warn("billing: a batch failed: %s", err);
        if (!c->from_spool)
            spool_append(b, c->batch, "Postgres unreachable");
        b->pg_down_until = tg_now_ms() + 2000;
        if (b->queue && json_array_size(b->queue) && spool_append(b, b->queue, "Postgres unreachable") == 0)
            json_array_clear(b->queue);
        json_decref(c->batch);
        free(c);
        return;
    }
    b->stats.batches++;
    release_durable(b, c->batch);
    debit_unheld(b, c->batch, res);
    for (int i = 0; i < PQntuples(res); i++) {
        const char *outcome = PQgetvalue(res, i, 1);
        if (!strcmp(outcome, "reserved") || !strcmp(outcome, "unknown"))
            continue;
        if (!strcmp(outcome, "settled"))
            b->stats.settled++;
        else if (!strcmp(outcome, "duplicate"))
            b->stats.duplicates++;
        else {
            b->stats.conflicts++;
            tg_log_error("billing: CONFLICT: request %s was already settled with a different fingerprint; "
                         "not billed again — investigate",
                         PQgetvalue(res, i, 0));
        }
    }
    int from_spool = c->from_spool;
    if (from_spool)
        b->stats.replayed += json_array_size(c->batch);
    json_decref(c->batch);
    free(c);
    if (from_spool)
        spool_next(b); /* Postgres takes batches again: the rest of the spool follows at once */
    if (json_array_size(b->queue))
        flush(b);
}

static const char SETTLE_SQL[] = "SELECT request_id, outcome FROM tg_settle_batch($1::jsonb)";

/* Sends `batch` (owned); 0 when sent. */
static int send_batch(tg_billing_t *b, json_t *batch, int from_spool) {
    tg_pg_t *pg = tg_state_pg(b->st);
    batch_ctx_t *c = calloc(1, sizeof(*c));
    c->b = b;
    c->batch = batch;
    c->from_spool = from_spool;
    char *text = json_dumps(batch, JSON_COMPACT);
    const char *params[1] = {text};
    int sent = pg && tg_pg_query(pg, SETTLE_SQL, 1, params, batch_done, c);
    free(text);
    if (sent) {
        if (from_spool)
            b->replay_inflight++;
        else
            b->live_inflight++;
        return 0;
    }
    if (!from_spool)
        spool_append(b, batch, "Postgres unreachable");
    json_decref(batch);
    free(c);
    return -1;
}

/* Removes the oldest batch (at most BATCH_MAX elements) from the queue and returns it. */
static json_t *queue_take(tg_billing_t *b) {
    size_t total = json_array_size(b->queue), n = TG_MIN(total, (size_t)BATCH_MAX);
    json_t *batch = json_array(), *rest = json_array();
    for (size_t i = 0; i < total; i++)
        json_array_append(i < n ? batch : rest, json_array_get(b->queue, i));
    json_decref(b->queue);
    b->queue = rest;
    return batch;
}

static void flush(tg_billing_t *b) {
    /* Few transactions under load: everything queued goes in (bounded) batches, at most
     * LIVE_INFLIGHT of them at Postgres; what arrives meanwhile waits for the next. */
    if (tg_now_ms() < b->pg_down_until && json_array_size(b->queue)) {
        if (spool_append(b, b->queue, "Postgres unreachable") == 0)
            json_array_clear(b->queue);
        return;
    }
    while (json_array_size(b->queue) && b->live_inflight < LIVE_INFLIGHT) {
        if (send_batch(b, queue_take(b), 0) != 0)
            break;
    }
}

static void flush_cb(uv_timer_t *t) { flush(t->data); }


static void release_attempts(tg_billing_t *b, const tg_settlement_t *s, int64_t cost_last) {
    /* Failed earlier attempts produced nothing billable; the last one carries the cost,
     * unless it went ahead without a hold (money open): then its cost comes off the live
     * balance after the commit (debit_unheld), and a hold an admission took before its
     * answer was lost goes back whole, so the cost is not taken twice. */
    int last = TG_MAX(s->attempts, 1);
    for (int a = 1; a <= last; a++) {
        int unheld = a <= 32 && (s->unheld & (1u << (a - 1)));
        settle_hold(b, s->tenant_id, s->key_id, s->request_id, a, a == last && !unheld ? cost_last : 0);
    }
}

/*
 * Gives back the holds of the settlements in `batch` once they are durable: committed in
 * Postgres, or fsync'd to the spool. Not before: a gateway killed between the two would
 * have paid the request in Redis (the hold and its index entry gone) and never in
 * Postgres (no row, no usage, nothing left for the reconciler to find), and the live
 * balance would stay short of Postgres' for ever. Kept until then, a hold outlives a
 * lost settlement and is reconciled like any other (an orphaned hold, or its row).
 * settle.lua is idempotent, so a settlement released when spooled and again when its
 * replay commits gives its holds back once. Elements of older spools, without
 * release_cost, were given back when they were made.
 */
static void release_durable(tg_billing_t *b, json_t *batch) {
    size_t i;
    json_t *e;
    json_array_foreach(batch, i, e) {
        json_t *cost = json_object_get(e, "release_cost");
        const char *rid = json_string_value(json_object_get(e, "request_id"));
        if (json_object_get(e, "op") || !json_is_integer(cost) || !rid)
            continue;
        tg_settlement_t s = {
            .request_id = rid,
            .tenant_id = json_integer_value(json_object_get(e, "tenant_id")),
            .key_id = json_integer_value(json_object_get(e, "api_key_id")),
            .attempts = (int)json_integer_value(json_object_get(e, "attempts")),
            .unheld = (unsigned)json_integer_value(json_object_get(e, "release_unheld")),
        };
        release_attempts(b, &s, json_integer_value(cost));
    }
}

static json_t *usage_field(const tg_usage_t *u, unsigned bit, int64_t v) {
    return (u->known & bit) ? json_integer(v) : json_null();
}

static json_t *settlement_json(const tg_settlement_t *s) {
    char cost[32], fp_src[512], fp[65];
    tg_money_format(s->cost, cost);
    const tg_usage_t *u = &s->usage;
    /* The fingerprint identifies what was billed: the same request settled again with
     * different numbers is a conflict, not a second charge. */
    snprintf(fp_src, sizeof(fp_src), "%lld|%s|%lld|%lld|%lld|%lld|%lld|%s", (long long)s->key_id, s->model,
             (long long)u->input, (long long)u->output, (long long)u->cache_read, (long long)u->cache_write,
             (long long)u->reasoning, cost);
    tg_sha256_hex(fp_src, strlen(fp_src), fp);
    json_t *o = json_object();
    json_object_set_new(o, "request_id", json_string(s->request_id));
    json_object_set_new(o, "fingerprint", json_string(fp));
    int last = TG_MAX(s->attempts, 1);
    if (last <= 32 && (s->unheld & (1u << (last - 1))))
        /* The billed attempt held nothing in Redis: once this settlement is in Postgres,
         * its cost comes off the live balance (batch_done). */
        json_object_set_new(o, "unheld_cost", json_integer(s->cost));
    json_object_set_new(o, "tenant_id", json_integer(s->tenant_id));
    json_object_set_new(o, "api_key_id", json_integer(s->key_id));
    json_object_set_new(o, "group_id", s->group_id ? json_integer(s->group_id) : json_null());
    json_object_set_new(o, "account_id", s->account_id ? json_integer(s->account_id) : json_null());
    json_object_set_new(o, "model", json_string(s->model ? s->model : ""));
    json_object_set_new(o, "attempts", json_integer(TG_MAX(s->attempts, 1)));
    /* What giving the holds back needs once this settlement is durable (release_durable). */
    json_object_set_new(o, "release_cost", json_integer(s->cost));
    json_object_set_new(o, "release_unheld", json_integer(s->unheld));
    json_object_set_new(o, "input", usage_field(u, TG_USAGE_INPUT, u->input));
    json_object_set_new(o, "output", usage_field(u, TG_USAGE_OUTPUT, u->output));
    json_object_set_new(o, "cache_read", usage_field(u, TG_USAGE_CACHE_READ, u->cache_read));
    json_object_set_new(o, "cache_write", usage_field(u, TG_USAGE_CACHE_WRITE, u->cache_write));
    json_object_set_new(o, "reasoning", usage_field(u, TG_USAGE_REASONING, u->reasoning));
    json_object_set_new(o, "cost", json_string(cost));
    json_object_set_new(o, "estimated", json_boolean(s->estimated));
    json_object_set_new(o, "status", json_integer(s->status));
    json_object_set_new(o, "ttft_ms", s->ttft_ms >= 0 ? json_real(s->ttft_ms) : json_null());
    json_object_set_new(o, "total_ms", json_real(s->total_ms));
    return o;
}

static void enqueue(tg_billing_t *b, json_t *item) {
    json_array_append_new(b->queue, item);
    size_t n = json_array_size(b->queue);
    if (n >= BATCH_MAX || n >= b->queue_max)
        flush(b);
    if (json_array_size(b->queue) >= b->queue_max) {
        /* Backpressure: every batch slot is busy and the queue is full — Postgres takes
         * settlements more slowly than requests come. The queue is bounded: it spills to
         * the spool (fsync'd, replayed batch by batch as soon as Postgres keeps up)
         * instead of growing in memory, and instead of being what a kill -9 would lose.
         * Requests never wait for it. */
        /* One batch at a time, the oldest: each overflow holds the loop for one batch's
         * encoding and fsync (milliseconds), not the whole queue's (was 0.25-0.8 s for
         * 20,000 elements, long enough for reservations in flight to time out). */
        json_t *oldest = queue_take(b);
        spool_append(b, oldest, "the queue is full (Postgres is slower than the traffic)"); /* on failure: back in the queue */
        json_decref(oldest);
    }
    if (json_array_size(b->queue) && !uv_is_active((uv_handle_t *)&b->flush_timer))
        uv_timer_start(&b->flush_timer, flush_cb, 1, 0);
}

void tg_billing_settle(tg_billing_t *b, const tg_settlement_t *s) {
    if (s->clamped)
        b->stats.clamped++;
    if (s->unreadable)
        b->stats.estimated++;
    /* The holds go back once the settlement is durable (release_durable), not now: a
     * gateway killed in between leaves them held and indexed, found by the reconciler. */
    enqueue(b, settlement_json(s));
}

void tg_billing_release_attempt(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id,
                                int attempt) {
    settle_hold(b, tenant_id, key_id, request_id, attempt, 0);
}

static void unlocked_cb(void *ud, redisReply *r, const char *err) {
    tg_billing_t *b = ud;
    TG_UNUSED(r);
    if (err)
        tg_log_warn("billing: releasing the reconciler lock failed (%s): it expires by itself", err);
    b->lock_released = 1;
}

void tg_billing_drain(tg_billing_t *b, uv_loop_t *loop, int timeout_ms) {
    if (!b)
        return;
    uint64_t end = tg_now_ms() + (uint64_t)timeout_ms;
    /* No reconciler pass from now on; a lock this worker holds is given back, so another
     * instance takes over within one of its passes instead of after the lock's TTL. */
    b->stopping = 1;
    uv_timer_stop(&b->reconcile_timer);
    b->lock_released = 1;
    tg_redis_t *redis = tg_state_redis(b->st);
    if (b->leader && redis) {
        const char *argv[5] = {"EVAL", tg_scripts_source("unlock"), "1", "tollgate:reconciler", instance_id};
        b->lock_released = !tg_redis_command(redis, unlocked_cb, b, 5, argv, NULL);
        b->leader = 0;
    }
    flush(b);
    /* The holds of what lands go back once it is durable: wait for those answers too. */
    while ((json_array_size(b->queue) || b->live_inflight || b->replay_inflight || !b->lock_released || b->returning) &&
           tg_now_ms() < end) {
        uv_run(loop, UV_RUN_ONCE);
        if (json_array_size(b->queue))
            flush(b);
    }
}

void tg_billing_unknown(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id, int attempts,
                        const char *model, int64_t amount) {
    /* In the same stream as the reservation rows, but batches land in any order: the
     * element carries the rows, so it writes them (pending) if it comes first. */
    char amt[32];
    tg_money_format(amount, amt);
    json_t *o = json_object();
    json_object_set_new(o, "op", json_string("unknown"));
    json_object_set_new(o, "request_id", json_string(request_id));
    json_object_set_new(o, "tenant_id", json_integer(tenant_id));
    json_object_set_new(o, "api_key_id", json_integer(key_id));
    json_object_set_new(o, "attempts", json_integer(attempts));
    json_object_set_new(o, "amount", json_string(amt));
    json_object_set_new(o, "model", json_string(model ? model : ""));
    json_object_set_new(o, "instance", json_string(instance_id));
    enqueue(b, o);
}

/* ---- spool replay --------------------------------------------------------------------- */

/* Takes the spool over for replay by renaming it (appends made meanwhile start a new
 * file). 1 when there is a replay file. */
static int spool_take(tg_billing_t *b, char taking[600]) {
    snprintf(taking, 600, "%s.replay", b->spool_path);
    struct stat sb;
    if (stat(taking, &sb) == 0)
        return 1;
    if (stat(b->spool_path, &sb) != 0 || rename(b->spool_path, taking) != 0)
        return 0;
    b->replay_offset = 0;
    return 1;
}

/* Sends the next batch of the replay file (one line); at its end removes it and goes on
 * with what was spooled meanwhile. */
static void spool_next(tg_billing_t *b) {
    if (b->replay_inflight || b->stopping || !tg_state_pg(b->st))
        return;
    char taking[600];
    if (!spool_take(b, taking))
        return;
    FILE *f = fopen(taking, "r");
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    json_t *batch = NULL;
    while (!batch && fseek(f, b->replay_offset, SEEK_SET) == 0) {
        ssize_t n = getline(&line, &cap, f);
        if (n <= 0)
            break;
        b->replay_offset = ftell(f);
        batch = json_loadb(line, (size_t)n, 0, NULL);
        if (!json_is_array(batch) || !json_array_size(batch)) {
            json_decref(batch);
            batch = NULL;
        }
    }
    free(line);
    fclose(f);
    if (!batch) {
        /* Everything in it is in Postgres. */
        unlink(taking);
        b->replay_offset = 0;
        struct stat sb;
        if (stat(b->spool_path, &sb) == 0)
            spool_next(b);
        return;
    }
    size_t n = json_array_size(batch);
    if (send_batch(b, batch, 1) != 0)
        b->replay_offset = 0; /* not sent: the file is kept and replayed from its start */
    else
        tg_log_info("billing: replaying %zu spooled settlement(s)", n);
}

static void spool_cb(uv_timer_t *t) {
    tg_billing_t *b = t->data;
    if (b->replay_inflight || !tg_state_pg(b->st) || !tg_pg_connected(tg_state_pg(b->st)))
        return;
    /* A replay file already there is replayed again from its start: what a failed
     * attempt left (tg_settle_batch is idempotent, so batches that got through are
     * no-ops). */
    b->replay_offset = 0;
    spool_next(b);
}


/* ---- reconciler ----------------------------------------------------------------------- */

static void reconcile_cb(uv_timer_t *t);

tg_billing_t *tg_billing_create(uv_loop_t *loop, tg_state_t *st, const tg_billing_config_t *cfg) {
    pthread_once(&instance_once, make_instance_id);
    tg_billing_t *b = calloc(1, sizeof(*b));
    b->loop = loop;
    b->st = st;
    b->cfg = *cfg;
    b->spool_dir = strdup(cfg->spool_dir ? cfg->spool_dir : "var/spool");
    b->cfg.spool_dir = b->spool_dir;
    /* mkdir -p: the spool must exist before the first settlement needs it. */
    for (char *q = b->spool_dir + 1; *q; q++)
        if (*q == '/') {
            *q = '\0';
            mkdir(b->spool_dir, 0700);
            *q = '/';
        }
    if (mkdir(b->spool_dir, 0700) != 0 && errno != EEXIST)
        tg_log_error("billing: cannot create the spool folder %s: %s", b->spool_dir, strerror(errno));
    snprintf(b->spool_path, sizeof(b->spool_path), "%s/settlements-w%d.jsonl", b->spool_dir, cfg->worker);
    b->queue = json_array();
    b->queue_max = cfg->queue_max > 0 ? (size_t)cfg->queue_max : QUEUE_MAX_DEFAULT;
    tg_redis_t *redis = tg_state_redis(st);
    if (redis) {
        b->reserve_script = tg_redis_script_register(redis, tg_scripts_source("reserve"));
        b->settle_script = tg_redis_script_register(redis, tg_scripts_source("settle"));
    }
    uv_timer_init(loop, &b->flush_timer);
    b->flush_timer.data = b;
    uv_timer_init(loop, &b->spool_timer);
    b->spool_timer.data = b;
    uv_timer_start(&b->spool_timer, spool_cb, 200, 2000);
    uv_unref((uv_handle_t *)&b->spool_timer);
    uv_timer_init(loop, &b->reconcile_timer);
    b->reconcile_timer.data = b;
    if (cfg->reconciler) {
        uint64_t every = (uint64_t)TG_MIN(TG_MAX(cfg->reconcile_after_ms / 4, 500), ALIVE_TTL_MS / 3);
        uv_timer_start(&b->reconcile_timer, reconcile_cb, every, every);
        uv_unref((uv_handle_t *)&b->reconcile_timer);
    }
    return b;
}

/* b is freed once its three timers are closed. */
static void timer_closed(uv_handle_t *h) {
    tg_billing_t *b = h->data;
    if (--b->closing == 0)
        free(b);
}

void tg_billing_destroy(tg_billing_t *b) {
    if (!b)
        return;
    /* Called after the worker's Postgres and Redis clients are gone (their pending
     * callbacks already ran, spooling what they carried). */
    /* Whatever is still queued goes to the spool: replayed at the next start. */
    if (json_array_size(b->queue))
        spool_append(b, b->queue, "shutting down");
    json_decref(b->queue);
    b->queue = NULL;
    free(b->spool_dir);
    b->spool_dir = NULL;
    /* Holds still being given back had their last answer when the Redis client went
     * (tg_redis_err_shutdown: the reconciler returns them). */
    b->closing = 3;
    uv_close((uv_handle_t *)&b->flush_timer, timer_closed);
    uv_close((uv_handle_t *)&b->spool_timer, timer_closed);
    uv_close((uv_handle_t *)&b->reconcile_timer, timer_closed);
}

const tg_billing_stats_t *tg_billing_stats(const tg_billing_t *b) { return &b->stats; }

static void billing_collect(const void *const *stats, int n, tg_buf_t *out) {
    tg_billing_stats_t s;
    tg_metrics_sum_u64(stats, n, TG_METRICS_NFIELDS(tg_billing_stats_t), (uint64_t *)&s);
    tg_buf_printf(out,
                  "# HELP tollgate_billing_total Reservations and settlements.\n"
                  "# TYPE tollgate_billing_total counter\n"
                  "tollgate_billing_total{event=\"reserved\"} %llu\n"
                  "tollgate_billing_total{event=\"refused\"} %llu\n"
                  "tollgate_billing_total{event=\"settled\"} %llu\n"
                  "tollgate_billing_total{event=\"duplicate\"} %llu\n"
                  "tollgate_billing_total{event=\"conflict\"} %llu\n"
                  "tollgate_billing_total{event=\"batch\"} %llu\n"
                  "tollgate_billing_total{event=\"spooled\"} %llu\n"
                  "tollgate_billing_total{event=\"replayed\"} %llu\n"
                  "tollgate_billing_total{event=\"reconciled\"} %llu\n"
                  "tollgate_billing_total{event=\"unheld\"} %llu\n"
                  "tollgate_billing_total{event=\"quarantined\"} %llu\n"
                  "tollgate_billing_total{event=\"usage_clamped\"} %llu\n"
                  "tollgate_billing_total{event=\"usage_estimated\"} %llu\n",
                  (unsigned long long)s.reserved, (unsigned long long)s.refused, (unsigned long long)s.settled,
                  (unsigned long long)s.duplicates, (unsigned long long)s.conflicts, (unsigned long long)s.batches,
                  (unsigned long long)s.spooled, (unsigned long long)s.replayed, (unsigned long long)s.reconciled,
                  (unsigned long long)s.unheld, (unsigned long long)s.quarantined, (unsigned long long)s.clamped,
                  (unsigned long long)s.estimated);
}

void tg_billing_metrics(tg_metrics_t *m, const tg_billing_t *b) {
    if (b)
        tg_metrics_collector_add(m, billing_collect, &b->stats);
}

/*
 * The reconciler: one per deployment, elected with a Redis lock (SET NX PX, renewed by
 * its holder). Each pass settles the reservations whose usage will never be reported:
 * `pending_reconciliation` rows (upstream timed out after the request was sent) and
 * `reserved` rows older than reconcile_after (the gateway that held them died). The
 * rule: unknown usage is charged at the reserved upper bound, marked estimated
 * (charge_unknown = 1, the default: the provider most likely billed it), or released
 * at no cost (charge_unknown = 0). Either way through tg_settle_batch, so a request
 * that was settled meanwhile is never billed twice.
 */
static const char DUE_SQL[] =
    "SELECT r.request_id, max(r.attempt), min(r.tenant_id), min(r.api_key_id), "
    "(sum(r.amount) * 1000000000)::bigint, coalesce(min(r.model), ''), "
    "bool_or(r.note = 'unheld' AND r.attempt = (SELECT max(x.attempt) FROM reservations x "
    "WHERE x.request_id = r.request_id)) FROM reservations r "
    "WHERE (r.state = 'pending_reconciliation' OR r.state = 'reserved') "
    "AND r.created_at < now() - $1::int * interval '1 millisecond' "
    "AND NOT (coalesce(r.instance, '') = ANY ($2::text[])) "
    "AND NOT EXISTS (SELECT 1 FROM billing_dedup d WHERE d.request_id = r.request_id) "
    "GROUP BY r.request_id LIMIT 500";

static void due_cb(void *ud, const PGresult *res, const char *err) {
    tg_billing_t *b = ud;
    if (err || b->stopping)
        return;
    for (int i = 0; i < PQntuples(res); i++) {
        int64_t amount = atoll(PQgetvalue(res, i, 4));
        int last = TG_MAX(atoi(PQgetvalue(res, i, 1)), 1);
        tg_settlement_t s = {
            .request_id = PQgetvalue(res, i, 0),
            .attempts = atoi(PQgetvalue(res, i, 1)),
            .tenant_id = atoll(PQgetvalue(res, i, 2)),
            .key_id = atoll(PQgetvalue(res, i, 3)),
            .model = PQgetvalue(res, i, 5),
            .cost = b->cfg.charge_unknown ? amount : 0,
            .estimated = 1,
            /* The billed attempt held nothing in Redis (money open): debit after commit. */
            .unheld = !strcmp(PQgetvalue(res, i, 6), "t") && last <= 32 ? 1u << (last - 1) : 0,
            .status = 0,
            .ttft_ms = -1,
        };
        tg_billing_settle(b, &s);
        b->stats.reconciled++;
    }
    if (PQntuples(res))
        tg_log_info("billing: reconciler settled %d request(s) with unknown usage (%s)", PQntuples(res),
                    b->cfg.charge_unknown ? "charged the reserved bound" : "released");
}

/*
 * Holds without a row. A request's hold is in Redis before its reservation row is in
 * Postgres (the row goes with the next batch): a gateway killed in between — for about
 * a millisecond normally, for as long as Postgres stalls otherwise — leaves a hold that
 * no row describes. Every hold is also indexed in {t:T}:holds (field <id>:<attempt>,
 * value key|instance|created ms|amount|model; removed by the script that settles it),
 * so the reconciler finds these: a hold of an instance that stopped heart-beating,
 * older than reconcile_after, whose request has neither a reservation row nor a
 * settlement, gets its row written now as `pending_reconciliation` (dated when the
 * hold was taken), and the next pass settles it by the same rule as any other; a hold
 * whose request was settled meanwhile is returned (at the settled cost for its last
 * attempt). A hold whose row exists is left to the row's reconciliation.
 */
static const char ORPHANS_SQL[] =
    "SELECT c.rid, c.att, c.key_id, c.ms, c.amount, c.model, c.instance, "
    "EXISTS (SELECT 1 FROM reservations r WHERE r.request_id = c.rid AND r.attempt = c.att), "
    "EXISTS (SELECT 1 FROM billing_dedup d WHERE d.request_id = c.rid), "
    "coalesce((SELECT (u.cost * 1000000000)::bigint FROM usage u WHERE u.request_id = c.rid AND u.attempts = c.att), 0) "
    "FROM jsonb_to_recordset($1::jsonb) AS c(rid text, att int, key_id bigint, ms bigint, amount bigint, model text, "
    "instance text) "
    /* A hold of a key this Postgres does not know (another deployment on the same Redis)
     * is not ours to record: its row would be refused (quarantined) at every pass. */
    "WHERE EXISTS (SELECT 1 FROM api_keys k WHERE k.id = c.key_id)";

typedef struct {
    tg_billing_t *b;
    int64_t tenant;
} orphans_ctx_t;

static void orphans_cb(void *ud, const PGresult *res, const char *err) {
    orphans_ctx_t *o = ud;
    tg_billing_t *b = o->b;
    int64_t tenant = o->tenant;
    free(o);
    if (err || b->stopping)
        return;
    int rows = 0;
    for (int i = 0; i < PQntuples(res); i++) {
        const char *rid = PQgetvalue(res, i, 0);
        int att = atoi(PQgetvalue(res, i, 1));
        int64_t key = atoll(PQgetvalue(res, i, 2));
        if (!strcmp(PQgetvalue(res, i, 8), "t")) {
            /* Settled, but its hold was never given back (Redis missed the release, or
             * the gateway died between the commit and the release). */
            settle_hold(b, tenant, key, rid, att, atoll(PQgetvalue(res, i, 9)));
            continue;
        }
        if (!strcmp(PQgetvalue(res, i, 7), "t"))
            continue; /* its row is there: reconciled as a row */
        char amount[32];
        tg_money_format(atoll(PQgetvalue(res, i, 4)), amount);
        json_t *e = json_object();
        json_object_set_new(e, "op", json_string("reserve"));
        json_object_set_new(e, "request_id", json_string(rid));
        json_object_set_new(e, "attempt", json_integer(att));
        json_object_set_new(e, "tenant_id", json_integer(tenant));
        json_object_set_new(e, "api_key_id", json_integer(key));
        json_object_set_new(e, "amount", json_string(amount));
        json_object_set_new(e, "model", json_string(PQgetvalue(res, i, 5)));
        json_object_set_new(e, "instance", json_string(PQgetvalue(res, i, 6)));
        json_object_set_new(e, "state", json_string("pending_reconciliation"));
        json_object_set_new(e, "note", json_string("orphaned hold: its gateway died before Postgres had the row"));
        json_object_set_new(e, "created_ms", json_integer(atoll(PQgetvalue(res, i, 3))));
        enqueue(b, e);
        rows++;
    }
    if (rows)
        tg_log_warn("billing: reconciler found %d hold(s) of tenant %lld without a reservation row (their gateway "
                    "died first): recorded as pending_reconciliation",
                    rows, (long long)tenant);
}

typedef struct {
    tg_billing_t *b;
    char **alive;
    size_t nalive;
    char cursor[32];
    char **keys; /* this SCAN page's {t:T}:holds keys */
    size_t nkeys, next;
} hold_scan_t;

static void scan_free(hold_scan_t *s) {
    for (size_t i = 0; i < s->nalive; i++)
        free(s->alive[i]);
    for (size_t i = 0; i < s->nkeys; i++)
        free(s->keys[i]);
    free(s->alive);
    free(s->keys);
    s->b->scanning = 0;
    free(s);
}

static void scan_step(hold_scan_t *s);

static int is_alive(const hold_scan_t *s, const char *instance, size_t len) {
    for (size_t i = 0; i < s->nalive; i++)
        if (strlen(s->alive[i]) == len && !memcmp(s->alive[i], instance, len))
            return 1;
    return 0;
}

static void holds_cb(void *ud, redisReply *r, const char *err) {
    hold_scan_t *s = ud;
    tg_billing_t *b = s->b;
    if (err || b->stopping || !r || r->type != REDIS_REPLY_ARRAY) {
        scan_free(s);
        return;
    }
    const char *hkey = s->keys[s->next - 1];
    int64_t tenant = atoll(hkey + 3); /* {t:T}:holds */
    uint64_t now = tg_wall_ms();
    tg_buf_t j;
    tg_buf_init(&j);
    tg_buf_appends(&j, "[");
    int n = 0;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const char *field = r->element[i]->str, *v = r->element[i + 1]->str;
        if (!field || !v)
            continue;
        /* field <id>:<attempt>; value key|instance|ms|amount|model */
        const char *colon = strrchr(field, ':');
        const char *p1 = strchr(v, '|'), *p2 = p1 ? strchr(p1 + 1, '|') : NULL;
        const char *p3 = p2 ? strchr(p2 + 1, '|') : NULL, *p4 = p3 ? strchr(p3 + 1, '|') : NULL;
        if (!colon || !p4)
            continue;
        uint64_t ms = strtoull(p2 + 1, NULL, 10);
        if (is_alive(s, p1 + 1, (size_t)(p2 - p1 - 1)) || now < ms + (uint64_t)b->cfg.reconcile_after_ms)
            continue; /* its gateway is alive (it settles it), or too young */
        tg_buf_appends(&j, n++ ? ",{\"rid\":\"" : "{\"rid\":\"");
        tg_buf_append_json_escaped(&j, field, (size_t)(colon - field));
        tg_buf_printf(&j, "\",\"att\":%d,\"key_id\":%lld,\"ms\":%llu,\"amount\":%lld,\"instance\":\"", atoi(colon + 1),
                      atoll(v), (unsigned long long)ms, atoll(p3 + 1));
        tg_buf_append_json_escaped(&j, p1 + 1, (size_t)(p2 - p1 - 1));
        tg_buf_appends(&j, "\",\"model\":\"");
        tg_buf_append_json_escaped(&j, p4 + 1, strlen(p4 + 1));
        tg_buf_appends(&j, "\"}");
    }
    tg_buf_appends(&j, "]");
    if (n) {
        orphans_ctx_t *o = malloc(sizeof(*o));
        o->b = b;
        o->tenant = tenant;
        const char *params[1] = {j.data};
        if (!tg_pg_query(tg_state_pg(b->st), ORPHANS_SQL, 1, params, orphans_cb, o))
            free(o);
    }
    tg_buf_free(&j);
    scan_step(s);
}

static void scan_cb(void *ud, redisReply *r, const char *err) {
    hold_scan_t *s = ud;
    if (err || s->b->stopping || !r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 || !r->element[0]->str ||
        r->element[1]->type != REDIS_REPLY_ARRAY) {
        scan_free(s);
        return;
    }
    snprintf(s->cursor, sizeof(s->cursor), "%s", r->element[0]->str);
    redisReply *ks = r->element[1];
    for (size_t i = 0; i < s->nkeys; i++)
        free(s->keys[i]);
    free(s->keys);
    s->keys = calloc(ks->elements + 1, sizeof(char *));
    s->nkeys = 0;
    s->next = 0;
    for (size_t i = 0; i < ks->elements; i++)
        if (ks->element[i]->str)
            s->keys[s->nkeys++] = strdup(ks->element[i]->str);
    scan_step(s);
}

/* The next holds key of this page, or the next page, or the end. */
static void scan_step(hold_scan_t *s) {
    tg_redis_t *redis = tg_state_redis(s->b->st);
    if (!redis) {
        scan_free(s);
        return;
    }
    if (s->next < s->nkeys) {
        const char *argv[2] = {"HGETALL", s->keys[s->next++]};
        if (!tg_redis_command(redis, holds_cb, s, 2, argv, NULL))
            scan_free(s);
        return;
    }
    if (s->keys && !strcmp(s->cursor, "0")) {
        scan_free(s);
        return;
    }
    const char *argv[6] = {"SCAN", s->cursor, "MATCH", "{t:*}:holds", "COUNT", "1000"};
    if (!tg_redis_command(redis, scan_cb, s, 6, argv, NULL))
        scan_free(s);
}

static void scan_holds(tg_billing_t *b, redisReply *alive) {
    if (b->scanning)
        return;
    hold_scan_t *s = calloc(1, sizeof(*s));
    s->b = b;
    s->alive = calloc(alive->elements + 1, sizeof(char *));
    for (size_t i = 0; i < alive->elements; i++)
        if (alive->element[i]->str)
            s->alive[s->nalive++] = strdup(alive->element[i]->str);
    snprintf(s->cursor, sizeof(s->cursor), "0");
    b->scanning = 1;
    scan_step(s);
}

static void alive_cb(void *ud, redisReply *r, const char *err) {
    tg_billing_t *b = ud;
    if (err || !r || r->type != REDIS_REPLY_ARRAY || b->stopping)
        return;
    /* Reservations of live instances are theirs to settle, however long they run. */
    tg_buf_t arr;
    tg_buf_init(&arr);
    tg_buf_appends(&arr, "{");
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->str) {
            tg_buf_appends(&arr, i ? ",\"" : "\"");
            tg_buf_append_json_escaped(&arr, r->element[i]->str, r->element[i]->len);
            tg_buf_appends(&arr, "\"");
        }
    tg_buf_appends(&arr, "}");
    char ms[16];
    snprintf(ms, sizeof(ms), "%d", b->cfg.reconcile_after_ms);
    const char *params[2] = {ms, arr.data};
    tg_pg_query(tg_state_pg(b->st), DUE_SQL, 2, params, due_cb, b);
    tg_buf_free(&arr);
    scan_holds(b, r);
}

static void lock_cb(void *ud, redisReply *r, const char *err) {
    tg_billing_t *b = ud;
    if (err || !r || r->type != REDIS_REPLY_INTEGER || b->stopping)
        return;
    b->leader = r->integer == 1;
    if (!b->leader)
        return;
    char now[32];
    snprintf(now, sizeof(now), "%llu", (unsigned long long)tg_wall_ms());
    const char *argv[4] = {"ZRANGEBYSCORE", ALIVE_KEY, now, "+inf"};
    tg_redis_command(tg_state_redis(b->st), alive_cb, b, 4, argv, NULL);
}

/* Every instance (worker 0) says it is alive: a sorted set member with its expiry. */
static void heartbeat(tg_billing_t *b) {
    tg_redis_t *redis = tg_state_redis(b->st);
    if (!redis)
        return;
    char until[32], now[32];
    snprintf(until, sizeof(until), "%llu", (unsigned long long)(tg_wall_ms() + ALIVE_TTL_MS));
    snprintf(now, sizeof(now), "%llu", (unsigned long long)tg_wall_ms());
    const char *add[4] = {"ZADD", ALIVE_KEY, until, instance_id};
    tg_redis_command(redis, NULL, NULL, 4, add, NULL);
    const char *trim[4] = {"ZREMRANGEBYSCORE", ALIVE_KEY, "-inf", now};
    tg_redis_command(redis, NULL, NULL, 4, trim, NULL);
}

static void reconcile_cb(uv_timer_t *t) {
    tg_billing_t *b = t->data;
    tg_redis_t *redis = tg_state_redis(b->st);
    if (!redis || !tg_state_pg(b->st))
        return;
    heartbeat(b);
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%d", TG_MAX(b->cfg.reconcile_after_ms, 2000));
    const char *argv[6] = {"EVAL", tg_scripts_source("lock"), "1", "tollgate:reconciler", instance_id, ttl};
    tg_redis_command(redis, lock_cb, b, 6, argv, NULL);
}

/* ---- `tollgate ledger verify|reconcile` (blocking clients: a one-shot command) -------- */

#include <hiredis/hiredis.h>

/* The Redis of `url` set up like the workers' (password, database), or NULL with the
 * reason in err (no password in it) when it is configured but cannot be reached or
 * refuses the setup: a ledger command never quietly skips a Redis it could not log in to. */
static redisContext *ledger_redis(const char *url, char err[400]) {
    err[0] = '\0';
    return url ? tg_redis_connect_sync(url, 2000, err, 400) : NULL;
}

static int check(PGconn *c, const char *what, const char *sql, int *problems) {
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        fprintf(stderr, "ledger verify: %s: %s", what, PQerrorMessage(c));
        PQclear(r);
        (*problems)++;
        return TG_ERROR;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        printf("PROBLEM %s:", what);
        for (int k = 0; k < PQnfields(r); k++)
            printf(" %s=%s", PQfname(r, k), PQgetisnull(r, i, k) ? "null" : PQgetvalue(r, i, k));
        printf("\n");
        (*problems)++;
    }
    if (PQntuples(r) == 0)
        printf("ok   %s\n", what);
    PQclear(r);
    return TG_OK;
}

int tg_ledger_verify_main(const char *pg_conninfo, const char *redis_url) {
    PGconn *c = PQconnectdb(pg_conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "ledger verify: cannot connect to Postgres: %s", PQerrorMessage(c));
        PQfinish(c);
        return 2;
    }
    int problems = 0;
    check(c, "each balance = opening balance + top-ups - usage (ledger)",
          "SELECT t.id AS tenant_id, t.balance, t.opening_balance + coalesce(sum(l.amount) FILTER (WHERE l.kind <> "
          "'opening'), 0) AS from_ledger FROM tenants t LEFT JOIN ledger l ON l.tenant_id = t.id GROUP BY t.id "
          "HAVING t.balance <> t.opening_balance + coalesce(sum(l.amount) FILTER (WHERE l.kind <> 'opening'), 0)",
          &problems);
    check(c, "usage debits in the ledger = usage costs",
          "SELECT u.tenant_id, sum(u.cost) AS usage_cost, (SELECT -coalesce(sum(l.amount), 0) FROM ledger l WHERE "
          "l.tenant_id = u.tenant_id AND l.kind = 'usage') AS ledger_debits FROM usage u GROUP BY u.tenant_id "
          "HAVING sum(u.cost) <> (SELECT -coalesce(sum(l.amount), 0) FROM ledger l WHERE l.tenant_id = u.tenant_id "
          "AND l.kind = 'usage')",
          &problems);
    check(c, "no request id billed twice",
          "SELECT request_id, count(*) FROM ledger WHERE kind = 'usage' GROUP BY request_id HAVING count(*) > 1",
          &problems);
    check(c, "every usage row has its dedup row",
          "SELECT u.request_id FROM usage u LEFT JOIN billing_dedup d ON d.request_id = u.request_id WHERE "
          "d.request_id IS NULL",
          &problems);
    check(c, "each key's spend = its usage",
          "SELECT k.id AS key_id, k.spend, coalesce(sum(u.cost), 0) AS usage_cost FROM api_keys k LEFT JOIN usage u "
          "ON u.api_key_id = k.id GROUP BY k.id HAVING k.spend <> coalesce(sum(u.cost), 0)",
          &problems);
    check(c, "every reservation is reconciled or pending (none left reserved for over a minute)",
          "SELECT request_id, attempt, state, created_at FROM reservations WHERE state = 'reserved' AND created_at < "
          "now() - interval '1 minute'",
          &problems);
    check(c, "every settled request's reservations are reconciled",
          "SELECT r.request_id, r.attempt, r.state FROM reservations r JOIN billing_dedup d ON d.request_id = "
          "r.request_id WHERE r.state <> 'reconciled'",
          &problems);
    char rerr[400];
    redisContext *rc = ledger_redis(redis_url, rerr);
    if (redis_url && !rc) {
        printf("PROBLEM Redis: cannot connect to compare reserved totals: %s\n", rerr);
        problems++;
    }
    if (rc) {
        PGresult *r = PQexec(c, "SELECT t.id, ((t.balance - coalesce(sum(r.amount), 0)) * 1000000000)::bigint, "
                                "(coalesce(sum(r.amount), 0) * 1000000000)::bigint FROM tenants t LEFT JOIN "
                                "reservations r ON r.tenant_id = t.id AND r.state IN ('reserved', "
                                "'pending_reconciliation') AND r.note IS DISTINCT FROM 'unheld' "
                                "GROUP BY t.id");
        int bad = 0;
        for (int i = 0; PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++) {
            redisReply *rep = redisCommand(rc, "HMGET {t:%s}:money avail reserved", PQgetvalue(r, i, 0));
            if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 && rep->element[0]->str) {
                long long avail = atoll(rep->element[0]->str);
                long long reserved = rep->element[1]->str ? atoll(rep->element[1]->str) : 0;
                if (avail != atoll(PQgetvalue(r, i, 1)) || reserved != atoll(PQgetvalue(r, i, 2))) {
                    printf("PROBLEM Redis reserved totals match Postgres: tenant_id=%s redis_avail=%lld "
                           "pg_avail=%s redis_reserved=%lld pg_reserved=%s (nano-USD)\n",
                           PQgetvalue(r, i, 0), avail, PQgetvalue(r, i, 1), reserved, PQgetvalue(r, i, 2));
                    bad++;
                }
            }
            if (rep)
                freeReplyObject(rep);
        }
        PQclear(r);
        if (!bad)
            printf("ok   Redis reserved totals match Postgres\n");
        problems += bad;
        redisFree(rc);
    }
    PQfinish(c);
    if (problems) {
        printf("ledger verify: %d problem(s)\n", problems);
        return 1;
    }
    printf("ledger verify: all invariants hold\n");
    return 0;
}

int tg_ledger_reconcile_main(const char *pg_conninfo, const char *redis_url, int older_than_ms, int charge_unknown) {
    PGconn *c = PQconnectdb(pg_conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "ledger reconcile: cannot connect to Postgres: %s", PQerrorMessage(c));
        PQfinish(c);
        return 2;
    }
    char rerr[400];
    redisContext *rc = ledger_redis(redis_url, rerr);
    if (redis_url && !rc)
        fprintf(stderr, "ledger reconcile: Redis: %s: the holds of the requests settled here stay there\n", rerr);
    char ms[16];
    snprintf(ms, sizeof(ms), "%d", older_than_ms);
    /* An operator's explicit pass: every instance counts as gone (run it when the
     * gateways that held these requests are stopped, or with --older-than-ms above the
     * longest request). */
    const char *params[2] = {ms, "{}"};
    PGresult *due = PQexecParams(c, DUE_SQL, 2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(due) != PGRES_TUPLES_OK) {
        fprintf(stderr, "ledger reconcile: %s", PQerrorMessage(c));
        PQclear(due);
        PQfinish(c);
        return 1;
    }
    int settled = 0;
    for (int i = 0; i < PQntuples(due); i++) {
        int64_t amount = atoll(PQgetvalue(due, i, 4));
        tg_settlement_t s = {
            .request_id = PQgetvalue(due, i, 0),
            .attempts = atoi(PQgetvalue(due, i, 1)),
            .tenant_id = atoll(PQgetvalue(due, i, 2)),
            .key_id = atoll(PQgetvalue(due, i, 3)),
            .model = PQgetvalue(due, i, 5),
            .cost = charge_unknown ? amount : 0,
            .estimated = 1,
            .ttft_ms = -1,
        };
        json_t *batch = json_array();
        json_array_append_new(batch, settlement_json(&s));
        char *text = json_dumps(batch, JSON_COMPACT);
        const char *p[1] = {text};
        PGresult *r = PQexecParams(c, "SELECT request_id, outcome FROM tg_settle_batch($1::jsonb)", 1, NULL, p, NULL,
                                   NULL, 0);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
            printf("%s %s (%s)\n", PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1),
                   charge_unknown ? "charged the reserved bound" : "released");
            settled++;
            for (int a = 1; rc && a <= TG_MAX(s.attempts, 1); a++) {
                char keys[4][128], field[96], actual[24];
                fmt_keys(keys, field, s.tenant_id, s.key_id, s.request_id, a);
                snprintf(actual, sizeof(actual), "%lld", (long long)(a == TG_MAX(s.attempts, 1) ? s.cost : 0));
                redisReply *rep = redisCommand(rc, "EVAL %s 4 %s %s %s %s %s %s", tg_scripts_source("settle"), keys[0],
                                               keys[1], keys[2], keys[3], actual, field);
                if (rep)
                    freeReplyObject(rep);
            }
        } else {
            fprintf(stderr, "ledger reconcile: %s: %s", s.request_id, PQerrorMessage(c));
        }
        PQclear(r);
        free(text);
        json_decref(batch);
    }
    PQclear(due);
    if (rc)
        redisFree(rc);
    PQfinish(c);
    printf("ledger reconcile: %d request(s) settled\n", settled);
    return 0;
}
