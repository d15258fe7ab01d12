/*
 * The router (tg_router.h): one table of the data plane's routes, and the prefixes of
 * the admin API and the console. Each route names its protocol, which decides the error
 * shape of every answer the gateway gives on it and whether the pipeline translates.
 */
#include "tollgate/tg_router.h"

#include <string.h>

#include "tollgate/tg_admin.h"
#include "tollgate/tg_proxy.h"
#include "tollgate/tg_ui.h"

/* The routes the data-plane pipeline answers. */
static const struct {
    const char *path;
    tg_route_t route;
    tg_proto_t proto; /* what the client speaks */
    int post;         /* POST only; otherwise GET and HEAD */
} data_routes[] = {
    {"/v1/chat/completions", TG_ROUTE_CHAT, TG_PROTO_OPENAI_CHAT, 1},
    {"/v1/messages", TG_ROUTE_MESSAGES, TG_PROTO_ANTHROPIC, 1},
    {"/v1/messages/count_tokens", TG_ROUTE_MESSAGES, TG_PROTO_ANTHROPIC, 1},
    {"/v1/responses", TG_ROUTE_RESPONSES, TG_PROTO_RESPONSES, 1},
    {"/v1/embeddings", TG_ROUTE_EMBEDDINGS, TG_PROTO_EMBEDDINGS, 1},
    {"/v1/models", TG_ROUTE_MODELS, TG_PROTO_OPENAI_CHAT, 0},
};

static const char ALLOW_GET[] = "Allow: GET, HEAD\r\n";
static const char ALLOW_POST[] = "Allow: POST\r\n";

static int is_get(const tg_request_t *req) { return req->method == HTTP_GET || req->method == HTTP_HEAD; }

/* /healthz and /metrics: not access-logged (scraped and probed all day). */
static void answer_ops(tg_request_t *req, tg_route_t route) {
    req->route = route;
    if (!is_get(req)) {
        tg_response_error_ex(req, 405, "invalid_request_error", "method_not_allowed", "method not allowed", ALLOW_GET);
        return;
    }
    if (route == TG_ROUTE_HEALTHZ) {
        tg_response_send(req, 200, "application/json", NULL, "{\"status\":\"ok\"}", 15);
        return;
    }
    tg_buf_t b;
    tg_buf_init(&b);
    const tg_gateway_t *gw = req->worker->gw;
    tg_metrics_render(gw->metrics, gw->nworkers, &b);
    tg_response_send(req, 200, "text/plain; version=0.0.4", NULL, b.data, b.len);
    tg_buf_free(&b);
}

void tg_router_handle(tg_request_t *req) {
    /* Strip the query string; keep the path NUL-terminated inside the url buffer. */
    char *q = req->url.data ? strchr(req->url.data, '?') : NULL;
    if (q)
        *q = '\0';
    const char *path = req->url.data ? req->url.data : "/";
    if (!strcmp(path, "/healthz")) {
        answer_ops(req, TG_ROUTE_HEALTHZ);
        return;
    }
    if (!strcmp(path, "/metrics")) {
        answer_ops(req, TG_ROUTE_METRICS);
        return;
    }
    for (size_t i = 0; i < sizeof(data_routes) / sizeof(data_routes[0]); i++) {
        if (strcmp(path, data_routes[i].path) != 0)
            continue;
        req->route = data_routes[i].route;
        if (data_routes[i].post ? req->method != HTTP_POST : !is_get(req))
            tg_proxy_refuse(req, data_routes[i].proto, 405, "method_not_allowed", "method not allowed",
                            data_routes[i].post ? ALLOW_POST : ALLOW_GET);
        else if (data_routes[i].route == TG_ROUTE_MODELS && tg_request_header(req, "anthropic-version"))
            tg_proxy_handle(req, TG_PROTO_ANTHROPIC); /* an Anthropic client: its list's shape, its errors */
        else
            tg_proxy_handle(req, data_routes[i].proto);
        return;
    }
    if (strncmp(path, "/admin/api/v1/", 14) == 0 || strcmp(path, "/admin/api/v1") == 0) {
        tg_admin_handle(req, path, q ? q + 1 : NULL);
        return;
    }
    if (strcmp(path, "/admin") == 0 || strncmp(path, "/admin/", 7) == 0) {
        tg_ui_handle(req, path);
        return;
    }
    tg_proxy_refuse(req, TG_PROTO_OPENAI_CHAT, 404, "not_found", "unknown route", NULL);
}
