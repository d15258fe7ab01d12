/*
 * `tollgate usage partitions|drop|rebuild` (see tg_usage_store.h): a one-shot command
 * with a blocking libpq connection, like `tollgate ledger`. What it runs is SQL of
 * sql/0009_partitions.sql (tg_partitions_ensure, tg_partition_drop) and
 * sql/0010_rollups.sql (tg_usage_rebuild_day); this file decides what retention allows
 * and prints.
 */
#include "tollgate/tg_usage_store.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_common.h"

static PGconn *connect_pg(const char *what, const char *conninfo) {
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "usage %s: cannot connect to Postgres: %s", what, PQerrorMessage(c));
        PQfinish(c);
        return NULL;
    }
    return c;
}

/* Runs sql (no result wanted); prints Postgres' message on failure. */
static int exec_ok(PGconn *c, const char *what, const char *sql) {
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "usage %s: %s", what, PQerrorMessage(c));
    PQclear(r);
    return ok ? TG_OK : TG_ERROR;
}

/* The partitions retention allows to drop, oldest first: usage days whose end is older
 * than usage_days, ledger months whose end is older than ledger_days, and the legacy
 * usage partition (rows without a start in their id) once its newest row is older than
 * usage_days. Never a DEFAULT partition; never anything with retention 0. */
static const char DROPPABLE_SQL[] =
    "SELECT p.name, p.parent FROM detail_partitions p WHERE p.dropped_at IS NULL AND ("
    "(p.parent = 'usage' AND $1::int > 0 AND ((NOT p.legacy AND p.hi <= now() - $1::int * interval '1 day') OR "
    "(p.legacy AND NOT EXISTS (SELECT 1 FROM usage_legacy u WHERE u.created_at >= now() - $1::int * interval '1 "
    "day')))) OR (p.parent = 'ledger' AND $2::int > 0 AND p.hi <= now() - $2::int * interval '1 day')) "
    "ORDER BY p.parent, p.lo";

static PGresult *droppable(PGconn *c, const tg_usage_cmd_t *cmd) {
    char ud[16], ld[16];
    snprintf(ud, sizeof(ud), "%d", cmd->usage_retention_days);
    snprintf(ld, sizeof(ld), "%d", cmd->ledger_retention_days);
    const char *params[2] = {ud, ld};
    PGresult *r = PQexecParams(c, DROPPABLE_SQL, 2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        fprintf(stderr, "usage: %s", PQerrorMessage(c));
        PQclear(r);
        return NULL;
    }
    return r;
}

static void print_size(long long bytes, char out[32]) {
    if (bytes >= 10LL << 30)
        snprintf(out, 32, "%lld GiB", bytes >> 30);
    else if (bytes >= 10LL << 20)
        snprintf(out, 32, "%lld MiB", bytes >> 20);
    else if (bytes >= 10LL << 10)
        snprintf(out, 32, "%lld KiB", bytes >> 10);
    else
        snprintf(out, 32, "%lld B", bytes);
}

int tg_usage_partitions_main(const tg_usage_cmd_t *cmd) {
    PGconn *c = connect_pg("partitions", cmd->pg_conninfo);
    if (!c)
        return 1;
    if (exec_ok(c, "partitions", "SELECT tg_partitions_ensure(7)") != TG_OK) {
        PQfinish(c);
        return 1;
    }
    PGresult *dr = droppable(c, cmd);
    if (!dr) {
        PQfinish(c);
        return 1;
    }
    /* Every partition, the DEFAULT ones included (rows there wait for their partition). */
    PGresult *r = PQexec(c, "SELECT p.name, p.parent, CASE WHEN p.legacy THEN 'legacy' ELSE to_char(p.lo AT TIME ZONE "
                            "'UTC', 'YYYY-MM-DD') END, CASE WHEN p.legacy AND p.parent = 'usage' THEN 'no start in the "
                            "request id' ELSE to_char(p.hi AT TIME ZONE 'UTC', 'YYYY-MM-DD') END, c.oid IS NOT NULL, "
                            "greatest(c.reltuples, 0)::bigint, coalesce(pg_total_relation_size(c.oid), 0), "
                            "p.dropped_at IS NOT NULL, to_char(p.dropped_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'), "
                            "p.dropped_rows FROM (SELECT name, parent, lo, hi, legacy, dropped_at, dropped_rows FROM "
                            "detail_partitions UNION ALL SELECT t || '_default', t, 'infinity', 'infinity', false, "
                            "NULL, NULL FROM unnest(ARRAY['usage', 'ledger']) t) p LEFT JOIN pg_class c ON c.relname "
                            "= p.name AND c.relkind = 'r' ORDER BY p.parent DESC, p.lo");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        fprintf(stderr, "usage partitions: %s", PQerrorMessage(c));
        PQclear(r);
        PQclear(dr);
        PQfinish(c);
        return 1;
    }
    printf("retention: usage %d day(s), ledger %d day(s) (0: kept for ever; billing.*_retention_days)\n",
           cmd->usage_retention_days, cmd->ledger_retention_days);
    printf("%-18s %-7s %-10s %-26s %14s %10s  %s\n", "partition", "table", "from", "to", "rows", "size",
           "retention");
    for (int i = 0; i < PQntuples(r); i++) {
        const char *name = PQgetvalue(r, i, 0);
        int is_default = strstr(name, "_default") != NULL;
        char rows[32] = "-", size[32] = "-", state[160];
        if (!strcmp(PQgetvalue(r, i, 7), "t")) {
            snprintf(state, sizeof(state), "dropped %s UTC, %s row(s) carried forward", PQgetvalue(r, i, 8),
                     PQgetvalue(r, i, 9));
        } else {
            if (cmd->exact || is_default) {
                char sql[160];
                snprintf(sql, sizeof(sql), "SELECT count(*) FROM \"%s\"", name);
                PGresult *n = PQexec(c, sql);
                snprintf(rows, sizeof(rows), "%s", PQresultStatus(n) == PGRES_TUPLES_OK ? PQgetvalue(n, 0, 0) : "?");
                PQclear(n);
            } else {
                snprintf(rows, sizeof(rows), "~%s", PQgetvalue(r, i, 5));
            }
            print_size(atoll(PQgetvalue(r, i, 6)), size);
            int drop = 0;
            for (int k = 0; k < PQntuples(dr); k++)
                drop |= !strcmp(PQgetvalue(dr, k, 0), name);
            snprintf(state, sizeof(state), "%s",
                     is_default ? "rows no partition covers yet (moved when theirs is made)"
                     : drop     ? "past retention: `tollgate usage drop` drops it"
                                : "kept");
        }
        printf("%-18s %-7s %-10s %-26s %14s %10s  %s\n", name, PQgetvalue(r, i, 1),
               is_default ? "(default)" : PQgetvalue(r, i, 2), is_default ? "" : PQgetvalue(r, i, 3), rows, size,
               state);
    }
    PQclear(r);
    PQclear(dr);
    PQfinish(c);
    return 0;
}

