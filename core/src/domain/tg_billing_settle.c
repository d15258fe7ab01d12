/*
 * The settlement batcher and the spool (see tg_billing.h): reservation rows and
 * settlements are queued, grouped into one tg_settle_batch transaction per batch (at
 * most LIVE_INFLIGHT at Postgres), and on failure, or when the queue is full, appended
 * to a local fsync'd spool that is replayed batch by batch until Postgres takes it. A
 * batch Postgres refuses for its data is split down to the element, which is
 * quarantined. A settlement's holds go back in Redis once it is durable.
 */
#include "tg_billing_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
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

static void spool_next(tg_billing_t *b);

/* A batch: elements taken from the queue (owned), or read back from the spool. */
typedef struct {
    tg__elem_t *v;
    size_t n;
} batch_t;

static void release_durable(tg_billing_t *b, const tg__elem_t *v, size_t n);
static void enqueue_unknown(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id, int attempts,
                            const char *model, const char *amount, const char *instance);

/* ---- elements ----------------------------------------------------------------------- */

void tg__elem_init(tg__elem_t *e, tg_buf_t *json, const char *request_id, int op) {
    memset(e, 0, sizeof(*e));
    size_t rl = strlen(request_id);
    tg_buf_reserve(json, rl + 2);
    e->len = (uint32_t)json->len;
    json->data[json->len] = '\0';
    memcpy(json->data + json->len + 1, request_id, rl + 1);
    e->json = json->data; /* taken over */
    e->op = (uint8_t)op;
    json->data = NULL;
    json->len = json->cap = 0;
}

void tg__elem_free(tg__elem_t *e) {
    free(e->json);
    e->json = NULL;
}

int tg__elem_from_json(tg__elem_t *e, const json_t *o) {
    const char *rid = json_string_value(json_object_get(o, "request_id"));
    char *text = rid ? json_dumps(o, JSON_COMPACT) : NULL;
    if (!text) {
        /* Nothing writes one: an element without a request id is not sent (named here). */
        char *all = json_dumps(o, JSON_COMPACT);
        tg_log_error("billing: an element without a request id is dropped: %.300s", all ? all : "?");
        free(all);
        return -1;
    }
    tg_buf_t j = {.data = text, .len = strlen(text), .cap = strlen(text) + 1};
    const char *op = json_string_value(json_object_get(o, "op"));
    tg__elem_init(e, &j, rid,
                  !op                         ? TG__OP_SETTLE
                  : !strcmp(op, "reserve")    ? TG__OP_RESERVE
                  : !strcmp(op, "unknown")    ? TG__OP_UNKNOWN
                                              : TG__OP_OTHER);
    e->tenant_id = json_integer_value(json_object_get(o, "tenant_id"));
    e->key_id = json_integer_value(json_object_get(o, "api_key_id"));
    e->attempts = (int)json_integer_value(json_object_get(o, "attempts"));
    json_t *cost = json_object_get(o, "release_cost");
    if (e->op == TG__OP_SETTLE && json_is_integer(cost)) {
        /* Elements of older spools, without release_cost, were given back when made. */
        e->release = 1;
        e->release_cost = json_integer_value(cost);
        e->unheld = (unsigned)json_integer_value(json_object_get(o, "release_unheld"));
    }
    json_t *unheld = json_object_get(o, "unheld_cost");
    if (json_is_integer(unheld)) {
        e->has_unheld_cost = 1;
        e->unheld_cost = json_integer_value(unheld);
    }
    return 0;
}

/* The queue is an array used from qhead on, compacted when its free head outgrows what
 * it holds: taking a batch costs the batch, not the queue (was O(queue) per batch). */
static void queue_push(tg_billing_t *b, tg__elem_t *e) {
    if (b->qhead + b->qlen == b->qcap) {
        if (b->qhead && b->qhead >= b->qlen) {
            memmove(b->queue, b->queue + b->qhead, b->qlen * sizeof(*b->queue));
            b->qhead = 0;
        } else {
            b->qcap = b->qcap ? b->qcap * 2 : 256;
            b->queue = realloc(b->queue, b->qcap * sizeof(*b->queue));
            if (!b->queue)
                abort();
        }
    }
    b->queue[b->qhead + b->qlen++] = *e;
}

/* Removes the oldest `max` elements (at most) from the queue into *out. */
static void queue_take(tg_billing_t *b, size_t max, batch_t *out) {
    size_t n = TG_MIN(b->qlen, max);
    out->v = malloc((n ? n : 1) * sizeof(*out->v));
    if (!out->v)
        abort();
    memcpy(out->v, b->queue + b->qhead, n * sizeof(*out->v));
    out->n = n;
    b->qhead += n;
    b->qlen -= n;
    if (!b->qlen)
        b->qhead = 0;
}

