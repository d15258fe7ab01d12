/*
 * The client-facing HTTP/1.1 server (see tg_server.h): listeners with SO_REUSEPORT,
 * one uv_loop per worker thread, connections parsed by llhttp, the response writer,
 * the timeouts that protect against slow clients, and graceful shutdown.
 *
 * Connection states: IDLE (between requests; idle timeout), HEADERS (header timeout),
 * BODY (body timeout), PROCESSING (the handler owns the request; input is still read
 * so that a disconnect is seen at once and pipelined requests wait in `in`).
 */
#include "tollgate/tg_access_log.h"
#include "tollgate/tg_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/sha.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tollgate/tg_tls.h"

#include "tg_timeout_internal.h"

enum { CONN_IDLE, CONN_HEADERS, CONN_BODY, CONN_PROCESSING };
enum { PARSE_NONE, PARSE_FIELD, PARSE_VALUE };

struct tg_conn_s {
    uv_tcp_t tcp;
    uv_timer_t timer;
    tg_timeout_t timeout; /* the state's timeout on `timer` (conn_set_timer) */
    tg_worker_t *w;
    tg_conn_t *prev, *next;
    tg_tls_t *tls;
    llhttp_t parser;
    tg_buf_t in;         /* plaintext not yet parsed */
    tg_buf_t tls_plain;  /* scratch for TLS reads */
    tg_request_t *req;   /* being parsed or processed */
    int state;
    int closing;
    int handles;         /* open uv handles; freed when 0 */
    int reading;
    int in_process;      /* inside process_input: do not recurse */
    int close_after_write;
    int lingering;       /* answered and closing: reading and discarding (conn_linger) */
    size_t linger_bytes;
    uint64_t linger_end_ms;
    uv_shutdown_t shutdown_req;
    int fuzz;            /* no socket: parse only */
    int fuzz_result;
    size_t header_bytes;
    size_t write_queued;
    int hstate;
    size_t name_off, name_len, val_off, val_len;
    size_t hoffs[TG_MAX_HEADERS][4];
    int nh;
    int err_status;      /* a response decided while parsing (413, 431) */
    int have_method;     /* the request line's method was parsed */
    const char *early_code; /* the error code of an answer the server gave itself */
    char client_ip[48];  /* the peer's address, looked up once per connection */
    tg_buf_t out;        /* corked output, flushed before the loop polls */
    int dirty;           /* on the worker's dirty list */
    tg_conn_t *dirty_next;
};

static llhttp_settings_t parser_settings;
static void conn_close(tg_conn_t *c);
static void process_input(tg_conn_t *c);
static void conn_set_timer(tg_conn_t *c, int ms);
static void conn_linger(tg_conn_t *c);

/* ---- requests ---------------------------------------------------------------------- */

/*
 * Requests are recycled through a short per-worker list: a keep-alive client's next
 * request reuses a finished one's struct and its url/header/body buffers instead of
 * four allocations and their growth. Only buffers up to SPARE_BUF_MAX are kept, and at
 * most SPARE_MAX requests, so idle memory stays bounded. Under ASan the kept ones are
 * poisoned (TG_POISON): touching one is reported like a use after free.
 */
#define SPARE_MAX 64
#define SPARE_BUF_MAX 16384

static void buf_recycle(tg_buf_t *b) {
    if (b->cap > SPARE_BUF_MAX)
        tg_buf_free(b);
    else
        tg_buf_reset(b);
}

static tg_request_t *request_new(tg_conn_t *c) {
    tg_worker_t *w = c->w;
    tg_request_t *r = w->spare;
    tg_buf_t url, raw, body;
    if (r) {
        TG_UNPOISON(r, sizeof(*r));
        w->spare = r->next_spare;
        w->nspare--;
        url = r->url, raw = r->raw_headers, body = r->body;
        TG_UNPOISON(url.data, url.cap);
        TG_UNPOISON(raw.data, raw.cap);
        TG_UNPOISON(body.data, body.cap);
    } else {
        r = malloc(sizeof(*r));
        if (!r)
            abort();
        tg_buf_init(&url);
        tg_buf_init(&raw);
        tg_buf_init(&body);
    }
    /* The header array (3 KiB) is filled before it is read: only the rest is zeroed. */
    memset(r, 0, offsetof(tg_request_t, headers));
    memset((char *)r + offsetof(tg_request_t, headers) + sizeof(r->headers), 0,
           sizeof(*r) - offsetof(tg_request_t, headers) - sizeof(r->headers));
    r->url = url, r->raw_headers = raw, r->body = body;
    r->conn = c;
    r->worker = w;
    r->start_ns = tg_now_ns();
    r->tls = c->tls != NULL;
    r->route = TG_ROUTE_OTHER;
    tg_request_id(r->id);
    if (!c->fuzz && !c->client_ip[0]) {
        struct sockaddr_storage ss;
        int len = sizeof(ss);
        if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
            if (ss.ss_family == AF_INET)
                uv_ip4_name((struct sockaddr_in *)&ss, c->client_ip, sizeof(c->client_ip));
            else if (ss.ss_family == AF_INET6)
                uv_ip6_name((struct sockaddr_in6 *)&ss, c->client_ip, sizeof(c->client_ip));
        }
    }
    memcpy(r->client_ip, c->client_ip, sizeof(r->client_ip));
    return r;
}

static void request_destroy(tg_request_t *r) {
    tg_buf_free(&r->url);
    tg_buf_free(&r->raw_headers);
    tg_buf_free(&r->body);
    free(r);
}

static void request_free(tg_request_t *r) {
    tg_worker_t *w = r->worker;
    if (w->nspare >= SPARE_MAX || w->draining) {
        request_destroy(r);
        return;
    }
    buf_recycle(&r->url);
    buf_recycle(&r->raw_headers);
    buf_recycle(&r->body);
    r->next_spare = w->spare;
    w->spare = r;
    w->nspare++;
    /* Under ASan a recycled request is as untouchable as a freed one. */
    TG_POISON(r->url.data, r->url.cap);
    TG_POISON(r->raw_headers.data, r->raw_headers.cap);
    TG_POISON(r->body.data, r->body.cap);
    TG_POISON(r, sizeof(*r));
}

