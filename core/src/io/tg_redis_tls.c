/*
 * TLS to Redis through an in-process tunnel (see tg_redis_tls.h).
 *
 * A tunnel is two libuv handles on one loop: `plain`, a pipe on the socket hiredis
 * talks to, and `net`, the TCP connection to the node; tg_tls between them. Plaintext
 * hiredis writes before the handshake is done waits inside tg_tls. Either side ending
 * closes both (hiredis then reads EOF and reconnects by its own rules); the tunnel is
 * freed from the close callback of its last handle.
 */
#include "tollgate/tg_redis_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tollgate/tg_tls.h"

static SSL_CTX *g_ctx;
static char *g_server_name;
static char g_dir[80]; /* the private directory of the async tunnels' sockets */
static atomic_uint g_seq;

static void remove_dir(void) {
    if (g_dir[0])
        rmdir(g_dir);
}

int tg_redis_tls_setup(const tg_redis_tls_opts_t *o, char *err, size_t errlen) {
    if (g_ctx)
        return TG_OK;
    if (!o->cert != !o->key) {
        snprintf(err, errlen, "redis_tls: cert and key go together (a client certificate and its key)");
        return TG_ERROR;
    }
    SSL_CTX *ctx = tg_tls_client_ctx(o->ca_file, o->verify, err, errlen);
    if (!ctx)
        return TG_ERROR;
    if (o->cert && tg_tls_client_cert(ctx, o->cert, o->key, err, errlen) != TG_OK) {
        SSL_CTX_free(ctx);
        return TG_ERROR;
    }
    /* The sockets' directory: short (a unix socket path is at most 107 bytes). */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 48)
        tmp = "/tmp";
    snprintf(g_dir, sizeof(g_dir), "%s/tollgate-redis-XXXXXX", tmp);
    if (!mkdtemp(g_dir)) { /* mode 0700 */
        snprintf(err, errlen, "redis_tls: cannot create a private directory in %s: %s", tmp, strerror(errno));
        g_dir[0] = '\0';
        SSL_CTX_free(ctx);
        return TG_ERROR;
    }
    atexit(remove_dir);
    /* A tunnel that ended leaves hiredis writing to a closed socket: EPIPE, not a kill
     * (the server ignores SIGPIPE already; `tollgate ledger` and `apply` too, now). */
    signal(SIGPIPE, SIG_IGN);
    g_server_name = o->server_name ? strdup(o->server_name) : NULL;
    if (!o->verify)
        tg_log_warn("redis: TLS certificate verification is off (redis_tls.verify = false): anyone on the path "
                    "can impersonate Redis");
    g_ctx = ctx;
    return TG_OK;
}

int tg_redis_tls_ready(void) { return g_ctx != NULL; }

/* ---- the tunnel ------------------------------------------------------------------ */

struct tg_rtls_s {
    uv_loop_t *loop;
    uv_tcp_t net;
    uv_pipe_t plain;
    uv_connect_t creq;
    int nopen; /* handles initialised and not yet closed */
    int connected, closing, up;
    int answered; /* plaintext came from the node: the setup is past TLS (TLS 1.3 refuses a
                   * client certificate after the client's handshake has completed) */
    tg_tls_t *tls;
    tg_rtls_fail_cb fail;
    tg_rtls_closed_cb closed;
    void (*on_up)(void *ud); /* the blocking callers' */
    void *ud;
    char where[280]; /* host:port, for logs */
    char rbuf[16384];
};

typedef struct {
    uv_write_t req;
    char data[];
} rtls_write_t;

static void rtls_on_close(uv_handle_t *h) {
    tg_rtls_t *t = h->data;
    if (--t->nopen > 0)
        return;
    if (t->closed)
        t->closed(t->ud, t);
    tg_tls_destroy(t->tls);
    free(t);
}

static void rtls_shut(tg_rtls_t *t) {
    if (t->closing)
        return;
    t->closing = 1;
    uv_close((uv_handle_t *)&t->net, rtls_on_close);
    uv_close((uv_handle_t *)&t->plain, rtls_on_close);
}

