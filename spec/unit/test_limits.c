/*
 * The limiter's fallback without Redis (tg_limits.c): decisions on a later loop turn,
 * never inside tg_limits_admit; a cancelled admission never calls back; a scope refused
 * by its tenant takes nothing from its key; the instance's table is bounded and fails
 * closed when full of entries it cannot drop.
 */
#include <uv.h>

#include "tg_test.h"
#include "tollgate/tg_config.h"
#include "tollgate/tg_limits.h"
#include "tollgate/tg_state.h"

typedef struct {
    int calls;
    tg_admit_result_t last;
    char which[96];
} seen_t;

static void on_admit(void *ud, const tg_admit_outcome_t *out) {
    seen_t *s = ud;
    s->calls++;
    s->last = out->result;
    snprintf(s->which, sizeof(s->which), "%s", out->which ? out->which : "");
}

typedef struct {
    uv_loop_t loop;
    tg_config_t cfg;
    tg_state_t *st;
    tg_limits_t *l;
} fixture_t;

static void setup(fixture_t *f, tg_fail_policy_t policy) {
    memset(f, 0, sizeof(*f));
    uv_loop_init(&f->loop);
    f->st = tg_state_create(&f->loop, &f->cfg, NULL, 0); /* no Postgres, no Redis */
    tg_admission_config_t ac = {.lease_ttl_ms = 30000, .queue_max = 16, .queue_timeout_ms = 1000,
                                .fail_rate = policy, .fail_tokens = policy, .fail_concurrency = policy};
    f->l = tg_limits_create(&f->loop, f->st, &ac);
}

static void teardown(fixture_t *f) {
    tg_limits_destroy(f->l);
    uv_run(&f->loop, UV_RUN_NOWAIT); /* the closed timers */
    tg_state_destroy(f->st);
    uv_run(&f->loop, UV_RUN_NOWAIT);
    uv_loop_close(&f->loop);
}

static tg_limit_req_t lim(int64_t key, int64_t tenant) {
    return (tg_limit_req_t){.tenant_id = tenant, .key_id = key, .key_rpm = -1, .key_burst = -1, .tenant_rpm = -1,
                            .tenant_burst = -1, .key_tpm = -1, .tenant_tpm = -1, .key_conc = -1, .tenant_conc = -1};
}

/* Admits and runs the loop until the decision came; returns the handle. */
static tg_admit_t *admit(fixture_t *f, const char *id, const tg_limit_req_t *m, seen_t *s) {
    int before = s->calls;
    tg_admit_t *a = tg_limits_admit(f->l, id, m, on_admit, s);
    ASSERT_EQ_INT(s->calls, before); /* never from inside tg_limits_admit */
    while (s->calls == before)
        uv_run(&f->loop, UV_RUN_ONCE);
    return a;
}

TG_TEST(limits, decided_on_a_later_loop_turn) {
    fixture_t f;
    setup(&f, TG_FAIL_CLOSED);
    seen_t s = {0};
    tg_limit_req_t m = lim(1, 1);
    m.key_rpm = 10;
    tg_admit_t *a = admit(&f, "r1", &m, &s);
    ASSERT_EQ_INT(s.last, TG_ADMIT_UNAVAILABLE);
    tg_admit_cancel(a); /* refused: frees the handle, no second call */
    uv_run(&f.loop, UV_RUN_NOWAIT);
    ASSERT_EQ_INT(s.calls, 1);
    ASSERT_EQ_INT(tg_limits_stats(f.l)->down[TG_DOWN_RATE][TG_FAIL_CLOSED], 1);
    /* Cancelled before its turn: no callback ever, nothing held. */
    seen_t c = {0};
    a = tg_limits_admit(f.l, "r2", &m, on_admit, &c);
    tg_admit_cancel(a);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    ASSERT_EQ_INT(c.calls, 0);
    teardown(&f);
}