static void spare_free_all(tg_worker_t *w) {
    while (w->spare) {
        tg_request_t *r = w->spare;
        TG_UNPOISON(r, sizeof(*r));
        TG_UNPOISON(r->url.data, r->url.cap);
        TG_UNPOISON(r->raw_headers.data, r->raw_headers.cap);
        TG_UNPOISON(r->body.data, r->body.cap);
        w->spare = r->next_spare;
        request_destroy(r);
    }
    w->nspare = 0;
}

const tg_str_t *tg_request_header(const tg_request_t *req, const char *name) {
    for (int i = 0; i < req->nheaders; i++)
        if (tg_str_ieq(req->headers[i].name, name))
            return &req->headers[i].value;
    return NULL;
}

/* ---- writing ----------------------------------------------------------------------- */

typedef struct {
    uv_write_t w;
    tg_conn_t *c;
    size_t len;
    char data[];
} wreq_t;

static void write_cb(uv_write_t *w, int status) {
    wreq_t *wr = (wreq_t *)w;
    tg_conn_t *c = wr->c;
    c->write_queued -= wr->len;
    free(wr);
    if (c->closing)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    if (c->write_queued == 0 && c->close_after_write && !c->dirty) {
        conn_linger(c);
        return;
    }
    if (c->req && c->req->drain_cb && c->write_queued <= c->w->gw->cfg->http_limits.max_write_buffer / 2)
        c->req->drain_cb(c->req);
    if (c->state == CONN_PROCESSING) {
        if (c->write_queued)
            conn_set_timer(c, c->w->gw->cfg->http_limits.write_timeout_ms);
        else
            tg_timeout_clear(&c->timeout);
    }
}

/* Writes bytes to the socket now: try, then queue the rest (copied). */
static void conn_write_raw(tg_conn_t *c, const char *p, size_t total) {
    if (c->closing || c->fuzz || total == 0)
        return;
    size_t done = 0;
    if (c->write_queued == 0) {
        uv_buf_t b = uv_buf_init((char *)p, (unsigned)total);
        int r = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
        if (r >= 0)
            done = (size_t)r;
        else if (r != UV_EAGAIN && r != UV_ENOSYS) {
            conn_close(c);
            return;
        }
    }
    if (done == total)
        return;
    wreq_t *wr = malloc(sizeof(*wr) + total - done);
    if (!wr)
        abort();
    wr->c = c;
    wr->len = total - done;
    memcpy(wr->data, p + done, wr->len);
    uv_buf_t b = uv_buf_init(wr->data, (unsigned)wr->len);
    c->write_queued += wr->len;
    int r = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
    if (r < 0) {
        c->write_queued -= wr->len;
        free(wr);
        conn_close(c);
        return;
    }
    if (c->state == CONN_PROCESSING)
        conn_set_timer(c, c->w->gw->cfg->http_limits.write_timeout_ms);
}

/*
 * Output is corked: everything written to a connection during one loop iteration is
 * appended to c->out and sent with one write before the loop polls again (the worker's
 * uv_prepare). A response head, its body and the final chunk usually leave in one
 * syscall, and no write waits longer than the current iteration.
 */
static void conn_writev(tg_conn_t *c, uv_buf_t *bufs, int nbufs) {
    if (c->closing || c->fuzz)
        return;
    for (int i = 0; i < nbufs; i++)
        tg_buf_append(&c->out, bufs[i].base, bufs[i].len);
    if (!c->dirty) {
        c->dirty = 1;
        c->dirty_next = c->w->dirty;
        c->w->dirty = c;
    }
}

static void conn_flush(tg_conn_t *c) {
    c->dirty = 0;
    if (c->closing)
        return;
    if (c->out.len) {
        if (c->tls) {
            tg_buf_t net;
            tg_buf_init(&net);
            int rc = tg_tls_write(c->tls, c->out.data, c->out.len, &net);
            tg_buf_reset(&c->out);
            if (rc != TG_OK) {
                tg_buf_free(&net);
                conn_close(c);
                return;
            }
            conn_write_raw(c, net.data, net.len);
            tg_buf_free(&net);
        } else {
            conn_write_raw(c, c->out.data, c->out.len);
            tg_buf_reset(&c->out);
        }
        if (c->out.cap > 65536)
            tg_buf_free(&c->out);
        /* The kernel may take the whole flush at once: then no write_cb follows, and a
         * handler that paused its source on a full queue must hear of the room here. */
        if (!c->closing && c->req && c->req->drain_cb &&
            c->write_queued <= c->w->gw->cfg->http_limits.max_write_buffer / 2)
            c->req->drain_cb(c->req);
    }
    if (!c->closing && c->close_after_write && c->write_queued == 0)
        conn_linger(c);
}

/* Access-log lines go to stdout in one write per loop iteration; each line is whole. */
static void log_flush(tg_worker_t *w) {
    size_t off = 0;
    while (off < w->logbuf.len) {
        ssize_t n = write(STDOUT_FILENO, w->logbuf.data + off, w->logbuf.len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    tg_buf_reset(&w->logbuf);
}

static void prepare_cb(uv_prepare_t *h) {
    tg_worker_t *w = h->data;
    while (w->dirty) {
        tg_conn_t *c = w->dirty;
        w->dirty = c->dirty_next;
        conn_flush(c);
    }
    if (w->gw->handler)
        w->gw->handler->flush(w);
    if (w->logbuf.len) {
        log_flush(w);
        if (w->logbuf.cap > 1 << 20)
            tg_buf_free(&w->logbuf);
    }
}

void tg_worker_log(tg_worker_t *w, const char *line, size_t len) {
    /* Every access-log line is valid JSON and one line, whatever a field carried
     * (control bytes, invalid UTF-8): escaped here, at the sink. */
    tg_buf_append_log_safe(&w->logbuf, line, len, 1);
    tg_buf_append(&w->logbuf, "\n", 1);
    if (w->logbuf.len > 256 * 1024)
        log_flush(w);
}

static const char *reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 402: return "Payment Required";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 529: return "Overloaded";
    default: return "Unknown";
    }
}

