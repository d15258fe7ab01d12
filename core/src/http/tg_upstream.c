/*
 * The upstream HTTP/1.1 client (see tg_upstream.h). A tg_upcall_t is one connection:
 * while a call runs it belongs to the caller; afterwards it goes back to the per-worker
 * pool (keep-alive) or is closed. Idle pooled connections keep reading, so a connection
 * the upstream closed leaves the pool at once instead of failing the next request.
 *
 * Memory: a connection is freed in the close callback of its last handle, never
 * earlier, so an abort from inside one of our own callbacks is safe: it only marks the
 * call and starts closing.
 */
#include "tollgate/tg_upstream.h"

#include <llhttp.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_tls.h"
#include "tollgate/tg_valid.h"

#include "tg_timeout_internal.h"

enum { UC_RESOLVING, UC_CONNECTING, UC_HANDSHAKE, UC_ACTIVE, UC_IDLE };

struct tg_upstream_s {
    uv_loop_t *loop;
    const tg_upstream_config_t *cfg;
    SSL_CTX *tls_ctx;
    char *host;
    char *host_header;
    char *prefix;
    char *name; /* scheme://host:port, for logs */
    int port;
    int tls;
    struct sockaddr_storage addr;
    int have_addr;
    uint64_t addr_expiry_ms;
    tg_upcall_t *idle; /* LIFO pool */
    int nidle;
    int destroying;
    int nconns;
};

struct tg_upcall_s {
    uv_tcp_t tcp;
    uv_timer_t timer;
    tg_timeout_t timeout; /* the call's timeout on `timer` (set_timer) */
    uv_connect_t connect_req;
    uv_getaddrinfo_t gai;
    tg_upstream_t *u;
    tg_upcall_t *next_idle;
    int state;
    int handles;       /* open handles + pending requests; freed at 0 */
    int closing;
    int tcp_open;
    int reused;
    int got_bytes;
    int head_done;
    int msg_done;
    int paused;
    int in_exec;
    tg_tls_t *tls;
    llhttp_t parser;
    tg_buf_t request;  /* kept until the first response byte, for one stale-pool retry */
    tg_buf_t scratch;  /* TLS plaintext */
    const tg_upcall_cbs_t *cbs;
    void *ud;
    uint64_t sent_ns;
    int hstate;
    tg_buf_t hname, hval, extra;
    char content_type[128];
    char retry_after[64];
};

static llhttp_settings_t resp_settings;
static int settings_ready;

static void call_fail(tg_upcall_t *c, tg_uperr_t err, const char *msg);
static void conn_close(tg_upcall_t *c);
static void start_connect(tg_upcall_t *c);

/* ---- helpers ------------------------------------------------------------------------ */

static void handle_closed(uv_handle_t *h) {
    tg_upcall_t *c = h->data;
    if (--c->handles > 0)
        return;
    tg_upstream_t *u = c->u;
    tg_tls_destroy(c->tls);
    tg_buf_free(&c->request);
    tg_buf_free(&c->scratch);
    tg_buf_free(&c->hname);
    tg_buf_free(&c->hval);
    tg_buf_free(&c->extra);
    free(c);
    u->nconns--;
    if (u->destroying && u->nconns == 0) {
        free(u->host);
        free(u->host_header);
        free(u->prefix);
        free(u->name);
        free(u);
    }
}

static void pool_remove(tg_upcall_t *c) {
    tg_upstream_t *u = c->u;
    for (tg_upcall_t **pp = &u->idle; *pp; pp = &(*pp)->next_idle)
        if (*pp == c) {
            *pp = c->next_idle;
            u->nidle--;
            break;
        }
    c->next_idle = NULL;
}

static void conn_close(tg_upcall_t *c) {
    if (c->closing)
        return;
    c->closing = 1;
    c->cbs = NULL;
    if (c->state == UC_IDLE)
        pool_remove(c);
    uv_close((uv_handle_t *)&c->timer, handle_closed);
    if (c->tcp_open)
        uv_close((uv_handle_t *)&c->tcp, handle_closed);
}