/* Failed before the node's first answer: the owner hears why, once; later, the log. */
static void rtls_fail(tg_rtls_t *t, const char *what, const char *detail) {
    if (t->answered && !t->closing)
        tg_log_warn("redis: TLS to %s: %s%s%s", t->where, what, detail ? ": " : "", detail ? detail : "");
    if (t->fail && !t->answered && !t->closing) {
        char why[600];
        snprintf(why, sizeof(why), "TLS to %s: %s%s%s", t->where, what, detail ? ": " : "", detail ? detail : "");
        tg_rtls_fail_cb cb = t->fail;
        t->fail = NULL;
        cb(t->ud, why);
    }
    rtls_shut(t);
}

void tg_rtls_close(tg_rtls_t *t) {
    if (!t)
        return;
    t->fail = NULL;
    rtls_shut(t);
}

static void rtls_on_written(uv_write_t *req, int status) {
    tg_rtls_t *t = req->data;
    free(req);
    if (status < 0 && status != UV_ECANCELED)
        rtls_fail(t,
                  t->up && !t->answered ? "the server dropped the session before answering "
                                          "(a client certificate missing or refused? redis_tls.cert)"
                                        : "write failed",
                  uv_strerror(status));
}

static void rtls_send(tg_rtls_t *t, uv_stream_t *s, tg_buf_t *b) {
    if (!b->len || t->closing)
        return;
    rtls_write_t *w = malloc(sizeof(*w) + b->len);
    if (!w)
        abort();
    memcpy(w->data, b->data, b->len);
    w->req.data = t;
    uv_buf_t ub = uv_buf_init(w->data, (unsigned)b->len);
    b->len = 0;
    if (uv_write(&w->req, s, &ub, 1, rtls_on_written) != 0) {
        free(w);
        rtls_shut(t);
    }
}

static void rtls_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    tg_rtls_t *t = h->data;
    *buf = uv_buf_init(t->rbuf, sizeof(t->rbuf));
}

/* Ciphertext from the node. */
static void rtls_on_net(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    tg_rtls_t *t = s->data;
    if (nread == 0 || t->closing)
        return;
    if (nread < 0) {
        if (nread == UV_EOF && t->answered)
            rtls_shut(t); /* hiredis tells */
        else
            rtls_fail(t,
                      !t->up ? "the server closed the connection during the handshake"
                             : "the server dropped the session before answering (a client certificate missing or "
                               "refused? redis_tls.cert)",
                      nread == UV_EOF ? NULL : uv_strerror((int)nread));
        return;
    }
    tg_buf_t plain, out;
    tg_buf_init(&plain);
    tg_buf_init(&out);
    int rc = tg_tls_feed(t->tls, buf->base, (size_t)nread, &plain, &out);
    rtls_send(t, (uv_stream_t *)&t->net, &out);
    if (rc != TG_OK) {
        char why[400];
        tg_tls_describe_error(t->tls, why, sizeof(why));
        rtls_fail(t, t->up ? "session failed" : "handshake failed", why);
    } else {
        if (!t->up && tg_tls_handshake_done(t->tls)) {
            t->up = 1;
            tg_log_debug("redis: TLS to %s established", t->where);
            if (t->on_up)
                t->on_up(t->ud);
        }
        if (plain.len)
            t->answered = 1;
        rtls_send(t, (uv_stream_t *)&t->plain, &plain);
    }
    tg_buf_free(&plain);
    tg_buf_free(&out);
}

/* Plaintext from hiredis. */
static void rtls_on_plain(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    tg_rtls_t *t = s->data;
    if (nread == 0 || t->closing)
        return;
    if (nread < 0) { /* hiredis closed its end */
        tg_rtls_close(t);
        return;
    }
    tg_buf_t out;
    tg_buf_init(&out);
    int rc = tg_tls_write(t->tls, buf->base, (size_t)nread, &out);
    if (t->connected)
        rtls_send(t, (uv_stream_t *)&t->net, &out);
    tg_buf_free(&out);
    if (rc != TG_OK)
        rtls_fail(t, "encryption failed", NULL);
}