/* Appends len bytes to a fixed head buffer, truncating rather than overflowing (the
 * values are short and bounded where they come from; this is only the last guard). */
static void head_put(char *head, size_t *n, size_t cap, const char *s, size_t len) {
    if (len > cap - *n)
        len = cap - *n;
    memcpy(head + *n, s, len);
    *n += len;
}

#define HEAD_LIT(lit) head_put(head, &n, sizeof(head), (lit), sizeof(lit) - 1)

static void head_puts(char *head, size_t *n, size_t cap, const char *s) { head_put(head, n, cap, s, strlen(s)); }

void tg_response_start(tg_request_t *req, int status, const char *content_type,
                       const char *extra_headers, int64_t content_length) {
    tg_conn_t *c = req->conn;
    if (req->resp_started)
        return;
    req->resp_started = 1;
    req->status = status;
    if (c->w->draining)
        req->keep_alive = 0;
    /* Built by hand: this runs once per response, and snprintf was a measurable part of
     * the per-request CPU (spec/bench/RESULTS.md). Every piece is bounded by head_put. */
    char head[1024];
    size_t n = 0;
    char num[24];
    HEAD_LIT("HTTP/1.1 ");
    head_put(head, &n, sizeof(head), num, tg_fmt_u64(num, (uint64_t)(status > 0 ? status : 0)));
    HEAD_LIT(" ");
    head_puts(head, &n, sizeof(head), reason(status));
    HEAD_LIT("\r\nx-request-id: ");
    head_puts(head, &n, sizeof(head), req->id);
    HEAD_LIT("\r\n");
    if (content_type) {
        HEAD_LIT("Content-Type: ");
        head_puts(head, &n, sizeof(head), content_type);
        HEAD_LIT("\r\n");
    }
    if (content_length >= 0) {
        HEAD_LIT("Content-Length: ");
        head_put(head, &n, sizeof(head), num, tg_fmt_u64(num, (uint64_t)content_length));
        HEAD_LIT("\r\n");
    } else {
        req->resp_chunked = 1;
        HEAD_LIT("Transfer-Encoding: chunked\r\n");
    }
    if (!req->keep_alive)
        HEAD_LIT("Connection: close\r\n");
    uv_buf_t bufs[3];
    int nb = 0;
    bufs[nb++] = uv_buf_init(head, (unsigned)n);
    if (extra_headers && *extra_headers)
        bufs[nb++] = uv_buf_init((char *)extra_headers, (unsigned)strlen(extra_headers));
    bufs[nb++] = uv_buf_init("\r\n", 2);
    for (int i = 0; i < nb; i++)
        req->bytes_out += bufs[i].len;
    conn_writev(c, bufs, nb);
}

void tg_response_body(tg_request_t *req, const char *p, size_t n) {
    /* A HEAD answer has its head only (the headers a GET would get): a body would be
     * read as the start of the next response on a keep-alive connection. */
    if (!n || req->resp_ended || req->method == HTTP_HEAD)
        return;
    req->bytes_out += n;
    if (!req->resp_chunked) {
        uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
        conn_writev(req->conn, &b, 1);
        return;
    }
    static const char hex[] = "0123456789abcdef";
    char size[24];
    int sn = 0;
    for (int shift = 60; shift >= 0; shift -= 4)
        if (sn || (n >> shift) & 15 || shift == 0)
            size[sn++] = hex[(n >> shift) & 15];
    size[sn++] = '\r';
    size[sn++] = '\n';
    uv_buf_t bufs[3] = {uv_buf_init(size, (unsigned)sn), uv_buf_init((char *)p, (unsigned)n),
                        uv_buf_init("\r\n", 2)};
    conn_writev(req->conn, bufs, 3);
}

static void request_finish(tg_request_t *req, int aborted) {
    tg_conn_t *c = req->conn;
    tg_worker_t *w = c->w;
    if (!req->status)
        req->status = aborted ? 499 : 500;
    if (req->finish_cb)
        req->finish_cb(req, aborted);
    if (!c->fuzz) {
        tg_metrics_count_request(&w->metrics, req->route, aborted && req->status < 400 ? 499 : req->status);
        tg_histogram_observe(&w->metrics.duration, (tg_now_ns() - req->start_ns) / 1000);
        atomic_fetch_sub_explicit(&w->metrics.inflight, 1, memory_order_relaxed);
        if (aborted)
            atomic_fetch_add_explicit(&w->metrics.client_aborts, 1, memory_order_relaxed);
    }
    c->req = NULL;
    request_free(req);
}

void tg_response_end(tg_request_t *req) {
    tg_conn_t *c = req->conn;
    if (req->resp_ended)
        return;
    req->resp_ended = 1;
    if (!req->resp_started)
        tg_response_start(req, req->status ? req->status : 200, NULL, NULL, 0);
    if (req->resp_chunked && req->method != HTTP_HEAD) {
        uv_buf_t b = uv_buf_init("0\r\n\r\n", 5);
        req->bytes_out += 5;
        conn_writev(c, &b, 1);
    }
    int keep = req->keep_alive && !c->w->draining && !c->closing;
    request_finish(req, 0);
    if (c->closing)
        return;
    if (!keep) {
        c->close_after_write = 1;
        if (!c->dirty && c->write_queued == 0)
            conn_linger(c);
        return;
    }
    c->state = CONN_IDLE;
    if (!c->fuzz) {
        conn_set_timer(c, c->w->gw->cfg->http_limits.idle_timeout_ms);
        if (!c->reading) {
            /* Reading was stopped because too much pipelined input was buffered. */
            c->reading = 1;
        }
    }
    llhttp_resume(&c->parser);
    if (!c->in_process)
        process_input(c);
}

