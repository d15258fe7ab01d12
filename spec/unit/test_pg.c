/*
 * The Postgres pool (tg_pg.c) against a real server: TOLLGATE_PG is a libpq conninfo
 * (spec/run.sh starts a private server and sets it). Each test runs its own uv_loop and
 * ends with the pool destroyed and the loop closed cleanly. Without TOLLGATE_PG,
 * `tg_unit pg` exits 77 (skipped) and the tests pass vacuously when run with the rest.
 */
#include <libpq-fe.h>
#include <stdint.h>
#include <unistd.h>
#include <uv.h>

#include "tg_test.h"
#include "tollgate/tg_pg.h"

/* `tg_unit pg` without a server: skip the module (glibc passes argc/argv to constructors). */
__attribute__((constructor)) static void pg_skip_without_server(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "pg") == 0 && !getenv("TOLLGATE_PG")) {
        fprintf(stderr, "skipped: TOLLGATE_PG (a libpq conninfo) is not set\n");
        exit(77);
    }
}

#define NEED_PG()                                                                           \
    const char *conninfo = getenv("TOLLGATE_PG");                                           \
    if (!conninfo) {                                                                        \
        fprintf(stderr, "skipped: TOLLGATE_PG is not set\n");                               \
        return;                                                                             \
    }

typedef struct {
    int calls;
    const char *err; /* the pointer the callback got */
    char errtext[256];
    int had_res;
    int isnull;
    char val[128];
    char val2[128];
    char sqlstate[8];
} result_t;

static void on_result(void *ud, const PGresult *res, const char *err) {
    result_t *r = ud;
    r->calls++;
    r->err = err;
    snprintf(r->errtext, sizeof(r->errtext), "%s", err ? err : "");
    r->had_res = res != NULL;
    if (!res)
        return;
    const char *st = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    snprintf(r->sqlstate, sizeof(r->sqlstate), "%s", st ? st : "");
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) > 0) {
        r->isnull = PQgetisnull(res, 0, 0);
        snprintf(r->val, sizeof(r->val), "%s", PQgetvalue(res, 0, 0));
        if (PQnfields(res) > 1)
            snprintf(r->val2, sizeof(r->val2), "%s", PQgetvalue(res, 0, 1));
    }
}

static void on_never(void *ud, const PGresult *res, const char *err) {
    (void)res;
    (void)err;
    ++*(int *)ud;
}

static void wake(uv_timer_t *t) { (void)t; }

/* Runs the loop until *count >= want or ms pass; returns whether it got there. */
static int run_until(uv_loop_t *loop, const int *count, int want, int ms) {
    uv_timer_t tick;
    uv_timer_init(loop, &tick);
    uv_timer_start(&tick, wake, 5, 5);
    uv_update_time(loop);
    uint64_t end = uv_now(loop) + (uint64_t)ms;
    while (*count < want && uv_now(loop) < end)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return *count >= want;
}

static void run_for(uv_loop_t *loop, int ms) {
    int never = 0;
    run_until(loop, &never, 1, ms);
}

static int connected_count;
static void wait_connected(uv_loop_t *loop, tg_pg_t *pg, int want) {
    uv_update_time(loop);
    uint64_t end = uv_now(loop) + 5000;
    while (tg_pg_connected(pg) < want && uv_now(loop) < end)
        run_for(loop, 5);
    connected_count = tg_pg_connected(pg);
    ASSERT_EQ_INT(connected_count, want);
}

/* Destroys the pool, lets every handle close, and checks the loop is empty. */
static void finish(uv_loop_t *loop, tg_pg_t *pg) {
    tg_pg_destroy(pg);
    uv_run(loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(loop), 0);
}

/* A blocking side connection, to look at and meddle with the server. */
static PGconn *side_connect(const char *conninfo) {
    PGconn *c = PQconnectdb(conninfo);
    ASSERT(PQstatus(c) == CONNECTION_OK);
    return c;
}