static void timer_cb(uv_timer_t *t);
static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* The call's timeout (connect, first byte, idle; the pooled connection's keep-alive),
 * ending any other; tg_timeout_clear ends it. Lazily re-armed (tg_timeout_internal.h). */
static void set_timer(tg_upcall_t *c, int ms) {
    if (!c->closing)
        tg_timeout_set(&c->timeout, &c->timer, timer_cb, (uint64_t)ms);
}

static void call_fail(tg_upcall_t *c, tg_uperr_t err, const char *msg) {
    const tg_upcall_cbs_t *cbs = c->cbs;
    void *ud = c->ud;
    conn_close(c);
    if (cbs)
        cbs->on_error(ud, err, msg);
}

/* ---- writing ------------------------------------------------------------------------ */

typedef struct {
    uv_write_t w;
    char data[];
} wreq_t;

static void write_cb(uv_write_t *w, int status) {
    tg_upcall_t *c = w->data;
    free(w);
    if (status < 0 && !c->closing && c->cbs)
        call_fail(c, TG_UPERR_RESET, uv_strerror(status));
}

static void write_raw(tg_upcall_t *c, const char *p, size_t n) {
    if (c->closing || n == 0)
        return;
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
    int r = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (r == (int)n)
        return;
    if (r < 0 && r != UV_EAGAIN) {
        call_fail(c, TG_UPERR_RESET, uv_strerror(r));
        return;
    }
    size_t done = r > 0 ? (size_t)r : 0;
    wreq_t *wr = malloc(sizeof(*wr) + n - done);
    if (!wr)
        abort();
    memcpy(wr->data, p + done, n - done);
    wr->w.data = c;
    b = uv_buf_init(wr->data, (unsigned)(n - done));
    r = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
    if (r < 0) {
        free(wr);
        call_fail(c, TG_UPERR_RESET, uv_strerror(r));
    }
}

static void send_request(tg_upcall_t *c) {
    c->state = UC_ACTIVE;
    llhttp_init(&c->parser, HTTP_RESPONSE, &resp_settings);
    c->parser.data = c;
    if (c->tls) {
        tg_buf_t net;
        tg_buf_init(&net);
        if (tg_tls_write(c->tls, c->request.data, c->request.len, &net) != TG_OK) {
            tg_buf_free(&net);
            call_fail(c, TG_UPERR_CONNECT, tg_tls_last_error());
            return;
        }
        write_raw(c, net.data, net.len);
        tg_buf_free(&net);
    } else {
        write_raw(c, c->request.data, c->request.len);
    }
    c->sent_ns = tg_now_ns();
    set_timer(c, c->u->cfg->first_byte_timeout_ms);
}

/* ---- response parsing ---------------------------------------------------------------- */

static tg_upcall_t *call_of(llhttp_t *p) { return p->data; }

/* A header value into a fixed field, truncated to fit, NUL-terminated. */
static void copy_value(char *dst, size_t cap, const char *v, size_t len) {
    len = strnlen(v, len);
    if (len >= cap)
        len = cap - 1;
    memcpy(dst, v, len);
    dst[len] = '\0';
}

static void header_done(tg_upcall_t *c) {
    if (c->hstate != 2)
        return;
    tg_str_t name = {c->hname.data, c->hname.len};
    const char *v = c->hval.data ? c->hval.data : "";
    if (tg_str_ieq(name, "content-type")) {
        copy_value(c->content_type, sizeof(c->content_type), v, c->hval.len);
    } else if (tg_str_ieq(name, "retry-after")) {
        copy_value(c->retry_after, sizeof(c->retry_after), v, c->hval.len);
    } else if ((name.len > 12 && strncasecmp(name.p, "x-ratelimit-", 12) == 0) ||
               (name.len > 7 && strncasecmp(name.p, "openai-", 7) == 0) ||
               (name.len > 10 && strncasecmp(name.p, "anthropic-", 10) == 0) ||
               (name.len > 8 && strncasecmp(name.p, "x-codex-", 8) == 0)) {
        if (!strpbrk(v, "\r\n")) {
            tg_buf_append(&c->extra, name.p, name.len);
            tg_buf_appends(&c->extra, ": ");
            tg_buf_appends(&c->extra, v);
            tg_buf_appends(&c->extra, "\r\n");
        }
    }
    tg_buf_reset(&c->hname);
    tg_buf_reset(&c->hval);
    c->hstate = 0;
}