void tg_response_send(tg_request_t *req, int status, const char *content_type,
                      const char *extra_headers, const char *body, size_t n) {
    tg_response_start(req, status, content_type, extra_headers, (int64_t)n);
    tg_response_body(req, body, n);
    tg_response_end(req);
}

void tg_response_error(tg_request_t *req, int status, const char *type, const char *code,
                       const char *message) {
    tg_response_error_ex(req, status, type, code, message, NULL);
}

void tg_response_error_ex(tg_request_t *req, int status, const char *type, const char *code,
                          const char *message, const char *extra_headers) {
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_appends(&b, "{\"error\":{\"message\":\"");
    tg_buf_append_json_escaped(&b, message, strlen(message));
    tg_buf_appends(&b, "\",\"type\":\"");
    tg_buf_appends(&b, type);
    tg_buf_appends(&b, "\",\"code\":\"");
    tg_buf_appends(&b, code);
    tg_buf_appends(&b, "\"}}");
    tg_response_send(req, status, "application/json", extra_headers, b.data, b.len);
    tg_buf_free(&b);
}

void tg_response_abort(tg_request_t *req) {
    tg_conn_t *c = req->conn;
    req->resp_ended = 1;
    if (!req->status)
        req->status = 502;
    request_finish(req, 0);
    /* What was already written still goes out; then the connection closes without
     * the final chunk. */
    c->close_after_write = 1;
    if (!c->dirty && c->write_queued == 0)
        conn_linger(c);
}

size_t tg_request_write_queue(const tg_request_t *req) {
    return req->conn->write_queued + req->conn->out.len;
}

/* ---- parsing ----------------------------------------------------------------------- */

static tg_conn_t *conn_of(llhttp_t *p) { return (tg_conn_t *)p->data; }

static int header_budget(tg_conn_t *c, size_t n) {
    c->header_bytes += n;
    if (c->header_bytes > c->w->gw->cfg->http_limits.max_header_bytes) {
        c->err_status = 431;
        return -1;
    }
    return 0;
}

static int on_message_begin(llhttp_t *p) {
    tg_conn_t *c = conn_of(p);
    c->req = request_new(c);
    c->header_bytes = 0;
    c->hstate = PARSE_NONE;
    c->nh = 0;
    c->err_status = 0;
    c->have_method = 0;
    c->early_code = NULL;
    c->state = CONN_HEADERS;
    if (!c->fuzz) {
        atomic_fetch_add_explicit(&c->w->metrics.inflight, 1, memory_order_relaxed);
        conn_set_timer(c, c->w->gw->cfg->http_limits.header_timeout_ms);
    }
    return 0;
}

static int on_method_complete(llhttp_t *p) {
    conn_of(p)->have_method = 1;
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n) {
    tg_conn_t *c = conn_of(p);
    if (header_budget(c, n))
        return -1;
    tg_buf_append(&c->req->url, at, n);
    return 0;
}

static void header_commit(tg_conn_t *c) {
    if (c->hstate == PARSE_VALUE && c->nh < TG_MAX_HEADERS) {
        c->hoffs[c->nh][0] = c->name_off;
        c->hoffs[c->nh][1] = c->name_len;
        c->hoffs[c->nh][2] = c->val_off;
        c->hoffs[c->nh][3] = c->val_len;
        c->nh++;
    }
}

static int on_header_field(llhttp_t *p, const char *at, size_t n) {
    tg_conn_t *c = conn_of(p);
    if (header_budget(c, n))
        return -1;
    tg_buf_t *raw = &c->req->raw_headers;
    if (c->hstate != PARSE_FIELD) {
        header_commit(c);
        if (c->nh >= TG_MAX_HEADERS) {
            c->err_status = 431;
            return -1;
        }
        c->hstate = PARSE_FIELD;
        c->name_off = raw->len;
        c->name_len = 0;
    }
    tg_buf_append(raw, at, n);
    c->name_len += n;
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n) {
    tg_conn_t *c = conn_of(p);
    if (header_budget(c, n))
        return -1;
    tg_buf_t *raw = &c->req->raw_headers;
    if (c->hstate != PARSE_VALUE) {
        c->hstate = PARSE_VALUE;
        c->val_off = raw->len;
        c->val_len = 0;
    }
    tg_buf_append(raw, at, n);
    c->val_len += n;
    return 0;
}

static int on_headers_complete(llhttp_t *p) {
    tg_conn_t *c = conn_of(p);
    tg_request_t *r = c->req;
    header_commit(c);
    c->hstate = PARSE_NONE;
    for (int i = 0; i < c->nh; i++) {
        r->headers[i].name = (tg_str_t){r->raw_headers.data + c->hoffs[i][0], c->hoffs[i][1]};
        r->headers[i].value = (tg_str_t){r->raw_headers.data + c->hoffs[i][2], c->hoffs[i][3]};
    }
    r->nheaders = c->nh;
    r->method = llhttp_get_method(p);
    r->bytes_in = c->header_bytes;
    size_t max_body = c->w->gw->cfg->http_limits.max_body_bytes;
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > max_body) {
        c->err_status = 413;
        return -1;
    }
    c->state = CONN_BODY;
    if (!c->fuzz) {
        conn_set_timer(c, c->w->gw->cfg->http_limits.body_timeout_ms);
        const tg_str_t *expect = tg_request_header(r, "expect");
        if (expect && tg_str_ieq(*expect, "100-continue")) {
            uv_buf_t b = uv_buf_init("HTTP/1.1 100 Continue\r\n\r\n", 25);
            conn_writev(c, &b, 1);
        }
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n) {
    tg_conn_t *c = conn_of(p);
    if (c->req->body.len + n > c->w->gw->cfg->http_limits.max_body_bytes) {
        c->err_status = 413;
        return -1;
    }
    tg_buf_append(&c->req->body, at, n);
    c->req->bytes_in += n;
    return 0;
}

