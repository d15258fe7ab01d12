/*
 * The access-log writer (tg_access_log.h): the one place a request's line is built, so
 * every line — data plane, admin API, console, the server's own answers — carries the
 * same members under the same names.
 */
#include <llhttp.h>

#include "tollgate/tg_access_log.h"

void tg_access_log(tg_request_t *req, int aborted, const tg_access_line_t *l) {
    if (!req->worker->gw->cfg->access_log)
        return;
    uint64_t now = l->now_ns ? l->now_ns : tg_now_ns();
    const char *path = l->path ? l->path : req->url.data ? req->url.data : "";
    size_t path_len = l->path ? l->path_len : req->url.data ? strlen(req->url.data) : 0;
    const char *error = l->error ? l->error : aborted ? "client_disconnected" : NULL;
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_printf(&b, "{\"ts\":%llu,\"request_id\":\"%s\",\"route\":\"%s\",\"method\":\"%s\",\"path\":\"",
                  (unsigned long long)tg_wall_ms(), req->id, l->route ? l->route : tg_route_name(req->route),
                  l->method ? l->method : llhttp_method_name((llhttp_method_t)req->method));
    tg_buf_append_json_escaped(&b, path, path_len);
    tg_buf_printf(&b, "\",\"status\":%d,\"client_ip\":\"%s\",\"bytes_in\":%llu,\"bytes_out\":%llu,\"total_ms\":%.3f",
                  aborted && req->status < 400 ? 499 : req->status, req->client_ip,
                  (unsigned long long)(l->bytes_in ? l->bytes_in : req->bytes_in), (unsigned long long)req->bytes_out,
                  (double)(now - req->start_ns) / 1e6);
    if (l->more)
        l->more(l->ud, &b, now);
    if (error)
        tg_buf_printf(&b, ",\"error\":\"%s\"", error);
    tg_buf_appends(&b, "}");
    tg_worker_log(req->worker, b.data, b.len);
    tg_buf_free(&b);
}
