/*
 * The access log: one JSON line per request, written by one function for every kind of
 * request — the data plane, the admin API, the console, and the answers the server gives
 * itself (400 from the parser, 408, 413, 431). Each handler calls tg_access_log from its
 * finish callback with what only it knows; the members every line has are written here.
 */
#ifndef TOLLGATE_TG_ACCESS_LOG_H
#define TOLLGATE_TG_ACCESS_LOG_H

#include "tollgate/tg_server.h"

/** What a handler adds to its request's line. Zeroed members take the request's own. */
typedef struct {
    const char *route;  /* NULL: tg_route_name(req->route) */
    const char *method; /* NULL: the request's method */
    const char *path;   /* NULL: the request's URL as received */
    size_t path_len;    /* with path */
    uint64_t bytes_in;  /* 0: req->bytes_in */
    uint64_t now_ns;    /* the end of the request; 0: now */
    const char *error;  /* a short code (no escaping needed); NULL: "client_disconnected" when
                           the client went away, else none */
    /** Appends the handler's own members, each as ,"name":value (may be NULL). */
    void (*more)(void *ud, tg_buf_t *line, uint64_t now_ns);
    void *ud;
} tg_access_line_t;

/**
 * Queues the request's access-log line, when the config's access_log is on: ts,
 * request_id, route, method, path, status (499 for a client gone before an error status),
 * client_ip, bytes_in, bytes_out, total_ms, then `more`'s members, then error. Control
 * bytes and invalid UTF-8 in any member are escaped at the sink (tg_worker_log).
 */
void tg_access_log(tg_request_t *req, int aborted, const tg_access_line_t *l);

#endif