static void batch_free(batch_t *bt) {
    for (size_t i = 0; i < bt->n; i++)
        tg__elem_free(&bt->v[i]);
    free(bt->v);
    bt->v = NULL;
    bt->n = 0;
}

/* Back at the end of the queue (a batch that could not be spooled): owned by it again. */
static void requeue(tg_billing_t *b, batch_t *bt) {
    for (size_t i = 0; i < bt->n; i++)
        queue_push(b, &bt->v[i]);
    free(bt->v);
    bt->v = NULL;
    bt->n = 0;
}

void tg__billing_queue_free(tg_billing_t *b) {
    for (size_t i = 0; i < b->qlen; i++)
        tg__elem_free(&b->queue[b->qhead + i]);
    free(b->queue);
    b->queue = NULL;
    b->qhead = b->qlen = b->qcap = 0;
}

/* "[e1,e2,...]": tg_settle_batch's argument (NUL-terminated). With `pair` (from
 * pair_reservations, or NULL), a settlement whose reservation is in the batch is written
 * as one element carrying the reservation's bound and instance, and that reservation is
 * not written on its own (sql/0023_settle_lean.sql). */
static void batch_text(const tg__elem_t *v, size_t n, const int32_t *pair, tg_buf_t *out) {
    size_t total = 2;
    for (size_t i = 0; i < n; i++)
        total += v[i].len + 1 + (pair ? 96 : 0);
    tg_buf_reserve(out, total + 1);
    tg_buf_append(out, "[", 1);
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        if (pair && pair[i] >= 0 && v[i].op == TG__OP_RESERVE)
            continue; /* inside its settlement */
        if (!first)
            tg_buf_append(out, ",", 1);
        first = 0;
        if (!pair || pair[i] < 0) {
            tg_buf_append(out, v[i].json, v[i].len);
            continue;
        }
        char amount[32];
        tg_money_format(v[pair[i]].amount, amount);
        tg_buf_append(out, v[i].json, v[i].len - 1); /* without its closing brace */
        tg_buf_appends(out, ",\"amount\":\"");
        tg_buf_appends(out, amount);
        tg_buf_appends(out, "\",\"instance\":\"");
        tg_buf_appends(out, tg__billing_instance);
        tg_buf_appends(out, "\"}");
    }
    tg_buf_append(out, "]", 2); /* with the NUL */
    out->len--;
}

static uint32_t rid_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/*
 * Pairs each settlement of one attempt with its reservation when both are in the batch
 * (under load, nearly every request: the reservation is queued at admission, the
 * settlement a few milliseconds later): pair[i] is the index of i's partner, or -1. A
 * reservation pairs only when made the normal way (`mergeable`: attempt 1, held) for
 * the same tenant and key. Returns the array (malloc'd), or NULL when nothing pairs.
 */
static int32_t *pair_reservations(const tg__elem_t *v, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    int32_t *slot = NULL, *pair = NULL;
    size_t nres = 0;
    for (size_t i = 0; i < n; i++)
        nres += v[i].op == TG__OP_RESERVE && v[i].mergeable;
    if (!nres)
        return NULL;
    slot = malloc(cap * sizeof(*slot));
    pair = malloc(n * sizeof(*pair));
    if (!slot || !pair)
        abort();
    memset(slot, 0xff, cap * sizeof(*slot));
    memset(pair, 0xff, n * sizeof(*pair));
    for (size_t i = 0; i < n; i++) {
        if (v[i].op != TG__OP_RESERVE || !v[i].mergeable)
            continue;
        size_t h = rid_hash(tg__elem_rid(&v[i])) & (cap - 1);
        while (slot[h] >= 0)
            h = (h + 1) & (cap - 1);
        slot[h] = (int32_t)i;
    }
    size_t paired = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i].op != TG__OP_SETTLE || v[i].attempts > 1)
            continue;
        const char *rid = tg__elem_rid(&v[i]);
        for (size_t h = rid_hash(rid) & (cap - 1); slot[h] >= 0; h = (h + 1) & (cap - 1)) {
            const tg__elem_t *r = &v[slot[h]];
            if (pair[slot[h]] < 0 && r->tenant_id == v[i].tenant_id && r->key_id == v[i].key_id &&
                !strcmp(tg__elem_rid(r), rid)) {
                pair[slot[h]] = (int32_t)i;
                pair[i] = slot[h];
                paired++;
                break;
            }
        }
    }
    free(slot);
    if (!paired) {
        free(pair);
        return NULL;
    }
    return pair;
}