static int on_message_complete(llhttp_t *p) {
    tg_conn_t *c = conn_of(p);
    c->req->keep_alive = llhttp_should_keep_alive(p);
    c->req->ready_ns = tg_now_ns();
    c->state = CONN_PROCESSING;
    return HPE_PAUSED;
}

static void dispatch(tg_conn_t *c) {
    tg_request_t *r = c->req;
    if (c->fuzz) {
        c->fuzz_result++;
        r->status = 200;
        r->resp_started = 1;
        tg_response_end(r);
        return;
    }
    tg_timeout_clear(&c->timeout);
    c->w->gw->handler->handle(r);
}

/*
 * The access-log line of a request the server answered itself — refused by the parser
 * (400), too large (413, 431), not received in time (408) — which no handler saw.
 */
static void early_more(void *ud, tg_buf_t *line, uint64_t now_ns) {
    TG_UNUSED(ud);
    TG_UNUSED(now_ns);
    tg_buf_appends(line, ",\"upstream\":null,\"upstream_status\":null");
}

static void early_finish(tg_request_t *req, int aborted) {
    tg_conn_t *c = req->conn;
    const char *method = "-";
    if (c->state == CONN_BODY || c->state == CONN_PROCESSING)
        method = llhttp_method_name((llhttp_method_t)req->method);
    else if (c->have_method)
        method = llhttp_method_name((llhttp_method_t)llhttp_get_method(&c->parser));
    tg_access_line_t line = {
        .route = "other",
        .method = method,
        .path = req->url.data ? req->url.data : "",
        .path_len = req->url.data ? req->url.len : 0,
        .bytes_in = req->bytes_in ? req->bytes_in : c->header_bytes + req->body.len,
        .error = c->early_code,
        .more = early_more,
    };
    tg_access_log(req, aborted, &line);
}

/*
 * An answer the server gives itself, in the error shape of the API that was called:
 * Anthropic's on /v1/messages (an SDK reads its error type from it), OpenAI's elsewhere.
 */
static void server_error(tg_request_t *r, int status, const char *code, const char *msg) {
    const char *u = r->url.data;
    if (u && strncmp(u, "/v1/messages", 12) == 0 && (u[12] == '\0' || u[12] == '?' || u[12] == '/')) {
        tg_buf_t b;
        tg_buf_init(&b);
        tg_buf_appends(&b, "{\"type\":\"error\",\"error\":{\"type\":\"");
        tg_buf_appends(&b, status == 413 ? "request_too_large" : "invalid_request_error");
        tg_buf_appends(&b, "\",\"message\":\"");
        tg_buf_append_json_escaped(&b, msg, strlen(msg));
        tg_buf_appends(&b, "\"}}");
        tg_response_send(r, status, "application/json", NULL, b.data, b.len);
        tg_buf_free(&b);
        return;
    }
    tg_response_error(r, status, "invalid_request_error", code, msg);
}

/* Answers a request that failed to parse, then closes the connection. */
static void parse_error(tg_conn_t *c, int status, const char *code, const char *msg) {
    if (c->fuzz) {
        c->fuzz_result = status == 431 ? -2 : status == 413 ? -3 : -1;
        c->closing = 1;
        if (c->req)
            request_finish(c->req, 1);
        return;
    }
    if (!c->req)
        on_message_begin(&c->parser);
    tg_request_t *r = c->req;
    r->keep_alive = 0;
    r->finish_cb = early_finish;
    c->early_code = code;
    server_error(r, status, code, msg);
}

static void process_input(tg_conn_t *c) {
    c->in_process = 1;
    size_t off = 0;
    while (!c->closing && c->state != CONN_PROCESSING && off < c->in.len) {
        const char *start = c->in.data + off;
        llhttp_errno_t e = llhttp_execute(&c->parser, start, c->in.len - off);
        if (e == HPE_OK) {
            off = c->in.len;
            break;
        }
        if (e == HPE_PAUSED) {
            off = (size_t)(llhttp_get_error_pos(&c->parser) - c->in.data);
            dispatch(c);
            /* dispatch may have ended the request synchronously (state back to IDLE). */
            continue;
        }
        if (c->err_status == 431)
            parse_error(c, 431, "headers_too_large", "request headers are too large");
        else if (c->err_status == 413)
            parse_error(c, 413, "body_too_large", "request body is too large");
        else
            parse_error(c, 400, "bad_request", llhttp_get_error_reason(&c->parser)
                                                   ? llhttp_get_error_reason(&c->parser)
                                                   : "malformed HTTP request");
        off = c->in.len;
        break;
    }
    if (!c->closing)
        tg_buf_consume(&c->in, off);
    c->in_process = 0;
}

static void settings_init(void) {
    parser_settings = (llhttp_settings_t){0};
    llhttp_settings_init(&parser_settings);
    parser_settings.on_message_begin = on_message_begin;
    parser_settings.on_method_complete = on_method_complete;
    parser_settings.on_url = on_url;
    parser_settings.on_header_field = on_header_field;
    parser_settings.on_header_value = on_header_value;
    parser_settings.on_headers_complete = on_headers_complete;
    parser_settings.on_body = on_body;
    parser_settings.on_message_complete = on_message_complete;
}

int tg_http_parse_for_fuzz(const char *data, size_t len, size_t max_header, size_t max_body) {
    tg_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.http_limits.max_header_bytes = max_header;
    cfg.http_limits.max_body_bytes = max_body;
    cfg.http_limits.max_write_buffer = 65536;
    tg_gateway_t gw;
    memset(&gw, 0, sizeof(gw));
    gw.cfg = &cfg;
    tg_worker_t *w = calloc(1, sizeof(*w));
    w->gw = &gw;
    tg_conn_t *c = calloc(1, sizeof(*c));
    c->w = w;
    c->fuzz = 1;
    settings_init();
    llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
    c->parser.data = c;
    /* Feed in two pieces to exercise resumption across reads. */
    size_t cut = len ? (unsigned char)data[0] % (len + 1) : 0;
    tg_buf_append(&c->in, data, cut);
    process_input(c);
    if (!c->closing) {
        tg_buf_append(&c->in, data + cut, len - cut);
        process_input(c);
    }
    int result = c->fuzz_result;
    if (c->req)
        request_free(c->req);
    spare_free_all(w);
    tg_buf_free(&c->in);
    free(c);
    free(w);
    return result;
}