static void side_exec(PGconn *c, const char *sql) {
    PGresult *res = PQexec(c, sql);
    if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
        fprintf(stderr, "side_exec(%s): %s", sql, PQerrorMessage(c));
    ASSERT(PQresultStatus(res) == PGRES_TUPLES_OK || PQresultStatus(res) == PGRES_COMMAND_OK);
    PQclear(res);
}

TG_TEST(pg, basic_query) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 2, 5000);
    ASSERT(pg);
    result_t r = {0};
    const char *params[] = {"41"};
    ASSERT(tg_pg_query(pg, "SELECT $1::int + 1", 1, params, on_result, &r));
    ASSERT_EQ_INT(r.calls, 0); /* never from inside the call */
    ASSERT(run_until(&loop, &r.calls, 1, 5000));
    ASSERT(r.err == NULL);
    ASSERT_EQ_STR(r.val, "42");
    wait_connected(&loop, pg, 2);
    ASSERT_EQ_INT(tg_pg_stats(pg)->requests, 1);
    finish(&loop, pg);
}

TG_TEST(pg, prepared_statement) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 2, 5000);
    /* Registered before the connections are up: prepared as each comes up. */
    ASSERT_EQ_INT(tg_pg_prepare(pg, "add", "SELECT $1::int + $2::int", 2), TG_OK);
    ASSERT_EQ_INT(tg_pg_prepare(pg, "add", "SELECT 1", 0), TG_ERROR);
    const char *params[] = {"2", "3"};
    result_t r = {0};
    ASSERT(tg_pg_exec(pg, "add", 2, params, on_result, &r));
    ASSERT(run_until(&loop, &r.calls, 1, 5000));
    ASSERT(r.err == NULL);
    ASSERT_EQ_STR(r.val, "5");

    /* Wrong calls fail at once and never call back. */
    int never = 0;
    ASSERT(tg_pg_exec(pg, "nope", 0, NULL, on_never, &never) == NULL);
    ASSERT(tg_pg_exec(pg, "add", 1, params, on_never, &never) == NULL);

    /* Registered after the connections are up: prepared before its first use on each. */
    wait_connected(&loop, pg, 2);
    ASSERT_EQ_INT(tg_pg_prepare(pg, "mul", "SELECT $1::int * $2::int", 2), TG_OK);
    result_t m[6];
    memset(m, 0, sizeof(m));
    int done = 0;
    for (int i = 0; i < 6; i++)
        ASSERT(tg_pg_exec(pg, "mul", 2, params, on_result, &m[i]));
    for (int i = 0; i < 6; i++) {
        ASSERT(run_until(&loop, &m[i].calls, 1, 5000));
        ASSERT(m[i].err == NULL);
        ASSERT_EQ_STR(m[i].val, "6");
        done++;
    }
    ASSERT_EQ_INT(done, 6);
    /* A statement that fails to prepare reports the server's error when run. */
    ASSERT_EQ_INT(tg_pg_prepare(pg, "bad", "SELEC nonsense", 0), TG_OK);
    result_t b = {0};
    ASSERT(tg_pg_exec(pg, "bad", 0, NULL, on_result, &b));
    ASSERT(run_until(&loop, &b.calls, 1, 5000));
    ASSERT(b.err != NULL && b.had_res);
    ASSERT_EQ_STR(b.sqlstate, "26000"); /* invalid_sql_statement_name */
    ASSERT_EQ_INT(never, 0);
    finish(&loop, pg);
}

TG_TEST(pg, null_params) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 1, 5000);
    const char *params[] = {NULL, "x"};
    result_t r = {0};
    ASSERT(tg_pg_query(pg, "SELECT $1::text IS NULL, coalesce($1::text, 'was null') || $2", 2, params, on_result,
                       &r));
    ASSERT(run_until(&loop, &r.calls, 1, 5000));
    ASSERT(r.err == NULL);
    ASSERT_EQ_STR(r.val, "t");
    ASSERT_EQ_STR(r.val2, "was nullx");

    ASSERT_EQ_INT(tg_pg_prepare(pg, "echo", "SELECT $1::text", 1), TG_OK);
    result_t e = {0};
    ASSERT(tg_pg_exec(pg, "echo", 1, params, on_result, &e));
    ASSERT(run_until(&loop, &e.calls, 1, 5000));
    ASSERT(e.err == NULL);
    ASSERT_EQ_INT(e.isnull, 1);
    finish(&loop, pg);
}

