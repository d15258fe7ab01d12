/*
 * OpenTelemetry traces (see tollgate/tg_trace.h): the W3C traceparent read and written,
 * the sampling decision, a pool of span records and one exporter thread that sends
 * them to the collector as OTLP/HTTP JSON.
 *
 * The pool is the bound: `queue_size` records allocated at start, a free list and a
 * FIFO of finished ones, both under one mutex taken twice by a sampled request (take,
 * submit) and never by an unsampled one. The exporter wakes when a batch is full or its
 * interval passed, takes up to `batch_size` records, encodes them outside the lock,
 * POSTs them (blocking socket, or OpenSSL over it for https, bounded by `timeout_ms`),
 * and returns them to the free list whatever the collector said: a collector that is
 * down costs the records of one batch per attempt, never a worker's time.
 */
#include "tollgate/tg_trace.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tollgate/tg_tls.h"

int tg__trace_active;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t thread;
    int running, stopping;
    tg_trace_rec_t *pool;
    tg_trace_rec_t *free_list;
    tg_trace_rec_t *q_head, *q_tail;
    int qn;
    /* config (copies) */
    uint64_t threshold; /* a new trace is sampled when its random 56 bits are below this */
    int batch_size, interval_ms, timeout_ms;
    char *service_name, *instance_id;
    char host[256], port[8], path[512], host_header[300];
    int https;
    char **headers;
    size_t nheaders;
    SSL_CTX *ssl;
    /* counters */
    _Atomic uint64_t sampled, exported_spans, exported_requests, dropped_full, dropped_failed, posts_ok,
        posts_failed;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

#define RELAXED memory_order_relaxed

/* ---- the trace context ------------------------------------------------------------- */

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* n lower-case hex digits into n/2 bytes; 0 when one is not. */
static int unhex(const char *s, size_t n, uint8_t *out) {
    for (size_t i = 0; i < n; i += 2) {
        int a = hexval(s[i]), b = hexval(s[i + 1]);
        if (a < 0 || b < 0)
            return 0;
        out[i / 2] = (uint8_t)(a << 4 | b);
    }
    return 1;
}

static int all_zero(const uint8_t *p, size_t n) {
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= p[i];
    return acc == 0;
}

int tg_traceparent_parse(const char *s, size_t n, tg_traceparent_t *out) {
    if (!s || n < TG_TRACEPARENT_LEN || n > 512)
        return 0;
    uint8_t version;
    if (!unhex(s, 2, &version) || version == 0xff)
        return 0;
    /* Version 00 is exactly 55 characters; a later one may add fields after a '-'. */
    if (version == 0 ? n != TG_TRACEPARENT_LEN : n > TG_TRACEPARENT_LEN && s[TG_TRACEPARENT_LEN] != '-')
        return 0;
    if (s[2] != '-' || s[35] != '-' || s[52] != '-')
        return 0;
    tg_traceparent_t t;
    if (!unhex(s + 3, 32, t.trace_id) || !unhex(s + 36, 16, t.span_id) || !unhex(s + 53, 2, &t.flags))
        return 0;
    if (all_zero(t.trace_id, 16) || all_zero(t.span_id, 8))
        return 0;
    *out = t;
    return 1;
}

static const char HEX[] = "0123456789abcdef";

static char *put_hex(char *o, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        *o++ = HEX[p[i] >> 4];
        *o++ = HEX[p[i] & 15];
    }
    return o;
}

void tg_traceparent_format(const uint8_t trace_id[16], const uint8_t span_id[8], int sampled, char out[56]) {
    char *o = out;
    *o++ = '0';
    *o++ = '0';
    *o++ = '-';
    o = put_hex(o, trace_id, 16);
    *o++ = '-';
    o = put_hex(o, span_id, 8);
    *o++ = '-';
    *o++ = '0';
    *o++ = sampled ? '1' : '0';
    *o = '\0';
}

