/*
 * A worker's subsystems, and the handler table the server runs the gateway with.
 *
 * tg_worker_handler's worker_init builds, for one worker and on its loop, everything a
 * request needs besides the connection: the state (Postgres, Redis, the key cache), the
 * static upstream, the account snapshot, admission, the plugin runtime, account health,
 * billing, and the pipeline's own per-worker part (tg_proxy.h); worker_close tears them
 * down in the one order that loses nothing. Its handle is the router (tg_router.h).
 *
 * Ownership: the context belongs to its worker (tg_worker_t.ctx) and is touched only on
 * that worker's thread, but for the counters /metrics reads from any worker.
 */
#ifndef TOLLGATE_TG_WORKER_H
#define TOLLGATE_TG_WORKER_H

#include "tollgate/tg_accounts.h"
#include "tollgate/tg_billing.h"
#include "tollgate/tg_health.h"
#include "tollgate/tg_identity.h"
#include "tollgate/tg_limits.h"
#include "tollgate/tg_plugin.h"
#include "tollgate/tg_policy_store.h"
#include "tollgate/tg_server.h"
#include "tollgate/tg_state.h"
#include "tollgate/tg_upstream.h"

typedef struct tg_proxy_worker_s tg_proxy_worker_t;

struct tg_worker_ctx_s {
    tg_state_t *state;        /* Postgres, Redis, the key cache */
    tg_upstream_t *upstream;  /* the static upstream of the config file; NULL if it failed */
    tg_accounts_t *accounts;  /* the account snapshot (with Postgres), else NULL */
    tg_limits_t *limits;      /* admission in Redis */
    tg_plugins_t *plugins;    /* this worker's plugin runtime, never NULL once built */
    tg_billing_t *billing;    /* metering (billing on, Postgres and Redis), else NULL */
    tg_health_t *health;      /* per-account EWMAs, cooldowns, trials */
    tg_identity_t *identity;  /* the accounts' access tokens (with accounts), else NULL */
    tg_proxy_worker_t *proxy; /* the pipeline's own: scripts, the key hash, spare requests */
    tg_policy_store_t *policies; /* the workbench's store (plugins.store and Postgres), else NULL */
    uv_timer_t *ready_timer;  /* polls for the first account snapshot, then sets tg_worker_t.ready */
};

/** {worker_init, worker_close, flush, handle}: this module's three, and tg_router_handle. */
extern const tg_handler_t tg_worker_handler;

#endif