TG_TEST(pg, server_error_with_sqlstate) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 2, 5000);
    char create[128], insert[128], drop[128];
    snprintf(create, sizeof(create), "CREATE TABLE tg_unit_pg_%d (id int PRIMARY KEY)", (int)getpid());
    snprintf(insert, sizeof(insert), "INSERT INTO tg_unit_pg_%d VALUES ($1::int)", (int)getpid());
    snprintf(drop, sizeof(drop), "DROP TABLE IF EXISTS tg_unit_pg_%d", (int)getpid());
    result_t c = {0}, i1 = {0}, i2 = {0}, z = {0}, ok = {0}, d = {0};
    const char *one[] = {"1"};
    tg_pg_query(pg, drop, 0, NULL, on_result, &d);
    ASSERT(run_until(&loop, &d.calls, 1, 5000));
    tg_pg_query(pg, create, 0, NULL, on_result, &c);
    ASSERT(run_until(&loop, &c.calls, 1, 5000));
    ASSERT(c.err == NULL);
    tg_pg_query(pg, insert, 1, one, on_result, &i1);
    ASSERT(run_until(&loop, &i1.calls, 1, 5000));
    ASSERT(i1.err == NULL);
    tg_pg_query(pg, insert, 1, one, on_result, &i2);
    ASSERT(run_until(&loop, &i2.calls, 1, 5000));
    ASSERT(i2.err != NULL);
    ASSERT(i2.had_res);
    ASSERT_EQ_STR(i2.sqlstate, "23505");
    ASSERT(strstr(i2.errtext, "duplicate key") != NULL);

    tg_pg_query(pg, "SELECT 1/0", 0, NULL, on_result, &z);
    ASSERT(run_until(&loop, &z.calls, 1, 5000));
    ASSERT_EQ_STR(z.sqlstate, "22012");
    ASSERT_EQ_STR(z.errtext, "division by zero");

    /* The connections are fine afterwards. */
    char tname[64];
    snprintf(tname, sizeof(tname), "tg_unit_pg_%d", (int)getpid());
    const char *tparams[] = {tname};
    tg_pg_query(pg, "SELECT count(*) FROM pg_class WHERE relname = $1", 1, tparams, on_result, &ok);
    ASSERT(run_until(&loop, &ok.calls, 1, 5000));
    ASSERT(ok.err == NULL);
    ASSERT_EQ_STR(ok.val, "1");
    ASSERT_EQ_INT(tg_pg_stats(pg)->errors, 2);
    memset(&d, 0, sizeof(d));
    tg_pg_query(pg, drop, 0, NULL, on_result, &d);
    ASSERT(run_until(&loop, &d.calls, 1, 5000));
    ASSERT(d.err == NULL);
    wait_connected(&loop, pg, 2);
    ASSERT_EQ_INT(tg_pg_stats(pg)->disconnects, 0);
    finish(&loop, pg);
}

typedef struct {
    int *done;
    int n;
    int ok;
    int pid;
} conc_t;

static void on_conc(void *ud, const PGresult *res, const char *err) {
    conc_t *c = ud;
    ++*c->done;
    if (!err && res && PQntuples(res) == 1 && atoi(PQgetvalue(res, 0, 0)) == c->n) {
        c->ok = 1;
        c->pid = atoi(PQgetvalue(res, 0, 1));
    }
}

