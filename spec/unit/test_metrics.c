/*
 * /metrics collectors (tg_metrics.h): each registered subsystem is rendered once, with
 * every worker's instance in worker order (NULL where a worker lacks it), after the
 * worker's own families; counters are summed across workers.
 */
#include "tg_test.h"
#include "tollgate/tg_metrics.h"

typedef struct {
    uint64_t a, b[2];
} fake_stats_t;

static void fake_collect(const void *const *inst, int n, tg_buf_t *out) {
    fake_stats_t s;
    tg_metrics_sum_u64(inst, n, TG_METRICS_NFIELDS(fake_stats_t), (uint64_t *)&s);
    tg_buf_printf(out, "fake_total{n=\"%d\",present=\"%d%d\"} %llu %llu %llu\n", n, inst[0] != NULL,
                  inst[1] != NULL, (unsigned long long)s.a, (unsigned long long)s.b[0], (unsigned long long)s.b[1]);
}

static void other_collect(const void *const *inst, int n, tg_buf_t *out) {
    tg_buf_printf(out, "other_total{present=\"%d%d\"} 1\n", inst[0] != NULL, n > 1 && inst[1] != NULL);
}

static int count(const char *hay, const char *needle) {
    int k = 0;
    for (const char *s = strstr(hay, needle); s; s = strstr(s + 1, needle))
        k++;
    return k;
}

TG_TEST(metrics, each_collector_renders_once_with_every_workers_instance) {
    static tg_metrics_t w0, w1;
    fake_stats_t s0 = {1, {2, 3}}, s1 = {10, {20, 30}};
    /* Worker 1 lacks the first subsystem; both have the second. */
    tg_metrics_collector_add(&w0, other_collect, &s0);
    tg_metrics_collector_add(&w0, fake_collect, &s0);
    tg_metrics_collector_add(&w1, fake_collect, &s1);
    tg_metrics_collector_add(&w1, other_collect, NULL); /* NULL registers nothing */
    ASSERT_EQ_INT(w1.ncollectors, 1);
    tg_metrics_t *ws[2] = {&w0, &w1};
    tg_buf_t b;
    tg_buf_init(&b);
    tg_metrics_render(ws, 2, &b);
    tg_buf_appends(&b, "");
    ASSERT(strstr(b.data, "tollgate_requests_total") != NULL);
    ASSERT_EQ_INT(count(b.data, "fake_total"), 1);
    ASSERT_EQ_INT(count(b.data, "other_total"), 1);
    ASSERT(strstr(b.data, "fake_total{n=\"2\",present=\"11\"} 11 22 33\n") != NULL);
    ASSERT(strstr(b.data, "other_total{present=\"10\"} 1\n") != NULL);
    /* Registration order, after the worker's own families. */
    ASSERT(strstr(b.data, "tollgate_tokens_total") < strstr(b.data, "other_total"));
    ASSERT(strstr(b.data, "other_total") < strstr(b.data, "fake_total"));
    tg_buf_free(&b);
    /* A worker being torn down contributes nothing more. */
    tg_metrics_collectors_clear(&w0);
    tg_buf_init(&b);
    tg_metrics_render(ws, 2, &b);
    tg_buf_appends(&b, "");
    ASSERT(strstr(b.data, "fake_total{n=\"2\",present=\"01\"} 10 20 30\n") != NULL);
    ASSERT_EQ_INT(count(b.data, "other_total"), 0);
    tg_buf_free(&b);
}