static int on_hfield(llhttp_t *p, const char *at, size_t n) {
    tg_upcall_t *c = call_of(p);
    if (c->hstate == 2)
        header_done(c);
    c->hstate = 1;
    if (c->hname.len + n > 8192)
        return -1;
    tg_buf_append(&c->hname, at, n);
    return 0;
}

static int on_hvalue(llhttp_t *p, const char *at, size_t n) {
    tg_upcall_t *c = call_of(p);
    c->hstate = 2;
    if (c->hval.len + n > 65536)
        return -1;
    tg_buf_append(&c->hval, at, n);
    return 0;
}

static int on_headers_complete(llhttp_t *p) {
    tg_upcall_t *c = call_of(p);
    header_done(c);
    int status = llhttp_get_status_code(p);
    if (status < 200)
        return 0; /* 1xx: another head follows */
    c->head_done = 1;
    set_timer(c, c->u->cfg->idle_timeout_ms);
    if (!c->cbs)
        return -1;
    tg_uphead_t head = {
        .status = status,
        .content_type = c->content_type[0] ? c->content_type : NULL,
        .retry_after = c->retry_after[0] ? c->retry_after : NULL,
        .extra_headers = c->extra.data ? c->extra.data : "",
        .content_length = (p->flags & F_CONTENT_LENGTH) && !(p->flags & F_CHUNKED) && p->content_length <= INT64_MAX
                              ? (int64_t)p->content_length
                              : -1,
    };
    c->cbs->on_head(c->ud, &head);
    return c->cbs ? 0 : -1;
}

static int on_body(llhttp_t *p, const char *at, size_t n) {
    tg_upcall_t *c = call_of(p);
    if (!c->cbs)
        return -1;
    c->cbs->on_body(c->ud, at, n);
    return c->cbs ? 0 : -1;
}

static int on_message_complete(llhttp_t *p) {
    tg_upcall_t *c = call_of(p);
    if (!c->head_done) {
        /* A 1xx response ended; reset for the real one. */
        tg_buf_reset(&c->extra);
        c->content_type[0] = c->retry_after[0] = '\0';
        return 0;
    }
    c->msg_done = 1;
    return HPE_PAUSED;
}

static void finish_call(tg_upcall_t *c) {
    tg_upstream_t *u = c->u;
    const tg_upcall_cbs_t *cbs = c->cbs;
    void *ud = c->ud;
    c->cbs = NULL;
    int keep = llhttp_should_keep_alive(&c->parser) && !u->destroying &&
               u->nidle < u->cfg->max_idle_conns && !c->closing;
    if (keep) {
        c->state = UC_IDLE;
        c->head_done = c->msg_done = c->got_bytes = 0;
        c->reused = 1;
        tg_buf_reset(&c->request);
        tg_buf_reset(&c->extra);
        c->content_type[0] = c->retry_after[0] = '\0';
        c->next_idle = u->idle;
        u->idle = c;
        u->nidle++;
        set_timer(c, u->cfg->pool_idle_ms);
        if (c->paused) {
            /* Keep watching an idle connection for the upstream closing it. */
            c->paused = 0;
            uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
        }
    } else {
        conn_close(c);
    }
    if (cbs)
        cbs->on_done(ud);
}

static void feed(tg_upcall_t *c, const char *p, size_t n) {
    if (!c->got_bytes) {
        c->got_bytes = 1;
        tg_buf_free(&c->request);
    }
    c->in_exec = 1;
    llhttp_errno_t e = llhttp_execute(&c->parser, p, n);
    c->in_exec = 0;
    if (c->closing)
        return;
    if (e == HPE_PAUSED || c->msg_done) {
        finish_call(c);
        return;
    }
    if (e != HPE_OK)
        call_fail(c, TG_UPERR_PROTOCOL, llhttp_errno_name(e));
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    static __thread char slab[65536];
    TG_UNUSED(h);
    TG_UNUSED(suggested);
    *buf = uv_buf_init(slab, sizeof(slab));
}

