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
#include "tollgate/tg_redis_cluster.h"
#include "tollgate/tg_redis_tls.h"
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
enum { R_SENT, R_ORPHAN, R_DEFERRED, R_DONE, R_PARKED };

/* Cluster mode: command connections, one per node (seeds, then the map's primaries). */
#define REDIS_CONNS_MAX (2 * TG_REDIS_NODES_MAX)
#define REDIS_HOPS_MAX 5            /* MOVED / ASK followed per command */
#define REDIS_RETRY_MS 20           /* TRYAGAIN / CLUSTERDOWN: sent again after this */
#define REDIS_MAP_EVERY_MS 5000     /* the slot map read again, at least this often */
#define REDIS_MAP_DEGRADED_MS 250   /* ... while a primary's connection is down */
#define REDIS_MAP_SOON_MS 50        /* ... after a redirection or CLUSTERDOWN */

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
    const char *host;  /* where it connects: the URL's; in cluster mode the node's */
    const char *path;
    int port;
    int wanted;        /* cluster: a seed, or a primary of the map; else not reconnected */
    char *own_host;    /* cluster: the node's address, freed with the client */
    tg_rtls_t *tun;    /* rediss: the TLS tunnel under ac (counted in r->handles) */
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
    int hops;                /* cluster: redirections followed */
    tg__redis_conn_t *at;    /* cluster: the node it must go to (ASK, tg_redis_command_at) */
    int pinned;              /* cluster: `at` is the caller's (tg_redis_command_at) */
    int asking;              /* cluster: ASKING goes first */
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

/* An idempotent script (or plain command: script -1) until its last answer
 * (tg_redis_eval_idempotent, tg_redis_command_idempotent): sent, and while it waits for
 * a resend, its timer; the arguments are copied behind it. */
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
    /* Cluster mode (a redis-cluster:// URL): a command connection per node, the slot
     * map (each slot's index in conns, -1 unknown), and its refresh. */
    int cluster;
    int one_keyspace; /* a single node that said cluster_enabled:0 (INFO cluster, at setup) */
    tg__redis_conn_t *conns[REDIS_CONNS_MAX];
    int nconns;
    int16_t slots[TG_REDIS_SLOTS];
    int have_map;
    int primaries[TG_REDIS_NODES_MAX]; /* indexes in conns */
    int nprimaries;
    int refreshing;   /* a CLUSTER SHARDS (or SLOTS) in flight */
    int use_slots;    /* the cluster does not know CLUSTER SHARDS (before Redis 7) */
    int nparked;      /* requests waiting for a map or a TRYAGAIN retry */
    int pick;         /* round robin: which node reads the map, which the subscriber uses */
    uv_timer_t topo;  /* the map's refresh */
    uv_timer_t retry; /* parked requests sent again */
    tg_redis_slotmap_t *map; /* a parse's scratch */
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
    for (int i = 0; i < r->nconns; i++)
        if (r->conns[i] != &r->cmd) {
            free(r->conns[i]->own_host);
            free(r->conns[i]);
        }
    free(r->map);
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
static void cluster_refresh(tg_redis_t *r);
static void cluster_refresh_soon(tg_redis_t *r);
static int cluster_all_up(const tg_redis_t *r);
static void sub_pick_node(tg_redis_t *r);
static int cluster_on_error(tg_redis_t *r, tg__redis_conn_t *c, tg_redis_req_t *q, const redisReply *reply);
static void conn_init(tg_redis_t *r, tg__redis_conn_t *c, const char *name, int is_sub);
static int conn_send(tg__redis_conn_t *c, tg_redis_req_t *q, int argc, const char **argv, const size_t *argvlen);
static int hostport_parse(const char *p, const char *end, char **host, int *port);

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
    for (int i = 0; i < r->nconns; i++) {
        const tg__redis_conn_t *c = r->conns[i];
        if (c->state == S_UP && c->inflight > 0)
            next = TG_MIN(next, c->last_io + (uint64_t)r->stall_ms);
    }
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
    if (r->cluster && !c->is_sub && !c->wanted) {
        c->state = S_DOWN; /* a node the map no longer uses */
        c->backoff_ms = 0;
        return;
    }
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
    for (int i = 0; i < r->nconns; i++)
        conn_flush(r->conns[i]);
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
    tg_rtls_close(c->tun);
    c->tun = NULL;
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
        if (!r->cluster)
            tg_log_warn("redis: %s connection lost; reconnecting", c->name);
        else if (c->wanted || c->is_sub)
            tg_log_warn("redis: %s connection to %s:%d lost; reconnecting", c->name, c->host, c->port);
    }
    if (r->cluster && !c->is_sub && c->wanted)
        cluster_refresh_soon(r); /* a primary gone: its replica may be taking over */
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

static const char k_auth[] = "AUTH", k_select[] = "SELECT", k_setname[] = "CLIENT SETNAME", k_info[] = "INFO cluster";

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
    if (r->cluster && !c->is_sub && !r->have_map)
        cluster_refresh(r);
}