/* ---- the spool ------------------------------------------------------------------------ */

/* Appends the elements to the spool, one line per BATCH_MAX elements (so that replaying
 * it never needs more memory than one batch), and fsyncs; once written, their holds go
 * back (release_durable). 0, or -1 when it could not be written: the caller keeps them. */
static int spool_append(tg_billing_t *b, const tg__elem_t *v, size_t n, const char *why) {
    if (!n)
        return 0;
    int fd = open(b->spool_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        tg_log_error("billing: cannot open the spool %s: %s — settlements kept in memory only", b->spool_path,
                     strerror(errno));
        return -1;
    }
    tg_buf_t text;
    tg_buf_init(&text);
    for (size_t i = 0; i < n; i += BATCH_MAX) {
        /* Reservations inside their settlements here too: under overload most of them
         * pass through the spool, and its replay then costs Postgres what a live batch
         * does. The elements stay as they are in memory (released below, as before). */
        size_t m = TG_MIN(n - i, (size_t)BATCH_MAX);
        int32_t *pair = pair_reservations(v + i, m);
        batch_text(v + i, m, pair, &text);
        free(pair);
        tg_buf_append(&text, "\n", 1);
    }
    ssize_t w = write(fd, text.data, text.len);
    int ok = w == (ssize_t)text.len && fsync(fd) == 0;
    close(fd);
    tg_buf_free(&text);
    if (!ok) {
        tg_log_error("billing: spool write failed: %s", strerror(errno));
        return -1;
    }
    b->stats.spooled += n;
    tg_log_warn("billing: %s: %zu settlement(s) spooled to %s", why, n, b->spool_path);
    release_durable(b, v, n);
    return 0;
}

/* A batch that is not in Postgres goes to the spool (freed), or back into the queue. */
static void spool_batch(tg_billing_t *b, batch_t *bt, const char *why) {
    if (spool_append(b, bt->v, bt->n, why) == 0)
        batch_free(bt);
    else
        requeue(b, bt);
}

int tg__billing_spool_queue(tg_billing_t *b, const char *why) {
    if (spool_append(b, b->queue + b->qhead, b->qlen, why) != 0)
        return -1;
    for (size_t i = 0; i < b->qlen; i++)
        tg__elem_free(&b->queue[b->qhead + i]);
    b->qhead = b->qlen = 0;
    return 0;
}

typedef struct {
    tg_billing_t *b;
    batch_t batch;
    int from_spool;
    size_t merged; /* reservations sent inside their settlements */
} batch_ctx_t;

/* The settlements of `batch` made without a Redis hold that Postgres just billed
 * ("settled", not a duplicate): their cost comes off the live balances now, after the
 * commit, so that a balance loaded from Postgres meanwhile either has it already (loaded
 * after) or gets it now (loaded before). Rare: only after money failed open. */
static void debit_unheld(tg_billing_t *b, const batch_t *bt, const PGresult *res) {
    tg_redis_t *redis = tg_state_redis(b->st);
    for (size_t i = 0; i < bt->n; i++) {
        const tg__elem_t *e = &bt->v[i];
        if (!e->has_unheld_cost || !redis)
            continue;
        const char *rid = tg__elem_rid(e);
        int settled = 0;
        for (int r = 0; r < PQntuples(res) && !settled; r++)
            settled = !strcmp(PQgetvalue(res, r, 0), rid) && !strcmp(PQgetvalue(res, r, 1), "settled");
        if (!settled || e->unheld_cost <= 0)
            continue;
        char keys[2][128], amt[24];
        snprintf(keys[0], sizeof(keys[0]), "{t:%lld}:money", (long long)e->tenant_id);
        snprintf(keys[1], sizeof(keys[1]), "{t:%lld}:kmoney:%lld", (long long)e->tenant_id, (long long)e->key_id);
        snprintf(amt, sizeof(amt), "%lld", (long long)e->unheld_cost);
        /* EVAL with the source, not EVALSHA: a Redis that restarted has no scripts, and a
         * NOSCRIPT answered after the command timed out would not be retried — this
         * debit must run even when Redis answers late. Rare and small. */
        const char *argv[6] = {"EVAL", tg_scripts_source("debit"), "2", keys[0], keys[1], amt};
        tg_redis_command(redis, NULL, NULL, 6, argv, NULL);
    }
}

