/*
 * The worker module: what one worker builds on its loop to serve requests, and the
 * handler table (tg_worker.h) the server runs the gateway with.
 *
 * worker_init builds the subsystems in dependency order — the state (Postgres, Redis,
 * the key cache) first, since accounts, admission and billing ride on its clients —
 * and refuses the worker when its plugin runtime cannot be built: a worker without it
 * would serve with no policy at all (a fail_closed plugin included), so the gateway
 * does not start. worker_close undoes it once the loop has stopped, in the order that
 * loses nothing: settlements still queued are sent to Postgres first, then the clients
 * go (their pending callbacks run with errors: billing spools what it carried), then
 * billing itself, which still owns its queue and spool.
 */
#include "tollgate/tg_worker.h"

#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_proxy.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_router.h"
#include "tollgate/tg_trace.h"

static void worker_close(tg_worker_t *w);

/* Readiness (/readyz): a worker is ready once it has its first account snapshot (it
 * could not route a group's key before), at once without Postgres. Polled every 50 ms
 * until then; the poll's handle is freed in its close callback. */
static void ready_timer_free(uv_handle_t *h) { free(h); }

static void ready_poll(uv_timer_t *t) {
    tg_worker_t *w = t->data;
    tg_snapshot_t *s = tg_accounts_snapshot(w->ctx->accounts);
    if (!s)
        return;
    tg_snapshot_release(s);
    atomic_store(&w->ready, 1);
    tg_log_debug("worker %d: ready (first account snapshot loaded)", w->index);
    w->ctx->ready_timer = NULL;
    uv_close((uv_handle_t *)t, ready_timer_free);
}

static int worker_init(tg_worker_t *w, char *errbuf, size_t errlen) {
    tg_worker_ctx_t *wc = calloc(1, sizeof(*wc));
    const tg_config_t *cfg = w->gw->cfg;
    char err[256];
    wc->state = tg_state_create(&w->loop, cfg, (const uint8_t(*)[32])w->gw->key_hashes, w->gw->nkeys);
    if (tg_state_redis(wc->state))
        tg_redis_owner_flushes(tg_state_redis(wc->state)); /* after the clients' bytes */
    wc->upstream = tg_upstream_create(&w->loop, &cfg->upstream, w->gw->client_tls, err, sizeof(err));
    if (!wc->upstream)
        tg_log_error("worker %d: %s", w->index, err);
    if (tg_state_pg(wc->state))
        wc->accounts = tg_accounts_create(&w->loop, wc->state, cfg, w->gw->client_tls);
    if (wc->accounts)
        wc->identity = tg_identity_create(&w->loop, wc->state, wc->accounts, cfg);
    tg_admission_config_t ac = {
        .lease_ttl_ms = cfg->limiter.lease_ttl_ms,
        .queue_max = cfg->limiter.queue_max,
        .queue_timeout_ms = cfg->limiter.queue_timeout_ms,
        .fail_rate = (tg_fail_policy_t)cfg->limiter.fail_rate,
        .fail_tokens = (tg_fail_policy_t)cfg->limiter.fail_tokens,
        .fail_concurrency = (tg_fail_policy_t)cfg->limiter.fail_concurrency,
    };
    wc->limits = tg_limits_create(&w->loop, wc->state, &ac);
    wc->plugins = tg_plugins_create(&w->loop, w->index, w->gw->nworkers, err, sizeof(err));
    wc->health = tg_health_create();
    if (cfg->billing.enabled && tg_state_pg(wc->state) && tg_state_redis(wc->state)) {
        tg_billing_config_t bc = {
            .spool_dir = cfg->billing.spool_dir,
            .reconcile_after_ms = cfg->billing.reconcile_after_ms,
            .charge_unknown = cfg->billing.charge_unknown,
            .worker = w->index,
            .reconciler = w->index == 0,
            .queue_max = cfg->billing.queue_max,
        };
        wc->billing = tg_billing_create(&w->loop, wc->state, &bc);
    }
    /* Each subsystem's counters on /metrics (every worker registers the same ones). */
    tg_state_metrics(&w->metrics, wc->state);
    tg_limits_metrics(&w->metrics, wc->limits);
    tg_billing_metrics(&w->metrics, wc->billing);
    tg_redis_metrics(&w->metrics, tg_state_redis(wc->state));
    tg_plugins_metrics(&w->metrics, wc->plugins);
    tg_identity_metrics(&w->metrics, wc->identity);
    tg_trace_metrics(&w->metrics);
    wc->proxy = tg_proxy_worker_create(wc);
    wc->policies = tg_policy_store_create(&w->loop, wc->state, cfg, w->index);
    w->ctx = wc;
    if (!wc->accounts) {
        atomic_store(&w->ready, 1);
    } else {
        wc->ready_timer = malloc(sizeof(*wc->ready_timer));
        if (!wc->ready_timer)
            abort();
        uv_timer_init(&w->loop, wc->ready_timer);
        wc->ready_timer->data = w;
        uv_timer_start(wc->ready_timer, ready_poll, 0, 50);
    }
    if (!wc->plugins) {
        snprintf(errbuf, errlen, "worker %d: the plugin runtime could not be built, refusing to serve without its "
                                 "policies: %s", w->index, err);
        worker_close(w);
        return TG_ERROR;
    }
    return TG_OK;
}

static void worker_close(tg_worker_t *w) {
    tg_worker_ctx_t *wc = w->ctx;
    if (!wc)
        return;
    tg_metrics_collectors_clear(&w->metrics);
    atomic_store(&w->ready, 0);
    if (wc->ready_timer) {
        uv_close((uv_handle_t *)wc->ready_timer, ready_timer_free);
        wc->ready_timer = NULL;
    }
    /* Settlements still queued go to Postgres now (bounded), not to the spool. */
    tg_billing_drain(wc->billing, &w->loop, 3000);
    tg_upstream_destroy(wc->upstream);
    tg_identity_destroy(wc->identity); /* its calls ride on the accounts' clients */
    tg_accounts_destroy(wc->accounts); /* cancels the account loader's query */
    tg_policy_store_destroy(wc->policies);
    if (wc->plugins)
        tg_plugins_destroy(wc->plugins);
    tg_state_destroy(wc->state);
    wc->state = NULL;
    tg_limits_destroy(wc->limits);
    tg_billing_destroy(wc->billing);
    tg_health_destroy(wc->health);
    tg_proxy_worker_destroy(wc->proxy);
    free(wc);
    w->ctx = NULL;
}

static void worker_flush(tg_worker_t *w) {
    tg_redis_t *r = w->ctx && w->ctx->state ? tg_state_redis(w->ctx->state) : NULL;
    if (r)
        tg_redis_flush(r);
}

const tg_handler_t tg_worker_handler = {
    .worker_init = worker_init,
    .worker_close = worker_close,
    .flush = worker_flush,
    .handle = tg_router_handle,
};