TG_TEST(pg, two_hundred_concurrent_on_four) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 4, 10000);
    ASSERT_EQ_INT(tg_pg_prepare(pg, "n", "SELECT $1::int, pg_backend_pid()", 1), TG_OK);
    wait_connected(&loop, pg, 4);
    static conc_t c[200];
    int done = 0;
    for (int i = 0; i < 200; i++) {
        char n[16];
        snprintf(n, sizeof(n), "%d", i);
        const char *params[] = {n};
        c[i] = (conc_t){&done, i, 0, 0};
        ASSERT(tg_pg_exec(pg, "n", 1, params, on_conc, &c[i]));
    }
    ASSERT_EQ_INT(done, 0);
    ASSERT(run_until(&loop, &done, 200, 10000));
    int pids[200], npids = 0;
    for (int i = 0; i < 200; i++) {
        ASSERT(c[i].ok);
        int seen = 0;
        for (int j = 0; j < npids; j++)
            seen |= pids[j] == c[i].pid;
        if (!seen)
            pids[npids++] = c[i].pid;
    }
    ASSERT_EQ_INT(npids, 4); /* every connection took work */
    ASSERT_EQ_INT(tg_pg_stats(pg)->requests, 200);
    finish(&loop, pg);
}

TG_TEST(pg, timeout_cancels_and_pool_recovers) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 2, 200);
    wait_connected(&loop, pg, 2);
    char marker[64], sql[128];
    snprintf(marker, sizeof(marker), "tg_unit_timeout_%d", (int)getpid());
    snprintf(sql, sizeof(sql), "SELECT pg_sleep(2) /* %s */", marker);
    result_t r = {0};
    uint64_t t0 = uv_hrtime();
    ASSERT(tg_pg_query(pg, sql, 0, NULL, on_result, &r));
    ASSERT(run_until(&loop, &r.calls, 1, 3000));
    uint64_t ms = (uv_hrtime() - t0) / 1000000;
    ASSERT(r.err == tg_pg_err_timeout);
    ASSERT(!r.had_res);
    ASSERT(ms >= 150 && ms < 1000);
    ASSERT_EQ_INT(tg_pg_stats(pg)->timeouts, 1);

    /* The pool answers afterwards (the timed-out connection is replaced). */
    for (int i = 0; i < 4; i++) {
        result_t ok = {0};
        ASSERT(tg_pg_query(pg, "SELECT 7", 0, NULL, on_result, &ok));
        ASSERT(run_until(&loop, &ok.calls, 1, 3000));
        ASSERT(ok.err == NULL);
        ASSERT_EQ_STR(ok.val, "7");
    }
    wait_connected(&loop, pg, 2);

    /* The sleeping statement was cancelled in the server, not left running. */
    PGconn *side = side_connect(conninfo);
    const char *params[] = {marker};
    int left = -1;
    for (int i = 0; i < 50 && left != 0; i++) {
        PGresult *res = PQexecParams(side,
                                     "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                                     "AND state = 'active' AND query LIKE '%' || $1 || '%'",
                                     1, NULL, params, NULL, NULL, 0);
        ASSERT(PQresultStatus(res) == PGRES_TUPLES_OK);
        left = atoi(PQgetvalue(res, 0, 0));
        PQclear(res);
        if (left)
            usleep(20000);
    }
    ASSERT_EQ_INT(left, 0);
    PQfinish(side);
    finish(&loop, pg);
}

TG_TEST(pg, queued_without_server_is_not_connected) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, "host=/nonexistent-tollgate-dir dbname=x connect_timeout=1", 2, 200);
    ASSERT(pg);
    result_t r = {0};
    ASSERT(tg_pg_query(pg, "SELECT 1", 0, NULL, on_result, &r));
    ASSERT(run_until(&loop, &r.calls, 1, 2000));
    ASSERT(r.err == tg_pg_err_not_connected);
    ASSERT_EQ_INT(tg_pg_connected(pg), 0);
    finish(&loop, pg);
}

/* Asks the pool for the backend pids of all its `n` connections at once. */
static void pool_pids(uv_loop_t *loop, tg_pg_t *pg, int n, int *pids) {
    result_t r[8];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < n; i++)
        ASSERT(tg_pg_query(pg, "SELECT pg_backend_pid(), pg_sleep(0.05)", 0, NULL, on_result, &r[i]));
    for (int i = 0; i < n; i++) {
        ASSERT(run_until(loop, &r[i].calls, 1, 5000));
        ASSERT(r[i].err == NULL);
        pids[i] = atoi(r[i].val);
        for (int j = 0; j < i; j++)
            ASSERT(pids[j] != pids[i]);
    }
}

