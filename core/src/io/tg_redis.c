/*
 * The per-worker Redis client (see tg_redis.h): hiredis 0.14 async on the worker's loop,
 * with per-command timeouts, reconnects, scripts and Pub/Sub added on top.
 *
 * Two connections, `cmd` for commands and `sub` for Pub/Sub (opened at the first
 * subscribe), each DOWN -> CONNECTING -> UP -> DOWN, with a timer that is the connect
 * timeout while CONNECTING and the backoff delay while DOWN. hiredis owns a request from
 * the moment it is sent until its reply callback runs, which it always does: with the
 * reply, or with NULL when the context is freed. A request that times out or is
 * cancelled becomes an ORPHAN: its callback has run (or never will) but its memory waits
 * for that reply callback. Requests that fail at once are DEFERRED to the next loop turn
 * (a uv_idle), so a callback never runs inside tg_redis_command.
 *
 * All commands share one timeout, so their deadlines increase in submission order: one
 * list sorted by construction and one uv_timer watch them all. The same timer detects a
 * stalled connection (requests outstanding and no reply for a long time: a black-holed
 * TCP peer, which hiredis would wait on forever) and replaces it.
 *
 * Memory: the client is freed from the close callback of its last handle, and its idle
 * handle is closed only once both hiredis contexts are gone, so hiredis never calls back
 * into freed memory, even when tg_redis_destroy runs inside a hiredis callback.
 */
#include "tollgate/tg_redis.h"

#include <assert.h>
#include <hiredis/async.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

const char tg_redis_err_timeout[] = "timeout";
const char tg_redis_err_disconnected[] = "disconnected";
const char tg_redis_err_shutdown[] = "shutdown";

#define REDIS_BACKOFF_MIN_MS 100
#define REDIS_BACKOFF_MAX_MS 5000
#define REDIS_STALL_MIN_MS 5000

enum { S_DOWN, S_CONNECTING, S_UP };
enum { R_SENT, R_ORPHAN, R_DEFERRED, R_DONE };

typedef struct {
    tg_redis_t *r;
    const char *name; /* "command" or "pubsub", for logs */
    int is_sub;
    int state;
    redisAsyncContext *ac;
    uv_timer_t timer;  /* connect timeout (CONNECTING) or backoff (DOWN) */
    int backoff_ms;    /* the next reconnect delay before jitter; 0 after a success */
    int tried;         /* a connection attempt has finished, successfully or not */
    int broken;        /* hiredis reported the context lost; cleanup follows */
    int freeing;       /* we called redisAsyncFree on ac */
    int inflight;      /* commands whose reply callback hiredis still owes */
    uint64_t last_io;  /* when a reply last arrived (or inflight became non-zero) */
} tg__redis_conn_t;

struct tg_redis_req_s {
    tg_redis_t *r;
    tg_redis_req_t *prev, *next; /* r->pending (SENT) or r->deferred (DEFERRED) */
    uint64_t deadline;
    tg_redis_cb cb;
    void *ud;
    const char *err; /* DEFERRED */
    int state;
    int script; /* -1, or the script id: argv below is kept for a NOSCRIPT retry */
    int retried;
    int argc;
    const char **argv;
    size_t *argvlen;
    char nkeys[16];
};

typedef struct {
    tg_redis_req_t *head, *tail;
    size_t n;
} tg__redis_list_t;

typedef struct {
    char *src;
    size_t len;
    char sha[41];
} tg__redis_script_t;

/* An idempotent script until its last answer (tg_redis_eval_idempotent): sent, and
 * while it waits for a resend, its timer; the arguments are copied behind it. */
typedef struct tg__redis_resend_s {
    tg_redis_t *r;
    struct tg__redis_resend_s *prev, *next; /* r->resends */
    uv_timer_t timer;
    int timer_open;
    int sends, max_sends;
    int script, nkeys, argc;
    tg_redis_cb cb;
    void *ud;
    const char **argv;
    size_t *argvlen;
} tg__redis_resend_t;

typedef struct {
    char *channel;
    tg_redis_msg_cb cb;
    void *ud;
    int gap; /* a connection attempt failed or the connection dropped: notify once subscribed */
} tg__redis_sub_t;

struct tg_redis_s {
    uv_loop_t *loop;
    tg_redis_url_t url;
    int timeout_ms, connect_timeout_ms, stall_ms;
    tg__redis_conn_t cmd, sub;
    tg__redis_script_t *scripts;
    int nscripts, scripts_cap;
    tg__redis_sub_t *subs;
    int nsubs, subs_cap;
    tg__redis_list_t pending, deferred;
    tg__redis_resend_t *resends; /* idempotent scripts until their last answer */
    int nresends;
    uv_timer_t timer; /* deadlines of pending, and the stall check */
    uv_idle_t idle;   /* runs while deferred is not empty; closed last */
    uv_prepare_t flush; /* writes the commands of this loop iteration before it polls */
    int owner_flushes;  /* tg_redis_owner_flushes(): the loop's owner calls tg_redis_flush */
    int closing;
    int idle_closing;
    int nctx;    /* live hiredis contexts */
    int handles; /* open handles; freed when closing and 0 */
    uint64_t rng;
    tg_redis_stats_t stats;
};

/* ---- lists and small helpers ---------------------------------------------------- */

static void l_push(tg__redis_list_t *l, tg_redis_req_t *q) {
    q->next = NULL;
    q->prev = l->tail;
    if (l->tail)
        l->tail->next = q;
    else
        l->head = q;
    l->tail = q;
    l->n++;
}

static void l_remove(tg__redis_list_t *l, tg_redis_req_t *q) {
    if (q->prev)
        q->prev->next = q->next;
    else
        l->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        l->tail = q->prev;
    q->prev = q->next = NULL;
    l->n--;
}

