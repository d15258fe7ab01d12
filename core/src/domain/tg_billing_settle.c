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

static void release_durable(tg_billing_t *b, json_t *batch);

/* Appends `batch` to the spool, one line per BATCH_MAX elements (so that replaying it
 * never needs more memory than one batch), and fsyncs. Returns 0, or -1 when it could
 * not be written: then the elements are kept in memory (re-queued) unless `batch` is
 * the queue itself. */
int tg__billing_spool_append(tg_billing_t *b, json_t *batch, const char *why) {
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
        tg__billing_enqueue(b, o);
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
            tg__billing_flush(b);
        return;
    }
    if (err) {
        /* Never dropped: a failed batch goes to the spool (a replayed one is still in the
         * replay file, which is kept and tried again by the timer), and so does everything
         * queued behind it; for two seconds new batches skip Postgres. */
        tg_log_warn("billing: a batch failed: %s", err);
        if (!c->from_spool)
            tg__billing_spool_append(b, c->batch, "Postgres unreachable");
        b->pg_down_until = tg_now_ms() + 2000;
        if (b->queue && json_array_size(b->queue) && tg__billing_spool_append(b, b->queue, "Postgres unreachable") == 0)
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
        tg__billing_flush(b);
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
        tg__billing_spool_append(b, batch, "Postgres unreachable");
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

void tg__billing_flush(tg_billing_t *b) {
    /* Few transactions under load: everything queued goes in (bounded) batches, at most
     * LIVE_INFLIGHT of them at Postgres; what arrives meanwhile waits for the next. */
    if (tg_now_ms() < b->pg_down_until && json_array_size(b->queue)) {
        if (tg__billing_spool_append(b, b->queue, "Postgres unreachable") == 0)
            json_array_clear(b->queue);
        return;
    }
    while (json_array_size(b->queue) && b->live_inflight < LIVE_INFLIGHT) {
        if (send_batch(b, queue_take(b), 0) != 0)
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
        tg__billing_release_attempts(b, &s, json_integer_value(cost));
    }
}

static json_t *usage_field(const tg_usage_t *u, unsigned bit, int64_t v) {
    return (u->known & bit) ? json_integer(v) : json_null();
}

json_t *tg__billing_settlement_json(const tg_settlement_t *s) {
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
    if (s->nbudgets > 0) /* the periods it counts in (tg_budget_settle, 0008_budgets.sql) */
        json_object_set_new(o, "budgets", tg__billing_budgets_json(s->budgets, s->nbudgets));
    return o;
}

void tg__billing_enqueue(tg_billing_t *b, json_t *item) {
    json_array_append_new(b->queue, item);
    size_t n = json_array_size(b->queue);
    if (n >= BATCH_MAX || n >= b->queue_max)
        tg__billing_flush(b);
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
        tg__billing_spool_append(b, oldest, "the queue is full (Postgres is slower than the traffic)"); /* on failure: back in the queue */
        json_decref(oldest);
    }
    if (json_array_size(b->queue) && !uv_is_active((uv_handle_t *)&b->flush_timer))
        uv_timer_start(&b->flush_timer, tg__billing_flush_cb, 1, 0);
}

void tg_billing_settle(tg_billing_t *b, const tg_settlement_t *s) {
    if (s->clamped)
        b->stats.clamped++;
    if (s->unreadable)
        b->stats.estimated++;
    /* The holds go back once the settlement is durable (release_durable), not now: a
     * gateway killed in between leaves them held and indexed, found by the reconciler. */
    tg__billing_enqueue(b, tg__billing_settlement_json(s));
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
    json_object_set_new(o, "instance", json_string(tg__billing_instance));
    tg__billing_enqueue(b, o);
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