static int send_batch(tg_billing_t *b, batch_t *bt, int from_spool);

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
static void quarantine(tg_billing_t *b, const tg__elem_t *e, const char *why) {
    b->stats.quarantined++;
    char path[600];
    snprintf(path, sizeof(path), "%s/quarantine-w%d.jsonl", b->spool_dir ? b->spool_dir : ".", b->cfg.worker);
    tg_buf_t line;
    tg_buf_init(&line);
    tg_buf_appends(&line, "{\"error\":\"");
    tg_buf_append_json_escaped(&line, why, strlen(why));
    tg_buf_appends(&line, "\",\"at_ms\":");
    tg_buf_append_u64(&line, tg_wall_ms());
    tg_buf_appends(&line, ",\"element\":");
    tg_buf_append(&line, e->json, e->len);
    tg_buf_append(&line, "}\n", 3);
    line.len--;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int ok = fd >= 0 && write(fd, line.data, line.len) == (ssize_t)line.len && fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    const char *op = e->op == TG__OP_RESERVE   ? "reserve"
                     : e->op == TG__OP_UNKNOWN ? "unknown"
                     : e->op == TG__OP_OTHER   ? "other"
                                               : "settlement";
    const char *rid = tg__elem_rid(e);
    line.data[line.len - 1] = '\0';
    tg_log_error("billing: QUARANTINED a %s element of request %s that Postgres refuses (%s)%s%s", op, rid, why,
                 ok ? ": kept in " : ": could not be written aside: ", ok ? path : line.data);
    tg_buf_free(&line);
    if (e->op == TG__OP_SETTLE) {
        /* Its usage is unknown now: the reconciliation rule settles it. A settlement that
         * carried its reservation (paired when spooled, sql/0023) takes it along: the
         * unknown element then writes the reservation row, pending_reconciliation. */
        json_t *o = json_loadb(e->json, e->len, 0, NULL);
        const char *amount = json_string_value(json_object_get(o, "amount"));
        if (amount) {
            const char *inst = json_string_value(json_object_get(o, "instance"));
            enqueue_unknown(b, rid, e->tenant_id, e->key_id, 1, json_string_value(json_object_get(o, "model")), amount,
                            inst ? inst : tg__billing_instance);
        } else {
            tg_buf_t j;
            tg_buf_init(&j);
            tg_buf_appends(&j, "{\"op\":\"unknown\",\"request_id\":\"");
            tg_buf_append_json_escaped(&j, rid, strlen(rid));
            tg_buf_appends(&j, "\"}");
            tg__elem_t u;
            tg__elem_init(&u, &j, rid, TG__OP_UNKNOWN);
            tg__billing_enqueue(b, &u);
        }
        json_decref(o);
    }
}

/* A batch refused for its data is split in halves, each sent again, down to the one
 * element that is refused on its own (quarantined): the others land. Takes `bt` over. */
static void split_batch(tg_billing_t *b, batch_t *bt, int from_spool, const char *why) {
    size_t n = bt->n;
    if (n <= 1) {
        if (n)
            quarantine(b, &bt->v[0], why);
        batch_free(bt);
        return;
    }
    for (int h = 0; h < 2; h++) {
        size_t from = h ? n / 2 : 0, to = h ? n : n / 2;
        batch_t half = {.v = malloc((to - from) * sizeof(*bt->v)), .n = to - from};
        if (!half.v)
            abort();
        memcpy(half.v, bt->v + from, half.n * sizeof(*bt->v));
        send_batch(b, &half, from_spool);
    }
    free(bt->v);
    bt->v = NULL;
    bt->n = 0;
}