/* ---- connections ------------------------------------------------------------------- */

static void conn_free_cb(uv_handle_t *h) {
    tg_conn_t *c = h->data;
    if (--c->handles > 0)
        return;
    tg_buf_free(&c->in);
    tg_buf_free(&c->out);
    tg_buf_free(&c->tls_plain);
    tg_tls_destroy(c->tls);
    free(c);
}

static void conn_close(tg_conn_t *c) {
    if (c->closing)
        return;
    c->closing = 1;
    tg_worker_t *w = c->w;
    if (c->dirty) {
        for (tg_conn_t **pp = (tg_conn_t **)&w->dirty; *pp; pp = &(*pp)->dirty_next)
            if (*pp == c) {
                *pp = c->dirty_next;
                break;
            }
        c->dirty = 0;
    }
    if (c->req) {
        tg_request_t *r = c->req;
        if (r->abort_cb && !r->resp_ended)
            r->abort_cb(r);
        request_finish(r, !r->resp_ended);
    }
    if (c->fuzz)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns_head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    w->nconns--;
    atomic_fetch_sub_explicit(&w->metrics.connections, 1, memory_order_relaxed);
    uv_close((uv_handle_t *)&c->timer, conn_free_cb);
    uv_close((uv_handle_t *)&c->tcp, conn_free_cb);
    if (w->draining && w->nconns == 0)
        uv_stop(&w->loop);
}

static void timer_cb(uv_timer_t *t) {
    tg_conn_t *c = t->data;
    if (c->lingering) {
        conn_close(c);
        return;
    }
    if (!tg_timeout_fired(&c->timeout, t, timer_cb))
        return; /* none, or moved later since the timer was armed */
    switch (c->state) {
    case CONN_IDLE:
        conn_close(c);
        break;
    case CONN_HEADERS:
    case CONN_BODY:
        if (c->req && !c->req->resp_started) {
            c->req->keep_alive = 0;
            c->req->finish_cb = early_finish;
            c->early_code = "request_timeout";
            server_error(c->req, 408, "request_timeout", "the request was not received in time");
        } else {
            conn_close(c);
        }
        break;
    case CONN_PROCESSING:
        /* The client stopped reading its response. */
        if (c->write_queued)
            conn_close(c);
        break;
    }
}

/* Starts the connection's timeout (the one of its state: header, body, idle, write),
 * ending any other; tg_timeout_clear ends it. Lazily re-armed (tg_timeout_internal.h):
 * a request used to pay four moves of libuv's timer heap, now most pay none. */
static void conn_set_timer(tg_conn_t *c, int ms) {
    if (!c->fuzz && !c->closing)
        tg_timeout_set(&c->timeout, &c->timer, timer_cb, (uint64_t)ms);
}

/*
 * Lingering close (nginx's lingering_close): an answer that ends the connection — a
 * 413 for a body sent whole without Expect: 100-continue, a 431, a 401 with more
 * requests behind it — is often sent while the client is still sending. Closing a
 * socket with unread input makes the kernel send a reset, which can destroy the answer
 * before the client reads it (an SDK then reports a connection error and retries the
 * upload). So once the answer is out the write side is shut down (FIN) and input is
 * read and discarded until the client closes, LINGER_GAP_MS pass without a byte,
 * LINGER_TIME_MS pass in all, or LINGER_MAX_BYTES were discarded.
 */
#define LINGER_GAP_MS 2000
#define LINGER_TIME_MS 10000
#define LINGER_MAX_BYTES ((size_t)32 << 20)

static void shutdown_cb(uv_shutdown_t *req, int status) {
    TG_UNUSED(req);
    TG_UNUSED(status);
}

static void conn_linger(tg_conn_t *c) {
    if (c->closing || c->lingering)
        return;
    if (c->fuzz || c->w->draining) {
        conn_close(c);
        return;
    }
    c->lingering = 1;
    c->linger_bytes = 0;
    c->linger_end_ms = tg_now_ms() + LINGER_TIME_MS;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, shutdown_cb) < 0) {
        conn_close(c);
        return;
    }
    tg_timeout_arm(&c->timeout, &c->timer, timer_cb, LINGER_GAP_MS);
}

/* Input while lingering: discarded; the gap timer restarts within the overall bound. */
static void linger_input(tg_conn_t *c, size_t n) {
    c->linger_bytes += n;
    uint64_t now = tg_now_ms();
    if (c->linger_bytes > LINGER_MAX_BYTES || now >= c->linger_end_ms) {
        conn_close(c);
        return;
    }
    uint64_t left = c->linger_end_ms - now;
    tg_timeout_arm(&c->timeout, &c->timer, timer_cb, left < LINGER_GAP_MS ? left : LINGER_GAP_MS);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    static __thread char slab[65536];
    TG_UNUSED(h);
    TG_UNUSED(suggested);
    *buf = uv_buf_init(slab, sizeof(slab));
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    tg_conn_t *c = s->data;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    if (nread == 0)
        return;
    if (c->lingering) {
        linger_input(c, (size_t)nread);
        return;
    }
    /* The last response said Connection: close: whatever else the client sends is not
     * parsed (no second answer), only drained until our bytes are out. */
    if (c->close_after_write && !c->req)
        return;
    if (c->tls) {
        tg_buf_t net;
        tg_buf_init(&net);
        tg_buf_reset(&c->tls_plain);
        int rc = tg_tls_feed(c->tls, buf->base, (size_t)nread, &c->tls_plain, &net);
        if (net.len) {
            conn_write_raw(c, net.data, net.len);
        }
        tg_buf_free(&net);
        if (rc != TG_OK) {
            tg_log_debug("tls: handshake or record error: %s", tg_tls_last_error());
            conn_close(c);
            return;
        }
        if (c->closing || !c->tls_plain.len)
            return;
        tg_buf_append(&c->in, c->tls_plain.data, c->tls_plain.len);
    } else {
        tg_buf_append(&c->in, buf->base, (size_t)nread);
    }
    if (c->state == CONN_IDLE && !c->fuzz)
        conn_set_timer(c, c->w->gw->cfg->http_limits.header_timeout_ms);
    if (c->state != CONN_PROCESSING) {
        process_input(c);
    } else {
        /* Pipelined input while a request is processed: bound what we buffer. */
        const tg_http_limits_t *l = &c->w->gw->cfg->http_limits;
        if (c->in.len > l->max_header_bytes + l->max_body_bytes) {
            c->req->keep_alive = 0;
        }
    }
}

