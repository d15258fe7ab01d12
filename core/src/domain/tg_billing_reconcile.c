/*
 * The reconciler (see tg_billing.h): its election, a Redis lock that one worker of the
 * deployment holds and renews while every instance heart-beats into a sorted set, and
 * its passes: reservations whose usage will never be reported are settled by the
 * configured rule, and holds whose gateway died before Postgres had their row get that
 * row (or, when their request was settled, are given back). Settlements go through the
 * batcher (tg_billing_settle.c).
 */
#include "tg_billing_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_pg.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_scripts.h"

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
const char tg__billing_due_sql[] =
    "SELECT r.request_id, max(r.attempt), min(r.tenant_id), min(r.api_key_id), "
    "(sum(r.amount) * 1000000000)::bigint, coalesce(min(r.model), ''), "
    "bool_or(r.note = 'unheld' AND r.attempt = (SELECT max(x.attempt) FROM reservations x "
    "WHERE x.request_id = r.request_id)) FROM reservations r "
    "WHERE (r.state = 'pending_reconciliation' OR r.state = 'reserved') "
    "AND r.created_at < now() - $1::int * interval '1 millisecond' "
    "AND NOT (coalesce(r.instance, '') = ANY ($2::text[])) "
    "AND NOT EXISTS (SELECT 1 FROM usage d WHERE d.request_id = r.request_id "
    "AND d.started_at = tg_request_started(r.request_id)) "
    "GROUP BY r.request_id LIMIT 500";

tg_settlement_t tg__billing_due_settlement(const PGresult *res, int i, int charge_unknown) {
    int64_t amount = atoll(PQgetvalue(res, i, 4));
    int last = TG_MAX(atoi(PQgetvalue(res, i, 1)), 1);
    return (tg_settlement_t){
        .request_id = PQgetvalue(res, i, 0),
        .attempts = atoi(PQgetvalue(res, i, 1)),
        .tenant_id = atoll(PQgetvalue(res, i, 2)),
        .key_id = atoll(PQgetvalue(res, i, 3)),
        .model = PQgetvalue(res, i, 5),
        .cost = charge_unknown ? amount : 0,
        .estimated = 1,
        /* The billed attempt held nothing in Redis (money open): debit after commit. */
        .unheld = !strcmp(PQgetvalue(res, i, 6), "t") && last <= 32 ? 1u << (last - 1) : 0,
        .status = 0,
        .ttft_ms = -1,
    };
}

