/*
 * The data-plane pipeline: a request to a /v1/ route walks phases (auth, parse,
 * plugins, admission, account selection, slot, reservation, the upstream call) and its
 * answer streams back as it arrives; at the end it is settled, released and logged.
 * See the top of app/tg_proxy.c for the phases and the files that hold them.
 *
 * Called by the router (tg_router.h) with the route already set on the request; uses the
 * subsystems of the request's worker (tg_worker.h).
 */
#ifndef TOLLGATE_TG_PROXY_H
#define TOLLGATE_TG_PROXY_H

#include "tollgate/tg_server.h"
#include "tollgate/tg_usage.h"

typedef struct tg_proxy_worker_s tg_proxy_worker_t;

/** The pipeline's own per-worker part (its Redis scripts, the key hash context, the
 *  spare requests), for worker_init; wc->state must be built. Never NULL. */
tg_proxy_worker_t *tg_proxy_worker_create(tg_worker_ctx_t *wc);
/** Frees it (NULL is fine); after the worker's loop has stopped. */
void tg_proxy_worker_destroy(tg_proxy_worker_t *pw);

/** Runs the pipeline for req (req->route set, the query string stripped from req->url);
 *  `proto` is what the client speaks. Takes the request over. */
void tg_proxy_handle(tg_request_t *req, tg_proto_t proto);
/** Answers a data-plane request the router refuses (404, 405 with `extra_headers`
 *  "Allow: ...\r\n") in the error shape of `proto`, access-logged like any other. */
void tg_proxy_refuse(tg_request_t *req, tg_proto_t proto, int status, const char *code, const char *msg,
                     const char *extra_headers);

#endif