static void on_connection(uv_stream_t *server, int status) {
    tg_worker_t *w = server->data;
    if (status < 0 || w->draining)
        return;
    tg_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        abort();
    c->w = w;
    uv_tcp_init(&w->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        c->handles = 1;
        uv_close((uv_handle_t *)&c->tcp, conn_free_cb);
        return;
    }
    uv_timer_init(&w->loop, &c->timer);
    c->timer.data = c;
    c->handles = 2;
    uv_tcp_nodelay(&c->tcp, 1);
    int is_tls = 0;
    for (int i = 0; i < w->nlisteners; i++)
        if ((uv_stream_t *)&w->listeners[i] == server)
            is_tls = w->listener_tls[i];
    if (is_tls)
        c->tls = tg_tls_create(w->gw->server_tls, 1, NULL);
    llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
    c->parser.data = c;
    c->state = CONN_IDLE;
    c->next = w->conns_head;
    if (c->next)
        c->next->prev = c;
    w->conns_head = c;
    w->nconns++;
    atomic_fetch_add_explicit(&w->metrics.connections, 1, memory_order_relaxed);
    conn_set_timer(c, w->gw->cfg->http_limits.header_timeout_ms);
    c->reading = 1;
    uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
}

/* ---- workers and the gateway ------------------------------------------------------- */

typedef struct {
    int fds[2][64];
    int tls[2];
    int n;
} listen_fds_t;

static int open_listener(const char *host, int port, char *err, size_t errlen) {
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    int family = strchr(host, ':') ? AF_INET6 : AF_INET;
    if (family == AF_INET6) {
        if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)
            goto bad;
    } else if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0) {
        goto bad;
    }
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto sys;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&ss,
             family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in)) != 0) {
        close(fd);
        goto sys;
    }
    return fd;
bad:
    snprintf(err, errlen, "listen: \"%s\" is not an IP address", host);
    return -1;
sys:
    snprintf(err, errlen, "listen: %s:%d: %s", host, port, strerror(errno));
    return -1;
}

static void shutdown_timer_cb(uv_timer_t *t) {
    tg_worker_t *w = t->data;
    tg_log_warn("worker %d: shutdown timeout, closing %lld connection(s)", w->index,
                (long long)w->nconns);
    tg_conn_t *c = w->conns_head;
    while (c) {
        tg_conn_t *next = c->next;
        conn_close(c);
        c = next;
    }
    uv_stop(&w->loop);
}

static void stop_async_cb(uv_async_t *a) {
    tg_worker_t *w = a->data;
    if (w->draining)
        return;
    w->draining = 1;
    for (int i = 0; i < w->nlisteners; i++)
        uv_close((uv_handle_t *)&w->listeners[i], NULL);
    /* Idle connections close now; busy ones close when their response ends. */
    tg_conn_t *c = w->conns_head;
    while (c) {
        tg_conn_t *next = c->next;
        if ((c->state == CONN_IDLE && c->in.len == 0) || c->lingering)
            conn_close(c);
        else if (c->req)
            c->req->keep_alive = 0;
        c = next;
    }
    if (w->nconns == 0)
        uv_stop(&w->loop);
    else
        uv_timer_start(&w->shutdown_timer, shutdown_timer_cb,
                       (uint64_t)w->gw->cfg->http_limits.shutdown_timeout_ms, 0);
}