static void due_cb(void *ud, const PGresult *res, const char *err) {
    tg_billing_t *b = ud;
    if (err || b->stopping)
        return;
    for (int i = 0; i < PQntuples(res); i++) {
        tg_settlement_t s = tg__billing_due_settlement(res, i, b->cfg.charge_unknown);
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
 *
 * A hold of a live instance older than reconcile_after is looked at too, and given back
 * when its request was settled: its gateway's release was lost (a Redis primary killed
 * after it acknowledged the release and before its replica had it, or a release that
 * ran out of resends while a shard failed over). Nothing else is done to it: its
 * gateway settles it. Giving it back twice is harmless (settle.lua finds no reservation
 * the second time).
 */
const char tg__billing_orphans_sql[] =
    "SELECT c.rid, c.att, c.key_id, c.ms, c.amount, c.model, c.instance, coalesce(c.live, false), "
    "EXISTS (SELECT 1 FROM reservations r WHERE r.request_id = c.rid AND r.attempt = c.att), "
    "EXISTS (SELECT 1 FROM usage d WHERE d.request_id = c.rid AND d.started_at = tg_request_started(c.rid)), "
    "coalesce((SELECT (u.cost * 1000000000)::bigint FROM usage u WHERE u.request_id = c.rid "
    "AND u.started_at = tg_request_started(c.rid) AND u.attempts = c.att), 0) "
    "FROM jsonb_to_recordset($1::jsonb) AS c(rid text, att int, key_id bigint, ms bigint, amount bigint, model text, "
    "instance text, live boolean) "
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
    int rows = 0, returned = 0;
    for (int i = 0; i < PQntuples(res); i++) {
        const char *rid = PQgetvalue(res, i, TG__ORPH_RID);
        int att = atoi(PQgetvalue(res, i, TG__ORPH_ATT));
        int64_t key = atoll(PQgetvalue(res, i, TG__ORPH_KEY));
        if (!strcmp(PQgetvalue(res, i, TG__ORPH_SETTLED), "t")) {
            /* Settled, but its hold was never given back (Redis missed the release, or
             * the gateway died between the commit and the release). */
            tg__billing_hold_return(b, tenant, key, rid, att, atoll(PQgetvalue(res, i, TG__ORPH_COST)));
            returned++;
            continue;
        }
        if (!strcmp(PQgetvalue(res, i, TG__ORPH_LIVE), "t") || !strcmp(PQgetvalue(res, i, TG__ORPH_HAS_ROW), "t"))
            continue; /* its gateway lives and settles it, or its row is there: reconciled as a row */
        char amount[32];
        tg_money_format(atoll(PQgetvalue(res, i, TG__ORPH_AMOUNT)), amount);
        json_t *e = json_object();
        json_object_set_new(e, "op", json_string("reserve"));
        json_object_set_new(e, "request_id", json_string(rid));
        json_object_set_new(e, "attempt", json_integer(att));
        json_object_set_new(e, "tenant_id", json_integer(tenant));
        json_object_set_new(e, "api_key_id", json_integer(key));
        json_object_set_new(e, "amount", json_string(amount));
        json_object_set_new(e, "model", json_string(PQgetvalue(res, i, TG__ORPH_MODEL)));
        json_object_set_new(e, "instance", json_string(PQgetvalue(res, i, TG__ORPH_INSTANCE)));
        json_object_set_new(e, "state", json_string("pending_reconciliation"));
        json_object_set_new(e, "note", json_string("orphaned hold: its gateway died before Postgres had the row"));
        json_object_set_new(e, "created_ms", json_integer(atoll(PQgetvalue(res, i, TG__ORPH_MS))));
        tg__billing_enqueue_json(b, e);
        json_decref(e);
        rows++;
    }
    if (returned)
        tg_log_warn("billing: reconciler gave back %d hold(s) of tenant %lld whose request was settled (their "
                    "release was lost)",
                    returned, (long long)tenant);
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
    int node; /* the primary being scanned (a Redis Cluster has several: each is scanned) */
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

static int alive_in_scan(void *ud, const char *instance, size_t len) { return is_alive(ud, instance, len); }

int tg__billing_hold_record(tg_buf_t *j, int first, const char *field, const char *v, uint64_t now,
                            uint64_t older_ms, int (*alive)(void *ud, const char *instance, size_t len), void *ud) {
    if (!field || !v)
        return 0;
    /* field <id>:<attempt>; value key|instance|ms|amount|model */
    const char *colon = strrchr(field, ':');
    const char *p1 = strchr(v, '|'), *p2 = p1 ? strchr(p1 + 1, '|') : NULL;
    const char *p3 = p2 ? strchr(p2 + 1, '|') : NULL, *p4 = p3 ? strchr(p3 + 1, '|') : NULL;
    if (!colon || !p4)
        return 0;
    uint64_t ms = strtoull(p2 + 1, NULL, 10);
    if (now < ms + older_ms)
        return 0; /* too young */
    int live = alive && alive(ud, p1 + 1, (size_t)(p2 - p1 - 1));
    tg_buf_appends(j, first ? "{\"rid\":\"" : ",{\"rid\":\"");
    tg_buf_append_json_escaped(j, field, (size_t)(colon - field));
    tg_buf_printf(j, "\",\"att\":%d,\"key_id\":%lld,\"ms\":%llu,\"amount\":%lld,\"instance\":\"", atoi(colon + 1),
                  atoll(v), (unsigned long long)ms, atoll(p3 + 1));
    tg_buf_append_json_escaped(j, p1 + 1, (size_t)(p2 - p1 - 1));
    tg_buf_appends(j, "\",\"model\":\"");
    tg_buf_append_json_escaped(j, p4 + 1, strlen(p4 + 1));
    tg_buf_appends(j, live ? "\",\"live\":true}" : "\"}");
    return 1;
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
    for (size_t i = 0; i + 1 < r->elements; i += 2)
        n += tg__billing_hold_record(&j, n == 0, r->element[i]->str, r->element[i + 1]->str, now,
                                     (uint64_t)b->cfg.reconcile_after_ms, alive_in_scan, s);
    tg_buf_appends(&j, "]");
    if (n) {
        orphans_ctx_t *o = malloc(sizeof(*o));
        o->b = b;
        o->tenant = tenant;
        const char *params[1] = {j.data};
        if (!tg_pg_query(tg_state_pg(b->st), tg__billing_orphans_sql, 1, params, orphans_cb, o))
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
    if (s->keys && !strcmp(s->cursor, "0")) { /* this primary is done: the next one */
        for (size_t i = 0; i < s->nkeys; i++)
            free(s->keys[i]);
        free(s->keys);
        s->keys = NULL;
        s->nkeys = s->next = 0;
        s->node++;
    }
    if (s->node >= tg_redis_primaries(redis)) {
        scan_free(s);
        return;
    }
    const char *argv[6] = {"SCAN", s->cursor, "MATCH", "{t:*}:holds", "COUNT", "1000"};
    if (!tg_redis_command_at(redis, s->node, scan_cb, s, 6, argv, NULL))
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
    tg_pg_query(tg_state_pg(b->st), tg__billing_due_sql, 2, params, due_cb, b);
    tg_buf_free(&arr);
    scan_holds(b, r);
}

static void partitions_cb(void *ud, const PGresult *res, const char *err) {
    (void)ud;
    if (err)
        tg_log_warn("billing: making the usage and ledger partitions ahead failed: %s", err);
    else if (PQntuples(res) == 1 && atoi(PQgetvalue(res, 0, 0)) > 0)
        tg_log_info("billing: %s usage/ledger partition(s) made ahead", PQgetvalue(res, 0, 0));
}

static void compact_cb(void *ud, const PGresult *res, const char *err) {
    (void)ud;
    if (err)
        tg_log_warn("billing: compacting the usage rollups failed: %s", err);
    else if (PQntuples(res) == 1 && atoi(PQgetvalue(res, 0, 0)) > 0)
        tg_log_info("billing: %s hour(s) and day(s) of usage rollups compacted", PQgetvalue(res, 0, 0));
}

static void lock_cb(void *ud, redisReply *r, const char *err) {
    tg_billing_t *b = ud;
    if (err || !r || r->type != REDIS_REPLY_INTEGER || b->stopping)
        return;
    b->leader = r->integer == 1;
    if (!b->leader)
        return;
    tg__budget_alerts_pass(b); /* budget alerts due (tg_budget_alerts.c) */
    if (tg_now_ms() >= b->partitions_due) {
        /* The usage and ledger partitions of the days ahead (sql/0009_partitions.sql), at
         * the first pass and every hour: a missing one costs nothing but a detour of its
         * rows through the DEFAULT partition until it is made. */
        b->partitions_due = tg_now_ms() + 3600 * 1000;
        tg_pg_query(tg_state_pg(b->st), "SELECT tg_partitions_ensure(7)", 0, NULL, partitions_cb, b);
    }
    if (tg_now_ms() >= b->compact_due) {
        /* The hours and days that are over folded into the coarse and daily rollups the
         * reports read (sql/0014_usage_coarse.sql), every 10 minutes: one query that
         * finds nothing to do in two index probes between hours. */
        b->compact_due = tg_now_ms() + 600 * 1000;
        tg_pg_query(tg_state_pg(b->st), "SELECT tg_usage_compact()", 0, NULL, compact_cb, b);
    }
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
    const char *add[4] = {"ZADD", ALIVE_KEY, until, tg__billing_instance};
    tg_redis_command(redis, NULL, NULL, 4, add, NULL);
    const char *trim[4] = {"ZREMRANGEBYSCORE", ALIVE_KEY, "-inf", now};
    tg_redis_command(redis, NULL, NULL, 4, trim, NULL);
}

void tg__billing_reconcile_cb(uv_timer_t *t) {
    tg_billing_t *b = t->data;
    tg_redis_t *redis = tg_state_redis(b->st);
    if (!redis || !tg_state_pg(b->st))
        return;
    heartbeat(b);
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%d", TG_MAX(b->cfg.reconcile_after_ms, 2000));
    const char *argv[6] = {"EVAL", tg_scripts_source("lock"), "1", "tollgate:reconciler", tg__billing_instance, ttl};
    tg_redis_command(redis, lock_cb, b, 6, argv, NULL);
}