TG_TEST(pg, reconnects_after_backends_are_terminated) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 3, 5000);
    ASSERT_EQ_INT(tg_pg_prepare(pg, "pid", "SELECT pg_backend_pid()", 0), TG_OK);
    wait_connected(&loop, pg, 3);
    int pids[3];
    pool_pids(&loop, pg, 3, pids);

    PGconn *side = side_connect(conninfo);
    for (int i = 0; i < 3; i++) {
        char sql[96];
        snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)", pids[i]);
        side_exec(side, sql);
    }
    /* The pool notices on its own (idle connections keep reading). */
    uv_update_time(&loop);
    uint64_t end = uv_now(&loop) + 5000;
    while (tg_pg_stats(pg)->disconnects < 3 && uv_now(&loop) < end)
        run_for(&loop, 2);
    ASSERT_EQ_INT(tg_pg_stats(pg)->disconnects, 3);
    ASSERT(tg_pg_connected(pg) < 3);

    /* Requests made while the connections are down wait for them, then run. */
    result_t r[20];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 20; i++)
        ASSERT(tg_pg_exec(pg, "pid", 0, NULL, on_result, &r[i]));
    for (int i = 0; i < 20; i++) {
        ASSERT(run_until(&loop, &r[i].calls, 1, 5000));
        ASSERT(r[i].err == NULL);
        int pid = atoi(r[i].val);
        ASSERT(pid != pids[0] && pid != pids[1] && pid != pids[2]);
    }
    wait_connected(&loop, pg, 3);
    ASSERT_EQ_INT(tg_pg_stats(pg)->connects, 6);
    PQfinish(side);
    finish(&loop, pg);
}

TG_TEST(pg, backend_terminated_mid_query) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 1, 5000);
    int pid;
    pool_pids(&loop, pg, 1, &pid);
    result_t r = {0};
    ASSERT(tg_pg_query(pg, "SELECT pg_sleep(3)", 0, NULL, on_result, &r));
    run_for(&loop, 100);
    PGconn *side = side_connect(conninfo);
    char sql[96];
    snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%d)", pid);
    side_exec(side, sql);
    PQfinish(side);
    ASSERT(run_until(&loop, &r.calls, 1, 2000));
    ASSERT(r.err != NULL);
    ASSERT(r.err != tg_pg_err_timeout);
    if (r.had_res)
        ASSERT_EQ_STR(r.sqlstate, "57P01"); /* admin_shutdown */
    /* The next request runs on a new connection. */
    result_t ok = {0};
    ASSERT(tg_pg_query(pg, "SELECT pg_backend_pid()", 0, NULL, on_result, &ok));
    ASSERT(run_until(&loop, &ok.calls, 1, 5000));
    ASSERT(ok.err == NULL);
    ASSERT(atoi(ok.val) != pid);
    finish(&loop, pg);
}

TG_TEST(pg, cancel_means_no_callback) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 1, 5000);
    wait_connected(&loop, pg, 1);
    int never = 0;
    tg_pg_req_t *running = tg_pg_query(pg, "SELECT pg_sleep(0.2)", 0, NULL, on_never, &never);
    tg_pg_req_t *queued = tg_pg_query(pg, "SELECT 2", 0, NULL, on_never, &never);
    ASSERT(running && queued);
    run_for(&loop, 20);
    tg_pg_cancel(running); /* on the wire: its result is discarded */
    tg_pg_cancel(queued);  /* never sent */
    tg_pg_cancel(NULL);
    result_t r = {0};
    ASSERT(tg_pg_query(pg, "SELECT 3", 0, NULL, on_result, &r));
    ASSERT(run_until(&loop, &r.calls, 1, 5000));
    ASSERT(r.err == NULL);
    ASSERT_EQ_STR(r.val, "3");
    run_for(&loop, 50);
    ASSERT_EQ_INT(never, 0);
    ASSERT_EQ_INT(tg_pg_stats(pg)->disconnects, 0);
    finish(&loop, pg);
}

