/*
 * The gateway's settlement path without HTTP: billing (core/src/domain/tg_billing*.c, linked from
 * libtollgate_core.a) against a real Postgres and Redis, driven the way the pipeline (app/tg_proxy*.c)
 * drives it — tg_billing_reserve (the Redis hold; its `reserve` element joins the
 * settlement queue), then, once reserved, tg_billing_settle with the request's usage
 * (the hold's unused part goes back in Redis; the settlement element joins the queue) —
 * for N distinct requests, as fast as the API accepts them. Nothing else runs in the
 * process, so what it measures is how fast the billing instance gets settlements
 * durably into Postgres (grouped by its batcher into tg_settle_batch calls), not how
 * fast an HTTP stack can produce them.
 *
 *   billing_settle_bench N WORKERS WINDOW BACKLOG SPOOL_DIR
 *     N        requests in all, split evenly over the workers
 *     WORKERS  billing instances, one per thread, each with its own loop, Postgres pool
 *              and Redis connection: what WORKERS gateway workers have
 *     WINDOW   reservations in flight per worker at most (requests being proxied)
 *     BACKLOG  settled-but-not-yet-committed requests per worker at most before the
 *              driver waits (0: never waits; then a queue that reaches queue_max spills
 *              to the spool, as in the gateway, and is replayed from there)
 *   Postgres and Redis from TOLLGATE_PG and TOLLGATE_REDIS; the (tenant, key) pairs of
 *   tenants named 'bench%' are used round robin.
 *
 * A request counts as committed when its batch's tg_settle_batch returned "settled" for
 * it (tg_billing_stats: settled). Prints one line of key=value: wall seconds from the
 * first reservation until every settlement is committed, committed per second, the
 * batches, this process's CPU per request, reservations refused or failed. Progress (per
 * second) goes to stderr. Only the public API is used.
 */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "tollgate/tg_billing.h"
#include "tollgate/tg_config.h"
#include "tollgate/tg_pg.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_state.h"

#define MAX_PAIRS 64
static int64_t pair_tenant[MAX_PAIRS], pair_key[MAX_PAIRS];
static int npairs;
static long n_per_worker, window, backlog;
static const char *spool_dir;
static pthread_barrier_t start_barrier;
/* A price like the integration tests': 1.00 USD / M input, 2.00 USD / M output. */
static const tg_price_t PRICE = {.input = 1000000000, .output = 2000000000};

typedef struct worker_s {
    int index;
    uv_loop_t loop;
    uv_timer_t tick, progress;
    tg_state_t *st;
    tg_billing_t *billing;
    long issued, inflight, settled_calls, failed, refused;
    uint64_t t0_ns, t_end_ns, t_accepted_ns;
    uint64_t last_settled;
    uint64_t last_tick_ns, max_gap_ns, gaps_over_10ms; /* the 1 ms tick: how long the loop was blocked */
    uint64_t last_tick_cpu_ns, max_busy_ns, busy_over_10ms; /* the thread's CPU between two ticks: its own work */
    int done;
    char id_prefix[40];
} worker_t;

typedef struct {
    worker_t *w;
    char id[64];
    int64_t tenant, key;
} req_t;

static void pump(worker_t *w);

