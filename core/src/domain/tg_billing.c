/*
 * The worker's billing (see tg_billing.h): made, drained and torn down here, with its
 * counters; its parts are the holds in Redis (tg_billing_holds.c), the settlement
 * batcher and spool (tg_billing_settle.c), the reconciler (tg_billing_reconcile.c) and
 * the `tollgate ledger` command (tg_ledger.c), which share tg_billing_internal.h.
 */
#include "tg_billing_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "tollgate/tg_redis.h"
#include "tollgate/tg_scripts.h"

#define QUEUE_MAX_DEFAULT 20000

char tg__billing_instance[40];
static pthread_once_t instance_once = PTHREAD_ONCE_INIT;
static void make_instance_id(void) { tg_random_id(tg__billing_instance); }

tg_billing_t *tg_billing_create(uv_loop_t *loop, tg_state_t *st, const tg_billing_config_t *cfg) {
    pthread_once(&instance_once, make_instance_id);
    tg_billing_t *b = calloc(1, sizeof(*b));
    b->loop = loop;
    b->st = st;
    b->cfg = *cfg;
    b->spool_dir = strdup(cfg->spool_dir ? cfg->spool_dir : "var/spool");
    b->cfg.spool_dir = b->spool_dir;
    /* mkdir -p: the spool must exist before the first settlement needs it. */
    for (char *q = b->spool_dir + 1; *q; q++)
        if (*q == '/') {
            *q = '\0';
            mkdir(b->spool_dir, 0700);
            *q = '/';
        }
    if (mkdir(b->spool_dir, 0700) != 0 && errno != EEXIST)
        tg_log_error("billing: cannot create the spool folder %s: %s", b->spool_dir, strerror(errno));
    snprintf(b->spool_path, sizeof(b->spool_path), "%s/settlements-w%d.jsonl", b->spool_dir, cfg->worker);
    b->queue_max = cfg->queue_max > 0 ? (size_t)cfg->queue_max : QUEUE_MAX_DEFAULT;
    tg_redis_t *redis = tg_state_redis(st);
    if (redis) {
        b->reserve_script = tg_redis_script_register(redis, tg_scripts_source("reserve"));
        b->settle_script = tg_redis_script_register(redis, tg_scripts_source("settle"));
        b->restore_script = tg_redis_script_register(redis, tg_scripts_source("restore"));
    } else {
        b->restore_script = -1;
    }
    uv_timer_init(loop, &b->flush_timer);
    b->flush_timer.data = b;
    uv_timer_init(loop, &b->spool_timer);
    b->spool_timer.data = b;
    uv_timer_start(&b->spool_timer, tg__billing_spool_cb, 200, 2000);
    uv_unref((uv_handle_t *)&b->spool_timer);
    uv_timer_init(loop, &b->reconcile_timer);
    b->reconcile_timer.data = b;
    if (cfg->reconciler) {
        uint64_t every = (uint64_t)TG_MIN(TG_MAX(cfg->reconcile_after_ms / 4, 500), ALIVE_TTL_MS / 3);
        uv_timer_start(&b->reconcile_timer, tg__billing_reconcile_cb, every, every);
        uv_unref((uv_handle_t *)&b->reconcile_timer);
    }
    return b;
}

/* b is freed once its three timers are closed. */
static void timer_closed(uv_handle_t *h) {
    tg_billing_t *b = h->data;
    if (--b->closing == 0)
        free(b);
}

void tg_billing_destroy(tg_billing_t *b) {
    if (!b)
        return;
    /* Called after the worker's Postgres and Redis clients are gone (their pending
     * callbacks already ran, spooling what they carried). */
    /* Whatever is still queued goes to the spool: replayed at the next start. */
    if (b->qlen)
        tg__billing_spool_queue(b, "shutting down");
    tg__billing_queue_free(b);
    free(b->spool_dir);
    b->spool_dir = NULL;
    /* Holds still being given back had their last answer when the Redis client went
     * (tg_redis_err_shutdown: the reconciler returns them). */
    b->closing = 3;
    uv_close((uv_handle_t *)&b->flush_timer, timer_closed);
    uv_close((uv_handle_t *)&b->spool_timer, timer_closed);
    uv_close((uv_handle_t *)&b->reconcile_timer, timer_closed);
}

const tg_billing_stats_t *tg_billing_stats(const tg_billing_t *b) { return &b->stats; }