static void conn_on_setup_reply(redisAsyncContext *ac, void *reply_, void *privdata) {
    tg__redis_conn_t *c = ac->data;
    redisReply *reply = reply_;
    if (!reply || c->r->closing || c->freeing)
        return;
    if (privdata == k_info) {
        /* Not fatal when refused (an ACL without INFO, a proxy): then unknown, so 0. */
        c->r->one_keyspace = reply->type == REDIS_REPLY_STRING && strstr(reply->str, "cluster_enabled:0") != NULL;
        return;
    }
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

/* The TLS tunnel could not reach the node or complete the handshake; hiredis reads
 * EOF next and conn_gone schedules the retry. */
static void conn_on_tun_fail(void *ud, const char *why) {
    tg__redis_conn_t *c = ud;
    conn_log_failure(c, why);
    c->tried = 1;
}

static void conn_on_tun_closed(void *ud, tg_rtls_t *t) {
    tg__redis_conn_t *c = ud;
    tg_redis_t *r = c->r;
    if (c->tun == t)
        c->tun = NULL;
    if (--r->handles == 0)
        redis_free(r);
}

static void conn_connect(tg__redis_conn_t *c) {
    tg_redis_t *r = c->r;
    char why[600];
    if (c->is_sub && r->cluster)
        sub_pick_node(r); /* classic Pub/Sub: any node hears every PUBLISH */
    redisAsyncContext *ac;
    if (r->url.tls) {
        ac = tg_redis_tls_connect_async(r->loop, c->host, c->port, &c->tun, conn_on_tun_fail, conn_on_tun_closed, c,
                                        why, sizeof(why));
        if (!ac) {
            conn_log_failure(c, why);
            c->tried = 1;
            conn_retry(c);
            return;
        }
        r->handles++; /* the tunnel's, until conn_on_tun_closed */
    } else {
        ac = c->path ? redisAsyncConnectUnix(c->path) : redisAsyncConnect(c->host, c->port);
    }
    if (!ac) {
        conn_log_failure(c, "out of memory");
        c->tried = 1;
        conn_retry(c);
        return;
    }
    if (ac->err) {
        snprintf(why, sizeof(why), "%s", ac->errstr);
        redisAsyncFree(ac);
        tg_rtls_close(c->tun);
        c->tun = NULL;
        conn_log_failure(c, why);
        c->tried = 1;
        conn_retry(c);
        return;
    }
    if (ev_attach(ac, r) != REDIS_OK) {
        redisAsyncFree(ac);
        tg_rtls_close(c->tun);
        c->tun = NULL;
        conn_log_failure(c, "cannot watch the socket");
        c->tried = 1;
        conn_retry(c);
        return;
    }
    if (!c->path && !c->tun)
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
    /* A single node's mode: a script may name keys under two hash tags only outside
     * cluster mode (tg_redis_one_keyspace), whatever the URL says. */
    if (!r->cluster && !c->is_sub) {
        r->one_keyspace = 0;
        const char *info[2] = {"INFO", "cluster"};
        redisAsyncCommandArgv(ac, conn_on_setup_reply, (void *)k_info, 2, info, NULL);
    }
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
        /* Sent, then the connection went: it may have run. On a cluster that is said as
         * "timeout", since tg_redis_connected() (all primaries up) cannot tell the
         * caller whether this command's own node was up when it was sent. */
        l_remove(&r->pending, q);
        const char *lost = r->cluster ? tg_redis_err_timeout : tg_redis_err_disconnected;
        req_finish(q, NULL, r->closing ? tg_redis_err_shutdown : lost);
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
    if (r->cluster && reply->type == REDIS_REPLY_ERROR && cluster_on_error(r, c, q, reply))
        return;
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


/* ---- Redis Cluster ----------------------------------------------------------------
 *
 * A command goes to the primary of its first key's slot, by the map read with CLUSTER
 * SHARDS (CLUSTER SLOTS before Redis 7) from any node. A request keeps its arguments
 * and stays on r->pending (its deadline) until its callback: MOVED sends it on to the
 * named node (and fixes that slot in the map at once), ASK sends ASKING and it to the
 * named node, TRYAGAIN, CLUSTERDOWN and READONLY park it for REDIS_RETRY_MS, within its
 * deadline. The map is read again after a redirection, a primary's lost connection or
 * CLUSTERDOWN (REDIS_MAP_SOON_MS), every REDIS_MAP_DEGRADED_MS while a primary is
 * unreachable, and every REDIS_MAP_EVERY_MS otherwise. Only primaries get commands; a
 * node that stops being one is closed once idle and not reconnected.
 */

static int cluster_all_up(const tg_redis_t *r) {
    if (!r->have_map || r->nprimaries == 0)
        return 0;
    for (int i = 0; i < r->nprimaries; i++) {
        const tg__redis_conn_t *c = r->conns[r->primaries[i]];
        if (c->state != S_UP || c->broken || c->freeing)
            return 0;
    }
    return 1;
}

/* The index in r->conns of node host:port, its connection opened when new; -1 when
 * there are too many. */
static int cluster_node(tg_redis_t *r, const char *host, int port) {
    for (int i = 0; i < r->nconns; i++)
        if (r->conns[i]->port == port && strcmp(r->conns[i]->host, host) == 0)
            return i;
    if (r->nconns == REDIS_CONNS_MAX)
        return -1;
    tg__redis_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        abort();
    conn_init(r, c, "command", 0);
    c->own_host = strdup(host);
    if (!c->own_host)
        abort();
    c->host = c->own_host;
    c->port = port;
    c->wanted = 1;
    r->conns[r->nconns] = c;
    conn_connect(c);
    return r->nconns++;
}

static void park(tg_redis_t *r, tg_redis_req_t *q) {
    q->state = R_PARKED;
    r->nparked++;
}

/* A node is still being tried for the first time: a request without a map can wait. */
static int cluster_starting(const tg_redis_t *r) {
    if (r->refreshing)
        return 1;
    for (int i = 0; i < r->nconns; i++)
        if (!r->conns[i]->tried)
            return 1;
    return 0;
}

/* ASKING's reply: nothing to do but count it (a refusal shows in the command's own). */
static void conn_on_asking(redisAsyncContext *ac, void *reply, void *privdata) {
    tg__redis_conn_t *c = ac->data;
    TG_UNUSED(privdata);
    c->inflight--;
    if (reply)
        c->last_io = uv_now(c->r->loop);
    else
        c->broken = 1;
}

/* Sends q (on r->pending, not owed by hiredis) to its node, or parks it, or fails it
 * on the next loop turn. */
static void cluster_dispatch(tg_redis_t *r, tg_redis_req_t *q) {
    tg__redis_conn_t *c = q->at;
    if (!c) {
        if (!r->have_map) {
            if (cluster_starting(r)) {
                park(r, q);
                return;
            }
        } else {
            const char *key;
            size_t klen;
            int idx = tg_redis_command_key(q->argc, q->argv, q->argvlen, &key, &klen) == 0
                          ? r->slots[tg_redis_key_slot(key, klen)]
                          : r->primaries[(r->pick++) % r->nprimaries];
            c = idx >= 0 ? r->conns[idx] : NULL;
        }
    }
    if (!c || !conn_accepts(c)) {
        r->stats.failed_fast++;
        l_remove(&r->pending, q);
        redis_defer(r, q, tg_redis_err_disconnected);
        cluster_refresh_soon(r); /* an unserved slot, or its primary unreachable */
        return;
    }
    if (q->asking) {
        q->asking = 0;
        if (redisAsyncCommand(c->ac, conn_on_asking, NULL, "ASKING") == REDIS_OK)
            c->inflight++;
    }
    if (conn_send(c, q, q->argc, q->argv, q->argvlen) != REDIS_OK) {
        r->stats.failed_fast++;
        l_remove(&r->pending, q);
        redis_defer(r, q, tg_redis_err_disconnected);
        return;
    }
    if (c->inflight++ == 0)
        c->last_io = uv_now(r->loop);
    q->state = R_SENT;
}

/* Parked requests go out again (a map arrived, or the retry delay passed). */
static void cluster_resume(tg_redis_t *r) {
    tg_redis_req_t *q = r->pending.head, *next;
    for (; q && r->nparked > 0; q = next) {
        next = q->next; /* dispatch may move q to the deferred list */
        if (q->state != R_PARKED)
            continue;
        r->nparked--;
        cluster_dispatch(r, q);
    }
}

static void cluster_on_retry(uv_timer_t *t) { cluster_resume(t->data); }

/* A Redis error that is the cluster's: handled (q sent on or parked, still on
 * r->pending) or 0 for the caller to report it. */
static int cluster_on_error(tg_redis_t *r, tg__redis_conn_t *c, tg_redis_req_t *q, const redisReply *reply) {
    char host[TG_REDIS_HOST_MAX];
    int slot, port;
    int kind = tg_redis_parse_redirect(reply->str, reply->len, &slot, host, &port);
    int idx = kind != TG_REDIS_REDIRECT_NONE ? cluster_node(r, host[0] ? host : c->host, port) : -1;
    if (kind != TG_REDIS_REDIRECT_NONE && q->hops < REDIS_HOPS_MAX && idx >= 0) {
        q->hops++;
        r->stats.redirects++;
        tg__redis_conn_t *to = r->conns[idx];
        if (kind == TG_REDIS_REDIRECT_MOVED) {
            to->wanted = 1;
            if (to->state == S_DOWN && !uv_is_active((uv_handle_t *)&to->timer))
                conn_connect(to);
            r->slots[slot] = (int16_t)idx;
            q->at = NULL;
            cluster_refresh_soon(r);
        } else {
            q->at = to;
            q->asking = 1;
        }
        if (q->at && q->at->state == S_DOWN && !q->at->ac)
            conn_connect(q->at); /* an ASK target the map does not use */
        cluster_dispatch(r, q);
        return 1;
    }
    int clusterdown = strncmp(reply->str, "CLUSTERDOWN", 11) == 0;
    if (kind == TG_REDIS_REDIRECT_NONE && !clusterdown && strncmp(reply->str, "TRYAGAIN", 8) != 0 &&
        strncmp(reply->str, "READONLY", 8) != 0)
        return 0;
    /* Within the deadline: a slot being migrated, a failover in progress, redirections
     * going round (the map is read again). The next try starts from the map; when the
     * deadline comes first, the caller hears "timeout", after which an idempotent script
     * is sent again. */
    r->stats.cluster_retries++;
    if (clusterdown || kind != TG_REDIS_REDIRECT_NONE || reply->str[0] == 'R')
        cluster_refresh_soon(r);
    if (!q->pinned)
        q->at = NULL;
    q->asking = 0;
    q->hops = 0;
    park(r, q);
    if (!uv_is_active((uv_handle_t *)&r->retry))
        uv_timer_start(&r->retry, cluster_on_retry, REDIS_RETRY_MS, 0);
    return 1;
}

/* The map just read (r->map, from node `from`) becomes the client's. */
static void cluster_apply(tg_redis_t *r, const tg__redis_conn_t *from) {
    const tg_redis_slotmap_t *m = r->map;
    int idx[TG_REDIS_NODES_MAX];
    for (int i = 0; i < r->nconns; i++)
        r->conns[i]->wanted = 0;
    r->nprimaries = 0;
    for (int i = 0; i < m->nnodes; i++) {
        idx[i] = cluster_node(r, m->nodes[i].host[0] ? m->nodes[i].host : from->host, m->nodes[i].port);
        if (idx[i] < 0)
            continue;
        r->conns[idx[i]]->wanted = 1;
        r->primaries[r->nprimaries++] = idx[i];
    }
    for (int s = 0; s < TG_REDIS_SLOTS; s++)
        r->slots[s] = (int16_t)(m->slot[s] >= 0 ? idx[m->slot[s]] : -1);
    if (!r->have_map)
        tg_log_info("redis: cluster map: %d primaries, %d of %d slots served", r->nprimaries, m->covered,
                    TG_REDIS_SLOTS);
    r->have_map = 1;
    for (int i = 0; i < r->nconns; i++) {
        tg__redis_conn_t *c = r->conns[i];
        if (c->wanted && c->state == S_DOWN && !c->ac && !uv_is_active((uv_handle_t *)&c->timer)) {
            conn_connect(c);
        } else if (!c->wanted && c->ac && !c->freeing && c->inflight == 0) {
            uv_timer_stop(&c->timer);
            c->freeing = 1;
            redisAsyncFree(c->ac); /* no longer a primary: closed while idle */
        } else if (!c->wanted && !c->ac) {
            uv_timer_stop(&c->timer); /* no reconnect */
        }
    }
    if (r->nparked)
        cluster_resume(r);
}

static void cluster_on_map(redisAsyncContext *ac, void *reply_, void *privdata) {
    tg__redis_conn_t *c = ac->data;
    tg_redis_t *r = c->r;
    redisReply *reply = reply_;
    TG_UNUSED(privdata);
    c->inflight--;
    r->refreshing = 0;
    if (!reply) {
        c->broken = 1;
        return;
    }
    c->last_io = uv_now(r->loop);
    if (r->closing)
        return;
    if (reply->type == REDIS_REPLY_ERROR) {
        if (!r->use_slots && strcasestr(reply->str, "unknown subcommand")) {
            r->use_slots = 1; /* before Redis 7 */
            cluster_refresh(r);
            return;
        }
        tg_log_warn("redis: cluster map from %s:%d: %s", c->host, c->port, reply->str);
        return;
    }
    if (!r->map && !(r->map = malloc(sizeof(*r->map))))
        abort();
    r->map->tls = r->url.tls;
    if (tg_redis_slotmap_parse(reply, !r->use_slots, r->map) < 0) {
        tg_log_warn("redis: cluster map from %s:%d: not a map of slots (is it a cluster node?)", c->host, c->port);
        return;
    }
    cluster_apply(r, c);
}

/* Reads the map from a node that is up: a primary of the map first (round robin), else
 * any. With none up, every known node is tried again. */
static void cluster_refresh(tg_redis_t *r) {
    if (r->refreshing || r->closing)
        return;
    tg__redis_conn_t *c = NULL;
    for (int pass = 0; pass < 2 && !c; pass++)
        for (int k = 0; k < r->nconns && !c; k++) {
            tg__redis_conn_t *x = r->conns[(r->pick + k) % r->nconns];
            if ((pass || x->wanted) && x->state == S_UP && !x->freeing && !x->broken)
                c = x;
        }
    r->pick++;
    if (!c) {
        for (int i = 0; i < r->nconns; i++) {
            tg__redis_conn_t *x = r->conns[i];
            x->wanted = 1;
            if (x->state == S_DOWN && !x->ac && !uv_is_active((uv_handle_t *)&x->timer))
                conn_connect(x);
        }
        return;
    }
    const char *argv[2] = {"CLUSTER", r->use_slots ? "SLOTS" : "SHARDS"};
    if (redisAsyncCommandArgv(c->ac, cluster_on_map, NULL, 2, argv, NULL) != REDIS_OK)
        return;
    if (c->inflight++ == 0)
        c->last_io = uv_now(r->loop);
    r->refreshing = 1;
    r->stats.map_reads++;
    redis_arm(r);
}

static void cluster_on_topo(uv_timer_t *t) {
    tg_redis_t *r = t->data;
    cluster_refresh(r);
    uv_timer_start(&r->topo, cluster_on_topo, cluster_all_up(r) ? REDIS_MAP_EVERY_MS : REDIS_MAP_DEGRADED_MS, 0);
}

static void cluster_refresh_soon(tg_redis_t *r) {
    if (r->closing || !r->cluster)
        return;
    if (uv_is_active((uv_handle_t *)&r->topo) && uv_timer_get_due_in(&r->topo) <= REDIS_MAP_SOON_MS)
        return;
    uv_timer_start(&r->topo, cluster_on_topo, REDIS_MAP_SOON_MS, 0);
}

/* Where the subscriber connects: classic PUBLISH reaches every node of a cluster, so
 * any node that is up (a primary of the map first), else the next known one. */
static void sub_pick_node(tg_redis_t *r) {
    tg__redis_conn_t *best = NULL;
    for (int pass = 0; pass < 2 && !best; pass++)
        for (int k = 0; k < r->nconns && !best; k++) {
            tg__redis_conn_t *x = r->conns[(r->pick + k) % r->nconns];
            if ((pass || x->wanted) && x->state == S_UP)
                best = x;
        }
    if (!best)
        best = r->conns[r->pick % r->nconns];
    r->pick++;
    r->sub.host = best->host;
    r->sub.port = best->port;
}

/* ---- timers --------------------------------------------------------------------- */

static void redis_on_timer(uv_timer_t *t) {
    tg_redis_t *r = t->data;
    uint64_t now = uv_now(r->loop);
    tg_redis_req_t *q;
    while ((q = r->pending.head) != NULL && q->deadline <= now) {
        l_remove(&r->pending, q);
        r->stats.timeouts++;
        if (q->state == R_PARKED) {
            r->nparked--;
            if (req_finish(q, NULL, tg_redis_err_timeout))
                return;
        } else if (req_abandon(q, tg_redis_err_timeout)) {
            return;
        }
    }
    for (int i = 0; i < r->nconns; i++) {
        tg__redis_conn_t *c = r->conns[i];
        if (c->state == S_UP && c->inflight > 0 && !c->freeing && now - c->last_io >= (uint64_t)r->stall_ms) {
            tg_log_warn("redis: command connection%s%s: no reply for %d ms with %d command(s) outstanding; "
                        "reconnecting",
                        r->cluster ? " to " : "", r->cluster ? c->host : "", r->stall_ms, c->inflight);
            c->freeing = 1;
            redisAsyncFree(c->ac);
            if (r->closing)
                return;
        }
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

/* "host[:port]" or "[v6]:port" from p to end: *host allocated, *port 6379 when not
 * given. 0, or -1 (and *host may need freeing). */
static int hostport_parse(const char *p, const char *end, char **host, int *port) {
    const char *hend;
    *port = 6379;
    if (p < end && *p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (!rb)
            return -1;
        *host = strndup(p + 1, (size_t)(rb - p - 1));
        hend = rb + 1;
    } else {
        hend = memchr(p, ':', (size_t)(end - p));
        if (!hend)
            hend = end;
        *host = strndup(p, (size_t)(hend - p));
    }
    if (hend < end) {
        if (*hend != ':' || hend + 1 == end || end - hend > 6)
            return -1;
        long v = 0;
        for (const char *d = hend + 1; d < end; d++) {
            if (*d < '0' || *d > '9')
                return -1;
            v = v * 10 + (*d - '0');
        }
        if (v <= 0 || v > 65535)
            return -1;
        *port = (int)v;
    }
    return *host && **host ? 0 : -1;
}

/* "redis-cluster://[[user]:password@]host:port[,host:port...]": the seeds are kept as
 * written (checked here), the first one is host and port. */
static int url_parse_cluster(tg_redis_url_t *u, const char *p) {
    const char *at = strrchr(p, '@');
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
    if (!*p || strchr(p, '/'))
        return -1; /* a cluster has database 0 only */
    for (const char *s = p; *s;) {
        const char *end = s + strcspn(s, ",");
        char *host = NULL;
        int port;
        int bad = hostport_parse(s, end, &host, &port);
        if (!bad && !u->host) {
            u->host = host;
            u->port = port;
            host = NULL;
        }
        free(host);
        if (bad)
            return -1;
        s = *end ? end + 1 : end;
        if (*end && !*s)
            return -1; /* a trailing comma */
    }
    u->seeds = strdup(p);
    u->cluster = 1;
    return 0;
}

static int url_parse(tg_redis_url_t *u, const char *url) {
    if (strncmp(url, "unix://", 7) == 0) {
        if (url[7] != '/')
            return -1;
        u->path = strdup(url + 7);
        return 0;
    }
    if (strncmp(url, "rediss", 6) == 0) { /* TLS: rediss:// and rediss-cluster:// */
        u->tls = 1;
        url += 6;
    } else if (strncmp(url, "redis", 5) == 0) {
        url += 5;
    } else {
        return -1;
    }
    if (strncmp(url, "-cluster://", 11) == 0)
        return url_parse_cluster(u, url + 11);
    if (strncmp(url, "://", 3) != 0)
        return -1;
    const char *p = url + 3;
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
    free(u->seeds);
    free(u->host);
    free(u->path);
    free(u->user);
    free(u->pass);
    memset(u, 0, sizeof(*u));
}

/* A blocking connection to host:port (or u's socket when host is NULL) with u's setup. */
static redisContext *sync_connect(const tg_redis_url_t *u, const char *host, int port, int timeout_ms, char *err,
                                  size_t errlen) {
    /* Where, for the messages: never the password. */
    char where[300];
    if (!host)
        snprintf(where, sizeof(where), "%.280s", u->path);
    else
        snprintf(where, sizeof(where), "%.256s:%d/%d", host, port, u->db);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    redisContext *c;
    if (u->tls) {
        c = tg_redis_tls_connect_sync(host, port, timeout_ms, err, errlen);
        if (!c)
            return NULL;
    } else {
        c = !host ? redisConnectUnixWithTimeout(u->path, tv) : redisConnectWithTimeout(host, port, tv);
    }
    if (!c || c->err) {
        snprintf(err, errlen, "%s: %s", where, c ? c->errstr : "out of memory");
        goto fail;
    }
    redisSetTimeout(c, tv);
    setup_cmd_t setup[2];
    int n = setup_cmds(u, 1, setup);
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
    return c;
fail:
    if (c)
        redisFree(c);
    return NULL;
}

redisContext *tg_redis_connect_sync_node(const char *url, const char *host, int port, int timeout_ms, char *err,
                                         size_t errlen) {
    tg_redis_url_t u;
    if (tg_redis_url_parse(url, &u) != TG_OK) {
        snprintf(err, errlen,
                 "bad URL (expected redis[s]://[[user]:password@]host[:port][/db], "
                 "redis[s]-cluster://[[user]:password@]host:port[,host:port...] or unix:///path/to.sock)");
        return NULL;
    }
    redisContext *c = NULL;
    if (host || !u.cluster) {
        c = sync_connect(&u, host ? host : u.path ? NULL : u.host, host ? port : u.port, timeout_ms, err, errlen);
    } else { /* a cluster: the first seed that answers */
        for (const char *p = u.seeds; *p && !c;) {
            const char *end = p + strcspn(p, ",");
            char *h = NULL;
            int hp;
            if (hostport_parse(p, end, &h, &hp) == 0)
                c = sync_connect(&u, h, hp, timeout_ms, err, errlen);
            free(h);
            p = *end ? end + 1 : end;
        }
    }
    tg_redis_url_free(&u);
    return c;
}

redisContext *tg_redis_connect_sync(const char *url, int timeout_ms, char *err, size_t errlen) {
    return tg_redis_connect_sync_node(url, NULL, 0, timeout_ms, err, errlen);
}

int tg_redis_url_is_cluster(const char *url) {
    return url && (strncmp(url, "redis-cluster://", 16) == 0 || strncmp(url, "rediss-cluster://", 17) == 0);
}

redisReply *tg_redis_sync_argv(redisContext **c, const char *url, int timeout_ms, int argc, const char **argv,
                               const size_t *argvlen) {
    redisReply *rep = redisCommandArgv(*c, argc, argv, argvlen);
    for (int hop = 0; rep && rep->type == REDIS_REPLY_ERROR && hop < REDIS_HOPS_MAX; hop++) {
        char host[TG_REDIS_HOST_MAX], err[400];
        int slot, port;
        int kind = tg_redis_parse_redirect(rep->str, rep->len, &slot, host, &port);
        if (kind == TG_REDIS_REDIRECT_NONE)
            break;
        if (!host[0] && !(*c)->tcp.host)
            break; /* a TLS connection (a tunnel's socket) knows no host of its own */
        redisContext *n = tg_redis_connect_sync_node(url, host[0] ? host : (*c)->tcp.host, port, timeout_ms, err,
                                                     sizeof(err));
        if (!n)
            break; /* the redirection is the answer */
        freeReplyObject(rep);
        if (kind == TG_REDIS_REDIRECT_ASK) {
            redisReply *a = redisCommand(n, "ASKING");
            if (a)
                freeReplyObject(a);
            rep = redisCommandArgv(n, argc, argv, argvlen);
            redisFree(n);
        } else {
            redisFree(*c);
            *c = n;
            rep = redisCommandArgv(*c, argc, argv, argvlen);
        }
    }
    return rep;
}

int tg_redis_sync_map(redisContext *c, tg_redis_slotmap_t *m) {
    for (int shards = 1; shards >= 0; shards--) {
        redisReply *rep = redisCommand(c, shards ? "CLUSTER SHARDS" : "CLUSTER SLOTS");
        int ok = rep && tg_redis_slotmap_parse(rep, shards, m) > 0;
        if (rep)
            freeReplyObject(rep);
        if (ok) {
            for (int i = 0; i < m->nnodes; i++)
                if (!m->nodes[i].host[0] && c->tcp.host)
                    snprintf(m->nodes[i].host, sizeof(m->nodes[i].host), "%s", c->tcp.host);
            return TG_OK;
        }
    }
    return TG_ERROR;
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
        tg_log_error("redis: bad URL: expected redis[s]://[[user]:password@]host[:port][/db], "
                     "redis[s]-cluster://[[user]:password@]host:port[,host:port...] or unix:///path/to.sock");
        redis_free(r);
        return NULL;
    }
    if (r->url.tls && !tg_redis_tls_ready()) {
        tg_log_error("redis: a rediss:// URL but TLS is not set up (tg_redis_tls_setup)");
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
    conn_init(r, &r->sub, "pubsub", 1);
    if (r->url.cluster) {
        r->cluster = 1;
        for (int s = 0; s < TG_REDIS_SLOTS; s++)
            r->slots[s] = -1;
        uv_timer_init(loop, &r->topo);
        r->topo.data = r;
        uv_timer_init(loop, &r->retry);
        r->retry.data = r;
        r->handles += 2;
        uv_timer_start(&r->topo, cluster_on_topo, REDIS_MAP_EVERY_MS, 0);
        /* The seeds: each connects, and the first one up reads the map. */
        for (const char *p = r->url.seeds; *p;) {
            const char *end = p + strcspn(p, ",");
            char *host = NULL;
            int port = 0;
            if (hostport_parse(p, end, &host, &port) == 0)
                cluster_node(r, host, port);
            free(host);
            p = *end ? end + 1 : end;
        }
        return r;
    }
    conn_init(r, &r->cmd, "command", 0);
    r->cmd.host = r->sub.host = r->url.host;
    r->cmd.path = r->sub.path = r->url.path;
    r->cmd.port = r->sub.port = r->url.port;
    r->conns[0] = &r->cmd;
    r->nconns = 1;
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

static tg_redis_req_t *resend_go(tg__redis_resend_t *x) {
    if (x->script < 0)
        return tg_redis_command(x->r, resend_done, x, x->argc, x->argv, x->argvlen);
    return tg_redis_eval(x->r, x->script, x->nkeys, x->argc, x->argv, x->argvlen, resend_done, x);
}

/* The resend, when its timer fires. */
static void resend_send(tg__redis_resend_t *x) {
    tg_redis_t *r = x->r;
    x->sends++;
    r->stats.resends++;
    if (!resend_go(x))
        resend_finish(x, NULL, tg_redis_err_shutdown); /* only while closing: the arguments were checked */
}

static int idempotent_send(tg_redis_t *r, int script_id, int nkeys, int argc, const char **argv,
                           const size_t *argvlen, tg_redis_cb cb, void *ud);

int tg_redis_command_idempotent(tg_redis_t *r, int argc, const char **argv, const size_t *argvlen, tg_redis_cb cb,
                                void *ud) {
    if (!r || r->closing || argc < 1 || !argv)
        return TG_ERROR;
    return idempotent_send(r, -1, 0, argc, argv, argvlen, cb, ud);
}

int tg_redis_eval_idempotent(tg_redis_t *r, int script_id, int nkeys, int argc, const char **argv,
                             const size_t *argvlen, tg_redis_cb cb, void *ud) {
    if (!r || r->closing || script_id < 0 || script_id >= r->nscripts || nkeys < 0 || argc < nkeys ||
        (argc > 0 && !argv))
        return TG_ERROR;
    return idempotent_send(r, script_id, nkeys, argc, argv, argvlen, cb, ud);
}

/* Both of the above, their arguments checked: script_id -1 is a plain command. */
static int idempotent_send(tg_redis_t *r, int script_id, int nkeys, int argc, const char **argv,
                           const size_t *argvlen, tg_redis_cb cb, void *ud) {
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
    if (!resend_go(x)) {
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
        if (q->state == R_PARKED)
            req_finish(q, NULL, tg_redis_err_shutdown);
        else
            req_abandon(q, tg_redis_err_shutdown);
    }
    r->nparked = 0;
    while ((q = r->deferred.head) != NULL) {
        l_remove(&r->deferred, q);
        req_finish(q, NULL, tg_redis_err_shutdown);
    }
    while (r->resends) /* those waiting for their resend timer */
        resend_finish(r->resends, NULL, tg_redis_err_shutdown);
    uv_idle_stop(&r->idle);
    uv_close((uv_handle_t *)&r->timer, redis_on_handle_close);
    for (int i = 0; i < r->nconns; i++)
        uv_close((uv_handle_t *)&r->conns[i]->timer, conn_on_timer_close);
    uv_close((uv_handle_t *)&r->sub.timer, conn_on_timer_close);
    if (r->cluster) {
        uv_close((uv_handle_t *)&r->topo, redis_on_handle_close);
        uv_close((uv_handle_t *)&r->retry, redis_on_handle_close);
    }
    for (int i = 0; i <= r->nconns; i++) {
        tg__redis_conn_t *c = i < r->nconns ? r->conns[i] : &r->sub;
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
    size_t lens[8];
    if (!argvlen && argc <= 8) { /* C strings (a ZREM, a GET): formatted here too */
        for (int i = 0; i < argc; i++)
            lens[i] = strlen(argv[i]);
        argvlen = lens;
    }
    size_t len = argvlen ? resp_format(buf, sizeof(buf), argc, argv, argvlen) : 0;
    if (len)
        return redisAsyncFormattedCommand(c->ac, conn_on_reply, q, buf, len);
    return redisAsyncCommandArgv(c->ac, conn_on_reply, q, argc, argv, argvlen);
}

static tg_redis_req_t *redis_send(tg_redis_t *r, tg_redis_req_t *q, int argc, const char **argv,
                                  const size_t *argvlen) {
    tg__redis_conn_t *c = &r->cmd;
    r->stats.commands++;
    if (r->cluster) { /* q->argv holds the command: it may have to go out again */
        q->deadline = uv_now(r->loop) + (uint64_t)r->timeout_ms;
        l_push(&r->pending, q);
        if (r->pending.head == q)
            redis_arm(r);
        cluster_dispatch(r, q);
        return q;
    }
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

/* Cluster mode: a request that keeps a copy of its command, for a redirection. */
static tg_redis_req_t *cluster_command(tg_redis_t *r, tg__redis_conn_t *at, tg_redis_cb cb, void *ud, int argc,
                                       const char **argv, const size_t *argvlen) {
    size_t size = sizeof(tg_redis_req_t) + (size_t)argc * (sizeof(char *) + sizeof(size_t));
    tg_redis_req_t *q = calloc(1, size + args_size(argc, argv, argvlen));
    if (!q)
        abort();
    q->r = r;
    q->cb = cb;
    q->ud = ud;
    q->script = -1;
    q->at = at;
    q->pinned = at != NULL;
    q->argc = argc;
    q->argv = (const char **)(q + 1);
    q->argvlen = (size_t *)(q->argv + argc);
    args_copy((char *)(q->argvlen + argc), argc, argv, argvlen, q->argv, q->argvlen);
    return redis_send(r, q, argc, q->argv, q->argvlen);
}

int tg_redis_one_keyspace(const tg_redis_t *r) { return r && !r->cluster && r->one_keyspace; }

int tg_redis_primaries(const tg_redis_t *r) {
    if (!r)
        return 0;
    return r->cluster ? r->nprimaries : 1;
}

tg_redis_req_t *tg_redis_command_at(tg_redis_t *r, int primary, tg_redis_cb cb, void *ud, int argc, const char **argv,
                                    const size_t *argvlen) {
    if (!r || r->closing || argc <= 0 || !argv || primary < 0 || primary >= tg_redis_primaries(r))
        return NULL;
    if (!r->cluster)
        return tg_redis_command(r, cb, ud, argc, argv, argvlen);
    return cluster_command(r, r->conns[r->primaries[primary]], cb, ud, argc, argv, argvlen);
}

tg_redis_req_t *tg_redis_command(tg_redis_t *r, tg_redis_cb cb, void *ud, int argc, const char **argv,
                                 const size_t *argvlen) {
    if (!r || r->closing || argc <= 0 || !argv)
        return NULL;
    if (r->cluster)
        return cluster_command(r, NULL, cb, ud, argc, argv, argvlen);
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
    tg_fmt_key(q->nkeys, sizeof(q->nkeys), "", nkeys, "");
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
    } else if (q->state == R_PARKED) {
        l_remove(&r->pending, q);
        r->nparked--;
        free(q);
    }
}

int tg_redis_connected(const tg_redis_t *r) {
    if (!r)
        return 0;
    if (r->cluster) /* a map, and its primaries reachable */
        return r->have_map && cluster_all_up(r);
    return r->cmd.state == S_UP && !r->cmd.broken && !r->cmd.freeing;
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
                  "tollgate_redis_total{event=\"resend\"} %llu\n"
                  "tollgate_redis_total{event=\"redirect\"} %llu\n"
                  "tollgate_redis_total{event=\"cluster_retry\"} %llu\n"
                  "tollgate_redis_total{event=\"map_read\"} %llu\n",
                  (unsigned long long)s.commands, (unsigned long long)s.failed_fast, (unsigned long long)s.timeouts,
                  (unsigned long long)s.disconnects, (unsigned long long)s.connects,
                  (unsigned long long)s.script_loads, (unsigned long long)s.resends, (unsigned long long)s.redirects,
                  (unsigned long long)s.cluster_retries, (unsigned long long)s.map_reads);
}

void tg_redis_metrics(tg_metrics_t *m, const tg_redis_t *r) {
    if (r)
        tg_metrics_collector_add(m, redis_collect, &r->stats);
}