static uint64_t redis_rand(tg_redis_t *r) {
    uint64_t x = r->rng; /* xorshift64: jitter only */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return r->rng = x;
}

static void redis_free(tg_redis_t *r) {
    for (int i = 0; i < r->nscripts; i++)
        free(r->scripts[i].src);
    for (int i = 0; i < r->nsubs; i++)
        free(r->subs[i].channel);
    free(r->scripts);
    free(r->subs);
    tg_redis_url_free(&r->url);
    free(r);
}

static void redis_on_handle_close(uv_handle_t *h) {
    tg_redis_t *r = h->data;
    if (--r->handles == 0)
        redis_free(r);
}

static void conn_on_timer_close(uv_handle_t *h) {
    tg__redis_conn_t *c = h->data;
    tg_redis_t *r = c->r;
    if (--r->handles == 0)
        redis_free(r);
}

/* Once destroyed and both hiredis contexts are gone, the last handle closes. */
static void redis_maybe_close(tg_redis_t *r) {
    if (r->closing && r->nctx == 0 && !r->idle_closing) {
        r->idle_closing = 1;
        uv_close((uv_handle_t *)&r->idle, redis_on_handle_close);
        uv_close((uv_handle_t *)&r->flush, redis_on_handle_close);
    }
}

static void redis_on_idle(uv_idle_t *h);
static void redis_on_timer(uv_timer_t *t);
static void redis_on_flush(uv_prepare_t *h);
static void conn_connect(tg__redis_conn_t *c);

static void redis_defer(tg_redis_t *r, tg_redis_req_t *q, const char *err) {
    q->state = R_DEFERRED;
    q->err = err;
    l_push(&r->deferred, q);
    uv_idle_start(&r->idle, redis_on_idle);
}

/* Runs the callback of a request that is on no list and not owed by hiredis, then frees
 * it. Returns non-zero when the client is being destroyed. */
static int req_finish(tg_redis_req_t *q, redisReply *reply, const char *err) {
    tg_redis_t *r = q->r;
    q->state = R_DONE;
    if (q->cb)
        q->cb(q->ud, reply, err);
    free(q);
    return r->closing;
}

/* Runs the callback of a request hiredis still owes a reply for; it becomes an orphan. */
static int req_abandon(tg_redis_req_t *q, const char *err) {
    tg_redis_t *r = q->r;
    q->state = R_ORPHAN;
    if (q->cb)
        q->cb(q->ud, NULL, err);
    return r->closing;
}

static void redis_arm(tg_redis_t *r) {
    uint64_t now = uv_now(r->loop), next = UINT64_MAX;
    if (r->pending.head)
        next = r->pending.head->deadline;
    if (r->cmd.state == S_UP && r->cmd.inflight > 0)
        next = TG_MIN(next, r->cmd.last_io + (uint64_t)r->stall_ms);
    if (next == UINT64_MAX)
        uv_timer_stop(&r->timer);
    else
        uv_timer_start(&r->timer, redis_on_timer, next > now ? next - now : 0, 0);
}

/* ---- connections ---------------------------------------------------------------- */

static int conn_accepts(const tg__redis_conn_t *c) {
    if (!c->ac || c->freeing || c->broken)
        return 0;
    /* Before the very first attempt has finished, commands wait for it (hiredis buffers
     * them); after that, only an established connection takes commands. */
    return c->state == S_UP || (c->state == S_CONNECTING && !c->tried);
}

static void conn_on_timer(uv_timer_t *t);

/* Schedules the next connection attempt. Subscribers will hear that messages may have
 * been missed once their channel is subscribed again. */
static void conn_retry(tg__redis_conn_t *c) {
    tg_redis_t *r = c->r;
    if (c->is_sub)
        for (int i = 0; i < r->nsubs; i++)
            r->subs[i].gap = 1;
    int base = c->backoff_ms ? c->backoff_ms : REDIS_BACKOFF_MIN_MS;
    c->backoff_ms = TG_MIN(base * 2, REDIS_BACKOFF_MAX_MS);
    c->state = S_DOWN;
    uint64_t delay = (uint64_t)(base / 2) + redis_rand(r) % (uint64_t)(base / 2 + 1);
    uv_timer_start(&c->timer, conn_on_timer, delay, 0);
}

static void conn_log_failure(tg__redis_conn_t *c, const char *why) {
    if (c->backoff_ms == 0)
        tg_log_warn("redis: %s connection: connect failed: %s", c->name, why ? why : "unknown error");
    else
        tg_log_debug("redis: %s connection: connect failed: %s", c->name, why ? why : "unknown error");
}


/* ---- the event adapter ----------------------------------------------------------------
 *
 * hiredis asks its event library to watch for writability after every command, and
 * hiredis's own libuv adapter restarts the uv_poll for each change: two epoll_ctl calls
 * and an extra loop iteration (wait for EPOLLOUT, then write) per command. Here the
 * socket stays registered for reading, and the commands a loop iteration issued are
 * written together just before the loop polls again (a uv_prepare, like the client
 * side's corked output): one write, no epoll_ctl, and pipelining for free. Writability
 * is watched only while connecting or when the kernel buffer was full.
 */
typedef struct {
    redisAsyncContext *context; /* NULL once hiredis let go of it */
    uv_poll_t handle;
    tg_redis_t *r;
    int events;   /* what hiredis wants watched */
    int started;  /* what the uv_poll watches */
    int want_flush, flushing;
} tg__redis_ev_t;

static void ev_poll_cb(uv_poll_t *h, int status, int events);

static void ev_apply(tg__redis_ev_t *e) {
    if (e->events == e->started || !e->context)
        return;
    e->started = e->events;
    if (e->events)
        uv_poll_start(&e->handle, e->events, ev_poll_cb);
    else
        uv_poll_stop(&e->handle);
}