static void retry_fresh(tg_upcall_t *old) {
    /* The pooled connection was closed by the upstream before it answered: resend once
     * on a new connection. */
    tg_upstream_t *u = old->u;
    tg_buf_t req = old->request;
    tg_buf_init(&old->request);
    const tg_upcall_cbs_t *cbs = old->cbs;
    void *ud = old->ud;
    old->cbs = NULL;
    conn_close(old);
    tg_upcall_t *c = tg_upcall_start(u, &req, cbs, ud);
    TG_UNUSED(c);
    tg_buf_free(&req);
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    tg_upcall_t *c = s->data;
    if (c->closing)
        return;
    if (nread < 0) {
        if (c->state == UC_IDLE) {
            conn_close(c);
            return;
        }
        if (c->state == UC_ACTIVE && c->reused && !c->got_bytes && c->request.len) {
            /* Only a reused connection with no byte of answer is retried. */
            tg_upcall_t *tmp = c;
            retry_fresh(tmp);
            return;
        }
        if (c->state == UC_ACTIVE && c->head_done && nread == UV_EOF) {
            c->in_exec = 1;
            llhttp_errno_t e = llhttp_finish(&c->parser);
            c->in_exec = 0;
            /* A body delimited by the close (no Content-Length, not chunked) is complete
             * here: llhttp_finish runs on_message_complete, which pauses the parser. */
            if (!c->closing && (e == HPE_OK || e == HPE_PAUSED) && c->msg_done) {
                finish_call(c);
                return;
            }
        }
        call_fail(c, c->state == UC_HANDSHAKE ? TG_UPERR_CONNECT : TG_UPERR_RESET,
                  nread == UV_EOF ? "upstream closed the connection" : uv_strerror((int)nread));
        return;
    }
    if (nread == 0)
        return;
    if (c->state == UC_IDLE) {
        /* Bytes on an idle connection: the upstream is confused; drop it. */
        conn_close(c);
        return;
    }
    if (!c->tls) {
        feed(c, buf->base, (size_t)nread);
        return;
    }
    tg_buf_t net;
    tg_buf_init(&net);
    tg_buf_reset(&c->scratch);
    int rc = tg_tls_feed(c->tls, buf->base, (size_t)nread, &c->scratch, &net);
    if (net.len)
        write_raw(c, net.data, net.len);
    tg_buf_free(&net);
    if (c->closing)
        return;
    if (rc != TG_OK) {
        call_fail(c, TG_UPERR_CONNECT, tg_tls_last_error());
        return;
    }
    if (c->state == UC_HANDSHAKE && tg_tls_handshake_done(c->tls)) {
        send_request(c);
        if (c->closing)
            return;
    }
    if (c->scratch.len && c->state == UC_ACTIVE)
        feed(c, c->scratch.data, c->scratch.len);
}

static void timer_cb(uv_timer_t *t) {
    tg_upcall_t *c = t->data;
    if (!tg_timeout_fired(&c->timeout, t, timer_cb))
        return; /* none, or moved later since the timer was armed */
    switch (c->state) {
    case UC_IDLE:
        conn_close(c);
        break;
    case UC_RESOLVING:
    case UC_CONNECTING:
    case UC_HANDSHAKE:
        call_fail(c, TG_UPERR_TIMEOUT_CONNECT, "connect timeout");
        break;
    default:
        if (c->head_done)
            call_fail(c, TG_UPERR_TIMEOUT_IDLE, "upstream idle timeout");
        else
            call_fail(c, TG_UPERR_TIMEOUT_FIRST_BYTE, "upstream first-byte timeout");
        break;
    }
}

/* ---- connecting -------------------------------------------------------------------- */