static void batch_done(void *ud, const PGresult *res, const char *err) {
    batch_ctx_t *c = ud;
    tg_billing_t *b = c->b;
    if (c->from_spool)
        b->replay_inflight--;
    else
        b->live_inflight--;
    if (err && data_error(res)) {
        tg_log_warn("billing: Postgres refused a batch of %zu for its data (%s): finding the element", c->batch.n, err);
        int from_spool = c->from_spool;
        split_batch(b, &c->batch, from_spool, err);
        free(c);
        if (from_spool)
            spool_next(b); /* after a quarantine nothing else is in flight: the replay goes on */
        if (b->qlen)
            tg__billing_flush(b);
        return;
    }
    if (err) {
        /* Never dropped: a failed batch goes to the spool (a replayed one is still in the
         * replay file, which is kept and tried again by the timer), and so does everything
         * queued behind it; for two seconds new batches skip Postgres. */
        tg_log_warn("billing: a batch failed: %s", err);
        if (!c->from_spool)
            spool_batch(b, &c->batch, "Postgres unreachable");
        b->pg_down_until = tg_now_ms() + 2000;
        if (b->qlen)
            tg__billing_spool_queue(b, "Postgres unreachable");
        batch_free(&c->batch);
        free(c);
        return;
    }
    b->stats.batches++;
    b->stats.merged += c->merged;
    release_durable(b, c->batch.v, c->batch.n);
    debit_unheld(b, &c->batch, res);
    for (int i = 0; i < PQntuples(res); i++) {
        const char *outcome = PQgetvalue(res, i, 1);
        if (!strcmp(outcome, "reserved") || !strcmp(outcome, "unknown"))
            continue;
        if (!strcmp(outcome, "settled"))
            b->stats.settled++;
        else if (!strcmp(outcome, "duplicate"))
            b->stats.duplicates++;
        else if (!strcmp(outcome, "expired")) {
            /* Its usage partition was dropped by retention (sql/0009): whether it was
             * billed is no longer known, so it is not billed again. */
            b->stats.conflicts++;
            tg_log_error("billing: EXPIRED: request %s started in a usage partition dropped by retention; not "
                         "billed — investigate (a spool replayed after its retention?)",
                         PQgetvalue(res, i, 0));
        } else {
            b->stats.conflicts++;
            tg_log_error("billing: CONFLICT: request %s was already settled with a different fingerprint; "
                         "not billed again — investigate",
                         PQgetvalue(res, i, 0));
        }
    }
    int from_spool = c->from_spool;
    if (from_spool)
        b->stats.replayed += c->batch.n;
    batch_free(&c->batch);
    free(c);
    if (from_spool)
        spool_next(b); /* Postgres takes batches again: the rest of the spool follows at once */
    if (b->qlen)
        tg__billing_flush(b);
}

/* json, not jsonb: read once by json_to_recordset (sql/0023_settle_lean.sql). */
static const char SETTLE_SQL[] = "SELECT request_id, outcome FROM tg_settle_batch($1::json)";

/* Sends the batch (taken over); 0 when sent. */
static int send_batch(tg_billing_t *b, batch_t *bt, int from_spool) {
    tg_pg_t *pg = tg_state_pg(b->st);
    batch_ctx_t *c = calloc(1, sizeof(*c));
    if (!c)
        abort();
    c->b = b;
    c->batch = *bt;
    c->from_spool = from_spool;
    bt->v = NULL;
    bt->n = 0;
    tg_buf_t text;
    tg_buf_init(&text);
    /* A live batch's reservations travel inside their settlements (a spooled batch was
     * paired when it was written; its reservations may name another instance). */
    int32_t *pair = from_spool ? NULL : pair_reservations(c->batch.v, c->batch.n);
    batch_text(c->batch.v, c->batch.n, pair, &text);
    for (size_t i = 0; pair && i < c->batch.n; i++)
        c->merged += pair[i] >= 0 && c->batch.v[i].op == TG__OP_RESERVE;
    free(pair);
    const char *params[1] = {text.data};
    int sent = pg && tg_pg_query(pg, SETTLE_SQL, 1, params, batch_done, c);
    tg_buf_free(&text);
    if (sent) {
        if (from_spool)
            b->replay_inflight++;
        else
            b->live_inflight++;
        return 0;
    }
    if (!from_spool)
        spool_batch(b, &c->batch, "Postgres unreachable");
    batch_free(&c->batch);
    free(c);
    return -1;
}

void tg__billing_flush(tg_billing_t *b) {
    /* Few transactions under load: everything queued goes in (bounded) batches, at most
     * LIVE_INFLIGHT of them at Postgres; what arrives meanwhile waits for the next. */
    if (tg_now_ms() < b->pg_down_until && b->qlen) {
        tg__billing_spool_queue(b, "Postgres unreachable");
        return;
    }
    while (b->qlen && b->live_inflight < LIVE_INFLIGHT) {
        batch_t bt;
        queue_take(b, BATCH_MAX, &bt);
        if (send_batch(b, &bt, 0) != 0)
            break;
    }
}