static void ev_poll_cb(uv_poll_t *h, int status, int events) {
    tg__redis_ev_t *e = h->data;
    if (status != 0)
        return; /* as hiredis's own adapter: the next read or write reports it */
    if (e->context && (events & UV_READABLE))
        redisAsyncHandleRead(e->context);
    if (e->context && (events & UV_WRITABLE))
        redisAsyncHandleWrite(e->context);
}

static void ev_add_read(void *d) {
    tg__redis_ev_t *e = d;
    e->events |= UV_READABLE;
    ev_apply(e);
}

static void ev_del_read(void *d) {
    tg__redis_ev_t *e = d;
    e->events &= ~UV_READABLE;
    ev_apply(e);
}

static void ev_add_write(void *d) {
    tg__redis_ev_t *e = d;
    if (e->flushing || !(e->context->c.flags & REDIS_CONNECTED)) {
        e->events |= UV_WRITABLE; /* connecting, or the kernel buffer is full */
        ev_apply(e);
        return;
    }
    e->want_flush = 1;
    if (!e->r->owner_flushes)
        uv_prepare_start(&e->r->flush, redis_on_flush);
}

static void ev_del_write(void *d) {
    tg__redis_ev_t *e = d;
    e->want_flush = 0;
    e->events &= ~UV_WRITABLE;
    ev_apply(e);
}

static void ev_on_close(uv_handle_t *h) { free(h->data); }

static void ev_cleanup(tg__redis_ev_t *e) {
    e->context = NULL;
    e->want_flush = 0;
    uv_close((uv_handle_t *)&e->handle, ev_on_close);
}

static int ev_attach(redisAsyncContext *ac, tg_redis_t *r) {
    tg__redis_ev_t *e = calloc(1, sizeof(*e));
    if (!e)
        return REDIS_ERR;
    if (uv_poll_init(r->loop, &e->handle, ac->c.fd) != 0) {
        free(e);
        return REDIS_ERR;
    }
    e->context = ac;
    e->r = r;
    e->handle.data = e;
    ac->ev.data = e;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    return REDIS_OK;
}

static void conn_flush(tg__redis_conn_t *c) {
    if (!c->ac || c->freeing)
        return;
    tg__redis_ev_t *e = c->ac->ev.data;
    if (!e || !e->want_flush)
        return;
    e->want_flush = 0;
    e->flushing = 1;
    redisAsyncHandleWrite(c->ac); /* may disconnect: then e->context is NULL */
    e->flushing = 0;
}

static void redis_on_flush(uv_prepare_t *h) {
    tg_redis_flush(h->data);
}

void tg_redis_flush(tg_redis_t *r) {
    uv_prepare_stop(&r->flush);
    conn_flush(&r->cmd);
    conn_flush(&r->sub);
}

void tg_redis_owner_flushes(tg_redis_t *r) {
    r->owner_flushes = 1;
}

/* The hiredis context is being freed (hiredis calls its event-library cleanup exactly
 * there). */
static void conn_gone(tg__redis_conn_t *c) {
    tg_redis_t *r = c->r;
    int was_up = c->state == S_UP;
    c->ac = NULL;
    c->inflight = 0;
    c->broken = c->freeing = 0;
    c->state = S_DOWN;
    r->nctx--;
    if (r->closing) {
        redis_maybe_close(r);
        return;
    }
    if (was_up) {
        r->stats.disconnects++;
        tg_log_warn("redis: %s connection lost; reconnecting", c->name);
    }
    conn_retry(c);
}

static void conn_on_cleanup(void *privdata) {
    tg__redis_ev_t *e = privdata;
    redisAsyncContext *ac = e ? e->context : NULL;
    if (!ac)
        return;
    tg__redis_conn_t *c = ac->data;
    ac->ev.cleanup = NULL; /* once */
    ev_cleanup(e);
    conn_gone(c);
}

static const char k_auth[] = "AUTH", k_select[] = "SELECT", k_setname[] = "CLIENT SETNAME";

/* A connection's setup commands before anything else: AUTH when the URL has a password,
 * SELECT when it names a database other than 0 (not on a Pub/Sub connection: channels
 * are not per database). Each command's `what` is k_auth or k_select. */
typedef struct {
    const char *what;
    int argc;
    const char *argv[3];
    char db[16];
} setup_cmd_t;

static int setup_cmds(const tg_redis_url_t *u, int select, setup_cmd_t out[2]) {
    int n = 0;
    if (u->pass) {
        out[n] = (setup_cmd_t){k_auth, u->user ? 3 : 2, {"AUTH", u->user ? u->user : u->pass, u->pass}, ""};
        n++;
    }
    if (u->db > 0 && select) {
        setup_cmd_t *c = &out[n++];
        *c = (setup_cmd_t){k_select, 2, {"SELECT", NULL, NULL}, ""};
        snprintf(c->db, sizeof(c->db), "%d", u->db);
        c->argv[1] = c->db;
    }
    return n;
}

static void conn_on_connect(const redisAsyncContext *ac, int status) {
    tg__redis_conn_t *c = ac->data;
    if (status != REDIS_OK) {
        /* hiredis frees the context after this returns; conn_gone schedules the retry. */
        conn_log_failure(c, ac->errstr);
        c->tried = 1;
    }
    /* Connected: the connection is up once its setup commands have succeeded. */
}

/* The setup commands succeeded: the connection takes commands. */
static void conn_ready(tg__redis_conn_t *c) {
    tg_redis_t *r = c->r;
    uv_timer_stop(&c->timer);
    c->state = S_UP;
    c->tried = 1;
    if (c->backoff_ms)
        tg_log_info("redis: %s connection re-established", c->name);
    else
        tg_log_debug("redis: %s connection up", c->name);
    c->backoff_ms = 0;
    c->last_io = uv_now(r->loop);
    r->stats.connects++;
    if (!c->is_sub)
        redis_arm(r);
}