typedef struct {
    int ok, busy, other;
} busy_t;

static void on_busy(void *ud, const PGresult *res, const char *err) {
    busy_t *b = ud;
    (void)res;
    if (!err)
        b->ok++;
    else if (err == tg_pg_err_busy)
        b->busy++;
    else
        b->other++;
}

TG_TEST(pg, queue_is_bounded) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 1, 50000); /* 10,000 round trips on a loaded CI box */
    wait_connected(&loop, pg, 1);
    busy_t b = {0};
    /* One on the wire, TG_PG_MAX_QUEUE queued, then refusals. */
    for (int i = 0; i < TG_PG_MAX_QUEUE + 3; i++)
        ASSERT(tg_pg_query(pg, "SELECT 1", 0, NULL, on_busy, &b));
    ASSERT_EQ_INT(b.busy, 0); /* reported on the next loop turn */
    int total = 0;
    uv_update_time(&loop);
    uint64_t end = uv_now(&loop) + 50000;
    while ((total = b.ok + b.busy + b.other) < TG_PG_MAX_QUEUE + 3 && uv_now(&loop) < end)
        uv_run(&loop, UV_RUN_ONCE);
    ASSERT_EQ_INT(b.busy, 2);
    ASSERT_EQ_INT(b.other, 0);
    ASSERT_EQ_INT(b.ok, TG_PG_MAX_QUEUE + 1);
    ASSERT_EQ_INT(tg_pg_stats(pg)->busy, 2);
    finish(&loop, pg);
}

typedef struct {
    int shutdown, other;
} shut_t;

static void on_shut(void *ud, const PGresult *res, const char *err) {
    shut_t *s = ud;
    (void)res;
    if (err == tg_pg_err_shutdown)
        s->shutdown++;
    else
        s->other++;
}

TG_TEST(pg, destroy_reports_shutdown) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    tg_pg_t *pg = tg_pg_create(&loop, conninfo, 1, 5000);
    wait_connected(&loop, pg, 1);
    shut_t s = {0};
    ASSERT(tg_pg_query(pg, "SELECT pg_sleep(1)", 0, NULL, on_shut, &s));
    for (int i = 0; i < 3; i++)
        ASSERT(tg_pg_query(pg, "SELECT 1", 0, NULL, on_shut, &s));
    run_for(&loop, 20);
    tg_pg_destroy(pg);
    ASSERT_EQ_INT(s.shutdown, 4);
    ASSERT_EQ_INT(s.other, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(&loop), 0);
}

typedef struct {
    tg_pg_t *pg;
    int calls;
    int shutdowns;
} inner_t;

static void on_destroy_inside(void *ud, const PGresult *res, const char *err) {
    inner_t *in = ud;
    (void)res;
    if (err == tg_pg_err_shutdown) {
        in->shutdowns++;
        return;
    }
    in->calls++;
    tg_pg_destroy(in->pg); /* from inside the pool's own callback */
    ASSERT(tg_pg_query(in->pg, "SELECT 1", 0, NULL, on_destroy_inside, in) == NULL);
}

TG_TEST(pg, destroy_from_inside_a_callback) {
    NEED_PG();
    uv_loop_t loop;
    uv_loop_init(&loop);
    inner_t in = {0};
    in.pg = tg_pg_create(&loop, conninfo, 2, 5000);
    for (int i = 0; i < 5; i++)
        ASSERT(tg_pg_query(in.pg, "SELECT 1", 0, NULL, on_destroy_inside, &in));
    ASSERT(run_until(&loop, &in.calls, 1, 5000));
    ASSERT_EQ_INT(in.calls, 1);
    ASSERT_EQ_INT(in.shutdowns, 4);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(&loop), 0);
}