static void reserved_cb(void *ud, int status, const char *code, const char *msg) {
    req_t *r = ud;
    worker_t *w = r->w;
    w->inflight--;
    if (status != 0) {
        if (status == 402)
            w->refused++;
        else
            w->failed++;
        if (w->failed + w->refused <= 5)
            fprintf(stderr, "billing_settle_bench: worker %d: reservation %s: %d %s %s\n", w->index, r->id, status,
                    code ? code : "", msg ? msg : "");
        free(r);
        pump(w);
        return;
    }
    /* The upstream answered: settle the usage it reported, as tg_proxy_settle.c does at the end
     * of a request. Distinct numbers per request (a real mix, not one repeated row). */
    long i = w->settled_calls;
    tg_usage_t u = {.input = 200 + i % 300, .output = 50 + i % 150, .known = TG_USAGE_INPUT | TG_USAGE_OUTPUT};
    tg_settlement_t s = {
        .request_id = r->id,
        .tenant_id = r->tenant,
        .key_id = r->key,
        .model = "gpt-4o-mini",
        .usage = u,
        .cost = tg_price_usage(&PRICE, &u, 1000000),
        .attempts = 1,
        .status = 200,
        .ttft_ms = 120.0,
        .total_ms = 480.0,
    };
    tg_billing_settle(w->billing, &s);
    w->settled_calls++;
    free(r);
    pump(w);
}

static uint64_t committed(const worker_t *w) {
    const tg_billing_stats_t *s = tg_billing_stats(w->billing);
    return s->settled + s->duplicates;
}

static void pump(worker_t *w) {
    while (w->issued < n_per_worker && w->inflight < window &&
           (backlog == 0 || (long)(w->settled_calls - (long)committed(w)) < backlog)) {
        req_t *r = calloc(1, sizeof(*r));
        r->w = w;
        int p = (int)((w->issued + w->index) % npairs);
        r->tenant = pair_tenant[p];
        r->key = pair_key[p];
        snprintf(r->id, sizeof(r->id), "%s%08ld", w->id_prefix, w->issued);
        /* The bound: ~1,000 input tokens estimated + 1,024 max output. */
        tg_usage_t bound = {.input = 1000, .output = 1024, .known = TG_USAGE_INPUT | TG_USAGE_OUTPUT};
        tg_reserve_req_t rr = {.request_id = r->id,
                               .attempt = 1,
                               .tenant_id = r->tenant,
                               .key_id = r->key,
                               .model = "gpt-4o-mini",
                               .amount = tg_price_usage(&PRICE, &bound, 1000000),
                               .key_budget = 0};
        w->issued++;
        w->inflight++;
        tg_billing_reserve(w->billing, &rr, reserved_cb, r);
    }
    if (!w->t_accepted_ns && w->settled_calls + w->failed + w->refused == n_per_worker)
        w->t_accepted_ns = tg_now_ns();
}

static void tick_cb(uv_timer_t *t) {
    worker_t *w = t->data;
    /* Every request on this worker waits while its loop is busy: a tick that comes late
     * is time the settlement path held the loop (a client would have waited as long). */
    uint64_t now = tg_now_ns();
    if (w->last_tick_ns && !w->done) {
        uint64_t gap = now - w->last_tick_ns;
        w->max_gap_ns = TG_MAX(w->max_gap_ns, gap);
        w->gaps_over_10ms += gap > 10000000;
    }
    w->last_tick_ns = now;
    /* The gap mixes the loop's own work with waiting for a CPU on a busy box; the
     * thread's CPU time over the same gap is the part the loop itself spent. */
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    uint64_t cpu = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    if (w->last_tick_cpu_ns && !w->done) {
        w->max_busy_ns = TG_MAX(w->max_busy_ns, cpu - w->last_tick_cpu_ns);
        w->busy_over_10ms += cpu - w->last_tick_cpu_ns > 10000000;
    }
    w->last_tick_cpu_ns = cpu;
    pump(w); /* the backlog may have gone down: batches completed */
    if (!w->done && w->settled_calls + w->failed + w->refused == n_per_worker &&
        committed(w) >= (uint64_t)w->settled_calls) {
        w->done = 1;
        w->t_end_ns = tg_now_ns();
        uv_stop(&w->loop);
    }
}

