/*
 * state_auth_bench: the in-process cost of authenticating one request with a warm key
 * cache (issue 4, item 9: goal under 1 µs per request). spec/bench/state_bench.sh builds
 * it with cc against build/libtollgate_core.a; it is not part of the tollgate build.
 *
 *   state_auth_bench CONNINFO ITERATIONS WARM_SET...
 *
 * For each WARM_SET size W it creates a fresh tg_state_t on a Postgres database whose
 * api_keys hold 'tg-bench-' || lpad(i, 34, '0') for i = 1..N (N >= W; 43-byte keys like
 * the ones tollgate issues), asks for keys 1..W once so that every one is cached (the
 * misses go to Postgres through the real pool), then times ITERATIONS lookups cycling
 * over the W keys, best of 3 runs, each case right after a fresh warm-up. One lookup is
 * what tg__phase_auth in tg_proxy_intake.c does per request with a warm cache:
 *
 *   SHA-256 of the presented key (EVP_Digest with an EVP_MD fetched once, as
 *   phase_auth does), tg_state_auth (hash bucket, compare, TTL check, reference),
 *   the checks of auth_check (active, expiry against the wall clock, IP allow list)
 *   plus tg_principal_allows_model, and tg_principal_release.
 *
 * It also times the parts alone (SHA-256 only; lookup + checks on precomputed digests)
 * and the static-key path (a key from the config file: tg_state_create with static
 * keys, no database). A lookup that does not hit the cache is counted and reported
 * (it would make the run invalid: the TTL is 30 s ±25%; warming 50,000 keys from a busy
 * Postgres takes 5-10 s here, a case a few seconds).
 *
 * Output: one Markdown table row per case on stdout; progress on stderr.
 */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "tollgate/tg_config.h"
#include "tollgate/tg_state.h"

#define RUNS 3
#define KEY_LEN 43

static EVP_MD *sha256;
static int pending;
static long warm_failed;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void key_text(char out[KEY_LEN + 1], long i) { snprintf(out, KEY_LEN + 1, "tg-bench-%034ld", i); }

static void digest_of(const char *key, size_t len, uint8_t d[32]) {
    if (!EVP_Digest(key, len, d, NULL, sha256, NULL))
        abort();
}

static void warm_cb(void *ud, tg_principal_t *p, const char *err) {
    (void)ud;
    if (err || !p)
        warm_failed++;
    tg_principal_release(p);
    pending--;
}

/* Asks for every key once; runs the loop until all misses are answered. */
static void warm(uv_loop_t *loop, tg_state_t *st, char (*keys)[KEY_LEN + 1], long n) {
    for (long i = 0; i < n; i++) {
        uint8_t d[32];
        digest_of(keys[i], KEY_LEN, d);
        tg_principal_t *p = NULL;
        tg_auth_wait_t *w = NULL;
        int rc = tg_state_auth(st, d, warm_cb, NULL, &p, &w);
        if (rc == TG_AGAIN) {
            pending++;
        } else {
            if (!p)
                warm_failed++;
            tg_principal_release(p);
        }
        while (pending >= 200) /* the pool's queue is bounded */
            uv_run(loop, UV_RUN_ONCE);
    }
    while (pending > 0)
        uv_run(loop, UV_RUN_ONCE);
}

typedef struct {
    double wall_ns, cpu_ns; /* per operation, best run */
    long misses;
} result_t;

enum { CASE_FULL, CASE_SHA_ONLY, CASE_LOOKUP_ONLY };

static volatile unsigned sink;

static result_t measure(tg_state_t *st, char (*keys)[KEY_LEN + 1], uint8_t (*digests)[32], long nkeys, long iters,
                        int what) {
    result_t best = {1e18, 1e18, 0};
    for (int run = 0; run < RUNS; run++) {
        long misses = 0;
        unsigned acc = 0;
        uint64_t c0 = thread_cpu_ns(), t0 = now_ns();
        long k = 0;
        for (long i = 0; i < iters; i++) {
            uint8_t d[32];
            const uint8_t *dp;
            if (what == CASE_LOOKUP_ONLY) {
                dp = digests[k];
            } else {
                digest_of(keys[k], KEY_LEN, d);
                dp = d;
            }
            if (++k == nkeys)
                k = 0;
            if (what == CASE_SHA_ONLY) {
                acc += dp[0];
                continue;
            }
            tg_principal_t *p = NULL;
            tg_auth_wait_t *w = NULL;
            int rc = tg_state_auth(st, dp, warm_cb, NULL, &p, &w);
            if (rc != TG_OK || !p) {
                misses++;
                if (w)
                    tg_state_auth_cancel(w);
                continue;
            }
            /* auth_check and the model check of phase_select. */
            int ok = p->active && (!p->expires_at_ms || (int64_t)tg_wall_ms() < p->expires_at_ms) &&
                     tg_principal_allows_ip(p, "127.0.0.1") && tg_principal_allows_model(p, "mock-gpt");
            acc += (unsigned)ok;
            tg_principal_release(p);
        }
        uint64_t t1 = now_ns(), c1 = thread_cpu_ns();
        sink = acc;
        double wall = (double)(t1 - t0) / (double)iters, cpu = (double)(c1 - c0) / (double)iters;
        if (cpu < best.cpu_ns) {
            best.cpu_ns = cpu;
            best.wall_ns = wall;
        }
        best.misses += misses;
    }
    return best;
}