static void conn_on_setup_reply(redisAsyncContext *ac, void *reply_, void *privdata) {
    tg__redis_conn_t *c = ac->data;
    redisReply *reply = reply_;
    if (!reply || c->r->closing || c->freeing)
        return;
    if (reply->type == REDIS_REPLY_ERROR) {
        /* A wrong password or database: not "up", so the backoff keeps growing. */
        tg_log_error("redis: %s connection: %s failed: %s", c->name, (const char *)privdata, reply->str);
        c->tried = 1;
        c->freeing = 1;
        redisAsyncFree(ac); /* deferred by hiredis until this callback returns */
        return;
    }
    if (privdata == k_setname) /* the last one */
        conn_ready(c);
}

static void conn_on_sub_reply(redisAsyncContext *ac, void *reply_, void *privdata);

static void conn_subscribe(tg__redis_conn_t *c, const char *channel) {
    const char *argv[2] = {"SUBSCRIBE", channel};
    redisAsyncCommandArgv(c->ac, conn_on_sub_reply, NULL, 2, argv, NULL);
}

static void conn_connect(tg__redis_conn_t *c) {
    tg_redis_t *r = c->r;
    char why[128];
    redisAsyncContext *ac = r->url.path ? redisAsyncConnectUnix(r->url.path) : redisAsyncConnect(r->url.host, r->url.port);
    if (!ac) {
        conn_log_failure(c, "out of memory");
        c->tried = 1;
        conn_retry(c);
        return;
    }
    if (ac->err) {
        snprintf(why, sizeof(why), "%s", ac->errstr);
        redisAsyncFree(ac);
        conn_log_failure(c, why);
        c->tried = 1;
        conn_retry(c);
        return;
    }
    if (ev_attach(ac, r) != REDIS_OK) {
        redisAsyncFree(ac);
        conn_log_failure(c, "cannot watch the socket");
        c->tried = 1;
        conn_retry(c);
        return;
    }
    if (!r->url.path)
        redisEnableKeepAlive(&ac->c);
    ac->data = c;
    ac->ev.cleanup = conn_on_cleanup;
    r->nctx++;
    c->ac = ac;
    c->state = S_CONNECTING;
    c->broken = c->freeing = 0;
    c->inflight = 0;
    redisAsyncSetConnectCallback(ac, conn_on_connect);
    uv_timer_start(&c->timer, conn_on_timer, (uint64_t)r->connect_timeout_ms, 0);

    /* Pipelined ahead of everything else on this connection; SETNAME comes last and its
     * reply makes the connection ready. */
    setup_cmd_t setup[2];
    int nsetup = setup_cmds(&r->url, !c->is_sub, setup);
    for (int i = 0; i < nsetup; i++)
        redisAsyncCommandArgv(ac, conn_on_setup_reply, (void *)setup[i].what, setup[i].argc, setup[i].argv, NULL);
    /* Named, so CLIENT LIST tells which gateway process owns which connection. */
    char name[64];
    snprintf(name, sizeof(name), "tollgate:%d:%s", (int)getpid(), c->is_sub ? "sub" : "cmd");
    const char *setname[3] = {"CLIENT", "SETNAME", name};
    redisAsyncCommandArgv(ac, conn_on_setup_reply, (void *)k_setname, 3, setname, NULL);
    if (c->is_sub) {
        for (int i = 0; i < r->nsubs; i++) {
            int dup = 0;
            for (int j = 0; j < i && !dup; j++)
                dup = strcmp(r->subs[j].channel, r->subs[i].channel) == 0;
            if (!dup)
                conn_subscribe(c, r->subs[i].channel);
        }
    }
}

static void conn_on_timer(uv_timer_t *t) {
    tg__redis_conn_t *c = t->data;
    if (c->state == S_DOWN) {
        conn_connect(c);
        return;
    }
    if (c->state == S_CONNECTING && c->ac && !c->freeing) {
        conn_log_failure(c, "connect timeout");
        c->tried = 1;
        c->freeing = 1;
        redisAsyncFree(c->ac); /* pending commands get "disconnected"; conn_gone retries */
    }
}

/* ---- replies -------------------------------------------------------------------- */

static void conn_on_reply(redisAsyncContext *ac, void *reply_, void *privdata) {
    tg__redis_conn_t *c = ac->data;
    tg_redis_t *r = c->r;
    redisReply *reply = reply_;
    tg_redis_req_t *q = privdata;
    c->inflight--;
    if (reply)
        c->last_io = uv_now(r->loop);
    else
        c->broken = 1; /* the context is going away */
    if (q->state == R_ORPHAN) {
        free(q);
        return;
    }
    assert(q->state == R_SENT);
    if (!reply) {
        l_remove(&r->pending, q);
        req_finish(q, NULL, r->closing ? tg_redis_err_shutdown : tg_redis_err_disconnected);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR && q->script >= 0 && !q->retried &&
        strncmp(reply->str, "NOSCRIPT", 8) == 0) {
        /* EVAL loads the script into the server's cache and runs it, in one round trip. */
        q->retried = 1;
        q->argv[0] = "EVAL";
        q->argv[1] = r->scripts[q->script].src;
        q->argvlen[0] = 4;
        q->argvlen[1] = r->scripts[q->script].len;
        r->stats.script_loads++;
        if (!c->freeing && !c->broken &&
            redisAsyncCommandArgv(ac, conn_on_reply, q, q->argc, q->argv, q->argvlen) == REDIS_OK) {
            c->inflight++;
            return;
        }
        l_remove(&r->pending, q);
        req_finish(q, NULL, tg_redis_err_disconnected);
        return;
    }
    l_remove(&r->pending, q);
    req_finish(q, reply, reply->type == REDIS_REPLY_ERROR ? reply->str : NULL);
}

