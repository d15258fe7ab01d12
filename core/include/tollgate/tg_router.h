/*
 * The router: the one place that maps a request's path to what answers it.
 *
 *   /healthz, /readyz, /metrics answered here (GET, HEAD)
 *   /v1/chat/completions, /v1/messages[/count_tokens], /v1/responses, /v1/embeddings,
 *   /v1/models                  the data-plane pipeline (tg_proxy.h)
 *   /admin/api/v1, /admin/api/v1/...   the admin API (tg_admin.h)
 *   /admin, /admin/...          the console (tg_ui.h)
 *
 * Anything else is a 404, and a route called with the wrong method a 405 with Allow,
 * in the route's own error shape (Anthropic's on /v1/messages) and access-logged like a
 * data-plane request.
 */
#ifndef TOLLGATE_TG_ROUTER_H
#define TOLLGATE_TG_ROUTER_H

#include "tollgate/tg_server.h"

/** The handler table's handle (tg_worker_handler): strips the query string from
 *  req->url in place (the path stays NUL-terminated there) and hands the request on. */
void tg_router_handle(tg_request_t *req);

#endif
