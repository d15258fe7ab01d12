/*
 * The client-facing HTTP/1.1 server: worker threads, listeners, connections and the
 * requests parsed from them.
 *
 * Each worker owns a uv_loop, its listeners (one socket per worker, SO_REUSEPORT) and
 * every connection accepted on them; nothing mutable crosses workers. A connection
 * parses requests with llhttp (pipelining: one request is processed at a time, later
 * ones wait in the input buffer), hands each complete request to the handler table's
 * handle(), and resumes parsing when that request's response has ended.
 *
 * The server knows nothing above it: what serves a request, and what a worker needs for
 * that, come in a tg_handler_t given to tg_gateway_create (the application's is
 * tg_worker_handler, app/tg_worker.c).
 *
 * Ownership: the connection owns its current request. When the client goes away while
 * a request is processed, the request's abort_cb runs first (the handler must detach
 * from everything it started, synchronously), then the request is freed.
 */
#ifndef TOLLGATE_TG_SERVER_H
#define TOLLGATE_TG_SERVER_H

#include <llhttp.h>
#include <openssl/ssl.h>
#include <uv.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_config.h"
#include "tollgate/tg_metrics.h"

typedef struct tg_worker_s tg_worker_t;
typedef struct tg_conn_s tg_conn_t;
typedef struct tg_request_s tg_request_t;
typedef struct tg_gateway_s tg_gateway_t;
/** The handler's per-worker context: defined by the layer above (tg_worker.h), opaque here. */
typedef struct tg_worker_ctx_s tg_worker_ctx_t;

/**
 * What the server calls, nginx-module style; every entry runs on the worker's thread but
 * worker_init, which runs on the thread calling tg_gateway_create.
 */
typedef struct {
    /** Builds w->ctx. TG_ERROR + err when the worker cannot serve as configured, having
     *  undone what it made (the gateway then refuses to start). */
    int (*worker_init)(tg_worker_t *w, char *err, size_t errlen);
    /** Tears w->ctx down once the worker's loop has stopped (or another worker's
     *  worker_init failed). Safe when w->ctx is NULL. */
    void (*worker_close)(tg_worker_t *w);
    /** The end of every loop iteration's output flush, after the clients' bytes (the
     *  Redis commands the iteration issued go out here, see tg_redis_owner_flushes). */
    void (*flush)(tg_worker_t *w);
    /** A complete request: answer it, now or later, with tg_response_*. */
    void (*handle)(tg_request_t *req);
} tg_handler_t;

#define TG_MAX_HEADERS 100

typedef struct {
    tg_str_t name;
    tg_str_t value;
} tg_header_t;

struct tg_request_s {
    tg_conn_t *conn;
    tg_worker_t *worker;
    char id[33];
    uint64_t start_ns;    /* first byte of the request seen */
    uint64_t ready_ns;    /* request fully read */
    int method;           /* llhttp_method_t */
    tg_buf_t url;
    tg_buf_t raw_headers; /* names and values, referenced by headers[] */
    tg_header_t headers[TG_MAX_HEADERS];
    int nheaders;
    tg_buf_t body;
    int keep_alive;
    int tls;              /* arrived over the TLS listener */
    char client_ip[48];

    /* The response. */
    int status;
    int resp_started;
    int resp_chunked;
    int resp_ended;
    uint64_t bytes_in;
    uint64_t bytes_out;
    tg_route_t route;

    /* Set by the handler. */
    void *handler_data;
    /** The client went away; detach from everything, do not write. */
    void (*abort_cb)(tg_request_t *req);
    /** The client's write queue drained below the low watermark (resume reading upstream). */
    void (*drain_cb)(tg_request_t *req);
    /** The response ended (or was aborted); write the access log. Runs exactly once. */
    void (*finish_cb)(tg_request_t *req, int aborted);
    tg_request_t *next_spare; /* the worker's list of reusable requests */
};