static void conn_on_sub_reply(redisAsyncContext *ac, void *reply_, void *privdata) {
    tg__redis_conn_t *c = ac->data;
    tg_redis_t *r = c->r;
    redisReply *reply = reply_;
    TG_UNUSED(privdata);
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 || r->closing)
        return;
    redisReply *kind = reply->element[0], *chan = reply->element[1], *body = reply->element[2];
    if (kind->type != REDIS_REPLY_STRING || chan->type != REDIS_REPLY_STRING)
        return;
    int message = strcasecmp(kind->str, "message") == 0;
    if (!message && strcasecmp(kind->str, "subscribe") != 0)
        return;
    if (message && body->type != REDIS_REPLY_STRING)
        return;
    /* By index: a callback may subscribe (and so move the array). */
    for (int i = 0; i < r->nsubs; i++) {
        tg__redis_sub_t *s = &r->subs[i];
        if (strlen(s->channel) != chan->len || memcmp(s->channel, chan->str, chan->len) != 0)
            continue;
        if (message) {
            s->cb(s->ud, body->str, body->len);
        } else if (s->gap) {
            s->gap = 0;
            s->cb(s->ud, NULL, 0);
        }
        if (r->closing)
            return;
    }
}

/* ---- timers --------------------------------------------------------------------- */

static void redis_on_timer(uv_timer_t *t) {
    tg_redis_t *r = t->data;
    uint64_t now = uv_now(r->loop);
    tg_redis_req_t *q;
    while ((q = r->pending.head) != NULL && q->deadline <= now) {
        l_remove(&r->pending, q);
        r->stats.timeouts++;
        if (req_abandon(q, tg_redis_err_timeout))
            return;
    }
    tg__redis_conn_t *c = &r->cmd;
    if (c->state == S_UP && c->inflight > 0 && !c->freeing && now - c->last_io >= (uint64_t)r->stall_ms) {
        tg_log_warn("redis: command connection: no reply for %d ms with %d command(s) outstanding; reconnecting",
                    r->stall_ms, c->inflight);
        c->freeing = 1;
        redisAsyncFree(c->ac);
        if (r->closing)
            return;
    }
    redis_arm(r);
}

static void redis_on_idle(uv_idle_t *h) {
    tg_redis_t *r = h->data;
    size_t n = r->deferred.n; /* only what was deferred before this turn */
    tg_redis_req_t *q;
    while (n-- > 0 && (q = r->deferred.head) != NULL) {
        l_remove(&r->deferred, q);
        if (req_finish(q, NULL, q->err))
            return;
    }
    if (!r->deferred.head)
        uv_idle_stop(&r->idle);
}

/* ---- the client ----------------------------------------------------------------- */

static int url_parse(tg_redis_url_t *u, const char *url) {
    if (strncmp(url, "unix://", 7) == 0) {
        if (url[7] != '/')
            return -1;
        u->path = strdup(url + 7);
        return 0;
    }
    if (strncmp(url, "redis://", 8) != 0)
        return -1;
    const char *p = url + 8;
    const char *end = p + strcspn(p, "/");
    const char *at = NULL;
    for (const char *s = p; s < end; s++)
        if (*s == '@')
            at = s;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon) {
            if (colon > p)
                u->user = strndup(p, (size_t)(colon - p));
            u->pass = strndup(colon + 1, (size_t)(at - colon - 1));
        } else {
            u->pass = strndup(p, (size_t)(at - p));
        }
        p = at + 1;
    }
    const char *hend;
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (!rb)
            return -1;
        u->host = strndup(p + 1, (size_t)(rb - p - 1));
        hend = rb + 1;
    } else {
        hend = memchr(p, ':', (size_t)(end - p));
        if (!hend)
            hend = end;
        u->host = strndup(p, (size_t)(hend - p));
    }
    if (hend < end) {
        if (*hend != ':')
            return -1;
        char *e;
        long port = strtol(hend + 1, &e, 10);
        if (e != end || port <= 0 || port > 65535)
            return -1;
        u->port = (int)port;
    }
    if (*end == '/' && end[1]) {
        char *e;
        long db = strtol(end + 1, &e, 10);
        if (*e || db < 0 || db > 1000000)
            return -1;
        u->db = (int)db;
    }
    return u->host && *u->host ? 0 : -1;
}

int tg_redis_url_parse(const char *url, tg_redis_url_t *u) {
    memset(u, 0, sizeof(*u));
    u->port = 6379;
    if (url && url_parse(u, url) == 0)
        return TG_OK;
    tg_redis_url_free(u);
    return TG_ERROR;
}

void tg_redis_url_free(tg_redis_url_t *u) {
    free(u->host);
    free(u->path);
    free(u->user);
    free(u->pass);
    memset(u, 0, sizeof(*u));
}

redisContext *tg_redis_connect_sync(const char *url, int timeout_ms, char *err, size_t errlen) {
    tg_redis_url_t u;
    if (tg_redis_url_parse(url, &u) != TG_OK) {
        snprintf(err, errlen, "bad URL (expected redis://[[user]:password@]host[:port][/db] or unix:///path/to.sock)");
        return NULL;
    }
    /* Where, for the messages: never the password. */
    char where[300];
    if (u.path)
        snprintf(where, sizeof(where), "%.280s", u.path);
    else
        snprintf(where, sizeof(where), "%.256s:%d/%d", u.host, u.port, u.db);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    redisContext *c = u.path ? redisConnectUnixWithTimeout(u.path, tv) : redisConnectWithTimeout(u.host, u.port, tv);
    if (!c || c->err) {
        snprintf(err, errlen, "%s: %s", where, c ? c->errstr : "out of memory");
        goto fail;
    }
    redisSetTimeout(c, tv);
    setup_cmd_t setup[2];
    int n = setup_cmds(&u, 1, setup);
    for (int i = 0; i < n; i++) {
        redisReply *rep = redisCommandArgv(c, setup[i].argc, setup[i].argv, NULL);
        int ok = rep && rep->type != REDIS_REPLY_ERROR;
        if (!ok)
            snprintf(err, errlen, "%s: %s failed: %s", where, setup[i].what, rep ? rep->str : c->errstr);
        if (rep)
            freeReplyObject(rep);
        if (!ok)
            goto fail;
    }
    tg_redis_url_free(&u);
    return c;
fail:
    if (c)
        redisFree(c);
    tg_redis_url_free(&u);
    return NULL;
}