void tg__billing_flush_cb(uv_timer_t *t) { tg__billing_flush(t->data); }

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
static void release_durable(tg_billing_t *b, const tg__elem_t *v, size_t n) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i].op == TG__OP_SETTLE && v[i].release)
            total += (size_t)TG_MAX(v[i].attempts, 1);
    if (!total)
        return;
    /* Every hold of the batch in one list, given back with one settle.lua call per
     * tenant (was one per hold). */
    tg__hold_t *h = malloc(total * sizeof(*h));
    if (!h)
        abort();
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const tg__elem_t *e = &v[i];
        if (e->op != TG__OP_SETTLE || !e->release)
            continue;
        tg_settlement_t s = {
            .request_id = tg__elem_rid(e),
            .tenant_id = e->tenant_id,
            .key_id = e->key_id,
            .attempts = e->attempts,
            .unheld = e->unheld,
        };
        k += tg__billing_attempt_holds(&s, e->release_cost, h + k);
    }
    tg__billing_holds_return(b, h, k);
    free(h);
}

/* "name":value pieces of the hot elements, without a tree. */
static void put_key(tg_buf_t *o, const char *name) {
    tg_buf_append(o, ",\"", 2);
    tg_buf_appends(o, name);
    tg_buf_append(o, "\":", 2);
}

static void put_int(tg_buf_t *o, const char *name, int64_t v) {
    put_key(o, name);
    tg__buf_i64(o, v);
}

static void put_usage(tg_buf_t *o, const char *name, const tg_usage_t *u, unsigned bit, int64_t v) {
    put_key(o, name);
    if (u->known & bit)
        tg__buf_i64(o, v);
    else
        tg_buf_append(o, "null", 4);
}

static void put_ms(tg_buf_t *o, const char *name, double ms) {
    /* To the microsecond, as "1234.567" (finer is noise for a request's duration;
     * printf's "%.17g" was a third of the settlement's text). Not a number JSON can carry (NaN,
     * infinities) as null; beyond int64 microseconds (never a real duration) as %g. */
    put_key(o, name);
    if (ms != ms || ms > 1e300 || ms < -1e300) {
        tg_buf_append(o, "null", 4);
        return;
    }
    if (ms > 9e12 || ms < -9e12) {
        char t[48];
        int k = snprintf(t, sizeof(t), "%.17g", ms);
        tg_buf_append(o, t, (size_t)TG_MIN(TG_MAX(k, 0), (int)sizeof(t) - 1));
        return;
    }
    int64_t us = (int64_t)(ms * 1000.0 + (ms < 0 ? -0.5 : 0.5));
    if (us < 0) {
        tg_buf_append(o, "-", 1);
        us = -us;
    }
    char d[24];
    tg_buf_append(o, d, tg__fmt_i64(d, us / 1000));
    int64_t frac = us % 1000;
    char f[4] = {'.', (char)('0' + frac / 100), (char)('0' + frac / 10 % 10), (char)('0' + frac % 10)};
    tg_buf_append(o, f, 4);
}

/* Appends len bytes of p at *n, cut to fit cap - 1 (as snprintf cuts). */
static void fp_put(char *out, size_t cap, size_t *n, const char *p, size_t len) {
    len = TG_MIN(len, cap - 1 - *n);
    memcpy(out + *n, p, len);
    *n += len;
}

static void fp_i64(char *out, size_t cap, size_t *n, int64_t v) {
    char d[24];
    fp_put(out, cap, n, d, tg__fmt_i64(d, v));
}

/* The fingerprint's source, "key|model|input|output|cache_read|cache_write|reasoning|cost"
 * (what snprintf made with "%lld|%s|...|%s", cut the same way), without printf. */
static size_t fp_text(char *out, size_t cap, const tg_settlement_t *s, const char *cost) {
    const tg_usage_t *u = &s->usage;
    const char *model = s->model ? s->model : "(null)";
    size_t n = 0;
    fp_i64(out, cap, &n, s->key_id);
    fp_put(out, cap, &n, "|", 1);
    fp_put(out, cap, &n, model, strlen(model));
    const int64_t v[5] = {u->input, u->output, u->cache_read, u->cache_write, u->reasoning};
    for (int i = 0; i < 5; i++) {
        fp_put(out, cap, &n, "|", 1);
        fp_i64(out, cap, &n, v[i]);
    }
    fp_put(out, cap, &n, "|", 1);
    fp_put(out, cap, &n, cost, strlen(cost));
    out[n] = '\0';
    return n;
}