static void connect_cb(uv_connect_t *req, int status) {
    tg_upcall_t *c = req->data;
    c->handles--; /* the connect request */
    if (c->closing) {
        return;
    }
    if (status < 0) {
        c->u->have_addr = 0; /* re-resolve next time */
        call_fail(c, TG_UPERR_CONNECT, uv_strerror(status));
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    if (c->u->tls) {
        c->state = UC_HANDSHAKE;
        c->tls = tg_tls_create(c->u->tls_ctx, 0, c->u->host);
        tg_buf_t net;
        tg_buf_init(&net);
        int rc = tg_tls_connect(c->tls, &net);
        write_raw(c, net.data, net.len);
        tg_buf_free(&net);
        if (rc != TG_OK && !c->closing)
            call_fail(c, TG_UPERR_CONNECT, tg_tls_last_error());
        return;
    }
    send_request(c);
}

static void do_connect(tg_upcall_t *c) {
    c->state = UC_CONNECTING;
    uv_tcp_init(c->u->loop, &c->tcp);
    c->tcp.data = c;
    c->tcp_open = 1;
    c->handles++;
    c->connect_req.data = c;
    int r = uv_tcp_connect(&c->connect_req, &c->tcp, (struct sockaddr *)&c->u->addr, connect_cb);
    if (r < 0) {
        call_fail(c, TG_UPERR_CONNECT, uv_strerror(r));
        return;
    }
    c->handles++;
}

static void gai_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
    tg_upcall_t *c = req->data;
    c->handles--;
    if (c->closing) {
        uv_freeaddrinfo(res);
        if (c->handles == 0) {
            /* All handles already closed: free through the normal path. */
            c->handles = 1;
            handle_closed((uv_handle_t *)&c->timer);
        }
        return;
    }
    if (status < 0 || !res) {
        uv_freeaddrinfo(res);
        call_fail(c, TG_UPERR_CONNECT, status < 0 ? uv_strerror(status) : "no address");
        return;
    }
    tg_upstream_t *u = c->u;
    memcpy(&u->addr, res->ai_addr, res->ai_addrlen);
    if (u->addr.ss_family == AF_INET)
        ((struct sockaddr_in *)&u->addr)->sin_port = htons((uint16_t)u->port);
    else
        ((struct sockaddr_in6 *)&u->addr)->sin6_port = htons((uint16_t)u->port);
    u->have_addr = 1;
    u->addr_expiry_ms = tg_now_ms() + 30000;
    uv_freeaddrinfo(res);
    do_connect(c);
}

static void start_connect(tg_upcall_t *c) {
    tg_upstream_t *u = c->u;
    set_timer(c, u->cfg->connect_timeout_ms);
    if (u->have_addr && tg_now_ms() < u->addr_expiry_ms) {
        do_connect(c);
        return;
    }
    c->state = UC_RESOLVING;
    c->gai.data = c;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    int r = uv_getaddrinfo(u->loop, &c->gai, gai_cb, u->host, NULL, &hints);
    if (r < 0) {
        call_fail(c, TG_UPERR_CONNECT, uv_strerror(r));
        return;
    }
    c->handles++;
}

/* ---- public ------------------------------------------------------------------------ */