/** The gateway: config, workers and what they share read-only. */
struct tg_gateway_s {
    tg_config_t *cfg;
    const tg_handler_t *handler;
    int nworkers;
    tg_worker_t **workers;
    tg_metrics_t **metrics; /* one per worker, for /metrics */
    SSL_CTX *server_tls;     /* NULL without a TLS listener */
    SSL_CTX *client_tls;     /* for https upstreams */
    uint8_t (*key_hashes)[32]; /* SHA-256 of the static keys */
    size_t nkeys;
    /* Set at the first SIGTERM/SIGINT, before the drain delay: /readyz answers 503 from
     * then on, while the listeners still accept (limits.drain_delay_ms). */
    _Atomic int draining;
};

struct tg_worker_s {
    tg_gateway_t *gw;
    int index;
    uv_loop_t loop;
    uv_thread_t thread;
    uv_async_t stop_async;
    uv_timer_t shutdown_timer;
    uv_tcp_t listeners[2];
    int nlisteners;
    int listener_tls[2];
    tg_metrics_t metrics;
    tg_worker_ctx_t *ctx; /* the handler's (worker_init .. worker_close) */
    _Atomic int ready;    /* set by the handler once the worker can serve (/readyz reads every worker's) */
    int draining;
    int64_t nconns;
    void *conns_head;     /* intrusive list of connections */
    uv_prepare_t prepare; /* flushes corked output and the access log */
    tg_conn_t *dirty;     /* connections with corked output */
    tg_buf_t logbuf;      /* access-log lines not yet written */
    tg_request_t *spare;  /* finished requests kept for reuse (bounded, small buffers) */
    int nspare;
};

/** Queues one access-log line (no newline) for the worker's next flush. */
void tg_worker_log(tg_worker_t *w, const char *line, size_t len);

/** Looks up a request header by name (ASCII case-insensitive). Returns NULL if absent. */
const tg_str_t *tg_request_header(const tg_request_t *req, const char *name);

/**
 * Starts the response. `extra_headers` is either NULL or complete header lines, each
 * ending in "\r\n". `content_length` < 0 means chunked. Adds Date-less minimal
 * headers, x-request-id and Connection.
 */
void tg_response_start(tg_request_t *req, int status, const char *content_type,
                       const char *extra_headers, int64_t content_length);
/** Writes body bytes (framed as a chunk when chunked). */
void tg_response_body(tg_request_t *req, const char *p, size_t n);
/** Ends the response: the request is finished and freed; do not touch it afterwards. */
void tg_response_end(tg_request_t *req);
/** A whole response in one call. */
void tg_response_send(tg_request_t *req, int status, const char *content_type,
                      const char *extra_headers, const char *body, size_t n);
/** An OpenAI-shaped error: {"error":{"message","type","code"}}. Ends the request. */
void tg_response_error(tg_request_t *req, int status, const char *type, const char *code,
                       const char *message);
/** The same, with extra header lines ("Name: value\r\n"...), e.g. Retry-After or Allow. */
void tg_response_error_ex(tg_request_t *req, int status, const char *type, const char *code,
                          const char *message, const char *extra_headers);
/** Ends a started response abnormally: the connection is closed without the last chunk,
 *  so the client sees a truncated response rather than a false success. */
void tg_response_abort(tg_request_t *req);
/** Bytes queued to the client and not yet written. */
size_t tg_request_write_queue(const tg_request_t *req);

/** Creates the gateway from a loaded config (it keeps the pointer), serving with
 *  `handler` (static, kept): calls its worker_init for every worker. NULL + err on
 *  failure. */
tg_gateway_t *tg_gateway_create(tg_config_t *cfg, const tg_handler_t *handler, char *err, size_t errlen);
/** Runs workers until SIGTERM/SIGINT, then drains. Returns the exit code. */
int tg_gateway_run(tg_gateway_t *gw);
void tg_gateway_destroy(tg_gateway_t *gw);

/*
 * The request-parsing core of a connection, exposed for the fuzz target: feeds bytes to
 * a fresh parser with the given limits and reports how many requests it completed (-1
 * on a protocol error, -2 for headers too large, -3 for a body too large).
 */
int tg_http_parse_for_fuzz(const char *data, size_t len, size_t max_header, size_t max_body);

#endif
