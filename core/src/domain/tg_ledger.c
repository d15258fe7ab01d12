/*
 * `tollgate ledger verify|reconcile` (see tg_billing.h): a one-shot command with blocking
 * clients. verify checks the ledger's invariants in Postgres and compares the live
 * reserved totals in Redis; reconcile runs one reconciliation pass by hand, settling
 * through tg_settle_batch and giving the holds back in Redis.
 */
#include "tg_billing_internal.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_redis.h"
#include "tollgate/tg_redis_cluster.h"
#include "tollgate/tg_scripts.h"

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
    /* Partitions dropped by retention (sql/0009_partitions.sql) left their totals in
     * ledger_carried (per tenant and kind) and usage_carried (per tenant, key and the
     * ledger entry, while that entry is in the ledger): each sum below is carried +
     * what remains, so a dropped partition changes none of them. */
    check(c, "each balance = opening balance + top-ups - usage (ledger)",
          "SELECT t.id AS tenant_id, t.balance, t.opening_balance + coalesce(l.s, 0) AS from_ledger FROM tenants t "
          "LEFT JOIN (SELECT tenant_id, sum(amount) AS s FROM (SELECT tenant_id, amount FROM ledger WHERE kind <> "
          "'opening' UNION ALL SELECT tenant_id, amount FROM ledger_carried WHERE kind <> 'opening') x GROUP BY "
          "tenant_id) l ON l.tenant_id = t.id WHERE t.balance <> t.opening_balance + coalesce(l.s, 0)",
          &problems);
    check(c, "usage debits in the ledger = usage costs",
          "WITH u AS (SELECT tenant_id, sum(cost) AS c FROM (SELECT tenant_id, cost FROM usage UNION ALL SELECT "
          "tenant_id, cost FROM usage_carried) x GROUP BY tenant_id), l AS (SELECT tenant_id, -sum(amount) AS d "
          "FROM (SELECT tenant_id, amount FROM ledger WHERE kind = 'usage' UNION ALL SELECT tenant_id, amount FROM "
          "ledger_carried WHERE kind = 'usage') y GROUP BY tenant_id) SELECT u.tenant_id, u.c AS usage_cost, "
          "coalesce(l.d, 0) AS ledger_debits FROM u LEFT JOIN l ON l.tenant_id = u.tenant_id WHERE u.c <> "
          "coalesce(l.d, 0)",
          &problems);
    check(c, "no request id billed twice",
          "SELECT request_id, count(*) FROM ledger WHERE kind = 'usage' AND request_id IS NOT NULL GROUP BY request_id "
          "HAVING count(*) > 1",
          &problems);
    /* A usage row is its request's dedup (its fingerprint) and is debited by one ledger
     * entry: its batch's for its tenant (usage.ledger_id, sql/0006), or before 0006 one of
     * its own (ledger.request_id) — unless that entry's partition was dropped (the entry
     * has the row's created_at: one transaction wrote both). */
    check(c, "every usage row has its fingerprint and its ledger entry",
          "SELECT u.request_id, u.ledger_id FROM usage u LEFT JOIN ledger l ON l.id = u.ledger_id AND l.kind = "
          "'usage' AND l.tenant_id = u.tenant_id LEFT JOIN (SELECT DISTINCT request_id FROM ledger WHERE kind = "
          "'usage' AND request_id IS NOT NULL) o ON o.request_id = u.request_id WHERE (u.fingerprint IS NULL OR "
          "(u.ledger_id IS NULL AND o.request_id IS NULL) OR (u.ledger_id IS NOT NULL AND l.id IS NULL)) AND NOT "
          "EXISTS (SELECT 1 FROM detail_partitions d WHERE d.parent = 'ledger' AND d.dropped_at IS NOT NULL AND "
          "u.created_at >= d.lo AND u.created_at < d.hi AND u.fingerprint IS NOT NULL)",
          &problems);
    check(c, "each batch's ledger entry = minus the costs of its usage rows",
          "SELECT l.id AS ledger_id, l.tenant_id, l.amount, -coalesce(u.c, 0) AS from_usage FROM ledger l LEFT JOIN "
          "(SELECT ledger_id, sum(cost) AS c FROM (SELECT ledger_id, cost FROM usage WHERE ledger_id IS NOT NULL "
          "UNION ALL SELECT ledger_id, cost FROM usage_carried WHERE ledger_id IS NOT NULL) x GROUP BY ledger_id) u "
          "ON u.ledger_id = l.id WHERE l.kind = 'usage' AND l.request_id IS NULL AND l.amount <> -coalesce(u.c, 0)",
          &problems);
    check(c, "each key's spend = its usage",
          "SELECT k.id AS key_id, k.spend, coalesce(u.c, 0) AS usage_cost FROM api_keys k LEFT JOIN (SELECT "
          "api_key_id, sum(cost) AS c FROM (SELECT api_key_id, cost FROM usage UNION ALL SELECT api_key_id, cost "
          "FROM usage_carried) x GROUP BY api_key_id) u ON u.api_key_id = k.id WHERE k.spend <> coalesce(u.c, 0)",
          &problems);
    check(c, "every reservation is reconciled or pending (none left reserved for over a minute)",
          "SELECT request_id, attempt, state, created_at FROM reservations WHERE state = 'reserved' AND created_at < "
          "now() - interval '1 minute'",
          &problems);
    check(c, "every settled request's reservations are reconciled",
          "SELECT r.request_id, r.attempt, r.state FROM reservations r JOIN usage u ON u.request_id = "
          "r.request_id AND u.started_at = tg_request_started(r.request_id) WHERE r.state <> 'reconciled'",
          &problems);
    /* Periodic budgets (0008_budgets.sql): each period's recorded spend is the sum of the
     * costs of the requests counted in it, and each of those is its usage row's cost
     * (while that row's partition is kept). */
    check(c, "each budget period's spend = the sum of its usage",
          "SELECT p.budget_id, p.period_start, p.spend, coalesce(sum(u.cost), 0) AS usage_cost FROM budget_periods p "
          "LEFT JOIN budget_usage u ON u.budget_id = p.budget_id AND u.period_start = p.period_start "
          "GROUP BY p.budget_id, p.period_start, p.spend HAVING p.spend <> coalesce(sum(u.cost), 0)",
          &problems);
    check(c, "each budget usage row = its request's usage cost",
          "SELECT b.request_id, b.budget_id, b.cost, u.cost AS usage_cost FROM budget_usage b LEFT JOIN usage u ON "
          "u.request_id = b.request_id AND u.started_at = tg_request_started(b.request_id) WHERE u.cost IS DISTINCT "
          "FROM b.cost AND NOT (u.request_id IS NULL AND tg_usage_dropped(tg_request_started(b.request_id)))",
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
            char mkey[64];
            snprintf(mkey, sizeof(mkey), "{t:%s}:money", PQgetvalue(r, i, 0));
            const char *argv[4] = {"HMGET", mkey, "avail", "reserved"};
            redisReply *rep = tg_redis_sync_argv(&rc, redis_url, 2000, 4, argv, NULL); /* a cluster: MOVED */
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

/* Gives one hold back (settle.lua), its attempt's actual cost kept. The script's layout:
 * money, holds, then the hold's reservation and key budget (tg__billing_hold_keys writes
 * money, reservation, key budget, holds). */
static void ledger_hold_return(redisContext *rc, int64_t tenant, int64_t key, const char *rid, int att, int64_t actual) {
    char keys[4][128], field[96], amt[24];
    tg__billing_hold_keys(keys, field, tenant, key, rid, att);
    tg_fmt_i64z(amt, actual);
    /* rc is the node that holds the tenant's keys (its holds index was found there). */
    /* settle.lua's layout: money, holds, then the hold's reservation and key budget
     * (tg__billing_hold_keys writes money, reservation, key budget, holds). */
    redisReply *rep = redisCommand(rc, "EVAL %s 4 %s %s %s %s %s %s", tg_scripts_source("settle"), keys[0], keys[3],
                                   keys[1], keys[2], amt, field);
    if (rep)
        freeReplyObject(rep);
}

/* The holds in Redis that no Postgres row describes (their gateway died before its batch
 * committed), as the reconciler finds them (tg_billing_reconcile.c), every instance
 * counting as gone: each older than older_ms gets its row, `pending_reconciliation`,
 * which the rows pass below then settles; a hold whose request was settled is given
 * back. Returns how many rows it wrote. */
static int ledger_orphaned_holds(PGconn *c, redisContext *rc, int older_ms) {
    int rows = 0;
    char cursor[32] = "0";
    uint64_t now = tg_wall_ms();
    do {
        redisReply *page = redisCommand(rc, "SCAN %s MATCH {t:*}:holds COUNT 1000", cursor);
        if (!page || page->type != REDIS_REPLY_ARRAY || page->elements != 2 || !page->element[0]->str) {
            if (page)
                freeReplyObject(page);
            fprintf(stderr, "ledger reconcile: Redis: could not scan the holds index\n");
            return rows;
        }
        snprintf(cursor, sizeof(cursor), "%s", page->element[0]->str);
        for (size_t k = 0; k < page->element[1]->elements; k++) {
            const char *hkey = page->element[1]->element[k]->str;
            redisReply *h = hkey ? redisCommand(rc, "HGETALL %s", hkey) : NULL;
            tg_buf_t j;
            tg_buf_init(&j);
            tg_buf_appends(&j, "[");
            int n = 0;
            for (size_t i = 0; h && h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2)
                n += tg__billing_hold_record(&j, n == 0, h->element[i]->str, h->element[i + 1]->str, now,
                                             (uint64_t)older_ms, NULL, NULL);
            tg_buf_appends(&j, "]");
            if (h)
                freeReplyObject(h);
            int64_t tenant = atoll(hkey + 3); /* {t:T}:holds */
            const char *params[1] = {j.data};
            PGresult *r = n ? PQexecParams(c, tg__billing_orphans_sql, 1, NULL, params, NULL, NULL, 0) : NULL;
            for (int i = 0; r && PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++) {
                const char *rid = PQgetvalue(r, i, TG__ORPH_RID);
                int att = atoi(PQgetvalue(r, i, TG__ORPH_ATT));
                int64_t key = atoll(PQgetvalue(r, i, TG__ORPH_KEY));
                if (!strcmp(PQgetvalue(r, i, TG__ORPH_SETTLED), "t")) {
                    ledger_hold_return(rc, tenant, key, rid, att, atoll(PQgetvalue(r, i, TG__ORPH_COST)));
                    continue;
                }
                if (!strcmp(PQgetvalue(r, i, TG__ORPH_HAS_ROW), "t"))
                    continue; /* its row is there: the rows pass settles it */
                char amount[32];
                tg_money_format(atoll(PQgetvalue(r, i, TG__ORPH_AMOUNT)), amount);
                tg_buf_t e;
                tg_buf_init(&e);
                tg_buf_appends(&e, "[{\"op\":\"reserve\",\"request_id\":\"");
                tg_buf_append_json_escaped(&e, rid, strlen(rid));
                tg_buf_printf(&e, "\",\"attempt\":%d,\"tenant_id\":%lld,\"api_key_id\":%lld,\"amount\":\"%s\",\"model\":\"",
                              att, (long long)tenant, (long long)key, amount);
                const char *model = PQgetvalue(r, i, TG__ORPH_MODEL), *inst = PQgetvalue(r, i, TG__ORPH_INSTANCE);
                tg_buf_append_json_escaped(&e, model, strlen(model));
                tg_buf_appends(&e, "\",\"instance\":\"");
                tg_buf_append_json_escaped(&e, inst, strlen(inst));
                tg_buf_printf(&e, "\",\"state\":\"pending_reconciliation\",\"note\":\"orphaned hold: its gateway died "
                                  "before Postgres had the row\",\"created_ms\":%s}]",
                              PQgetvalue(r, i, TG__ORPH_MS));
                const char *p[1] = {e.data};
                PGresult *w = PQexecParams(c, "SELECT request_id, outcome FROM tg_settle_batch($1::jsonb)", 1, NULL, p,
                                           NULL, NULL, 0);
                if (PQresultStatus(w) == PGRES_TUPLES_OK) {
                    printf("%s:%d orphaned hold recorded (pending_reconciliation)\n", rid, att);
                    rows++;
                } else {
                    fprintf(stderr, "ledger reconcile: %s: %s", rid, PQerrorMessage(c));
                }
                PQclear(w);
                tg_buf_free(&e);
            }
            if (r)
                PQclear(r);
            tg_buf_free(&j);
        }
        freeReplyObject(page);
    } while (strcmp(cursor, "0"));
    return rows;
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
    if (rc && tg_redis_url_is_cluster(redis_url)) { /* every primary's holds */
        tg_redis_slotmap_t *m = malloc(sizeof(*m));
        if (m)
            m->tls = strncmp(redis_url, "rediss", 6) == 0;
        if (!m || tg_redis_sync_map(rc, m) != TG_OK) {
            fprintf(stderr, "ledger reconcile: Redis: could not read the cluster's slot map\n");
        } else {
            for (int i = 0; i < m->nnodes; i++) {
                redisContext *n = tg_redis_connect_sync_node(redis_url, m->nodes[i].host, m->nodes[i].port, 2000, rerr,
                                                             sizeof(rerr));
                if (!n) {
                    fprintf(stderr, "ledger reconcile: Redis: %s: its holds are not scanned\n", rerr);
                    continue;
                }
                ledger_orphaned_holds(c, n, older_than_ms);
                redisFree(n);
            }
        }
        free(m);
    } else if (rc) {
        ledger_orphaned_holds(c, rc, older_than_ms);
    }
    char ms[16];
    snprintf(ms, sizeof(ms), "%d", older_than_ms);
    /* An operator's explicit pass: every instance counts as gone (run it when the
     * gateways that held these requests are stopped, or with --older-than-ms above the
     * longest request). */
    const char *params[2] = {ms, "{}"};
    PGresult *due = PQexecParams(c, tg__billing_due_sql, 2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(due) != PGRES_TUPLES_OK) {
        fprintf(stderr, "ledger reconcile: %s", PQerrorMessage(c));
        PQclear(due);
        PQfinish(c);
        return 1;
    }
    int settled = 0;
    for (int i = 0; i < PQntuples(due); i++) {
        tg_settlement_t s = tg__billing_due_settlement(due, i, charge_unknown);
        s.unheld = 0; /* no live balance to debit here: Redis reloads it from Postgres */
        tg_buf_t text;
        tg_buf_init(&text);
        tg_buf_appends(&text, "[");
        tg__billing_settlement_text(&s, &text);
        tg_buf_append(&text, "]", 2); /* with its NUL */
        const char *p[1] = {text.data};
        PGresult *r = PQexecParams(c, "SELECT request_id, outcome FROM tg_settle_batch($1::jsonb)", 1, NULL, p, NULL,
                                   NULL, 0);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
            printf("%s %s (%s)\n", PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1),
                   charge_unknown ? "charged the reserved bound" : "released");
            settled++;
            for (int a = 1; rc && a <= TG_MAX(s.attempts, 1); a++) {
                char keys[4][128], field[96], actual[24];
                tg__billing_hold_keys(keys, field, s.tenant_id, s.key_id, s.request_id, a);
                snprintf(actual, sizeof(actual), "%lld", (long long)(a == TG_MAX(s.attempts, 1) ? s.cost : 0));
                /* settle.lua's layout: money, holds, then the hold's reservation and key budget. */
                const char *argv[9] = {"EVAL", tg_scripts_source("settle"), "4", keys[0], keys[3], keys[1], keys[2],
                                       actual, field};
                redisReply *rep = tg_redis_sync_argv(&rc, redis_url, 2000, 9, argv, NULL);
                if (rep)
                    freeReplyObject(rep);
            }
        } else {
            fprintf(stderr, "ledger reconcile: %s: %s", s.request_id, PQerrorMessage(c));
        }
        PQclear(r);
        tg_buf_free(&text);
    }
    PQclear(due);
    if (rc)
        redisFree(rc);
    PQfinish(c);
    printf("ledger reconcile: %d request(s) settled\n", settled);
    return 0;
}