static void conn_init(tg_redis_t *r, tg__redis_conn_t *c, const char *name, int is_sub) {
    c->r = r;
    c->name = name;
    c->is_sub = is_sub;
    c->state = S_DOWN;
    uv_timer_init(r->loop, &c->timer);
    c->timer.data = c;
    r->handles++;
}

tg_redis_t *tg_redis_create(uv_loop_t *loop, const char *url, int timeout_ms) {
    if (!loop || !url || timeout_ms <= 0)
        return NULL;
    tg_redis_t *r = calloc(1, sizeof(*r));
    if (!r)
        abort();
    if (tg_redis_url_parse(url, &r->url) != TG_OK) {
        tg_log_error("redis: bad URL \"%s\": expected redis://[[user]:password@]host[:port][/db] or "
                     "unix:///path/to.sock",
                     url);
        redis_free(r);
        return NULL;
    }
    r->loop = loop;
    r->timeout_ms = timeout_ms;
    r->connect_timeout_ms = TG_MAX(timeout_ms, 1000);
    r->stall_ms = TG_MAX(REDIS_STALL_MIN_MS, 10 * timeout_ms);
    if (tg_random_bytes(&r->rng, sizeof(r->rng)) < 0 || r->rng == 0)
        r->rng = tg_now_ns() | 1;
    uv_timer_init(loop, &r->timer);
    r->timer.data = r;
    uv_idle_init(loop, &r->idle);
    r->idle.data = r;
    uv_prepare_init(loop, &r->flush);
    r->flush.data = r;
    r->handles = 3;
    conn_init(r, &r->cmd, "command", 0);
    conn_init(r, &r->sub, "pubsub", 1);
    conn_connect(&r->cmd);
    return r;
}

/* The bytes that copies of argc arguments take, each with a NUL after it. */
static size_t args_size(int argc, const char **argv, const size_t *argvlen) {
    size_t size = 0;
    for (int i = 0; i < argc; i++)
        size += (argvlen ? argvlen[i] : strlen(argv[i])) + 1;
    return size;
}

/* Copies the arguments to p (args_size bytes) and points dst / dstlen at the copies. */
static void args_copy(char *p, int argc, const char **argv, const size_t *argvlen, const char **dst, size_t *dstlen) {
    for (int i = 0; i < argc; i++) {
        size_t len = argvlen ? argvlen[i] : strlen(argv[i]);
        memcpy(p, argv[i], len);
        p[len] = '\0';
        dst[i] = p;
        dstlen[i] = len;
        p += len + 1;
    }
}

/* ---- idempotent scripts, sent again -------------------------------------------- */

static void resend_closed(uv_handle_t *h) {
    tg__redis_resend_t *x = h->data;
    tg_redis_t *r = x->r;
    free(x);
    if (--r->handles == 0)
        redis_free(r);
}

/* The last answer: the caller hears it, and x goes. */
static void resend_finish(tg__redis_resend_t *x, redisReply *reply, const char *err) {
    tg_redis_t *r = x->r;
    if (x->prev)
        x->prev->next = x->next;
    else
        r->resends = x->next;
    if (x->next)
        x->next->prev = x->prev;
    r->nresends--;
    if (x->cb)
        x->cb(x->ud, reply, err);
    if (x->timer_open)
        uv_close((uv_handle_t *)&x->timer, resend_closed);
    else
        free(x);
}

static void resend_send(tg__redis_resend_t *x);

static void resend_timer_cb(uv_timer_t *t) { resend_send(t->data); }

static void resend_done(void *ud, redisReply *reply, const char *err) {
    tg__redis_resend_t *x = ud;
    tg_redis_t *r = x->r;
    if ((err == tg_redis_err_timeout || err == tg_redis_err_disconnected) && x->sends < x->max_sends && !r->closing) {
        if (!x->timer_open) {
            uv_timer_init(r->loop, &x->timer);
            x->timer.data = x;
            x->timer_open = 1;
            r->handles++;
        }
        uv_timer_start(&x->timer, resend_timer_cb, 500u << (x->sends - 1), 0);
        return;
    }
    resend_finish(x, reply, err);
}

/* The resend, when its timer fires. */
static void resend_send(tg__redis_resend_t *x) {
    tg_redis_t *r = x->r;
    x->sends++;
    r->stats.resends++;
    if (!tg_redis_eval(r, x->script, x->nkeys, x->argc, x->argv, x->argvlen, resend_done, x))
        resend_finish(x, NULL, tg_redis_err_shutdown); /* only while closing: the arguments were checked */
}