tg_upstream_t *tg_upstream_create(uv_loop_t *loop, const tg_upstream_config_t *cfg,
                                  SSL_CTX *tls_ctx, char *err, size_t errlen) {
    if (!settings_ready) {
        llhttp_settings_init(&resp_settings);
        resp_settings.on_header_field = on_hfield;
        resp_settings.on_header_value = on_hvalue;
        resp_settings.on_headers_complete = on_headers_complete;
        resp_settings.on_body = on_body;
        resp_settings.on_message_complete = on_message_complete;
        settings_ready = 1;
    }
    const char *url = cfg->url;
    /* The host and path go into every request line and Host header: refuse what would
     * break out of them (the admin API and apply refuse it first; see tg_valid.h). */
    const char *why = tg_valid_base_url(url, strlen(url));
    if (why) {
        snprintf(err, errlen, "upstream url refused: it %s", why);
        return NULL;
    }
    int tls = strncmp(url, "https://", 8) == 0;
    const char *hp = url + (tls ? 8 : 7);
    const char *slash = strchr(hp, '/');
    size_t hplen = slash ? (size_t)(slash - hp) : strlen(hp);
    char hostport[512];
    if (hplen == 0 || hplen >= sizeof(hostport)) {
        snprintf(err, errlen, "upstream.url: no host in \"%s\"", url);
        return NULL;
    }
    memcpy(hostport, hp, hplen);
    hostport[hplen] = '\0';
    tg_upstream_t *u = calloc(1, sizeof(*u));
    u->loop = loop;
    u->cfg = cfg;
    u->tls_ctx = tls_ctx;
    u->tls = tls;
    u->host_header = strdup(hostport);
    if (!strchr(hostport, ':') || (hostport[0] == '[' && !strstr(hostport, "]:"))) {
        u->port = tls ? 443 : 80;
        u->host = hostport[0] == '[' ? strndup(hostport + 1, strlen(hostport) - 2) : strdup(hostport);
    } else if (tg_config_parse_hostport(hostport, &u->host, &u->port) != TG_OK) {
        snprintf(err, errlen, "upstream.url: bad host:port in \"%s\"", url);
        free(u->host_header);
        free(u);
        return NULL;
    }
    u->prefix = strdup(slash ? slash : "");
    size_t pl = strlen(u->prefix);
    if (pl && u->prefix[pl - 1] == '/')
        u->prefix[pl - 1] = '\0';
    char name[600];
    snprintf(name, sizeof(name), "%s://%s", tls ? "https" : "http", hostport);
    u->name = strdup(name);
    /* IP literals need no resolver. */
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    if (uv_ip4_addr(u->host, u->port, &a4) == 0) {
        memcpy(&u->addr, &a4, sizeof(a4));
        u->have_addr = 1;
        u->addr_expiry_ms = UINT64_MAX;
    } else if (uv_ip6_addr(u->host, u->port, &a6) == 0) {
        memcpy(&u->addr, &a6, sizeof(a6));
        u->have_addr = 1;
        u->addr_expiry_ms = UINT64_MAX;
    }
    return u;
}

void tg_upstream_destroy(tg_upstream_t *u) {
    if (!u)
        return;
    u->destroying = 1;
    while (u->idle)
        conn_close(u->idle);
    if (u->nconns == 0) {
        free(u->host);
        free(u->host_header);
        free(u->prefix);
        free(u->name);
        free(u);
    }
}

const char *tg_upstream_path_prefix(const tg_upstream_t *u) { return u->prefix; }
const char *tg_upstream_host_header(const tg_upstream_t *u) { return u->host_header; }
const char *tg_upstream_name(const tg_upstream_t *u) { return u->name; }

tg_upcall_t *tg_upcall_start(tg_upstream_t *u, tg_buf_t *request, const tg_upcall_cbs_t *cbs, void *ud) {
    tg_upcall_t *c = u->idle;
    if (c) {
        u->idle = c->next_idle;
        u->nidle--;
        c->next_idle = NULL;
        tg_timeout_clear(&c->timeout);
    } else {
        c = calloc(1, sizeof(*c));
        if (!c)
            abort();
        c->u = u;
        uv_timer_init(u->loop, &c->timer);
        c->timer.data = c;
        c->handles = 1;
        u->nconns++;
    }
    c->cbs = cbs;
    c->ud = ud;
    c->request = *request;
    tg_buf_init(request);
    if (c->tcp_open) {
        send_request(c);
    } else {
        start_connect(c);
    }
    return c;
}

void tg_upcall_pause(tg_upcall_t *c) {
    if (!c->paused && c->tcp_open && !c->closing) {
        c->paused = 1;
        uv_read_stop((uv_stream_t *)&c->tcp);
        tg_timeout_clear(&c->timeout);
    }
}

void tg_upcall_resume(tg_upcall_t *c) {
    if (c->paused && !c->closing) {
        c->paused = 0;
        uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
        set_timer(c, c->u->cfg->idle_timeout_ms);
    }
}

void tg_upcall_abort(tg_upcall_t *c) {
    c->cbs = NULL;
    conn_close(c);
}

uint64_t tg_upcall_sent_ns(const tg_upcall_t *c) { return c->sent_ns; }