static void billing_collect(const void *const *stats, int n, tg_buf_t *out) {
    tg_billing_stats_t s;
    tg_metrics_sum_u64(stats, n, TG_METRICS_NFIELDS(tg_billing_stats_t), (uint64_t *)&s);
    tg_buf_printf(out,
                  "# HELP tollgate_billing_total Reservations and settlements.\n"
                  "# TYPE tollgate_billing_total counter\n"
                  "tollgate_billing_total{event=\"reserved\"} %llu\n"
                  "tollgate_billing_total{event=\"refused\"} %llu\n"
                  "tollgate_billing_total{event=\"settled\"} %llu\n"
                  "tollgate_billing_total{event=\"duplicate\"} %llu\n"
                  "tollgate_billing_total{event=\"conflict\"} %llu\n"
                  "tollgate_billing_total{event=\"batch\"} %llu\n"
                  "tollgate_billing_total{event=\"spooled\"} %llu\n"
                  "tollgate_billing_total{event=\"replayed\"} %llu\n"
                  "tollgate_billing_total{event=\"reconciled\"} %llu\n"
                  "tollgate_billing_total{event=\"unheld\"} %llu\n"
                  "tollgate_billing_total{event=\"quarantined\"} %llu\n"
                  "tollgate_billing_total{event=\"usage_clamped\"} %llu\n"
                  "tollgate_billing_total{event=\"usage_estimated\"} %llu\n"
                  "tollgate_billing_total{event=\"reservation_merged\"} %llu\n",
                  (unsigned long long)s.reserved, (unsigned long long)s.refused, (unsigned long long)s.settled,
                  (unsigned long long)s.duplicates, (unsigned long long)s.conflicts, (unsigned long long)s.batches,
                  (unsigned long long)s.spooled, (unsigned long long)s.replayed, (unsigned long long)s.reconciled,
                  (unsigned long long)s.unheld, (unsigned long long)s.quarantined, (unsigned long long)s.clamped,
                  (unsigned long long)s.estimated, (unsigned long long)s.merged);
    /* Gauges, read from each worker's batcher (a scrape runs on another thread: a
     * moment's value, like the counters): what waits for the next batch, and the
     * batches at Postgres. Both fall back to 0 within postgres_timeout_ms of
     * Postgres going away, whether it closes its connections or stops answering: every
     * batch then ends committed or spooled. */
    uint64_t queued = 0, live = 0, replay = 0;
    for (int i = 0; i < n; i++) {
        const tg_billing_t *b = TG_CONTAINER_OF(stats[i], tg_billing_t, stats);
        queued += b->qlen;
        live += (uint64_t)TG_MAX(b->live_inflight, 0);
        replay += (uint64_t)TG_MAX(b->replay_inflight, 0);
    }
    tg_buf_printf(out,
                  "# HELP tollgate_billing_queue Settlement batcher elements waiting for the next batch.\n"
                  "# TYPE tollgate_billing_queue gauge\n"
                  "tollgate_billing_queue %llu\n"
                  "# HELP tollgate_billing_batches_inflight Settlement batches sent to Postgres and not yet "
                  "committed or failed (live: from the queue; replay: from the spool).\n"
                  "# TYPE tollgate_billing_batches_inflight gauge\n"
                  "tollgate_billing_batches_inflight{source=\"live\"} %llu\n"
                  "tollgate_billing_batches_inflight{source=\"replay\"} %llu\n",
                  (unsigned long long)queued, (unsigned long long)live, (unsigned long long)replay);
    tg_buf_printf(out,
                  "# HELP tollgate_budget_refusals_total Requests refused by a periodic budget (402 budget_exceeded).\n"
                  "# TYPE tollgate_budget_refusals_total counter\n"
                  "tollgate_budget_refusals_total %llu\n"
                  "# HELP tollgate_budget_alerts_total Budget threshold alerts: first sends, and attempts' outcomes.\n"
                  "# TYPE tollgate_budget_alerts_total counter\n"
                  "tollgate_budget_alerts_total{event=\"sent\"} %llu\n"
                  "tollgate_budget_alerts_total{event=\"delivered\"} %llu\n"
                  "tollgate_budget_alerts_total{event=\"retried\"} %llu\n"
                  "tollgate_budget_alerts_total{event=\"failed\"} %llu\n",
                  (unsigned long long)s.refused_budget, (unsigned long long)s.alerts_sent,
                  (unsigned long long)s.alerts_delivered, (unsigned long long)s.alerts_retried,
                  (unsigned long long)s.alerts_failed);
}

void tg_billing_metrics(tg_metrics_t *m, const tg_billing_t *b) {
    if (b)
        tg_metrics_collector_add(m, billing_collect, &b->stats);
}

static void unlocked_cb(void *ud, redisReply *r, const char *err) {
    tg_billing_t *b = ud;
    TG_UNUSED(r);
    if (err)
        tg_log_warn("billing: releasing the reconciler lock failed (%s): it expires by itself", err);
    b->lock_released = 1;
}

void tg_billing_drain(tg_billing_t *b, uv_loop_t *loop, int timeout_ms) {
    if (!b)
        return;
    uint64_t end = tg_now_ms() + (uint64_t)timeout_ms;
    /* No reconciler pass from now on; a lock this worker holds is given back, so another
     * instance takes over within one of its passes instead of after the lock's TTL. */
    b->stopping = 1;
    uv_timer_stop(&b->reconcile_timer);
    b->lock_released = 1;
    tg_redis_t *redis = tg_state_redis(b->st);
    if (b->leader && redis) {
        const char *argv[5] = {"EVAL", tg_scripts_source("unlock"), "1", "tollgate:reconciler", tg__billing_instance};
        b->lock_released = !tg_redis_command(redis, unlocked_cb, b, 5, argv, NULL);
        b->leader = 0;
    }
    tg__billing_flush(b);
    /* The holds of what lands go back once it is durable: wait for those answers too. */
    while ((b->qlen || b->live_inflight || b->replay_inflight || !b->lock_released || b->returning ||
            b->alerts_inflight || b->alerts_claiming) &&
           tg_now_ms() < end) {
        uv_run(loop, UV_RUN_ONCE);
        if (b->qlen)
            tg__billing_flush(b);
    }
}