static void progress_cb(uv_timer_t *t) {
    worker_t *w = t->data;
    uint64_t c = committed(w);
    const tg_billing_stats_t *s = tg_billing_stats(w->billing);
    fprintf(stderr, "billing_settle_bench: worker %d t=%.0fs committed %llu (+%llu/s) settle calls %ld batches %llu spooled %llu\n",
            w->index, (double)(tg_now_ns() - w->t0_ns) / 1e9, (unsigned long long)c,
            (unsigned long long)(c - w->last_settled), w->settled_calls, (unsigned long long)s->batches,
            (unsigned long long)s->spooled);
    w->last_settled = c;
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    uv_loop_init(&w->loop);
    tg_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    /* The gateway's defaults (tg_config.c): 4 Postgres connections per worker, 5 s per
     * query, 250 ms per Redis command. */
    cfg.pg_conninfo = getenv("TOLLGATE_PG");
    cfg.pg_pool_size = 4;
    cfg.pg_timeout_ms = 5000;
    cfg.redis_url = getenv("TOLLGATE_REDIS");
    cfg.redis_timeout_ms = 250;
    w->st = tg_state_create(&w->loop, &cfg, NULL, 0);
    uint64_t end = tg_now_ms() + 5000;
    while ((!tg_redis_connected(tg_state_redis(w->st)) || !tg_pg_connected(tg_state_pg(w->st))) && tg_now_ms() < end)
        uv_run(&w->loop, UV_RUN_ONCE);
    if (!tg_redis_connected(tg_state_redis(w->st)) || !tg_pg_connected(tg_state_pg(w->st))) {
        fprintf(stderr, "billing_settle_bench: worker %d cannot connect to Postgres and Redis\n", w->index);
        exit(1);
    }
    tg_billing_config_t bc = {.spool_dir = spool_dir,
                              .reconcile_after_ms = 60000,
                              .charge_unknown = 1,
                              .worker = w->index,
                              .reconciler = w->index == 0, /* as in the gateway: worker 0 competes */
                              .queue_max = 0};
    w->billing = tg_billing_create(&w->loop, w->st, &bc);
    snprintf(w->id_prefix, sizeof(w->id_prefix), "sb%06x%llxw%d-", (unsigned)getpid() & 0xffffff,
             (unsigned long long)(tg_wall_ms() % 100000000), w->index);
    uv_timer_init(&w->loop, &w->tick);
    w->tick.data = w;
    uv_timer_init(&w->loop, &w->progress);
    w->progress.data = w;
    pthread_barrier_wait(&start_barrier);
    w->t0_ns = tg_now_ns();
    uv_timer_start(&w->tick, tick_cb, 1, 1);
    uv_timer_start(&w->progress, progress_cb, 1000, 1000);
    pump(w);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    uv_timer_stop(&w->tick);
    uv_timer_stop(&w->progress);
    tg_billing_drain(w->billing, &w->loop, 3000);
    return NULL;
}