int tg_redis_eval_idempotent(tg_redis_t *r, int script_id, int nkeys, int argc, const char **argv,
                             const size_t *argvlen, tg_redis_cb cb, void *ud) {
    if (!r || r->closing || script_id < 0 || script_id >= r->nscripts || nkeys < 0 || argc < nkeys ||
        (argc > 0 && !argv))
        return TG_ERROR;
    /* One allocation: x, argv, argvlen and the copies of the arguments. */
    size_t size = sizeof(tg__redis_resend_t) + (size_t)argc * (sizeof(char *) + sizeof(size_t));
    tg__redis_resend_t *x = calloc(1, size + args_size(argc, argv, argvlen));
    if (!x)
        abort();
    x->r = r;
    x->script = script_id;
    x->nkeys = nkeys;
    x->argc = argc;
    x->cb = cb;
    x->ud = ud;
    x->max_sends = 1 + (r->nresends < TG_REDIS_RESEND_PENDING_MAX ? TG_REDIS_RESEND_TRIES : 0);
    x->argv = (const char **)(x + 1);
    x->argvlen = (size_t *)(x->argv + argc);
    args_copy((char *)(x->argvlen + argc), argc, argv, argvlen, x->argv, x->argvlen);
    x->next = r->resends;
    if (r->resends)
        r->resends->prev = x;
    r->resends = x;
    r->nresends++;
    x->sends = 1;
    if (!tg_redis_eval(r, script_id, nkeys, argc, x->argv, x->argvlen, resend_done, x)) {
        x->cb = NULL; /* failed at once: no callback */
        resend_finish(x, NULL, NULL);
        return TG_ERROR;
    }
    return TG_OK;
}

void tg_redis_destroy(tg_redis_t *r) {
    if (!r || r->closing)
        return;
    r->closing = 1;
    tg_redis_req_t *q;
    while ((q = r->pending.head) != NULL) {
        l_remove(&r->pending, q);
        req_abandon(q, tg_redis_err_shutdown);
    }
    while ((q = r->deferred.head) != NULL) {
        l_remove(&r->deferred, q);
        req_finish(q, NULL, tg_redis_err_shutdown);
    }
    while (r->resends) /* those waiting for their resend timer */
        resend_finish(r->resends, NULL, tg_redis_err_shutdown);
    uv_idle_stop(&r->idle);
    uv_close((uv_handle_t *)&r->timer, redis_on_handle_close);
    uv_close((uv_handle_t *)&r->cmd.timer, conn_on_timer_close);
    uv_close((uv_handle_t *)&r->sub.timer, conn_on_timer_close);
    tg__redis_conn_t *conns[2] = {&r->cmd, &r->sub};
    for (int i = 0; i < 2; i++) {
        tg__redis_conn_t *c = conns[i];
        if (c->ac && !c->freeing) {
            c->freeing = 1;
            redisAsyncFree(c->ac); /* deferred by hiredis when inside its callback */
        }
    }
    redis_maybe_close(r);
}

/* Writes v in decimal at p; returns the end. */
static char *put_u64(char *p, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* The command in the Redis protocol. hiredis's own formatting (sdscatfmt per argument)
 * cost more than the rest of sending an admission; this is one pass into one buffer.
 * Returns the length, or 0 when it does not fit in cap bytes. */
static size_t resp_format(char *out, size_t cap, int argc, const char **argv, const size_t *argvlen) {
    size_t need = 24;
    for (int i = 0; i < argc; i++)
        need += argvlen[i] + 26;
    if (need > cap)
        return 0;
    char *p = out;
    *p++ = '*';
    p = put_u64(p, (uint64_t)argc);
    *p++ = '\r';
    *p++ = '\n';
    for (int i = 0; i < argc; i++) {
        *p++ = '$';
        p = put_u64(p, argvlen[i]);
        *p++ = '\r';
        *p++ = '\n';
        memcpy(p, argv[i], argvlen[i]);
        p += argvlen[i];
        *p++ = '\r';
        *p++ = '\n';
    }
    return (size_t)(p - out);
}

/* Sends argv (with lengths) on the command connection. */
static int conn_send(tg__redis_conn_t *c, tg_redis_req_t *q, int argc, const char **argv, const size_t *argvlen) {
    char buf[2048];
    size_t len = argvlen ? resp_format(buf, sizeof(buf), argc, argv, argvlen) : 0;
    if (len)
        return redisAsyncFormattedCommand(c->ac, conn_on_reply, q, buf, len);
    return redisAsyncCommandArgv(c->ac, conn_on_reply, q, argc, argv, argvlen);
}

static tg_redis_req_t *redis_send(tg_redis_t *r, tg_redis_req_t *q, int argc, const char **argv,
                                  const size_t *argvlen) {
    tg__redis_conn_t *c = &r->cmd;
    r->stats.commands++;
    if (!conn_accepts(c) || conn_send(c, q, argc, argv, argvlen) != REDIS_OK) {
        r->stats.failed_fast++;
        redis_defer(r, q, tg_redis_err_disconnected);
        return q;
    }
    uint64_t now = uv_now(r->loop);
    if (c->inflight++ == 0)
        c->last_io = now;
    q->state = R_SENT;
    q->deadline = now + (uint64_t)r->timeout_ms;
    l_push(&r->pending, q);
    if (r->pending.head == q)
        redis_arm(r);
    return q;
}

tg_redis_req_t *tg_redis_command(tg_redis_t *r, tg_redis_cb cb, void *ud, int argc, const char **argv,
                                 const size_t *argvlen) {
    if (!r || r->closing || argc <= 0 || !argv)
        return NULL;
    tg_redis_req_t *q = calloc(1, sizeof(*q));
    if (!q)
        abort();
    q->r = r;
    q->cb = cb;
    q->ud = ud;
    q->script = -1;
    return redis_send(r, q, argc, argv, argvlen);
}

int tg_redis_script_register(tg_redis_t *r, const char *lua_source) {
    if (!r || !lua_source)
        return TG_ERROR;
    size_t len = strlen(lua_source);
    for (int i = 0; i < r->nscripts; i++)
        if (r->scripts[i].len == len && memcmp(r->scripts[i].src, lua_source, len) == 0)
            return i;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(lua_source, len, md, &mdlen, EVP_sha1(), NULL) || mdlen != 20)
        return TG_ERROR;
    if (r->nscripts == r->scripts_cap) {
        int cap = r->scripts_cap ? r->scripts_cap * 2 : 8;
        tg__redis_script_t *s = realloc(r->scripts, (size_t)cap * sizeof(*s));
        if (!s)
            abort();
        r->scripts = s;
        r->scripts_cap = cap;
    }
    tg__redis_script_t *s = &r->scripts[r->nscripts];
    s->src = strdup(lua_source);
    if (!s->src)
        abort();
    s->len = len;
    for (unsigned i = 0; i < 20; i++)
        snprintf(s->sha + 2 * i, 3, "%02x", md[i]);
    return r->nscripts++;
}