int tg_tracestate_ok(const char *s, size_t n) {
    if (!s || !n || n > TG_TRACESTATE_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

/* A per-thread splitmix64, seeded from getrandom: trace and span ids without a system
 * call per request. */
static uint64_t rnd64(void) {
    static __thread uint64_t s;
    static __thread int seeded;
    if (!seeded) {
        if (tg_random_bytes(&s, sizeof(s)) != 0)
            s = tg_now_ns() ^ (uint64_t)(uintptr_t)&s;
        seeded = 1;
    }
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tg_trace_span_id(uint8_t out[8]) {
    uint64_t v;
    do
        v = rnd64();
    while (!v);
    memcpy(out, &v, 8);
}

int tg_trace_decide(const tg_traceparent_t *incoming, tg_traceparent_t *ctx) {
    int sampled;
    if (incoming) {
        /* Parent-based: the caller decided. */
        memcpy(ctx->trace_id, incoming->trace_id, 16);
        sampled = incoming->flags & 1;
    } else {
        uint64_t a = rnd64(), b = rnd64();
        if (!a && !b)
            a = 1;
        memcpy(ctx->trace_id, &a, 8);
        memcpy(ctx->trace_id + 8, &b, 8);
        /* The ratio on the id's random low 56 bits (as W3C level 2's random flag reads
         * them), so that any other sampler that reads the id agrees. */
        uint64_t r = 0;
        for (int i = 9; i < 16; i++)
            r = r << 8 | ctx->trace_id[i];
        sampled = r < T.threshold;
    }
    tg_trace_span_id(ctx->span_id);
    ctx->flags = (uint8_t)sampled;
    if (sampled)
        atomic_fetch_add_explicit(&T.sampled, 1, RELAXED);
    return sampled;
}

int64_t tg_trace_clock_offset(void) {
    struct timespec w;
    clock_gettime(CLOCK_REALTIME, &w);
    return (int64_t)((uint64_t)w.tv_sec * 1000000000ull + (uint64_t)w.tv_nsec) - (int64_t)tg_now_ns();
}

/* ---- the pool ------------------------------------------------------------------------ */

tg_trace_rec_t *tg_trace_take(void) {
    pthread_mutex_lock(&T.mu);
    tg_trace_rec_t *r = T.free_list;
    if (r)
        T.free_list = r->next;
    pthread_mutex_unlock(&T.mu);
    if (!r) {
        atomic_fetch_add_explicit(&T.dropped_full, 1, RELAXED);
        return NULL;
    }
    memset(r, 0, sizeof(*r));
    r->input_tokens = r->output_tokens = r->cache_read_tokens = -1;
    return r;
}

void tg_trace_submit(tg_trace_rec_t *r) {
    r->next = NULL;
    pthread_mutex_lock(&T.mu);
    if (T.q_tail)
        T.q_tail->next = r;
    else
        T.q_head = r;
    T.q_tail = r;
    if (++T.qn >= T.batch_size)
        pthread_cond_signal(&T.cond);
    pthread_mutex_unlock(&T.mu);
}

void tg_trace_cancel(tg_trace_rec_t *r) {
    pthread_mutex_lock(&T.mu);
    r->next = T.free_list;
    T.free_list = r;
    pthread_mutex_unlock(&T.mu);
}

/* ---- OTLP/HTTP JSON -------------------------------------------------------------------- */

/* A JSON string. The path or a model name may hold bytes that are not UTF-8, which
 * would make the collector refuse the whole batch: each becomes U+FFFD. */
static void json_str(tg_buf_t *b, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), start = 0, i = 0;
    tg_buf_appends(b, "\"");
    while (i < n) {
        size_t len = tg_utf8_seq(u + i, n - i);
        if (len) {
            i += len;
            continue;
        }
        tg_buf_append_json_escaped(b, s + start, i - start);
        tg_buf_appends(b, "\\ufffd");
        start = ++i;
    }
    tg_buf_append_json_escaped(b, s + start, n - start);
    tg_buf_appends(b, "\"");
}

static void id_hex(tg_buf_t *b, const uint8_t *p, size_t n) {
    char h[33];
    *put_hex(h, p, n) = '\0';
    tg_buf_appends(b, "\"");
    tg_buf_appends(b, h);
    tg_buf_appends(b, "\"");
}

/* Attributes are written as a list; `first` tracks the comma. */
typedef struct {
    tg_buf_t *b;
    int n;
} attrs_t;

static void attr_key(attrs_t *a, const char *key) {
    tg_buf_appends(a->b, a->n++ ? ",{\"key\":\"" : "{\"key\":\"");
    tg_buf_appends(a->b, key);
    tg_buf_appends(a->b, "\",\"value\":{");
}

static void attr_str(attrs_t *a, const char *key, const char *v) {
    if (!v || !*v)
        return;
    attr_key(a, key);
    tg_buf_appends(a->b, "\"stringValue\":");
    json_str(a->b, v);
    tg_buf_appends(a->b, "}}");
}

static void attr_int(attrs_t *a, const char *key, int64_t v) {
    attr_key(a, key);
    tg_buf_printf(a->b, "\"intValue\":\"%lld\"}}", (long long)v);
}

static void attr_bool(attrs_t *a, const char *key, int v) {
    attr_key(a, key);
    tg_buf_appends(a->b, v ? "\"boolValue\":true}}" : "\"boolValue\":false}}");
}

/* A span's head: ids, name, kind, times; the caller writes its attributes, then
 * span_end. */
static attrs_t span_begin(tg_buf_t *b, int *nspans, const tg_trace_rec_t *r, const uint8_t *span_id,
                          const uint8_t *parent, const char *name, int kind, uint64_t start, uint64_t end) {
    if (end < start)
        end = start;
    tg_buf_appends(b, (*nspans)++ ? ",{\"traceId\":" : "{\"traceId\":");
    id_hex(b, r->trace_id, 16);
    tg_buf_appends(b, ",\"spanId\":");
    id_hex(b, span_id, 8);
    if (parent) {
        tg_buf_appends(b, ",\"parentSpanId\":");
        id_hex(b, parent, 8);
    }
    if (r->tracestate[0]) {
        tg_buf_appends(b, ",\"traceState\":");
        json_str(b, r->tracestate);
    }
    tg_buf_appends(b, ",\"name\":");
    json_str(b, name);
    tg_buf_printf(b, ",\"kind\":%d,\"startTimeUnixNano\":\"%llu\",\"endTimeUnixNano\":\"%llu\",\"attributes\":[", kind,
                  (unsigned long long)((int64_t)start + r->wall_minus_mono),
                  (unsigned long long)((int64_t)end + r->wall_minus_mono));
    return (attrs_t){b, 0};
}

static void span_end(attrs_t *a, int error, const char *msg) {
    tg_buf_appends(a->b, "]");
    if (error) {
        tg_buf_appends(a->b, ",\"status\":{\"code\":2");
        if (msg && *msg) {
            tg_buf_appends(a->b, ",\"message\":");
            json_str(a->b, msg);
        }
        tg_buf_appends(a->b, "}");
    }
    tg_buf_appends(a->b, "}");
}

enum { KIND_INTERNAL = 1, KIND_SERVER = 2, KIND_CLIENT = 3 };

static void encode_rec(tg_buf_t *b, int *nspans, const tg_trace_rec_t *r) {
    char name[160];
    uint64_t end = r->end ? r->end : r->start;
    /* The server span: the request as the client made it. */
    snprintf(name, sizeof(name), "%s %s", r->method ? r->method : "POST", r->path);
    attrs_t a = span_begin(b, nspans, r, r->span_id, r->has_parent ? r->parent_id : NULL, name, KIND_SERVER, r->start,
                           end);
    attr_str(&a, "http.request.method", r->method);
    attr_str(&a, "url.path", r->path);
    if (r->status)
        attr_int(&a, "http.response.status_code", r->status);
    attr_str(&a, "tollgate.request.id", r->request_id);
    attr_str(&a, "gen_ai.operation.name", r->operation);
    attr_str(&a, "gen_ai.request.model", r->model);
    if (r->input_tokens >= 0)
        attr_int(&a, "gen_ai.usage.input_tokens", r->input_tokens);
    if (r->output_tokens >= 0)
        attr_int(&a, "gen_ai.usage.output_tokens", r->output_tokens);
    if (r->cache_read_tokens >= 0)
        attr_int(&a, "gen_ai.usage.cache_read.input_tokens", r->cache_read_tokens);
    if (r->operation)
        attr_bool(&a, "tollgate.stream", r->stream);
    if (r->key_id)
        attr_int(&a, "tollgate.key.id", r->key_id);
    if (r->tenant_id)
        attr_int(&a, "tollgate.tenant.id", r->tenant_id);
    if (r->nat)
        attr_int(&a, "tollgate.attempts", r->nat);
    attr_str(&a, "error.type", r->error);
    span_end(&a, r->status >= 500, r->error);
    /* Admission: the limits and the first attempt's money, one Redis script. */
    if (r->admit_start) {
        a = span_begin(b, nspans, r, r->admit_span_id, r->span_id, "admission", KIND_INTERNAL, r->admit_start,
                       r->admit_end ? r->admit_end : end);
        attr_str(&a, "tollgate.admission.result", r->admit_result[0] ? r->admit_result : "unfinished");
        span_end(&a, 0, NULL);
    }
    for (int i = 0; i < r->nat && i < TG_TRACE_ATTEMPTS; i++) {
        const tg_trace_attempt_t *t = &r->at[i];
        if (t->select_start) {
            a = span_begin(b, nspans, r, t->select_span_id, r->span_id, "select account", KIND_INTERNAL, t->select_start,
                           t->select_end ? t->select_end : t->start ? t->start : end);
            attr_int(&a, "tollgate.attempt", i + 1);
            if (t->account_id)
                attr_int(&a, "tollgate.account.id", t->account_id);
            attr_int(&a, "tollgate.select.candidates", t->candidates);
            span_end(&a, 0, NULL);
        }
        if (!t->start)
            continue;
        /* The upstream attempt, named as the GenAI conventions name a client call. */
        if (r->operation)
            snprintf(name, sizeof(name), "%s %s", r->operation, r->model);
        else
            snprintf(name, sizeof(name), "GET /models");
        a = span_begin(b, nspans, r, t->span_id, r->span_id, name, KIND_CLIENT, t->start, t->end ? t->end : end);
        attr_str(&a, "gen_ai.operation.name", r->operation);
        attr_str(&a, "gen_ai.provider.name", t->provider);
        attr_str(&a, "gen_ai.request.model", r->model);
        if (t->status)
            attr_int(&a, "http.response.status_code", t->status);
        if (i > 0)
            attr_int(&a, "http.request.resend_count", i);
        attr_int(&a, "tollgate.attempt", i + 1);
        if (t->account_id)
            attr_int(&a, "tollgate.account.id", t->account_id);
        if (i == r->nat - 1) {
            if (r->input_tokens >= 0)
                attr_int(&a, "gen_ai.usage.input_tokens", r->input_tokens);
            if (r->output_tokens >= 0)
                attr_int(&a, "gen_ai.usage.output_tokens", r->output_tokens);
        }
        char st[16];
        const char *etype = t->error;
        if (!etype && t->status >= 400) {
            snprintf(st, sizeof(st), "%d", t->status);
            etype = st;
        }
        attr_str(&a, "error.type", etype);
        span_end(&a, etype != NULL, NULL);
    }
    if (r->settle_start) {
        /* The settlement handed to billing's queue; its Postgres write follows in a
         * batch, found by tollgate.request.id (the usage row's request_id). */
        a = span_begin(b, nspans, r, r->settle_span_id, r->span_id, "settlement", KIND_INTERNAL, r->settle_start,
                       r->settle_end ? r->settle_end : r->settle_start);
        attr_str(&a, "tollgate.settlement.kind", r->settle_kind);
        attr_str(&a, "tollgate.request.id", r->request_id);
        if (r->cost_nanousd >= 0)
            attr_int(&a, "tollgate.billing.cost_nanousd", r->cost_nanousd);
        attr_bool(&a, "tollgate.billing.estimated", r->estimated);
        attr_str(&a, "tollgate.settlement.write", "queued");
        span_end(&a, 0, NULL);
    }
}

void tg_trace_encode(tg_trace_rec_t *const *recs, int n, const char *service_name, tg_buf_t *out) {
    tg_buf_appends(out, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    attrs_t a = {out, 0};
    attr_str(&a, "service.name", service_name ? service_name : "tollgate");
    attr_str(&a, "service.instance.id", T.instance_id);
    attr_str(&a, "telemetry.sdk.name", "tollgate");
    attr_str(&a, "telemetry.sdk.language", "c");
    tg_buf_appends(out, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"tollgate\"},\"spans\":[");
    int nspans = 0;
    for (int i = 0; i < n; i++)
        encode_rec(out, &nspans, recs[i]);
    tg_buf_appends(out, "]}]}]}");
}

/* Spans a record becomes (for the exported count). */
static int rec_spans(const tg_trace_rec_t *r) {
    int n = 1 + (r->admit_start != 0) + (r->settle_start != 0);
    for (int i = 0; i < r->nat && i < TG_TRACE_ATTEMPTS; i++)
        n += (r->at[i].select_start != 0) + (r->at[i].start != 0);
    return n;
}

/* ---- the POST ------------------------------------------------------------------------ */

static int64_t ms_left(uint64_t deadline) {
    uint64_t now = tg_now_ms();
    return now >= deadline ? 0 : (int64_t)(deadline - now);
}

static int connect_to(uint64_t deadline, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(T.host, T.port, &hints, &res);
    if (g) {
        snprintf(err, errlen, "resolve %s: %s", T.host, gai_strerror(g));
        return -1;
    }
    int fd = -1;
    snprintf(err, errlen, "connect %s:%s: no address", T.host, T.port);
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0)
            continue;
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            int64_t left = ms_left(deadline);
            if (left <= 0 || poll(&p, 1, (int)left) != 1)
                soerr = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                soerr = errno;
            rc = soerr ? -1 : 0;
            errno = soerr;
        }
        if (rc < 0) {
            snprintf(err, errlen, "connect %s:%s: %s", T.host, T.port, strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return -1;
    /* Blocking from here, each read and write bounded by what is left. */
    int64_t left = TG_MAX(ms_left(deadline), 1);
    struct timeval tv = {.tv_sec = left / 1000, .tv_usec = (left % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

typedef struct {
    int fd;
    SSL *ssl;
} conn_t;

static int conn_write(conn_t *c, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = c->ssl ? SSL_write(c->ssl, p, (int)TG_MIN(n, (size_t)1 << 30)) : send(c->fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) {
            if (!c->ssl && w < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static ssize_t conn_read(conn_t *c, char *p, size_t n) {
    for (;;) {
        ssize_t r = c->ssl ? SSL_read(c->ssl, p, (int)n) : recv(c->fd, p, n, 0);
        if (r < 0 && !c->ssl && errno == EINTR)
            continue;
        return r;
    }
}

/* POSTs body to the endpoint; returns the HTTP status, or -1 with err filled. */
static int post(const char *body, size_t len, char *err, size_t errlen) {
    uint64_t deadline = tg_now_ms() + (uint64_t)T.timeout_ms;
    conn_t c = {.fd = connect_to(deadline, err, errlen)};
    if (c.fd < 0)
        return -1;
    int status = -1;
    if (T.https) {
        c.ssl = SSL_new(T.ssl);
        if (!c.ssl) {
            snprintf(err, errlen, "tls: %s", tg_tls_last_error());
            goto out;
        }
        SSL_set_fd(c.ssl, c.fd);
        SSL_set_tlsext_host_name(c.ssl, T.host);
        SSL_set1_host(c.ssl, T.host);
        if (SSL_connect(c.ssl) != 1) {
            snprintf(err, errlen, "tls handshake with %s: %s", T.host, tg_tls_last_error());
            goto out;
        }
    }
    tg_buf_t head;
    tg_buf_init(&head);
    tg_buf_printf(&head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                         "Connection: close\r\nUser-Agent: tollgate\r\n",
                  T.path, T.host_header, len);
    for (size_t i = 0; i < T.nheaders; i++) {
        tg_buf_appends(&head, T.headers[i]);
        tg_buf_appends(&head, "\r\n");
    }
    tg_buf_appends(&head, "\r\n");
    int wrc = conn_write(&c, head.data, head.len);
    tg_buf_free(&head);
    if (wrc != 0 || conn_write(&c, body, len) != 0) {
        snprintf(err, errlen, "send to %s:%s: %s", T.host, T.port, errno ? strerror(errno) : "failed");
        goto out;
    }
    /* The status line is all we read; the collector's body (a partial success at most)
     * is not acted on. */
    char line[256];
    size_t got = 0;
    while (got < sizeof(line) - 1 && !memchr(line, '\n', got)) {
        ssize_t r = conn_read(&c, line + got, sizeof(line) - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    line[got] = '\0';
    int code;
    if (sscanf(line, "HTTP/1.%*d %d", &code) == 1)
        status = code;
    else
        snprintf(err, errlen, "no HTTP answer from %s:%s", T.host, T.port);
out:
    if (c.ssl)
        SSL_free(c.ssl);
    close(c.fd);
    return status;
}

/* ---- the exporter thread ---------------------------------------------------------------- */

static int export_batch(tg_trace_rec_t **recs, int n, tg_buf_t *body) {
    tg_buf_reset(body);
    tg_trace_encode(recs, n, T.service_name, body);
    char err[300] = "";
    int status = post(body->data, body->len, err, sizeof(err));
    if (status >= 200 && status < 300) {
        int spans = 0;
        for (int i = 0; i < n; i++)
            spans += rec_spans(recs[i]);
        atomic_fetch_add_explicit(&T.exported_spans, (uint64_t)spans, RELAXED);
        atomic_fetch_add_explicit(&T.exported_requests, (uint64_t)n, RELAXED);
        atomic_fetch_add_explicit(&T.posts_ok, 1, RELAXED);
        return 1;
    }
    atomic_fetch_add_explicit(&T.posts_failed, 1, RELAXED);
    atomic_fetch_add_explicit(&T.dropped_failed, (uint64_t)n, RELAXED);
    uint64_t skipped;
    if (tg_log_allow("trace-export", 12, tg_now_ms(), &skipped)) {
        if (status > 0)
            snprintf(err, sizeof(err), "the collector answered %d", status);
        tg_log_warn("tracing: %d requests' spans not exported to %s:%s%s: %s (%llu such failures not logged)", n, T.host,
                    T.port, T.path, err, (unsigned long long)skipped);
    }
    return 0;
}

static void *exporter_main(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    tg_trace_rec_t **batch = malloc((size_t)T.batch_size * sizeof(*batch));
    tg_buf_t body;
    tg_buf_init(&body);
    pthread_mutex_lock(&T.mu);
    for (;;) {
        /* Wait for a full batch, the interval, or the stop. */
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += T.interval_ms / 1000;
        dl.tv_nsec += (long)(T.interval_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        while (!T.stopping && T.qn < T.batch_size) {
            if (pthread_cond_timedwait(&T.cond, &T.mu, &dl) == ETIMEDOUT)
                break;
        }
        if (!T.qn) {
            if (T.stopping)
                break;
            continue;
        }
        int n = 0;
        while (T.q_head && n < T.batch_size) {
            batch[n++] = T.q_head;
            T.q_head = T.q_head->next;
        }
        if (!T.q_head)
            T.q_tail = NULL;
        T.qn -= n;
        pthread_mutex_unlock(&T.mu);
        int ok = export_batch(batch, n, &body);
        pthread_mutex_lock(&T.mu);
        for (int i = 0; i < n; i++) {
            batch[i]->next = T.free_list;
            T.free_list = batch[i];
        }
        if (!ok && T.stopping) {
            /* Stopping with the collector failing: one attempt, not one per batch. */
            atomic_fetch_add_explicit(&T.dropped_failed, (uint64_t)T.qn, RELAXED);
            break;
        }
    }
    pthread_mutex_unlock(&T.mu);
    tg_buf_free(&body);
    free(batch);
    return NULL;
}

/* ---- start, stop, metrics ------------------------------------------------------------------ */

/* Splits the endpoint URL into host, port, path and the Host header. */
static int parse_endpoint(const char *url, char *err, size_t errlen) {
    T.https = !strncmp(url, "https://", 8);
    const char *h = url + (T.https ? 8 : 7);
    const char *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    snprintf(T.path, sizeof(T.path), "%s", slash ? slash : "/v1/traces");
    if (!hl || hl >= sizeof(T.host)) {
        snprintf(err, errlen, "config: tracing.endpoint: no host in \"%s\"", url);
        return TG_ERROR;
    }
    snprintf(T.host_header, sizeof(T.host_header), "%.*s", (int)hl, h);
    const char *port = NULL;
    if (h[0] == '[') {
        const char *rb = memchr(h, ']', hl);
        if (!rb) {
            snprintf(err, errlen, "config: tracing.endpoint: bad IPv6 host in \"%s\"", url);
            return TG_ERROR;
        }
        snprintf(T.host, sizeof(T.host), "%.*s", (int)(rb - h - 1), h + 1);
        if (rb + 1 < h + hl && rb[1] == ':')
            port = rb + 2;
    } else {
        const char *colon = memchr(h, ':', hl);
        snprintf(T.host, sizeof(T.host), "%.*s", (int)(colon ? (size_t)(colon - h) : hl), h);
        if (colon)
            port = colon + 1;
    }
    if (port) {
        size_t pl = (size_t)(h + hl - port);
        char *end;
        char tmp[8];
        snprintf(tmp, sizeof(tmp), "%.*s", (int)TG_MIN(pl, sizeof(tmp) - 1), port);
        long v = strtol(tmp, &end, 10);
        if (!pl || pl > 5 || *end || v < 1 || v > 65535) {
            snprintf(err, errlen, "config: tracing.endpoint: bad port in \"%s\"", url);
            return TG_ERROR;
        }
        snprintf(T.port, sizeof(T.port), "%ld", v);
    } else {
        snprintf(T.port, sizeof(T.port), "%s", T.https ? "443" : "80");
    }
    return TG_OK;
}

int tg_trace_start(const tg_tracing_config_t *cfg, char *err, size_t errlen) {
    if (!cfg->endpoint)
        return TG_OK;
    if (parse_endpoint(cfg->endpoint, err, errlen) != TG_OK)
        return TG_ERROR;
    if (T.https && !(T.ssl = tg_tls_client_ctx(cfg->ca_file, 1, err, errlen)))
        return TG_ERROR;
    T.batch_size = cfg->batch_size;
    T.interval_ms = cfg->batch_interval_ms;
    T.timeout_ms = cfg->timeout_ms;
    /* ratio 1 samples every id: 2^56 is above every 56-bit value. */
    T.threshold = cfg->sample_ratio >= 1 ? (1ull << 56) : (uint64_t)(cfg->sample_ratio * (double)(1ull << 56));
    T.service_name = strdup(cfg->service_name ? cfg->service_name : "tollgate");
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    char inst[300];
    snprintf(inst, sizeof(inst), "%s:%d", host, (int)getpid());
    T.instance_id = strdup(inst);
    T.nheaders = cfg->nheaders;
    T.headers = calloc(cfg->nheaders + 1, sizeof(char *));
    for (size_t i = 0; i < cfg->nheaders; i++)
        T.headers[i] = strdup(cfg->headers[i]);
    T.pool = calloc((size_t)cfg->queue_size, sizeof(*T.pool));
    if (!T.pool) {
        snprintf(err, errlen, "tracing: no memory for %d records", cfg->queue_size);
        return TG_ERROR;
    }
    for (int i = cfg->queue_size - 1; i >= 0; i--) {
        T.pool[i].next = T.free_list;
        T.free_list = &T.pool[i];
    }
    T.stopping = 0;
    /* The exporter's waits are on the monotonic clock (a wall-clock step must not
     * stall or hurry them). */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_destroy(&T.cond);
    pthread_cond_init(&T.cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&T.thread, NULL, exporter_main, NULL) != 0) {
        snprintf(err, errlen, "tracing: cannot start the exporter thread");
        return TG_ERROR;
    }
    T.running = 1;
    tg__trace_active = 1;
    tg_log_info("tracing: OTLP/HTTP JSON to %s, sample ratio %g, %d requests per batch", cfg->endpoint,
                cfg->sample_ratio, cfg->batch_size);
    return TG_OK;
}

void tg_trace_stop(void) {
    if (!T.running)
        return;
    tg__trace_active = 0;
    pthread_mutex_lock(&T.mu);
    T.stopping = 1;
    pthread_cond_signal(&T.cond);
    pthread_mutex_unlock(&T.mu);
    pthread_join(T.thread, NULL);
    T.running = 0;
    free(T.pool);
    T.pool = T.free_list = T.q_head = T.q_tail = NULL;
    T.qn = 0;
    for (size_t i = 0; i < T.nheaders; i++)
        free(T.headers[i]);
    free(T.headers);
    T.headers = NULL;
    free(T.service_name);
    free(T.instance_id);
    T.service_name = T.instance_id = NULL;
    if (T.ssl)
        SSL_CTX_free(T.ssl);
    T.ssl = NULL;
}

static void trace_collect(const void *const *inst, int n, tg_buf_t *out) {
    (void)inst;
    (void)n;
    pthread_mutex_lock(&T.mu);
    int queued = T.qn;
    pthread_mutex_unlock(&T.mu);
    tg_buf_printf(out,
                  "# HELP tollgate_trace_sampled_total Requests sampled for tracing.\n"
                  "# TYPE tollgate_trace_sampled_total counter\ntollgate_trace_sampled_total %llu\n"
                  "# HELP tollgate_trace_exported_total Sampled requests whose spans the collector accepted.\n"
                  "# TYPE tollgate_trace_exported_total counter\ntollgate_trace_exported_total %llu\n"
                  "# HELP tollgate_trace_spans_exported_total Spans the collector accepted.\n"
                  "# TYPE tollgate_trace_spans_exported_total counter\ntollgate_trace_spans_exported_total %llu\n"
                  "# HELP tollgate_trace_dropped_total Sampled requests whose spans were not sent: the queue was "
                  "full, or the export failed.\n"
                  "# TYPE tollgate_trace_dropped_total counter\n"
                  "tollgate_trace_dropped_total{reason=\"queue_full\"} %llu\n"
                  "tollgate_trace_dropped_total{reason=\"export_failed\"} %llu\n"
                  "# HELP tollgate_trace_exports_total POSTs to the collector, by result.\n"
                  "# TYPE tollgate_trace_exports_total counter\n"
                  "tollgate_trace_exports_total{result=\"ok\"} %llu\n"
                  "tollgate_trace_exports_total{result=\"failed\"} %llu\n"
                  "# HELP tollgate_trace_queued Finished requests waiting to be exported.\n"
                  "# TYPE tollgate_trace_queued gauge\ntollgate_trace_queued %d\n",
                  (unsigned long long)atomic_load_explicit(&T.sampled, RELAXED),
                  (unsigned long long)atomic_load_explicit(&T.exported_requests, RELAXED),
                  (unsigned long long)atomic_load_explicit(&T.exported_spans, RELAXED),
                  (unsigned long long)atomic_load_explicit(&T.dropped_full, RELAXED),
                  (unsigned long long)atomic_load_explicit(&T.dropped_failed, RELAXED),
                  (unsigned long long)atomic_load_explicit(&T.posts_ok, RELAXED),
                  (unsigned long long)atomic_load_explicit(&T.posts_failed, RELAXED), queued);
}

void tg_trace_metrics(tg_metrics_t *m) {
    if (tg__trace_active)
        tg_metrics_collector_add(m, trace_collect, &T);
}