int tg_usage_drop_main(const tg_usage_cmd_t *cmd) {
    PGconn *c = connect_pg("drop", cmd->pg_conninfo);
    if (!c)
        return 1;
    if (!cmd->usage_retention_days && !cmd->ledger_retention_days) {
        printf("usage drop: nothing to drop: billing.usage_retention_days and billing.ledger_retention_days are 0 "
               "(every partition is kept)\n");
        PQfinish(c);
        return 0;
    }
    if (!cmd->dry_run && exec_ok(c, "drop", "SELECT tg_partitions_ensure(7)") != TG_OK) {
        PQfinish(c);
        return 1;
    }
    PGresult *dr = droppable(c, cmd);
    if (!dr) {
        PQfinish(c);
        return 1;
    }
    int failed = 0, dropped = 0;
    for (int i = 0; i < PQntuples(dr); i++) {
        const char *name = PQgetvalue(dr, i, 0);
        if (cmd->dry_run) {
            printf("would drop %s (%s)\n", name, PQgetvalue(dr, i, 1));
            continue;
        }
        /* Each partition in its own transaction: its totals carried forward, then the
         * table dropped (tg_partition_drop). */
        const char *params[1] = {name};
        PGresult *r = PQexecParams(c, "SELECT tg_partition_drop($1)", 1, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(r) == PGRES_TUPLES_OK) {
            printf("dropped %s (%s): %s row(s), their totals carried forward\n", name, PQgetvalue(dr, i, 1),
                   PQgetvalue(r, 0, 0));
            dropped++;
        } else {
            fprintf(stderr, "usage drop: %s: %s", name, PQerrorMessage(c));
            failed++;
        }
        PQclear(r);
    }
    if (!PQntuples(dr))
        printf("usage drop: nothing past retention (usage %d day(s), ledger %d day(s))\n", cmd->usage_retention_days,
               cmd->ledger_retention_days);
    else if (!cmd->dry_run)
        printf("usage drop: %d partition(s) dropped\n", dropped);
    PQclear(dr);
    PQfinish(c);
    return failed ? 1 : 0;
}

int tg_usage_rebuild_main(const tg_usage_cmd_t *cmd) {
    PGconn *c = connect_pg("rebuild", cmd->pg_conninfo);
    if (!c)
        return 1;
    /* The days to rebuild: those asked for, within what the partitions still hold (a
     * dropped day's rollups are all that is left of it: never recomputed from nothing). */
    const char *params[2] = {cmd->from, cmd->to};
    PGresult *days = PQexecParams(c, "SELECT d::date::text FROM tg_usage_days($1::date, $2::date) d ORDER BY d", 2,
                                  NULL, params, NULL, NULL, 0);
    if (PQresultStatus(days) != PGRES_TUPLES_OK) {
        fprintf(stderr, "usage rebuild: %s", PQerrorMessage(c));
        PQclear(days);
        PQfinish(c);
        return 1;
    }
    int failed = 0;
    long long rows = 0;
    for (int i = 0; i < PQntuples(days); i++) {
        const char *p[1] = {PQgetvalue(days, i, 0)};
        /* One day per transaction: the rollups of that day are locked against the
         * settlement batches while they are recomputed (seconds for a busy day). */
        PGresult *r = PQexecParams(c, "SELECT tg_usage_rebuild_day($1::date)", 1, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(r) == PGRES_TUPLES_OK) {
            printf("%s: %s usage row(s) rolled up\n", p[0], PQgetvalue(r, 0, 0));
            rows += atoll(PQgetvalue(r, 0, 0));
        } else {
            fprintf(stderr, "usage rebuild: %s: %s", p[0], PQerrorMessage(c));
            failed++;
        }
        PQclear(r);
    }
    printf("usage rebuild: %d day(s), %lld usage row(s)%s\n", PQntuples(days), rows, failed ? ", with failures" : "");
    PQclear(days);
    PQfinish(c);
    return failed ? 1 : 0;
}
