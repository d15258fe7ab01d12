/*
 * The router (tg_router.h): one table of the data plane's routes, and the prefixes of
 * the admin API and the console. Each route names its protocol, which decides the error
 * shape of every answer the gateway gives on it and whether the pipeline translates.
 */
#include "tollgate/tg_router.h"

#include <string.h>

#include "tollgate/tg_admin.h"
#include "tollgate/tg_health.h"
#include "tollgate/tg_proxy.h"
#include "tollgate/tg_ui.h"
#include "tollgate/tg_worker.h"

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

/*
 * The accounts' learned quota on /metrics, as the worker answering the scrape has it
 * (tg_health.h: each worker learns from its own answers and reads the fleet's copy,
 * {a:<id>}:quota, when its own is older than a second): per account and kind, what the
 * provider said is left, its limit and the seconds to its reset; per window, its
 * utilisation and reset; and how old the figures are. Only accounts whose provider said
 * something; read on this worker's own thread (the health map is the worker's).
 */
typedef struct {
    tg_buf_t *b;
    int64_t now;
    int part;
} quota_render_t;

static const char *const quota_kinds[TG_QL__COUNT] = {"requests", "tokens", "input_tokens", "output_tokens"};
static const char *const quota_windows[TG_QW__COUNT] = {"short", "long"};

static void quota_secs(tg_buf_t *b, int64_t at_ms, int64_t now) {
    tg_buf_printf(b, "%.3f\n", at_ms > now ? (double)(at_ms - now) / 1000.0 : 0.0);
}

static void quota_entry(const tg_health_entry_t *e, void *ud) {
    quota_render_t *r = ud;
    const tg_quota_t *q = e->quota;
    if (!q || !q->known)
        return;
    long long id = (long long)e->account_id;
    for (int k = 0; k < TG_QL__COUNT; k++) {
        const tg_quota_limit_t *l = &q->lim[k];
        if (r->part == 0 && l->remaining >= 0)
            tg_buf_printf(r->b, "tollgate_account_quota_remaining{account=\"%lld\",kind=\"%s\"} %lld\n", id,
                          quota_kinds[k], (long long)l->remaining);
        if (r->part == 1 && l->limit >= 0)
            tg_buf_printf(r->b, "tollgate_account_quota_limit{account=\"%lld\",kind=\"%s\"} %lld\n", id,
                          quota_kinds[k], (long long)l->limit);
        if (r->part == 2 && l->reset_at_ms > 0) {
            tg_buf_printf(r->b, "tollgate_account_quota_reset_seconds{account=\"%lld\",kind=\"%s\"} ", id,
                          quota_kinds[k]);
            quota_secs(r->b, l->reset_at_ms, r->now);
        }
    }
    for (int w = 0; w < TG_QW__COUNT; w++) {
        const tg_quota_window_t *win = &q->win[w];
        if (r->part == 3 && win->used >= 0)
            tg_buf_printf(r->b, "tollgate_account_quota_window_utilization{account=\"%lld\",window=\"%s\"} %.4f\n",
                          id, quota_windows[w], win->used);
        if (r->part == 4 && win->reset_at_ms > 0) {
            tg_buf_printf(r->b, "tollgate_account_quota_window_reset_seconds{account=\"%lld\",window=\"%s\"} ", id,
                          quota_windows[w]);
            quota_secs(r->b, win->reset_at_ms, r->now);
        }
    }
    if (r->part == 5)
        tg_buf_printf(r->b, "tollgate_account_quota_age_seconds{account=\"%lld\"} %.3f\n", id,
                      q->at_ms > 0 && r->now > q->at_ms ? (double)(r->now - q->at_ms) / 1000.0 : 0.0);
}

static void quota_gauges(const tg_health_t *h, tg_buf_t *b) {
    static const char *const heads[6][2] = {
        {"tollgate_account_quota_remaining", "What the account's provider last said is left, by kind."},
        {"tollgate_account_quota_limit", "The limit the account's provider last stated, by kind."},
        {"tollgate_account_quota_reset_seconds", "Seconds until that limit resets, as the provider said."},
        {"tollgate_account_quota_window_utilization", "A subscription window's utilisation (0 to 1)."},
        {"tollgate_account_quota_window_reset_seconds", "Seconds until that window resets."},
        {"tollgate_account_quota_age_seconds", "How old this worker's figures for the account are."},
    };
    quota_render_t r = {.b = b, .now = (int64_t)tg_wall_ms()};
    for (r.part = 0; r.part < 6; r.part++) {
        tg_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", heads[r.part][0], heads[r.part][1], heads[r.part][0]);
        tg_health_foreach(h, quota_entry, &r);
    }
}

/* /readyz: 200 while the gateway takes traffic; 503 from the first SIGTERM on (draining:
 * a load balancer takes the instance out before the listeners close) and until every
 * worker has its first account snapshot (starting). /healthz stays 200 throughout: the
 * process is alive. */
static void answer_readyz(tg_request_t *req) {
    const tg_gateway_t *gw = req->worker->gw;
    if (atomic_load(&gw->draining)) {
        tg_response_send(req, 503, "application/json", "Retry-After: 1\r\n", "{\"status\":\"draining\"}", 21);
        return;
    }
    for (int i = 0; i < gw->nworkers; i++)
        if (!atomic_load(&gw->workers[i]->ready)) {
            tg_response_send(req, 503, "application/json", "Retry-After: 1\r\n", "{\"status\":\"starting\"}", 21);
            return;
        }
    tg_response_send(req, 200, "application/json", NULL, "{\"status\":\"ready\"}", 18);
}

/* /healthz, /readyz and /metrics: not access-logged (scraped and probed all day). */
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
    if (route == TG_ROUTE_READYZ) {
        answer_readyz(req);
        return;
    }
    tg_buf_t b;
    tg_buf_init(&b);
    const tg_gateway_t *gw = req->worker->gw;
    tg_metrics_render(gw->metrics, gw->nworkers, &b);
    if (req->worker->ctx && req->worker->ctx->health)
        quota_gauges(req->worker->ctx->health, &b);
    if (req->worker->ctx && req->worker->ctx->identity) {
        tg_snapshot_t *s = tg_accounts_snapshot(req->worker->ctx->accounts);
        tg_identity_render(req->worker->ctx->identity, s, &b);
        tg_snapshot_release(s);
    }
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
    if (!strcmp(path, "/readyz")) {
        answer_ops(req, TG_ROUTE_READYZ);
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