static double cpu_us(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s N WORKERS WINDOW BACKLOG SPOOL_DIR (TOLLGATE_PG, TOLLGATE_REDIS set)\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    int nworkers = atoi(argv[2]);
    window = atol(argv[3]);
    backlog = atol(argv[4]);
    spool_dir = argv[5];
    if (n <= 0 || nworkers < 1 || nworkers > 16 || window < 1 || backlog < 0 || !getenv("TOLLGATE_PG") ||
        !getenv("TOLLGATE_REDIS")) {
        fprintf(stderr, "billing_settle_bench: bad arguments or TOLLGATE_PG / TOLLGATE_REDIS unset\n");
        return 2;
    }
    n_per_worker = n / nworkers;
    PGconn *c = PQconnectdb(getenv("TOLLGATE_PG"));
    PGresult *res = PQexec(c, "SELECT t.id, k.id FROM tenants t JOIN api_keys k ON k.tenant_id = t.id "
                              "WHERE t.name LIKE 'bench%' ORDER BY t.id, k.id");
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) == 0) {
        fprintf(stderr, "billing_settle_bench: no 'bench%%' tenant with a key: %s\n", PQerrorMessage(c));
        return 1;
    }
    for (int i = 0; i < PQntuples(res) && npairs < MAX_PAIRS; i++, npairs++) {
        pair_tenant[npairs] = atoll(PQgetvalue(res, i, 0));
        pair_key[npairs] = atoll(PQgetvalue(res, i, 1));
    }
    PQclear(res);
    PQfinish(c);

    worker_t *ws = calloc((size_t)nworkers, sizeof(*ws));
    pthread_t *th = calloc((size_t)nworkers, sizeof(*th));
    pthread_barrier_init(&start_barrier, NULL, (unsigned)nworkers + 1);
    for (int i = 0; i < nworkers; i++) {
        ws[i].index = i;
        pthread_create(&th[i], NULL, worker_main, &ws[i]);
    }
    pthread_barrier_wait(&start_barrier);
    double c0 = cpu_us();
    for (int i = 0; i < nworkers; i++)
        pthread_join(th[i], NULL);
    double cpu = cpu_us() - c0;

    uint64_t t0 = UINT64_MAX, t_end = 0, t_acc = 0;
    unsigned long long settled = 0, dup = 0, conflicts = 0, batches = 0, reserved = 0, spooled = 0, replayed = 0;
    long failed = 0, refused = 0, calls = 0;
    uint64_t max_gap = 0, gaps10 = 0, max_busy = 0, busy10 = 0;
    for (int i = 0; i < nworkers; i++) {
        worker_t *w = &ws[i];
        const tg_billing_stats_t *s = tg_billing_stats(w->billing);
        t0 = TG_MIN(t0, w->t0_ns);
        t_end = TG_MAX(t_end, w->t_end_ns);
        t_acc = TG_MAX(t_acc, w->t_accepted_ns);
        settled += s->settled;
        dup += s->duplicates;
        conflicts += s->conflicts;
        batches += s->batches;
        reserved += s->reserved;
        spooled += s->spooled;
        replayed += s->replayed;
        failed += w->failed;
        refused += w->refused;
        calls += w->settled_calls;
        max_gap = TG_MAX(max_gap, w->max_gap_ns);
        gaps10 += w->gaps_over_10ms;
        max_busy = TG_MAX(max_busy, w->max_busy_ns);
        busy10 += w->busy_over_10ms;
    }
    double wall = (double)(t_end - t0) / 1e9, accept = (double)(t_acc - t0) / 1e9;
    printf("workers=%d n=%ld settle_calls=%ld committed=%llu duplicates=%llu conflicts=%llu failed=%ld refused=%ld "
           "wall_s=%.3f committed_per_s=%.0f accepted_s=%.3f accepted_per_s=%.0f batches=%llu "
           "elements_per_batch=%.1f reserved=%llu spooled=%llu replayed=%llu cpu_us_per_req=%.1f loop_max_stall_ms=%.1f "
           "loop_stalls_over_10ms=%llu loop_max_busy_ms=%.1f loop_busy_over_10ms=%llu\n",
           nworkers, n_per_worker * nworkers, calls, settled, dup, conflicts, failed, refused, wall,
           (double)settled / wall, accept, (double)calls / accept, batches,
           batches ? (double)(settled + reserved) / (double)batches : 0.0, reserved, spooled, replayed,
           calls ? cpu / (double)calls : 0.0, (double)max_gap / 1e6, (unsigned long long)gaps10,
           (double)max_busy / 1e6, (unsigned long long)busy10);
    for (int i = 0; i < nworkers; i++) {
        tg_billing_destroy(ws[i].billing);
        tg_state_destroy(ws[i].st);
        uv_close((uv_handle_t *)&ws[i].tick, NULL);
        uv_close((uv_handle_t *)&ws[i].progress, NULL);
        uv_run(&ws[i].loop, UV_RUN_DEFAULT);
    }
    return (conflicts || failed || refused || settled != (unsigned long long)calls) ? 1 : 0;
}