static void close_walk_cb(uv_handle_t *h, void *arg) {
    TG_UNUSED(arg);
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* A worker's end: the handler's context (when it has one), log buffer, spares, then
 * every handle of its loop. */
static void worker_teardown(tg_worker_t *w, int with_ctx) {
    if (with_ctx)
        w->gw->handler->worker_close(w);
    prepare_cb(&w->prepare);
    tg_buf_free(&w->logbuf);
    spare_free_all(w);
    uv_walk(&w->loop, close_walk_cb, NULL);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    uv_loop_close(&w->loop);
}

static void worker_main(void *arg) {
    tg_worker_t *w = arg;
    /* Runs until draining ends: every connection closed, or the shutdown timeout. */
    uv_run(&w->loop, UV_RUN_DEFAULT);
    worker_teardown(w, 1);
}

tg_gateway_t *tg_gateway_create(tg_config_t *cfg, const tg_handler_t *handler, char *err, size_t errlen) {
    settings_init();

    tg_gateway_t *gw = calloc(1, sizeof(*gw));
    gw->cfg = cfg;
    gw->handler = handler;
    gw->nworkers = cfg->workers > 0 ? cfg->workers : (int)TG_MAX(1, sysconf(_SC_NPROCESSORS_ONLN));
    gw->nkeys = cfg->nkeys;
    gw->key_hashes = calloc(cfg->nkeys + 1, 32);
    for (size_t i = 0; i < cfg->nkeys; i++)
        SHA256((const unsigned char *)cfg->keys[i], strlen(cfg->keys[i]), gw->key_hashes[i]);
    if (cfg->tls_listen_host) {
        gw->server_tls = tg_tls_server_ctx(cfg->tls_cert, cfg->tls_key, err, errlen);
        if (!gw->server_tls)
            goto fail;
    }
    if (strncmp(cfg->upstream.url, "https://", 8) == 0) {
        gw->client_tls = tg_tls_client_ctx(cfg->upstream.ca_file, cfg->upstream.tls_verify, err, errlen);
        if (!gw->client_tls)
            goto fail;
    }
    gw->workers = calloc((size_t)gw->nworkers, sizeof(*gw->workers));
    gw->metrics = calloc((size_t)gw->nworkers, sizeof(*gw->metrics));
    for (int i = 0; i < gw->nworkers; i++) {
        tg_worker_t *w = calloc(1, sizeof(*w));
        w->gw = gw;
        w->index = i;
        gw->workers[i] = w;
        gw->metrics[i] = &w->metrics;
        uv_loop_init(&w->loop);
        uv_async_init(&w->loop, &w->stop_async, stop_async_cb);
        w->stop_async.data = w;
        uv_timer_init(&w->loop, &w->shutdown_timer);
        w->shutdown_timer.data = w;
        uv_prepare_init(&w->loop, &w->prepare);
        w->prepare.data = w;
        uv_prepare_start(&w->prepare, prepare_cb);
        uv_unref((uv_handle_t *)&w->prepare);
        const char *hosts[2] = {cfg->listen_host, cfg->tls_listen_host};
        int ports[2] = {cfg->listen_port, cfg->tls_listen_port};
        for (int k = 0; k < 2; k++) {
            if (!hosts[k])
                continue;
            int fd = open_listener(hosts[k], ports[k], err, errlen);
            if (fd < 0)
                goto fail;
            uv_tcp_t *l = &w->listeners[w->nlisteners];
            uv_tcp_init(&w->loop, l);
            uv_tcp_open(l, fd);
            l->data = w;
            w->listener_tls[w->nlisteners] = k == 1;
            int r = uv_listen((uv_stream_t *)l, 4096, on_connection);
            if (r < 0) {
                snprintf(err, errlen, "listen: %s:%d: %s", hosts[k], ports[k], uv_strerror(r));
                goto fail;
            }
            w->nlisteners++;
        }
        if (handler->worker_init(w, err, errlen) != TG_OK) {
            /* Undo every worker made so far (this one's context is already gone), as
             * worker_main does at its end, so nothing is left behind. */
            for (int k = 0; k <= i; k++)
                worker_teardown(gw->workers[k], k < i);
            goto fail;
        }
    }
    return gw;
fail:
    tg_gateway_destroy(gw);
    return NULL;
}

static uv_signal_t sig_term, sig_int;
static uv_timer_t drain_timer;

/* The listeners close and in-flight requests finish (each worker's stop_async). */
static void gateway_stop(tg_gateway_t *gw) {
    for (int i = 0; i < gw->nworkers; i++)
        uv_async_send(&gw->workers[i]->stop_async);
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    uv_close((uv_handle_t *)&drain_timer, NULL);
}

static void drain_timer_cb(uv_timer_t *t) {
    tg_gateway_t *gw = t->data;
    tg_log_info("drain delay over: closing the listeners, in-flight requests get up to %d ms",
                gw->cfg->http_limits.shutdown_timeout_ms);
    gateway_stop(gw);
}

/*
 * The first SIGTERM or SIGINT makes /readyz answer 503 at once; the listeners keep
 * accepting for limits.drain_delay_ms, long enough for a load balancer's health check to
 * take the instance out, and then close while in-flight requests finish (up to
 * limits.shutdown_timeout_ms). A second signal during the delay skips what is left of it.
 */
static void on_signal(uv_signal_t *s, int signum) {
    tg_gateway_t *gw = s->data;
    const char *name = signum == SIGTERM ? "SIGTERM" : "SIGINT";
    if (atomic_exchange(&gw->draining, 1)) {
        tg_log_info("received %s again: closing the listeners now", name);
        gateway_stop(gw);
        return;
    }
    int delay = gw->cfg->http_limits.drain_delay_ms;
    if (delay > 0) {
        tg_log_info("received %s: /readyz answers 503; the listeners close in %d ms, then draining (up to %d ms)",
                    name, delay, gw->cfg->http_limits.shutdown_timeout_ms);
        uv_timer_start(&drain_timer, drain_timer_cb, (uint64_t)delay, 0);
        return;
    }
    tg_log_info("received %s: draining (up to %d ms)", name, gw->cfg->http_limits.shutdown_timeout_ms);
    gateway_stop(gw);
}

int tg_gateway_run(tg_gateway_t *gw) {
    signal(SIGPIPE, SIG_IGN);
    uv_loop_t *main_loop = uv_default_loop();
    uv_signal_init(main_loop, &sig_term);
    uv_signal_init(main_loop, &sig_int);
    sig_term.data = sig_int.data = gw;
    uv_timer_init(main_loop, &drain_timer);
    drain_timer.data = gw;
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    for (int i = 0; i < gw->nworkers; i++)
        uv_thread_create(&gw->workers[i]->thread, worker_main, gw->workers[i]);
    tg_log_info("tollgate listening on %s:%d%s (%d workers)", gw->cfg->listen_host,
                gw->cfg->listen_port, gw->cfg->tls_listen_host ? " and TLS" : "", gw->nworkers);
    uv_run(main_loop, UV_RUN_DEFAULT);
    for (int i = 0; i < gw->nworkers; i++)
        uv_thread_join(&gw->workers[i]->thread);
    uv_loop_close(main_loop);
    tg_log_info("tollgate stopped");
    return 0;
}

void tg_gateway_destroy(tg_gateway_t *gw) {
    if (!gw)
        return;
    if (gw->workers) {
        for (int i = 0; i < gw->nworkers; i++)
            free(gw->workers[i]);
    }
    free(gw->workers);
    free(gw->metrics);
    free(gw->key_hashes);
    SSL_CTX_free(gw->server_tls);
    SSL_CTX_free(gw->client_tls);
    free(gw);
}