static void rtls_on_connect(uv_connect_t *req, int status) {
    tg_rtls_t *t = req->data;
    if (t->closing)
        return;
    if (status < 0) {
        rtls_fail(t, "connect failed", uv_strerror(status));
        return;
    }
    t->connected = 1;
    uv_tcp_nodelay(&t->net, 1);
    uv_tcp_keepalive(&t->net, 1, 60);
    tg_buf_t out;
    tg_buf_init(&out);
    int rc = tg_tls_connect(t->tls, &out);
    rtls_send(t, (uv_stream_t *)&t->net, &out);
    tg_buf_free(&out);
    if (rc != TG_OK) {
        char why[400];
        tg_tls_describe_error(t->tls, why, sizeof(why));
        rtls_fail(t, "handshake failed", why);
        return;
    }
    uv_read_start((uv_stream_t *)&t->net, rtls_alloc, rtls_on_net);
}

/* A tunnel from the connected local socket `fd` (taken over) to host:port. NULL with
 * the reason in err (fd closed). */
static tg_rtls_t *rtls_start(uv_loop_t *loop, int fd, const char *host, int port, char *err, size_t errlen) {
    tg_rtls_t *t = calloc(1, sizeof(*t));
    if (!t)
        abort();
    t->loop = loop;
    snprintf(t->where, sizeof(t->where), "%.256s:%d", host, port);
    /* Host names: a blocking lookup, as hiredis's own connect does. */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof(ps), "%d", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "TLS to %s: cannot resolve: %s", t->where, gai_strerror(gai));
        close(fd);
        free(t);
        return NULL;
    }
    const char *name = g_server_name ? g_server_name : host;
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
    t->tls = tg_tls_create(g_ctx, 0, is_ip ? NULL : name); /* SNI and the name checked */
    if (is_ip)
        tg_tls_expect_ip(t->tls, name);
    uv_tcp_init(loop, &t->net);
    uv_pipe_init(loop, &t->plain, 0);
    t->net.data = t->plain.data = t->creq.data = t;
    t->nopen = 2;
    int rc = uv_pipe_open(&t->plain, fd);
    int adopted = rc == 0;
    if (rc == 0)
        rc = uv_tcp_connect(&t->creq, &t->net, ai->ai_addr, rtls_on_connect);
    freeaddrinfo(ai);
    if (rc != 0) {
        snprintf(err, errlen, "TLS to %s: %s", t->where, uv_strerror(rc));
        if (!adopted)
            close(fd);
        t->closing = 1;
        uv_close((uv_handle_t *)&t->net, rtls_on_close);
        uv_close((uv_handle_t *)&t->plain, rtls_on_close);
        return NULL;
    }
    uv_read_start((uv_stream_t *)&t->plain, rtls_alloc, rtls_on_plain);
    return t;
}

redisAsyncContext *tg_redis_tls_connect_async(uv_loop_t *loop, const char *host, int port, tg_rtls_t **tun,
                                              tg_rtls_fail_cb fail, tg_rtls_closed_cb closed, void *ud, char *err,
                                              size_t errlen) {
    *tun = NULL;
    if (!g_ctx) {
        snprintf(err, errlen, "TLS is not set up (tg_redis_tls_setup)");
        return NULL;
    }
    /* A one-shot listener: hiredis's connect lands in its backlog at once (a unix
     * socket connects synchronously), the accept takes it, the path goes. */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%d-%u.sock", g_dir, (int)getpid(), atomic_fetch_add(&g_seq, 1));
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(l, 1) != 0) {
        snprintf(err, errlen, "TLS tunnel: local socket %s: %s", sa.sun_path, strerror(errno));
        if (l >= 0)
            close(l);
        unlink(sa.sun_path);
        return NULL;
    }
    redisAsyncContext *ac = redisAsyncConnectUnix(sa.sun_path);
    int fd = ac && !ac->err ? accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK) : -1;
    int e = errno;
    close(l);
    unlink(sa.sun_path);
    if (fd < 0) {
        snprintf(err, errlen, "TLS tunnel: local socket: %s", !ac ? "out of memory" : ac->err ? ac->errstr : strerror(e));
        if (ac)
            redisAsyncFree(ac);
        return NULL;
    }
    tg_rtls_t *t = rtls_start(loop, fd, host, port, err, errlen);
    if (!t) {
        redisAsyncFree(ac);
        return NULL;
    }
    t->fail = fail;
    t->closed = closed;
    t->ud = ud;
    *tun = t;
    return ac;
}