TG_TEST(limits, local_takes_both_or_neither) {
    fixture_t f;
    setup(&f, TG_FAIL_LOCAL);
    seen_t s = {0};
    /* The tenant's one slot is held by another key. */
    tg_limit_req_t holder = lim(1, 7);
    holder.tenant_conc = 1;
    tg_admit_t *h = admit(&f, "h", &holder, &s);
    ASSERT_EQ_INT(s.last, TG_ADMIT_OK);
    /* Key 2 (burst 3) is refused by the tenant five times... */
    tg_limit_req_t m = lim(2, 7);
    m.key_rpm = 1; /* a token a minute: nothing refills during the test */
    m.key_burst = 3;
    m.tenant_conc = 1;
    for (int i = 0; i < 5; i++) {
        tg_admit_t *a = admit(&f, "x", &m, &s);
        ASSERT_EQ_INT(s.last, TG_ADMIT_CONCURRENCY);
        ASSERT(strstr(s.which, "tenant concurrency"));
        tg_admit_cancel(a);
    }
    tg_admit_release(h, -1);
    /* ...and still has its whole burst, one request at a time. */
    for (int i = 0; i < 3; i++) {
        tg_admit_t *a = admit(&f, "y", &m, &s);
        ASSERT_EQ_INT(s.last, TG_ADMIT_OK);
        tg_admit_release(a, -1);
    }
    tg_admit_t *a = admit(&f, "z", &m, &s);
    ASSERT_EQ_INT(s.last, TG_ADMIT_RATE);
    ASSERT(strstr(s.which, "key rpm"));
    tg_admit_cancel(a);
    teardown(&f);
}

TG_TEST(limits, local_tpm_bucket_and_correction) {
    fixture_t f;
    setup(&f, TG_FAIL_LOCAL);
    seen_t s = {0};
    tg_limit_req_t m = lim(3, 8);
    m.key_tpm = 1000;
    m.est_tokens = 700;
    tg_admit_t *a = admit(&f, "t1", &m, &s);
    ASSERT_EQ_INT(s.last, TG_ADMIT_OK);
    tg_admit_t *b = admit(&f, "t2", &m, &s); /* 300 left, 700 asked */
    ASSERT_EQ_INT(s.last, TG_ADMIT_TOKENS);
    tg_admit_cancel(b);
    tg_admit_release(a, 10); /* used 10: 690 come back */
    b = admit(&f, "t3", &m, &s);
    ASSERT_EQ_INT(s.last, TG_ADMIT_OK);
    tg_admit_release(b, -1);
    teardown(&f);
}

static void noop(uv_timer_t *t) { (void)t; }

static void wait_ms(uv_loop_t *loop, uint64_t ms) {
    uv_timer_t t;
    uv_timer_init(loop, &t);
    uv_timer_start(&t, noop, ms, 0);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

TG_TEST(limits, local_table_is_bounded) {
    fixture_t f;
    setup(&f, TG_FAIL_LOCAL);
    enum { N = 65536 }; /* the table's size (LOCAL_MAX) */
    static tg_admit_t *held[N];
    seen_t s = {0};
    tg_limit_req_t m = lim(0, 0);
    m.key_conc = 1; /* each entry holds a request: none can be dropped */
    for (int i = 0; i < N; i++) {
        m.key_id = 1000 + i;
        m.tenant_id = -1; /* the tenant has no limit: one entry per key */
        held[i] = tg_limits_admit(f.l, "k", &m, on_admit, &s);
    }
    while (s.calls < N)
        uv_run(&f.loop, UV_RUN_ONCE);
    ASSERT_EQ_INT(tg_limits_stats(f.l)->admitted, N);
    m.key_id = 1000 + N;
    tg_admit_t *a = admit(&f, "full", &m, &s);
    ASSERT_EQ_INT(s.last, TG_ADMIT_UNAVAILABLE); /* full of held entries: fails closed */
    ASSERT(strstr(s.which, "table full"));
    tg_admit_cancel(a);
    for (int i = 0; i < N; i++)
        tg_admit_release(held[i], -1);
    uv_run(&f.loop, UV_RUN_NOWAIT);
    wait_ms(&f.loop, 1100); /* a sweep runs at most once a second */
    a = admit(&f, "room", &m, &s);
    ASSERT_EQ_INT(s.last, TG_ADMIT_OK); /* idle entries were dropped */
    tg_admit_release(a, -1);
    teardown(&f);
}
