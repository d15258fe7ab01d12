/*
 * Admission plus release without HTTP: the gateway's own limiter code (tg_limits.c on
 * tg_redis.c, linked from libtollgate_core.a) against a real Redis, one request at a
 * time (closed loop, one in flight): tg_limits_admit, wait for its callback, then
 * tg_admit_release and the next admission at once, as the proxy does at the end of a
 * request. Only the public API is used, so the same file builds against any commit.
 *
 *   limits_admit_bench REDIS_URL MODE N [TENANT]
 *     MODE  key  rpm + burst, tpm and concurrency on the key (the tenant has none)
 *           all  the same on the key and on its tenant
 *           rpm  rpm + burst on the key only (no lease, nothing to correct)
 *
 * The limits are far above what one connection can reach: nothing is refused. Prints one
 * line: n, admission round trip p50 / p90 / p99 µs (tg_limits_admit to its callback) and
 * this process's CPU per admission + release (user + sys, µs). Redis's side is measured
 * from outside (INFO commandstats, SLOWLOG) by limits_bench.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "tollgate/tg_config.h"
#include "tollgate/tg_limits.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_state.h"

static tg_limits_t *limits;
static tg_limit_req_t lim;
static long n_total, n_done, n_refused;
static uint64_t t_sent;
static uint32_t *lat_us;
static uv_loop_t loop;
static uv_timer_t stop_timer;
static long tenant;

static void admit_next(void);

static void on_admit(void *ud, const tg_admit_outcome_t *out) {
    tg_admit_t **slot = ud;
    uint64_t dt = tg_now_ns() - t_sent;
    lat_us[n_done] = (uint32_t)(dt / 1000);
    if (out->result != TG_ADMIT_OK || out->degraded) {
        n_refused++;
        tg_admit_cancel(*slot);
    } else {
        tg_admit_release(*slot, 40); /* a small real usage: the TPM correction runs */
    }
    n_done++;
    admit_next();
}

static void on_stop(uv_timer_t *t) { uv_stop(t->loop); }

static void admit_next(void) {
    static tg_admit_t *handle;
    if (n_done == n_total) {
        uv_timer_start(&stop_timer, on_stop, 300, 0); /* the last release's reply */
        return;
    }
    char id[40];
    snprintf(id, sizeof(id), "bench%08lx%019ld", (unsigned long)getpid(), n_done);
    t_sent = tg_now_ns();
    handle = tg_limits_admit(limits, id, &lim, on_admit, &handle);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double cpu_us(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s REDIS_URL key|all|rpm N [TENANT]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[2];
    n_total = atol(argv[3]);
    tenant = argc > 4 ? atol(argv[4]) : 900001;
    lat_us = calloc((size_t)n_total + 1, sizeof(*lat_us));
    const int64_t big = 1000000000;
    lim = (tg_limit_req_t){.tenant_id = tenant, .key_id = tenant * 10, .key_rpm = big, .key_burst = big,
                           .tenant_rpm = -1, .tenant_burst = -1, .key_tpm = 2 * big, .tenant_tpm = -1,
                           .key_conc = 100000, .tenant_conc = -1, .est_tokens = 1040};
    if (!strcmp(mode, "all")) {
        lim.tenant_rpm = lim.tenant_burst = big;
        lim.tenant_tpm = 2 * big;
        lim.tenant_conc = 100000;
    } else if (!strcmp(mode, "rpm")) {
        lim.key_tpm = lim.key_conc = -1;
    } else if (strcmp(mode, "key") != 0) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    uv_loop_init(&loop);
    uv_timer_init(&loop, &stop_timer);
    tg_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.redis_url = argv[1];
    cfg.redis_timeout_ms = 1000;
    tg_state_t *st = tg_state_create(&loop, &cfg, NULL, 0);
    tg_redis_t *redis = tg_state_redis(st);
    uint64_t end = tg_now_ms() + 3000;
    while (!tg_redis_connected(redis) && tg_now_ms() < end)
        uv_run(&loop, UV_RUN_ONCE);
    if (!tg_redis_connected(redis)) {
        fprintf(stderr, "limits_admit_bench: cannot connect to %s\n", argv[1]);
        return 1;
    }
    tg_admission_config_t ac = {.lease_ttl_ms = 30000, .queue_max = 16, .queue_timeout_ms = 8000,
                                .fail_rate = TG_FAIL_OPEN, .fail_concurrency = TG_FAIL_OPEN};
    limits = tg_limits_create(&loop, st, &ac);
    double c0 = cpu_us();
    uint64_t w0 = tg_now_ns();
    admit_next();
    uv_run(&loop, UV_RUN_DEFAULT);
    double wall_s = (double)(tg_now_ns() - w0) / 1e9 - 0.3;
    double cpu = cpu_us() - c0;
    qsort(lat_us, (size_t)n_done, sizeof(*lat_us), cmp_u32);
#define PCT(p) lat_us[(size_t)((double)(n_done - 1) * (p) / 100.0)]
    printf("mode=%s n=%ld refused=%ld admit_p50_us=%u admit_p90_us=%u admit_p99_us=%u cpu_us_per_req=%.2f "
           "req_per_s=%.0f redis_commands=%llu\n",
           mode, n_done, n_refused, PCT(50), PCT(90), PCT(99), cpu / (double)n_done, (double)n_done / wall_s,
           (unsigned long long)tg_redis_stats(redis)->commands);
    tg_limits_destroy(limits);
    tg_state_destroy(st);
    uv_close((uv_handle_t *)&stop_timer, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    return n_refused ? 1 : 0;
}
