/*
 * The admission lifecycle (tg_limits.c) against a real Redis: TOLLGATE_REDIS is set by
 * spec/run.sh. These call the limiter the way the gateway does, with request ids the
 * HTTP side never lets a client choose, and read what the scripts left in Redis with a
 * blocking side connection. Each test uses its own tenant and key ids (from its pid), so
 * it shares the server with other tests. Without TOLLGATE_REDIS, `tg_unit limits_redis`
 * exits 77. (test_limits.c tests the fallback without Redis.)
 */
#include <hiredis/hiredis.h>
#include <stdint.h>
#include <unistd.h>
#include <uv.h>

#include "tg_test.h"
#include "tg_test_redis.h"
#include "tollgate/tg_config.h"
#include "tollgate/tg_limits.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_state.h"

__attribute__((constructor)) static void limits_skip_without_server(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "limits_redis") == 0 && !getenv("TOLLGATE_REDIS")) {
        fprintf(stderr, "skipped: TOLLGATE_REDIS (unix:///path or redis://host:port) is not set\n");
        exit(77);
    }
}

typedef struct {
    uv_loop_t loop;
    tg_config_t cfg;
    tg_state_t *st;
    tg_limits_t *l;
    redisContext *side;
    int64_t tenant, key;
    char buckets[96], leases[96], tleases[96];
} fx_t;

typedef struct {
    int calls;
    tg_admit_outcome_t out;
} got_t;

static void on_admit(void *ud, const tg_admit_outcome_t *out) {
    got_t *g = ud;
    g->calls++;
    g->out = *out;
}

static void wake(uv_timer_t *t) { (void)t; }