void tg__billing_settlement_text(const tg_settlement_t *s, tg_buf_t *o) {
    char cost[32], fp_src[512], fp[65];
    tg_money_format(s->cost, cost);
    const tg_usage_t *u = &s->usage;
    const char *model = s->model ? s->model : "";
    /* The fingerprint identifies what was billed: the same request settled again with
     * different numbers is a conflict, not a second charge. */
    size_t n = fp_text(fp_src, sizeof(fp_src), s, cost);
    tg_sha256_hex(fp_src, n, fp);
    tg_buf_reserve(o, 512 + strlen(model));
    tg_buf_appends(o, "{\"request_id\":\"");
    tg_buf_append_json_escaped(o, s->request_id, strlen(s->request_id));
    tg_buf_appends(o, "\",\"fingerprint\":\"");
    tg_buf_append(o, fp, 64);
    tg_buf_append(o, "\"", 1);
    int last = TG_MAX(s->attempts, 1);
    if (last <= 32 && (s->unheld & (1u << (last - 1))))
        /* The billed attempt held nothing in Redis: once this settlement is in Postgres,
         * its cost comes off the live balance (batch_done). */
        put_int(o, "unheld_cost", s->cost);
    put_int(o, "tenant_id", s->tenant_id);
    put_int(o, "api_key_id", s->key_id);
    put_key(o, "group_id");
    if (s->group_id)
        tg__buf_i64(o, s->group_id);
    else
        tg_buf_append(o, "null", 4);
    put_key(o, "account_id");
    if (s->account_id)
        tg__buf_i64(o, s->account_id);
    else
        tg_buf_append(o, "null", 4);
    put_key(o, "model");
    tg_buf_append(o, "\"", 1);
    tg_buf_append_json_escaped(o, model, strlen(model));
    tg_buf_append(o, "\"", 1);
    put_int(o, "attempts", last);
    /* What giving the holds back needs once this settlement is durable (release_durable). */
    put_int(o, "release_cost", s->cost);
    put_int(o, "release_unheld", s->unheld);
    put_usage(o, "input", u, TG_USAGE_INPUT, u->input);
    put_usage(o, "output", u, TG_USAGE_OUTPUT, u->output);
    put_usage(o, "cache_read", u, TG_USAGE_CACHE_READ, u->cache_read);
    put_usage(o, "cache_write", u, TG_USAGE_CACHE_WRITE, u->cache_write);
    put_usage(o, "reasoning", u, TG_USAGE_REASONING, u->reasoning);
    put_key(o, "cost");
    tg_buf_append(o, "\"", 1);
    tg_buf_appends(o, cost);
    tg_buf_append(o, "\"", 1);
    put_key(o, "estimated");
    tg_buf_appends(o, s->estimated ? "true" : "false");
    put_int(o, "status", s->status);
    if (s->ttft_ms >= 0)
        put_ms(o, "ttft_ms", s->ttft_ms);
    else {
        put_key(o, "ttft_ms");
        tg_buf_append(o, "null", 4);
    }
    put_ms(o, "total_ms", s->total_ms);
    if (s->nbudgets > 0) {
        /* the periods it counts in (tg_budget_settle, 0008_budgets.sql): [[id, start], ...] */
        put_key(o, "budgets");
        tg_buf_append(o, "[", 1);
        for (int i = 0; i < s->nbudgets; i++) {
            tg_buf_append(o, i ? ",[" : "[", i ? 2 : 1);
            tg__buf_i64(o, s->budgets[i].id);
            tg_buf_append(o, ",", 1);
            tg__buf_i64(o, s->budgets[i].start);
            tg_buf_append(o, "]", 1);
        }
        tg_buf_append(o, "]", 1);
    }
    tg_buf_append(o, "}", 1);
}

void tg__billing_enqueue(tg_billing_t *b, tg__elem_t *e) {
    queue_push(b, e);
    if (b->qlen >= BATCH_MAX || b->qlen >= b->queue_max)
        tg__billing_flush(b);
    if (b->qlen >= b->queue_max) {
        /* Backpressure: every batch slot is busy and the queue is full — Postgres takes
         * settlements more slowly than requests come. The queue is bounded: it spills to
         * the spool (fsync'd, replayed batch by batch as soon as Postgres keeps up)
         * instead of growing in memory, and instead of being what a kill -9 would lose.
         * Requests never wait for it. */
        /* One batch at a time, the oldest: each overflow holds the loop for one batch's
         * encoding and fsync (milliseconds), not the whole queue's (was 0.25-0.8 s for
         * 20,000 elements, long enough for reservations in flight to time out). */
        batch_t oldest;
        queue_take(b, BATCH_MAX, &oldest);
        spool_batch(b, &oldest, "the queue is full (Postgres is slower than the traffic)"); /* on failure: back in the queue */
    }
    if (b->qlen && !uv_is_active((uv_handle_t *)&b->flush_timer))
        uv_timer_start(&b->flush_timer, tg__billing_flush_cb, 1, 0);
}