static void row(const char *name, long warm_set, result_t r) {
    printf("| %s | %ld | %.0f | %.0f | %s |\n", name, warm_set, r.cpu_ns, r.wall_ns,
           r.misses ? "**misses!**" : (r.cpu_ns < 1000 ? "yes" : "no"));
    fflush(stdout);
    if (r.misses)
        fprintf(stderr, "state_auth_bench: %s, warm set %ld: %ld lookups missed the cache\n", name, warm_set, r.misses);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s CONNINFO ITERATIONS WARM_SET...\n", argv[0]);
        return 2;
    }
    const char *conninfo = argv[1];
    long iters = atol(argv[2]);
    sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!sha256 || iters <= 0)
        return 2;
    tg_log_level = TG_LOG_WARN;

    printf("| case | warm keys | ns / lookup (CPU) | ns / lookup (wall) | under 1 µs |\n");
    printf("|---|---:|---:|---:|---|\n");

    /* The static-key path: one key from the config file. */
    {
        uv_loop_t loop;
        uv_loop_init(&loop);
        tg_config_t cfg;
        memset(&cfg, 0, sizeof(cfg));
        char (*keys)[KEY_LEN + 1] = calloc(1, sizeof(*keys));
        key_text(keys[0], 1);
        uint8_t(*digests)[32] = calloc(1, sizeof(*digests));
        digest_of(keys[0], KEY_LEN, digests[0]);
        tg_state_t *st = tg_state_create(&loop, &cfg, (const uint8_t(*)[32])digests, 1);
        row("static key (config file): SHA-256 + lookup + checks", 1, measure(st, keys, digests, 1, iters, CASE_FULL));
        tg_state_destroy(st);
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
        free(keys);
        free(digests);
    }

    for (int a = 3; a < argc; a++) {
        long n = atol(argv[a]);
        if (n <= 0)
            continue;
        char (*keys)[KEY_LEN + 1] = calloc((size_t)n, sizeof(*keys));
        uint8_t(*digests)[32] = calloc((size_t)n, sizeof(*digests));
        for (long i = 0; i < n; i++) {
            key_text(keys[i], i + 1);
            digest_of(keys[i], KEY_LEN, digests[i]);
        }
        uv_loop_t loop;
        uv_loop_init(&loop);
        tg_config_t cfg;
        memset(&cfg, 0, sizeof(cfg));
        cfg.pg_conninfo = (char *)conninfo;
        cfg.pg_pool_size = 8;
        cfg.pg_timeout_ms = 30000;
        tg_state_t *st = tg_state_create(&loop, &cfg, NULL, 0);
        static const char *const names[] = {"SHA-256 + lookup + checks (what phase_auth does)",
                                            "SHA-256 alone (cached EVP_MD)", "lookup + checks alone (digest given)"};
        for (int c = CASE_FULL; c <= CASE_LOOKUP_ONLY; c++) {
            /* A fresh warm-up before each case: every entry then has a full TTL (22.5 s at
             * least) ahead of it, and a case takes a few seconds. */
            tg_state_invalidate(st, NULL);
            uint64_t w0 = now_ns();
            warm_failed = 0;
            warm(&loop, st, keys, n);
            fprintf(stderr, "state_auth_bench: warmed %ld keys in %.2f s (%ld not found)\n", n,
                    (double)(now_ns() - w0) / 1e9, warm_failed);
            if (warm_failed) {
                fprintf(stderr, "state_auth_bench: the database lacks keys 1..%ld\n", n);
                return 1;
            }
            uint64_t lookups_before = tg_state_stats(st)->db_lookups;
            row(names[c], n, measure(st, keys, digests, n, iters, c));
            if (tg_state_stats(st)->db_lookups != lookups_before)
                fprintf(stderr, "state_auth_bench: %llu database lookups during the measurement\n",
                        (unsigned long long)(tg_state_stats(st)->db_lookups - lookups_before));
        }
        tg_state_destroy(st);
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
        free(keys);
        free(digests);
    }
    EVP_MD_free(sha256);
    return 0;
}