static void run_for(uv_loop_t *loop, int ms) {
    uv_timer_t tick;
    uv_timer_init(loop, &tick);
    uv_timer_start(&tick, wake, 5, 5);
    uv_update_time(loop);
    uint64_t end = uv_now(loop) + (uint64_t)ms;
    while (uv_now(loop) < end)
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

static void fx_init(fx_t *f, int lease_ttl_ms, int salt) {
    memset(f, 0, sizeof(*f));
    const char *url = getenv("TOLLGATE_REDIS");
    uv_loop_init(&f->loop);
    f->cfg.redis_url = (char *)url;
    f->cfg.redis_timeout_ms = 2000;
    f->st = tg_state_create(&f->loop, &f->cfg, NULL, 0);
    tg_redis_t *r = tg_state_redis(f->st);
    ASSERT(r);
    uv_update_time(&f->loop);
    for (int i = 0; i < 500 && !tg_redis_connected(r); i++)
        run_for(&f->loop, 10);
    ASSERT(tg_redis_connected(r));
    tg_admission_config_t ac = {.lease_ttl_ms = lease_ttl_ms, .queue_max = 16, .queue_timeout_ms = 0};
    f->l = tg_limits_create(&f->loop, f->st, &ac);
    f->side = side_connect(url);
    /* Ids no real tenant has: 7e11 + pid · 10 + salt. */
    f->tenant = 700000000000LL + (int64_t)getpid() * 10 + salt;
    f->key = f->tenant + 1000000000LL;
    snprintf(f->buckets, sizeof(f->buckets), "{t:%lld}:b:k:%lld", (long long)f->tenant, (long long)f->key);
    snprintf(f->leases, sizeof(f->leases), "{t:%lld}:conc:k:%lld", (long long)f->tenant, (long long)f->key);
    snprintf(f->tleases, sizeof(f->tleases), "{t:%lld}:conc:t", (long long)f->tenant);
}

static void fx_done(fx_t *f) {
    tg_state_destroy(f->st); /* the Redis client first, as the worker does */
    tg_limits_destroy(f->l);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    ASSERT_EQ_INT(uv_loop_close(&f->loop), 0);
    redisFree(f->side);
}

static tg_limit_req_t lim_none(const fx_t *f) {
    return (tg_limit_req_t){.tenant_id = f->tenant, .key_id = f->key, .key_rpm = -1, .key_burst = -1,
                            .tenant_rpm = -1, .tenant_burst = -1, .key_tpm = -1, .tenant_tpm = -1,
                            .key_conc = -1, .tenant_conc = -1, .est_tokens = 0};
}

static tg_admit_t *admit(fx_t *f, const char *id, const tg_limit_req_t *lim, got_t *g) {
    memset(g, 0, sizeof(*g));
    tg_admit_t *a = tg_limits_admit(f->l, id, lim, on_admit, g);
    for (int i = 0; i < 500 && !g->calls; i++)
        run_for(&f->loop, 5);
    ASSERT_EQ_INT(g->calls, 1);
    return a;
}

/* A reply of the side connection as a string ("" for nil), integer replies included. */
static void side_str(fx_t *f, char *out, size_t n, const char *fmt, const char *key) {
    redisReply *r = redisCommand(f->side, fmt, key);
    ASSERT(r);
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
        snprintf(out, n, "%s", r->str);
    else if (r->type == REDIS_REPLY_INTEGER)
        snprintf(out, n, "%lld", r->integer);
    else
        snprintf(out, n, "%s", "");
    freeReplyObject(r);
}

static long long side_int(fx_t *f, const char *fmt, const char *key) {
    char s[64];
    side_str(f, s, sizeof(s), fmt, key);
    return atoll(s);
}

/* The TPM level of a bucket string "<rpm> <tpm> <ts>", in milli-tokens. */
static long long tpm_level(fx_t *f) {
    char s[128];
    side_str(f, s, sizeof(s), "GET %s", f->buckets);
    long long rpm, tpm, ts;
    ASSERT(sscanf(s, "%lld %lld %lld", &rpm, &tpm, &ts) == 3);
    return tpm;
}

static void marker(const fx_t *f, const char *id, char *out, size_t n) {
    snprintf(out, n, "{t:%lld}:a:%s", (long long)f->tenant, id);
}

/* B10: the same request id admitted twice is charged once (bucket levels and lease count
 * change once), and released twice its TPM correction is applied once (by the handle
 * whose admission charged; it goes alone, correct.lua, when no admission follows). */
TG_TEST(limits_redis, same_id_is_charged_once) {
    fx_t f;
    fx_init(&f, 30000, 1);
    tg_limit_req_t lim = lim_none(&f);
    lim.key_rpm = 60;
    lim.key_burst = 10;
    lim.key_tpm = 1000;
    lim.key_conc = 5;
    lim.est_tokens = 100;
    char id[64], mk[128], b1[128], b2[128];
    snprintf(id, sizeof(id), "req-once-%d", (int)getpid());
    marker(&f, id, mk, sizeof(mk));

    got_t g1, g2;
    tg_admit_t *a1 = admit(&f, id, &lim, &g1);
    ASSERT_EQ_INT(g1.out.result, TG_ADMIT_OK);
    side_str(&f, b1, sizeof(b1), "GET %s", f.buckets);
    long long rpm1, tpm1, ts1;
    ASSERT(sscanf(b1, "%lld %lld %lld", &rpm1, &tpm1, &ts1) == 3);
    ASSERT_EQ_INT(rpm1, 9000);   /* burst 10 tokens, one taken (milli-tokens) */
    ASSERT_EQ_INT(tpm1, 900000); /* 1000 tokens, the estimate of 100 taken */
    ASSERT_EQ_INT(side_int(&f, "ZCARD %s", f.leases), 1);

    /* The same id again (a retried admission): admitted, nothing charged, one lease. */
    tg_admit_t *a2 = admit(&f, id, &lim, &g2);
    ASSERT_EQ_INT(g2.out.result, TG_ADMIT_OK);
    side_str(&f, b2, sizeof(b2), "GET %s", f.buckets);
    ASSERT_EQ_STR(b2, b1);
    ASSERT_EQ_INT(side_int(&f, "ZCARD %s", f.leases), 1);

    /* Released with 40 tokens used: 60 given back, once. */
    tg_admit_release(a1, 40);
    run_for(&f.loop, 200);
    ASSERT_EQ_INT(tpm_level(&f), 960000);
    ASSERT_EQ_INT(side_int(&f, "EXISTS %s", f.leases), 0); /* the last ZREM deletes the set */
    ASSERT_EQ_INT(side_int(&f, "EXISTS %s", mk), 0);       /* the end deletes the marker */
    ASSERT_EQ_INT(tg_limits_stats(f.l)->corrections_alone, 1);
    tg_admit_release(a2, 40);
    run_for(&f.loop, 200);
    ASSERT_EQ_INT(tpm_level(&f), 960000);
    ASSERT_EQ_INT(side_int(&f, "ZCARD %s", f.leases), 0);

    /* A different id is charged. */
    got_t g3;
    snprintf(id, sizeof(id), "req-other-%d", (int)getpid());
    tg_admit_t *a3 = admit(&f, id, &lim, &g3);
    ASSERT_EQ_INT(g3.out.result, TG_ADMIT_OK);
    ASSERT(tpm_level(&f) <= 960000 - 100000 + 50000); /* charged (refilled < 3 s since) */
    tg_admit_release(a3, -1);
    run_for(&f.loop, 100);
    redisReply *r = redisCommand(f.side, "DEL %s %s", f.buckets, mk);
    freeReplyObject(r);
    fx_done(&f);
}

/* The end of a request sends no script: its TPM correction rides on the next admission
 * that reads the bucket (one more argument of admit.lua), so nothing goes alone; with no
 * admission after it, it goes alone (correct.lua) 20 ms later. */
TG_TEST(limits_redis, the_correction_rides_on_the_next_admission) {
    fx_t f;
    fx_init(&f, 30000, 4);
    tg_limit_req_t lim = lim_none(&f);
    lim.key_tpm = 1000;
    lim.est_tokens = 100;
    char id1[64], id2[64], id3[64];
    snprintf(id1, sizeof(id1), "req-ride-1-%d", (int)getpid());
    snprintf(id2, sizeof(id2), "req-ride-2-%d", (int)getpid());
    snprintf(id3, sizeof(id3), "req-ride-3-%d", (int)getpid());
    got_t g1, g2, g3;
    tg_admit_t *a1 = admit(&f, id1, &lim, &g1);
    ASSERT_EQ_INT(g1.out.result, TG_ADMIT_OK);
    ASSERT_EQ_INT(tpm_level(&f), 900000);
    tg_admit_release(a1, 40); /* 60 tokens owed back, kept in the worker */
    tg_admit_t *a2 = admit(&f, id2, &lim, &g2);
    ASSERT_EQ_INT(g2.out.result, TG_ADMIT_OK);
    int64_t l2 = tpm_level(&f);
    ASSERT(l2 >= 860000 && l2 < 860000 + 5000); /* 900 + 60 - 100 (+ a refill of < 0.3 s) */
    ASSERT_EQ_INT(tg_limits_stats(f.l)->corrections_alone, 0);
    tg_admit_release(a2, 100); /* used its estimate: nothing owed */
    run_for(&f.loop, 100);
    ASSERT_EQ_INT(tg_limits_stats(f.l)->corrections_alone, 0);
    tg_admit_t *a3 = admit(&f, id3, &lim, &g3);
    ASSERT_EQ_INT(g3.out.result, TG_ADMIT_OK);
    tg_admit_release(a3, 0); /* 100 owed, and no admission follows */
    run_for(&f.loop, 100);
    ASSERT_EQ_INT(tg_limits_stats(f.l)->corrections_alone, 1);
    int64_t l3 = tpm_level(&f);
    ASSERT(l3 >= l2 && l3 < l2 + 10000); /* charged 100, given back 100 */
    redisReply *r = redisCommand(f.side, "DEL %s", f.buckets);
    freeReplyObject(r);
    fx_done(&f);
}

/* B6: a running request's leases that Redis lost (a restart, a failover, a lease expired
 * during an outage: here DEL) are back after the next renewal, and counted. */
TG_TEST(limits_redis, renewal_reacquires_lost_leases) {
    fx_t f;
    fx_init(&f, 1200, 2); /* renewed every 400 ms */
    tg_limit_req_t lim = lim_none(&f);
    lim.key_conc = 2;
    lim.tenant_conc = 3;
    char id[64];
    snprintf(id, sizeof(id), "req-renew-%d", (int)getpid());
    got_t g;
    tg_admit_t *a = admit(&f, id, &lim, &g);
    ASSERT_EQ_INT(g.out.result, TG_ADMIT_OK);
    ASSERT_EQ_INT(side_int(&f, "ZCARD %s", f.leases), 1);
    ASSERT_EQ_INT(side_int(&f, "ZCARD %s", f.tleases), 1);
    redisReply *r = redisCommand(f.side, "DEL %s %s", f.leases, f.tleases);
    freeReplyObject(r);
    ASSERT_EQ_INT(side_int(&f, "EXISTS %s", f.leases), 0);
    run_for(&f.loop, 700);
    char member[128];
    snprintf(member, sizeof(member), "ZSCORE %%s %s", id);
    ASSERT(side_int(&f, member, f.leases) > 0);
    ASSERT(side_int(&f, member, f.tleases) > 0);
    ASSERT_EQ_INT(side_int(&f, "PTTL %s", f.leases), -1); /* no TTL: it lives while it holds leases */
    ASSERT(tg_limits_stats(f.l)->leases_reacquired >= 2);
    tg_admit_release(a, -1);
    run_for(&f.loop, 200);
    ASSERT_EQ_INT(side_int(&f, "ZCARD %s", f.leases), 0);
    ASSERT_EQ_INT(side_int(&f, "ZCARD %s", f.tleases), 0);
    fx_done(&f);
}

/* B9: renewal keeps the request's marker alive past its first TTL, so a stream longer
 * than that is still admitted once (and, should its end go by release.lua, corrected
 * once). The marker's remaining TTL is cut to
 * 1 s here, standing in for a stream near 10 minutes old. */
TG_TEST(limits_redis, renewal_extends_the_marker) {
    fx_t f;
    fx_init(&f, 1200, 3);
    tg_limit_req_t lim = lim_none(&f);
    lim.key_tpm = 1000;
    lim.key_conc = 4;
    lim.est_tokens = 300;
    char id[64], mk[128];
    snprintf(id, sizeof(id), "req-marker-%d", (int)getpid());
    marker(&f, id, mk, sizeof(mk));
    got_t g;
    tg_admit_t *a = admit(&f, id, &lim, &g);
    ASSERT_EQ_INT(g.out.result, TG_ADMIT_OK);
    ASSERT_EQ_INT(tpm_level(&f), 700000);
    redisReply *r = redisCommand(f.side, "PEXPIRE %s 1000", mk);
    freeReplyObject(r);
    run_for(&f.loop, 1300); /* renewals at 400, 800, 1200 ms */
    ASSERT(side_int(&f, "PTTL %s", mk) > 500000);
    tg_admit_release(a, 100); /* 200 of the 300 given back */
    run_for(&f.loop, 200);
    ASSERT_EQ_INT(tpm_level(&f), 900000); /* a correction adds no refill */
    r = redisCommand(f.side, "DEL %s %s", f.buckets, mk);
    freeReplyObject(r);
    fx_done(&f);
}