void tg__billing_enqueue_json(tg_billing_t *b, const json_t *o) {
    tg__elem_t e;
    if (tg__elem_from_json(&e, o) == 0)
        tg__billing_enqueue(b, &e);
}

void tg_billing_settle(tg_billing_t *b, const tg_settlement_t *s) {
    if (s->clamped)
        b->stats.clamped++;
    if (s->unreadable)
        b->stats.estimated++;
    /* The holds go back once the settlement is durable (release_durable), not now: a
     * gateway killed in between leaves them held and indexed, found by the reconciler. */
    tg_buf_t j;
    tg_buf_init(&j);
    tg__billing_settlement_text(s, &j);
    tg__elem_t e;
    tg__elem_init(&e, &j, s->request_id, TG__OP_SETTLE);
    e.tenant_id = s->tenant_id;
    e.key_id = s->key_id;
    e.attempts = TG_MAX(s->attempts, 1);
    e.release = 1;
    e.release_cost = s->cost;
    e.unheld = s->unheld;
    int last = TG_MAX(s->attempts, 1);
    if (last <= 32 && (s->unheld & (1u << (last - 1)))) {
        e.has_unheld_cost = 1;
        e.unheld_cost = s->cost;
    }
    tg__billing_enqueue(b, &e);
}

/* An `unknown` element carrying the rows it writes if it lands first: `amount` is each
 * attempt's bound as text, `instance` the gateway that held them. */
static void enqueue_unknown(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id, int attempts,
                            const char *model, const char *amount, const char *instance) {
    json_t *o = json_object();
    json_object_set_new(o, "op", json_string("unknown"));
    json_object_set_new(o, "request_id", json_string(request_id));
    json_object_set_new(o, "tenant_id", json_integer(tenant_id));
    json_object_set_new(o, "api_key_id", json_integer(key_id));
    json_object_set_new(o, "attempts", json_integer(attempts));
    json_object_set_new(o, "amount", json_string(amount));
    json_object_set_new(o, "model", json_string(model ? model : ""));
    json_object_set_new(o, "instance", json_string(instance));
    tg__billing_enqueue_json(b, o);
    json_decref(o);
}

void tg_billing_unknown(tg_billing_t *b, const char *request_id, int64_t tenant_id, int64_t key_id, int attempts,
                        const char *model, int64_t amount) {
    /* In the same stream as the reservation rows, but batches land in any order: the
     * element carries the rows, so it writes them (pending) if it comes first. */
    char amt[32];
    tg_money_format(amount, amt);
    enqueue_unknown(b, request_id, tenant_id, key_id, attempts, model, amt, tg__billing_instance);
}

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
    batch_t batch = {0};
    while (!batch.n && fseek(f, b->replay_offset, SEEK_SET) == 0) {
        ssize_t n = getline(&line, &cap, f);
        if (n <= 0)
            break;
        b->replay_offset = ftell(f);
        json_t *arr = json_loadb(line, (size_t)n, 0, NULL);
        size_t k = json_array_size(arr);
        if (k) {
            batch.v = malloc(k * sizeof(*batch.v));
            if (!batch.v)
                abort();
            for (size_t i = 0; i < k; i++)
                if (tg__elem_from_json(&batch.v[batch.n], json_array_get(arr, i)) == 0)
                    batch.n++;
            if (!batch.n) {
                free(batch.v);
                batch.v = NULL;
            }
        }
        json_decref(arr);
    }
    free(line);
    fclose(f);
    if (!batch.n) {
        /* Everything in it is in Postgres. */
        unlink(taking);
        b->replay_offset = 0;
        struct stat sb;
        if (stat(b->spool_path, &sb) == 0)
            spool_next(b);
        return;
    }
    size_t n = batch.n;
    if (send_batch(b, &batch, 1) != 0)
        b->replay_offset = 0; /* not sent: the file is kept and replayed from its start */
    else
        tg_log_info("billing: replaying %zu spooled settlement(s)", n);
}

void tg__billing_spool_cb(uv_timer_t *t) {
    tg_billing_t *b = t->data;
    if (b->replay_inflight || !tg_state_pg(b->st) || !tg_pg_connected(tg_state_pg(b->st)))
        return;
    /* A replay file already there is replayed again from its start: what a failed
     * attempt left (tg_settle_batch is idempotent, so batches that got through are
     * no-ops). */
    b->replay_offset = 0;
    spool_next(b);
}