tg_redis_req_t *tg_redis_eval(tg_redis_t *r, int script_id, int nkeys, int argc, const char **argv,
                              const size_t *argvlen, tg_redis_cb cb, void *ud) {
    if (!r || r->closing || script_id < 0 || script_id >= r->nscripts || nkeys < 0 || argc < nkeys ||
        (argc > 0 && !argv))
        return NULL;
    /* One allocation: the request, argv and argvlen for EVALSHA sha nkeys args..., and
     * copies of the arguments (kept for a NOSCRIPT retry). */
    int n = argc + 3;
    size_t size = sizeof(tg_redis_req_t) + (size_t)n * (sizeof(char *) + sizeof(size_t));
    tg_redis_req_t *q = calloc(1, size + args_size(argc, argv, argvlen));
    if (!q)
        abort();
    q->r = r;
    q->cb = cb;
    q->ud = ud;
    q->script = script_id;
    q->argc = n;
    q->argv = (const char **)(q + 1);
    q->argvlen = (size_t *)(q->argv + n);
    snprintf(q->nkeys, sizeof(q->nkeys), "%d", nkeys);
    q->argv[0] = "EVALSHA";
    q->argvlen[0] = 7;
    q->argv[1] = r->scripts[script_id].sha;
    q->argvlen[1] = 40;
    q->argv[2] = q->nkeys;
    q->argvlen[2] = strlen(q->nkeys);
    args_copy((char *)(q->argvlen + n), argc, argv, argvlen, q->argv + 3, q->argvlen + 3);
    return redis_send(r, q, n, q->argv, q->argvlen);
}

void tg_redis_cancel(tg_redis_req_t *q) {
    if (!q)
        return;
    tg_redis_t *r = q->r;
    if (q->state == R_SENT) {
        l_remove(&r->pending, q);
        q->state = R_ORPHAN; /* freed when hiredis hands back its reply */
    } else if (q->state == R_DEFERRED) {
        l_remove(&r->deferred, q);
        free(q);
    }
}

int tg_redis_connected(const tg_redis_t *r) {
    return r && r->cmd.state == S_UP && !r->cmd.broken && !r->cmd.freeing;
}

int tg_redis_subscribe(tg_redis_t *r, const char *channel, tg_redis_msg_cb cb, void *ud) {
    if (!r || r->closing || !channel || !*channel || !cb)
        return TG_ERROR;
    int known = 0;
    for (int i = 0; i < r->nsubs && !known; i++)
        known = strcmp(r->subs[i].channel, channel) == 0;
    if (r->nsubs == r->subs_cap) {
        int cap = r->subs_cap ? r->subs_cap * 2 : 4;
        tg__redis_sub_t *s = realloc(r->subs, (size_t)cap * sizeof(*s));
        if (!s)
            abort();
        r->subs = s;
        r->subs_cap = cap;
    }
    tg__redis_sub_t *s = &r->subs[r->nsubs++];
    s->channel = strdup(channel);
    if (!s->channel)
        abort();
    s->cb = cb;
    s->ud = ud;
    s->gap = 0;
    tg__redis_conn_t *c = &r->sub;
    if (c->ac) {
        if (!known && !c->freeing && !c->broken)
            conn_subscribe(c, channel);
    } else if (c->state == S_DOWN && !uv_is_active((uv_handle_t *)&c->timer)) {
        conn_connect(c); /* first subscription: open the connection */
    }
    /* Otherwise a reconnect is scheduled, and it subscribes to every channel. */
    return TG_OK;
}

tg_redis_req_t *tg_redis_publish(tg_redis_t *r, const char *channel, const char *msg, size_t len, tg_redis_cb cb,
                                 void *ud) {
    if (!channel || (!msg && len > 0))
        return NULL;
    const char *argv[3] = {"PUBLISH", channel, msg ? msg : ""};
    size_t argvlen[3] = {7, strlen(channel), len};
    return tg_redis_command(r, cb, ud, 3, argv, argvlen);
}

const tg_redis_stats_t *tg_redis_stats(const tg_redis_t *r) { return &r->stats; }

static void redis_collect(const void *const *stats, int n, tg_buf_t *out) {
    tg_redis_stats_t s;
    tg_metrics_sum_u64(stats, n, TG_METRICS_NFIELDS(tg_redis_stats_t), (uint64_t *)&s);
    tg_buf_printf(out,
                  "# HELP tollgate_redis_total The workers' Redis clients: commands, failures, connections.\n"
                  "# TYPE tollgate_redis_total counter\n"
                  "tollgate_redis_total{event=\"command\"} %llu\n"
                  "tollgate_redis_total{event=\"failed_fast\"} %llu\n"
                  "tollgate_redis_total{event=\"timeout\"} %llu\n"
                  "tollgate_redis_total{event=\"disconnect\"} %llu\n"
                  "tollgate_redis_total{event=\"connect\"} %llu\n"
                  "tollgate_redis_total{event=\"script_load\"} %llu\n"
                  "tollgate_redis_total{event=\"resend\"} %llu\n",
                  (unsigned long long)s.commands, (unsigned long long)s.failed_fast, (unsigned long long)s.timeouts,
                  (unsigned long long)s.disconnects, (unsigned long long)s.connects,
                  (unsigned long long)s.script_loads, (unsigned long long)s.resends);
}

void tg_redis_metrics(tg_metrics_t *m, const tg_redis_t *r) {
    if (r)
        tg_metrics_collector_add(m, redis_collect, &r->stats);
}