/* ---- blocking callers: the tunnel on a thread -------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int state; /* 0 waiting, 1 up, -1 failed */
    char why[600];
    char host[256];
    int port, fd;
} sync_t;

static void sync_unref(sync_t *s) {
    pthread_mutex_lock(&s->mu);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
    }
}

static void sync_settle(sync_t *s, int state, const char *why) {
    pthread_mutex_lock(&s->mu);
    if (s->state == 0) {
        s->state = state;
        if (why)
            snprintf(s->why, sizeof(s->why), "%s", why);
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

static void sync_on_fail(void *ud, const char *why) {
    sync_t *s = ud;
    pthread_mutex_lock(&s->mu);
    if (!s->why[0])
        snprintf(s->why, sizeof(s->why), "%s", why); /* also after the handshake: for the PING */
    pthread_mutex_unlock(&s->mu);
    sync_settle(s, -1, why);
}

static void sync_on_closed(void *ud, tg_rtls_t *t) {
    (void)t;
    sync_settle(ud, -1, "TLS tunnel closed");
}

static void sync_on_up(void *ud) { sync_settle(ud, 1, NULL); }

static void *sync_thread(void *arg) {
    sync_t *s = arg;
    uv_loop_t loop;
    uv_loop_init(&loop);
    char err[400];
    tg_rtls_t *t = rtls_start(&loop, s->fd, s->host, s->port, err, sizeof(err));
    if (t) {
        t->fail = sync_on_fail;
        t->closed = sync_on_closed;
        t->on_up = sync_on_up;
        t->ud = s;
        uv_run(&loop, UV_RUN_DEFAULT); /* until the tunnel has closed */
    } else {
        sync_settle(s, -1, err);
    }
    uv_loop_close(&loop);
    sync_unref(s);
    return NULL;
}

redisContext *tg_redis_tls_connect_sync(const char *host, int port, int timeout_ms, char *err, size_t errlen) {
    if (!g_ctx) {
        snprintf(err, errlen, "TLS is not set up (tg_redis_tls_setup)");
        return NULL;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(err, errlen, "TLS tunnel: socketpair: %s", strerror(errno));
        return NULL;
    }
    sync_t *s = calloc(1, sizeof(*s));
    if (!s)
        abort();
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->refs = 2;
    s->fd = sv[1];
    s->port = port;
    snprintf(s->host, sizeof(s->host), "%s", host);
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, sync_thread, s) != 0) {
        pthread_attr_destroy(&at);
        close(sv[0]);
        close(sv[1]);
        free(s);
        snprintf(err, errlen, "TLS tunnel: cannot start its thread");
        return NULL;
    }
    pthread_attr_destroy(&at);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    while (s->state == 0)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) != 0)
            break;
    int state = s->state;
    if (state < 0)
        snprintf(err, errlen, "%s", s->why);
    else if (state == 0)
        snprintf(err, errlen, "TLS to %.256s:%d: no handshake within %d ms", host, port, timeout_ms);
    pthread_mutex_unlock(&s->mu);
    if (state <= 0) {
        sync_unref(s);
        close(sv[0]); /* the tunnel sees EOF and ends its thread */
        return NULL;
    }
    redisContext *c = redisConnectFd(sv[0]);
    if (!c || c->err) {
        snprintf(err, errlen, "TLS tunnel: %s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        else
            close(sv[0]);
        sync_unref(s);
        return NULL;
    }
    /* Where it leads, as hiredis keeps it for a TCP connection (redisFree frees it): a
     * cluster's map names the answering node by an empty host. */
    c->tcp.host = strdup(host);
    c->tcp.port = port;
    /* A first answer: a node that refuses this client (its certificate) says so only now. */
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    redisSetTimeout(c, tv);
    redisReply *pong = redisCommand(c, "PING");
    int ok = pong != NULL; /* any answer, NOAUTH included (AUTH comes next) */
    if (!ok || c->err) {
        pthread_mutex_lock(&s->mu);
        snprintf(err, errlen, "%s", s->why[0] ? s->why : c->err ? c->errstr : "no answer to PING");
        pthread_mutex_unlock(&s->mu);
    }
    if (pong)
        freeReplyObject(pong);
    sync_unref(s);
    if (!ok || c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}
