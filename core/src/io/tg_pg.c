/*
 * The per-worker Postgres pool (see tg_pg.h): libpq in non-blocking mode, one uv_poll
 * per connection socket, everything in the worker's loop thread.
 *
 * A connection moves DOWN -> CONNECTING (PQconnectPoll) -> SETUP (one PQsendPrepare per
 * registered statement) -> IDLE <-> BUSY (one request on the wire at a time), and back
 * to DOWN when it breaks, whence a timer reconnects it with exponential backoff and
 * jitter. A request is QUEUED (waiting for an idle connection), RUNNING (on the wire),
 * DEFERRED (its error is reported on the next loop turn, so that no callback runs inside
 * tg_pg_exec) or DONE (inside its callback).
 *
 * Every request shares one timeout, so deadlines increase in submission order: all
 * pending requests sit in one list sorted by construction, watched by one uv_timer. A
 * request that times out on the wire leaves its connection in an unknown state: the
 * statement is cancelled (PQcancel, which blocks, runs on a detached thread with its own
 * PGcancel copy, at most PG_CANCELS_MAX at once in the process) and the connection is
 * replaced.
 *
 * Memory: requests are freed right after their callback (or cancel); the pool is freed
 * from the close callback of its last handle, so destroying it from inside one of its own
 * callbacks is safe: every path that runs a callback checks `closing` afterwards.
 */
#include "tollgate/tg_pg.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char tg_pg_err_timeout[] = "timeout";
const char tg_pg_err_not_connected[] = "not connected";
const char tg_pg_err_busy[] = "busy";
const char tg_pg_err_shutdown[] = "shutdown";
const char tg_pg_err_conn_lost[] = "connection lost";

#define PG_BACKOFF_MIN_MS 100
#define PG_BACKOFF_MAX_MS 5000
#define PG_MAX_PARAMS 65535

enum { C_DOWN, C_CONNECTING, C_SETUP, C_IDLE, C_BUSY };
enum { R_QUEUED, R_RUNNING, R_DEFERRED, R_DONE };

typedef struct tg_pg_conn_s tg_pg_conn_t;

struct tg_pg_req_s {
    tg_pg_t *pg;
    tg_pg_req_t *prev, *next;   /* pg->queue (QUEUED) or pg->deferred (DEFERRED) */
    tg_pg_req_t *tprev, *tnext; /* pg->pending, by deadline (QUEUED, RUNNING) */
    tg_pg_conn_t *conn;         /* RUNNING */
    uint64_t deadline;
    tg_pg_cb cb;
    void *ud;
    const char *err; /* DEFERRED */
    int state;
    int stmt; /* index into pg->stmts, or -1 for the ad-hoc `sql` */
    int nparams;
    const char *sql;
    const char **params; /* copies, in the same allocation as the request */
};

typedef struct {
    tg_pg_req_t *head, *tail;
    size_t n;
} tg__pg_list_t;

struct tg_pg_conn_s {
    tg_pg_t *pg;
    int index;
    int state;
    PGconn *db;
    uv_poll_t *poll;  /* heap: replaced while connecting, freed in its close callback */
    uv_timer_t timer; /* connect timeout (CONNECTING, SETUP) or backoff (DOWN) */
    int events;       /* what `poll` watches */
    int flushing;     /* output waits for the socket to become writable */
    int preparing;    /* a Prepare is on the wire */
    int nprepared;    /* registered statements prepared on this connection */
    int backoff_ms;   /* the next reconnect delay before jitter; 0 after a success */
    int connect_failed; /* its latest connect attempt failed (cleared by a success) */
    tg_pg_req_t *req; /* the request on the wire (BUSY), NULL when its result is discarded */
    PGresult *res;    /* the result kept for that request */
};

typedef struct {
    char *name, *sql;
    int nparams;
} tg__pg_stmt_t;

struct tg_pg_s {
    uv_loop_t *loop;
    char *conninfo;
    int size;
    int timeout_ms;
    tg_pg_conn_t *conns;
    tg__pg_stmt_t *stmts;
    int nstmts, stmts_cap;
    tg__pg_list_t queue, deferred, pending;
    uv_timer_t timer; /* the deadline of pending.head */
    uv_idle_t idle;   /* runs while deferred is not empty */
    int closing;
    int handles; /* open handles; the pool is freed when closing and 0 */
    uint64_t rng;
    tg_pg_stats_t stats;
};

/* ---- lists ---------------------------------------------------------------------- */

static void q_push(tg__pg_list_t *l, tg_pg_req_t *r) {
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail)
        l->tail->next = r;
    else
        l->head = r;
    l->tail = r;
    l->n++;
}

static void q_push_head(tg__pg_list_t *l, tg_pg_req_t *r) {
    r->prev = NULL;
    r->next = l->head;
    if (l->head)
        l->head->prev = r;
    else
        l->tail = r;
    l->head = r;
    l->n++;
}

static void q_remove(tg__pg_list_t *l, tg_pg_req_t *r) {
    if (r->prev)
        r->prev->next = r->next;
    else
        l->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        l->tail = r->prev;
    r->prev = r->next = NULL;
    l->n--;
}

static void t_push(tg__pg_list_t *l, tg_pg_req_t *r) {
    assert(!l->tail || l->tail->deadline <= r->deadline);
    r->tnext = NULL;
    r->tprev = l->tail;
    if (l->tail)
        l->tail->tnext = r;
    else
        l->head = r;
    l->tail = r;
    l->n++;
}

static void t_remove(tg__pg_list_t *l, tg_pg_req_t *r) {
    if (r->tprev)
        r->tprev->tnext = r->tnext;
    else
        l->head = r->tnext;
    if (r->tnext)
        r->tnext->tprev = r->tprev;
    else
        l->tail = r->tprev;
    r->tprev = r->tnext = NULL;
    l->n--;
}

/* ---- helpers -------------------------------------------------------------------- */

static void conn_setup(tg_pg_conn_t *c);
static void conn_start(tg_pg_conn_t *c);
static void conn_reset(tg_pg_conn_t *c, int cancel, const char *why);
static void pg_dispatch(tg_pg_t *pg);
static void pg_on_timer(uv_timer_t *t);
static void pg_on_idle(uv_idle_t *h);

static uint64_t pg_rand(tg_pg_t *pg) {
    /* xorshift64: jitter only, not security. */
    uint64_t x = pg->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return pg->rng = x;
}

/* Copies a libpq message for a one-line log entry: line breaks and tabs become spaces. */
static const char *pg_msg(char *buf, size_t n, const char *msg) {
    snprintf(buf, n, "%s", msg && *msg ? msg : "unknown error");
    size_t len = 0;
    for (char *s = buf; *s; s++) {
        if (*s == '\n' || *s == '\t' || *s == '\r')
            *s = ' ';
        if (*s != ' ' || (len > 0 && buf[len - 1] != ' '))
            buf[len++] = *s;
    }
    while (len > 0 && buf[len - 1] == ' ')
        len--;
    buf[len] = '\0';
    return buf;
}

static void pg_free(tg_pg_t *pg) {
    for (int i = 0; i < pg->nstmts; i++) {
        free(pg->stmts[i].name);
        free(pg->stmts[i].sql);
    }
    free(pg->stmts);
    free(pg->conns);
    free(pg->conninfo);
    free(pg);
}

static void pg_unref(tg_pg_t *pg) {
    if (--pg->handles == 0 && pg->closing)
        pg_free(pg);
}

static void pg_on_handle_close(uv_handle_t *h) { pg_unref(h->data); }

static void conn_on_handle_close(uv_handle_t *h) {
    tg_pg_conn_t *c = h->data;
    pg_unref(c->pg);
}

static void conn_on_poll_close(uv_handle_t *h) {
    tg_pg_conn_t *c = h->data;
    free(h);
    pg_unref(c->pg);
}

/* Arms the pool timer for the earliest deadline. */
static void pg_arm(tg_pg_t *pg) {
    if (!pg->pending.head) {
        uv_timer_stop(&pg->timer);
        return;
    }
    uint64_t now = uv_now(pg->loop), d = pg->pending.head->deadline;
    uv_timer_start(&pg->timer, pg_on_timer, d > now ? d - now : 0, 0);
}

static void pg_defer(tg_pg_t *pg, tg_pg_req_t *req, const char *err) {
    req->state = R_DEFERRED;
    req->err = err;
    q_push(&pg->deferred, req);
    uv_idle_start(&pg->idle, pg_on_idle);
}

/*
 * No server to send anything to: every connection is down and its latest attempt to
 * connect failed (Postgres is down, or failing over and no host takes writes yet). A
 * connection that was lost but not yet tried again does not count: requests wait for
 * its reconnect, which usually succeeds at once (a backend terminated, a proxy recycled).
 */
static int pg_unreachable(const tg_pg_t *pg) {
    for (int i = 0; i < pg->size; i++) {
        const tg_pg_conn_t *c = &pg->conns[i];
        if ((c->state != C_DOWN && c->state != C_CONNECTING) || !c->connect_failed)
            return 0;
    }
    return 1;
}

/* What waits for a connection fails now with tg_pg_err_not_connected (on the next loop
 * turn) instead of at its timeout: the pool has become unreachable. */
static void pg_fail_queued(tg_pg_t *pg) {
    tg_pg_req_t *req;
    while ((req = pg->queue.head) != NULL) {
        q_remove(&pg->queue, req);
        t_remove(&pg->pending, req);
        pg->stats.unreachable++;
        pg_defer(pg, req, tg_pg_err_not_connected);
    }
    pg_arm(pg);
}

/*
 * Runs the callback of a request that is already off every list, then frees it.
 * Returns non-zero when the pool is being destroyed (the caller must return at once).
 */
static int req_finish(tg_pg_req_t *req, const PGresult *res, const char *err) {
    tg_pg_t *pg = req->pg;
    req->state = R_DONE;
    if (req->cb)
        req->cb(req->ud, res, err);
    free(req);
    return pg->closing;
}

/* ---- connections ---------------------------------------------------------------- */

static void conn_on_poll(uv_poll_t *h, int status, int events);

/* Watches the connection's socket for `events`; `renew` replaces the poll handle (while
 * connecting libpq may have moved to a new socket with the same number). */
static int conn_watch(tg_pg_conn_t *c, int events, int renew) {
    tg_pg_t *pg = c->pg;
    int fd = PQsocket(c->db);
    if (fd < 0)
        return UV_EBADF;
    if (c->poll && renew) {
        uv_close((uv_handle_t *)c->poll, conn_on_poll_close);
        c->poll = NULL;
    }
    if (!c->poll) {
        uv_poll_t *p = malloc(sizeof(*p));
        if (!p)
            abort();
        int rc = uv_poll_init(pg->loop, p, fd);
        if (rc < 0) {
            free(p);
            return rc;
        }
        p->data = c;
        pg->handles++;
        c->poll = p;
        c->events = 0;
    }
    if (c->events == events)
        return 0;
    c->events = events;
    return uv_poll_start(c->poll, events, conn_on_poll);
}

/* Releases the libpq connection and its poll handle. */
static void conn_close(tg_pg_conn_t *c) {
    if (c->poll) {
        uv_close((uv_handle_t *)c->poll, conn_on_poll_close);
        c->poll = NULL;
    }
    if (c->res) {
        PQclear(c->res);
        c->res = NULL;
    }
    if (c->db) {
        PQfinish(c->db);
        c->db = NULL;
    }
    c->events = c->flushing = c->preparing = c->nprepared = 0;
}

/*
 * Cancel requests in flight in this process, at most PG_CANCELS_MAX. PQcancel blocks
 * until the server has read the request and closed the connection: against a server
 * that does not answer (a hung host, a stopped postmaster) that is for as long as it
 * hangs. So it runs on a detached thread of its own, not on libuv's thread pool (four
 * threads, shared with the upstreams' name lookups, which it would starve, and a
 * pending work request keeps its loop, and the gateway's shutdown, waiting), and past
 * PG_CANCELS_MAX unanswered ones a timed-out statement is not cancelled: its
 * connection is closed all the same, and the server ends it when it notices.
 */
#define PG_CANCELS_MAX 2
static atomic_int pg_cancels;

typedef struct {
    PGcancel *cancel;
    int index;
} tg__pg_cancel_t;

static void *cancel_thread(void *arg) {
    tg__pg_cancel_t *pc = arg;
    char err[256];
    if (!PQcancel(pc->cancel, err, sizeof(err)))
        tg_log_warn("pg: connection %d: cancel request failed: %s", pc->index, err);
    PQfreeCancel(pc->cancel);
    free(pc);
    atomic_fetch_sub(&pg_cancels, 1);
    return NULL;
}

/* Asks the server to cancel what the connection runs (best effort, see pg_cancels). */
static void conn_cancel_async(tg_pg_conn_t *c) {
    if (atomic_fetch_add(&pg_cancels, 1) >= PG_CANCELS_MAX) {
        atomic_fetch_sub(&pg_cancels, 1);
        tg_log_warn("pg: connection %d: statement not cancelled: %d cancel requests are still unanswered", c->index,
                    PG_CANCELS_MAX);
        return;
    }
    PGcancel *cancel = PQgetCancel(c->db);
    tg__pg_cancel_t *pc = cancel ? calloc(1, sizeof(*pc)) : NULL;
    pthread_attr_t attr;
    pthread_t t;
    int ok = 0;
    if (pc && pthread_attr_init(&attr) == 0) {
        pc->cancel = cancel;
        pc->index = c->index;
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        ok = pthread_create(&t, &attr, cancel_thread, pc) == 0;
        pthread_attr_destroy(&attr);
    }
    if (!ok) {
        if (cancel)
            PQfreeCancel(cancel);
        free(pc);
        atomic_fetch_sub(&pg_cancels, 1);
    }
}

static void conn_on_timer(uv_timer_t *t) {
    tg_pg_conn_t *c = t->data;
    if (c->state == C_DOWN) {
        conn_start(c);
        return;
    }
    /* CONNECTING or SETUP took too long; nothing of ours is on the wire. */
    conn_reset(c, 0, "connect timeout");
}

/*
 * Takes the connection down and schedules a reconnect: at once after a cancel (the
 * server is fine, only this session's state is unknown), else after the backoff delay.
 * The request on the wire, if any, must have been detached by the caller. Runs no
 * callback.
 */
static void conn_reset(tg_pg_conn_t *c, int cancel, const char *why) {
    tg_pg_t *pg = c->pg;
    char buf[256];
    int was_up = c->state >= C_SETUP;
    assert(!c->req);
    if (was_up) {
        pg->stats.disconnects++;
        if (!cancel) /* a timeout was logged already */
            tg_log_warn("pg: connection %d lost: %s", c->index, pg_msg(buf, sizeof(buf), why));
    } else if (c->backoff_ms == 0) {
        tg_log_warn("pg: connection %d: connect failed: %s", c->index, pg_msg(buf, sizeof(buf), why));
    } else {
        tg_log_debug("pg: connection %d: connect failed: %s", c->index, pg_msg(buf, sizeof(buf), why));
    }
    if (!was_up)
        c->connect_failed = 1;
    if (cancel && c->db)
        conn_cancel_async(c);
    conn_close(c);
    c->state = C_DOWN;
    uint64_t delay = 0;
    if (!cancel) {
        int base = c->backoff_ms ? c->backoff_ms : PG_BACKOFF_MIN_MS;
        c->backoff_ms = TG_MIN(base * 2, PG_BACKOFF_MAX_MS);
        delay = (uint64_t)(base / 2) + pg_rand(pg) % (uint64_t)(base / 2 + 1);
    }
    uv_timer_start(&c->timer, conn_on_timer, delay, 0);
    if (!was_up && pg_unreachable(pg))
        pg_fail_queued(pg);
}

/*
 * The connection broke. Its request on the wire, if any, gets tg_pg_err_conn_lost (with
 * libpq's error result when there is one). Returns non-zero when the pool is closing.
 */
static int conn_fail(tg_pg_conn_t *c, const char *why) {
    tg_pg_t *pg = c->pg;
    tg_pg_req_t *req = c->req;
    PGresult *res = c->res;
    c->req = NULL;
    c->res = NULL;
    conn_reset(c, 0, why);
    int closing = 0;
    if (req) {
        t_remove(&pg->pending, req);
        closing = req_finish(req, res, tg_pg_err_conn_lost);
    }
    PQclear(res);
    return closing;
}

static void conn_start(tg_pg_conn_t *c) {
    tg_pg_t *pg = c->pg;
    c->db = PQconnectStart(pg->conninfo);
    if (!c->db) {
        conn_reset(c, 0, "out of memory");
        return;
    }
    if (PQstatus(c->db) == CONNECTION_BAD) {
        conn_reset(c, 0, PQerrorMessage(c->db));
        return;
    }
    c->state = C_CONNECTING;
    uv_timer_start(&c->timer, conn_on_timer, TG_PG_CONNECT_TIMEOUT_MS, 0);
    /* "Just after PQconnectStart, behave as if PQconnectPoll returned WRITING." */
    int rc = conn_watch(c, UV_WRITABLE, 1);
    if (rc < 0)
        conn_reset(c, 0, uv_strerror(rc));
}

static void pg_on_notice(void *arg, const char *msg) {
    tg_pg_conn_t *c = arg;
    char buf[512];
    tg_log_debug("pg: connection %d: %s", c->index, pg_msg(buf, sizeof(buf), msg));
}

static void conn_connect_step(tg_pg_conn_t *c) {
    int rc;
    switch (PQconnectPoll(c->db)) {
    case PGRES_POLLING_READING:
        if ((rc = conn_watch(c, UV_READABLE, 1)) < 0)
            conn_reset(c, 0, uv_strerror(rc));
        return;
    case PGRES_POLLING_WRITING:
        if ((rc = conn_watch(c, UV_WRITABLE, 1)) < 0)
            conn_reset(c, 0, uv_strerror(rc));
        return;
    case PGRES_POLLING_OK:
        break;
    default:
        conn_reset(c, 0, PQerrorMessage(c->db));
        return;
    }
    if (PQsetnonblocking(c->db, 1) != 0) {
        conn_reset(c, 0, PQerrorMessage(c->db));
        return;
    }
    if ((rc = conn_watch(c, UV_READABLE, 1)) < 0) {
        conn_reset(c, 0, uv_strerror(rc));
        return;
    }
    PQsetNoticeProcessor(c->db, pg_on_notice, c);
    if (c->backoff_ms)
        tg_log_info("pg: connection %d re-established (backend pid %d)", c->index, PQbackendPID(c->db));
    else
        tg_log_debug("pg: connection %d up (backend pid %d)", c->index, PQbackendPID(c->db));
    c->backoff_ms = 0;
    c->connect_failed = 0;
    c->pg->stats.connects++;
    c->state = C_SETUP;
    conn_setup(c);
}

/* Flushes libpq's output; watches for writability while some remains. -1 on error. */
static int conn_flush(tg_pg_conn_t *c) {
    int r = PQflush(c->db);
    if (r < 0)
        return -1;
    c->flushing = r == 1;
    return conn_watch(c, c->flushing ? UV_READABLE | UV_WRITABLE : UV_READABLE, 0) < 0 ? -1 : 0;
}

/*
 * Prepares the next registered statement this connection lacks; when none is left the
 * connection becomes IDLE and takes queued work.
 */
static void conn_setup(tg_pg_conn_t *c) {
    tg_pg_t *pg = c->pg;
    if (c->nprepared < pg->nstmts) {
        tg__pg_stmt_t *s = &pg->stmts[c->nprepared];
        if (!PQsendPrepare(c->db, s->name, s->sql, s->nparams, NULL)) {
            conn_reset(c, 0, PQerrorMessage(c->db));
            return;
        }
        c->preparing = 1;
        c->state = C_SETUP;
        if (conn_flush(c) < 0)
            conn_reset(c, 0, PQerrorMessage(c->db));
        return;
    }
    uv_timer_stop(&c->timer);
    c->state = C_IDLE;
    pg_dispatch(pg);
}

static void conn_send(tg_pg_conn_t *c, tg_pg_req_t *req) {
    tg_pg_t *pg = c->pg;
    int ok;
    if (req->stmt >= 0)
        ok = PQsendQueryPrepared(c->db, pg->stmts[req->stmt].name, req->nparams, req->params, NULL, NULL, 0);
    else
        ok = PQsendQueryParams(c->db, req->sql, req->nparams, NULL, req->params, NULL, NULL, 0);
    if (!ok) {
        /* Nothing reached the server: the request goes back to the front of the queue. */
        req->state = R_QUEUED;
        q_push_head(&pg->queue, req);
        conn_reset(c, 0, PQerrorMessage(c->db));
        return;
    }
    req->state = R_RUNNING;
    req->conn = c;
    c->req = req;
    c->state = C_BUSY;
    if (conn_flush(c) < 0) {
        /* Part of it may have been sent. Report it from the next loop turn: this may run
         * inside tg_pg_exec. */
        c->req = NULL;
        t_remove(&pg->pending, req);
        pg_defer(pg, req, tg_pg_err_conn_lost);
        conn_reset(c, 0, PQerrorMessage(c->db));
    }
}

static void pg_dispatch(tg_pg_t *pg) {
    for (int i = 0; i < pg->size && pg->queue.head && !pg->closing; i++) {
        tg_pg_conn_t *c = &pg->conns[i];
        if (c->state != C_IDLE)
            continue;
        if (c->nprepared < pg->nstmts) {
            conn_setup(c);
            continue;
        }
        tg_pg_req_t *req = pg->queue.head;
        q_remove(&pg->queue, req);
        conn_send(c, req);
    }
}

static int res_is_error(const PGresult *res) {
    switch (PQresultStatus(res)) {
    case PGRES_TUPLES_OK:
    case PGRES_COMMAND_OK:
    case PGRES_EMPTY_QUERY:
    case PGRES_SINGLE_TUPLE:
        return 0;
    default:
        return 1;
    }
}

/* The request on the wire has all its results. */
static void conn_complete(tg_pg_conn_t *c) {
    tg_pg_t *pg = c->pg;
    tg_pg_req_t *req = c->req;
    PGresult *res = c->res;
    c->req = NULL;
    c->res = NULL;
    c->state = C_IDLE;

    const char *err = NULL;
    int dead = PQstatus(c->db) == CONNECTION_BAD;
    if (res && res_is_error(res)) {
        err = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
        if (!err)
            err = PQresultErrorMessage(res);
        if (!err || !*err)
            err = "error";
        /* FATAL / PANIC: the backend is exiting (e.g. pg_terminate_backend). */
        const char *sev = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
        if (sev && (strcmp(sev, "FATAL") == 0 || strcmp(sev, "PANIC") == 0))
            dead = 1;
        if (!dead)
            pg->stats.errors++;
    }
    if (dead) {
        conn_reset(c, 0, PQerrorMessage(c->db));
        if (!err)
            err = tg_pg_err_conn_lost;
    } else if (!res) {
        err = tg_pg_err_conn_lost; /* cannot happen for a single statement */
    }

    int closing = 0;
    if (req) {
        t_remove(&pg->pending, req);
        closing = req_finish(req, res, err);
    }
    PQclear(res);
    if (!closing)
        pg_dispatch(pg);
}

/* Takes every result libpq has without blocking; completes the command on the wire. */
static void conn_drain(tg_pg_conn_t *c) {
    char buf[512];
    while (!PQisBusy(c->db)) {
        PGresult *res = PQgetResult(c->db);
        if (res) {
            if (c->preparing) {
                if (res_is_error(res)) {
                    const char *m = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
                    tg_log_error("pg: connection %d: statement \"%s\" failed to prepare: %s", c->index,
                                 c->pg->stmts[c->nprepared].name, pg_msg(buf, sizeof(buf), m));
                }
                PQclear(res);
            } else if (c->state == C_BUSY && (!c->res || (res_is_error(res) && !res_is_error(c->res)))) {
                PQclear(c->res);
                c->res = res; /* keep the first result, or the first error */
            } else {
                PQclear(res);
            }
            continue;
        }
        /* NULL: the command on the wire (if any) is complete. */
        if (c->preparing) {
            c->preparing = 0;
            c->nprepared++;
            conn_setup(c);
            return;
        }
        if (c->state == C_BUSY) {
            conn_complete(c);
            return;
        }
        break;
    }
    PGnotify *n;
    while ((n = PQnotifies(c->db)) != NULL)
        PQfreemem(n);
    if (PQstatus(c->db) == CONNECTION_BAD)
        conn_fail(c, PQerrorMessage(c->db));
}

static void conn_on_poll(uv_poll_t *h, int status, int events) {
    tg_pg_conn_t *c = h->data;
    if (c->state == C_CONNECTING) {
        conn_connect_step(c);
        return;
    }
    if (status < 0) {
        conn_fail(c, uv_strerror(status));
        return;
    }
    if ((events & UV_READABLE) && !PQconsumeInput(c->db)) {
        conn_fail(c, PQerrorMessage(c->db));
        return;
    }
    if (c->flushing && conn_flush(c) < 0) {
        conn_fail(c, PQerrorMessage(c->db));
        return;
    }
    conn_drain(c);
}

/* ---- the pool ------------------------------------------------------------------- */

static void pg_on_timer(uv_timer_t *t) {
    tg_pg_t *pg = t->data;
    uint64_t now = uv_now(pg->loop);
    tg_pg_req_t *req;
    while ((req = pg->pending.head) != NULL && req->deadline <= now) {
        const char *err = tg_pg_err_timeout;
        t_remove(&pg->pending, req);
        if (req->state == R_QUEUED) {
            q_remove(&pg->queue, req);
            if (tg_pg_connected(pg) == 0)
                err = tg_pg_err_not_connected;
        } else {
            assert(req->state == R_RUNNING);
            tg_pg_conn_t *c = req->conn;
            c->req = NULL;
            tg_log_warn("pg: connection %d: query timed out after %d ms; cancelling and reconnecting", c->index,
                        pg->timeout_ms);
            conn_reset(c, 1, "query timeout");
        }
        pg->stats.timeouts++;
        if (req_finish(req, NULL, err))
            return;
    }
    pg_arm(pg);
}

static void pg_on_idle(uv_idle_t *h) {
    tg_pg_t *pg = h->data;
    /* Only what was deferred before this turn: callbacks may defer more. */
    size_t n = pg->deferred.n;
    tg_pg_req_t *req;
    while (n-- > 0 && (req = pg->deferred.head) != NULL) {
        q_remove(&pg->deferred, req);
        if (req_finish(req, NULL, req->err))
            return;
    }
    if (!pg->deferred.head)
        uv_idle_stop(&pg->idle);
}

tg_pg_t *tg_pg_create(uv_loop_t *loop, const char *conninfo, int size, int query_timeout_ms) {
    if (!loop || !conninfo || size <= 0 || size > 1000 || query_timeout_ms <= 0)
        return NULL;
    tg_pg_t *pg = calloc(1, sizeof(*pg));
    if (!pg)
        abort();
    pg->loop = loop;
    pg->conninfo = strdup(conninfo);
    pg->conns = calloc((size_t)size, sizeof(*pg->conns));
    if (!pg->conninfo || !pg->conns)
        abort();
    pg->size = size;
    pg->timeout_ms = query_timeout_ms;
    if (tg_random_bytes(&pg->rng, sizeof(pg->rng)) < 0 || pg->rng == 0)
        pg->rng = tg_now_ns() | 1;
    uv_timer_init(loop, &pg->timer);
    pg->timer.data = pg;
    uv_idle_init(loop, &pg->idle);
    pg->idle.data = pg;
    pg->handles = 2;
    for (int i = 0; i < size; i++) {
        tg_pg_conn_t *c = &pg->conns[i];
        c->pg = pg;
        c->index = i;
        uv_timer_init(loop, &c->timer);
        c->timer.data = c;
        pg->handles++;
    }
    for (int i = 0; i < size; i++)
        conn_start(&pg->conns[i]);
    return pg;
}

void tg_pg_destroy(tg_pg_t *pg) {
    if (!pg || pg->closing)
        return;
    pg->closing = 1;
    tg_pg_req_t *req;
    for (int i = 0; i < pg->size; i++) {
        tg_pg_conn_t *c = &pg->conns[i];
        if ((req = c->req) != NULL) {
            c->req = NULL;
            t_remove(&pg->pending, req);
            req_finish(req, NULL, tg_pg_err_shutdown);
        }
    }
    while ((req = pg->queue.head) != NULL) {
        q_remove(&pg->queue, req);
        t_remove(&pg->pending, req);
        req_finish(req, NULL, tg_pg_err_shutdown);
    }
    while ((req = pg->deferred.head) != NULL) {
        q_remove(&pg->deferred, req);
        req_finish(req, NULL, tg_pg_err_shutdown);
    }
    for (int i = 0; i < pg->size; i++) {
        tg_pg_conn_t *c = &pg->conns[i];
        conn_close(c);
        c->state = C_DOWN;
        uv_close((uv_handle_t *)&c->timer, conn_on_handle_close);
    }
    uv_close((uv_handle_t *)&pg->timer, pg_on_handle_close);
    uv_close((uv_handle_t *)&pg->idle, pg_on_handle_close);
}

int tg_pg_prepare(tg_pg_t *pg, const char *name, const char *sql, int nparams) {
    if (!pg || pg->closing || !name || !*name || !sql || nparams < 0 || nparams > PG_MAX_PARAMS)
        return TG_ERROR;
    for (int i = 0; i < pg->nstmts; i++)
        if (strcmp(pg->stmts[i].name, name) == 0)
            return TG_ERROR;
    if (pg->nstmts == pg->stmts_cap) {
        int cap = pg->stmts_cap ? pg->stmts_cap * 2 : 16;
        tg__pg_stmt_t *s = realloc(pg->stmts, (size_t)cap * sizeof(*s));
        if (!s)
            abort();
        pg->stmts = s;
        pg->stmts_cap = cap;
    }
    tg__pg_stmt_t *s = &pg->stmts[pg->nstmts];
    s->name = strdup(name);
    s->sql = strdup(sql);
    if (!s->name || !s->sql)
        abort();
    s->nparams = nparams;
    pg->nstmts++;
    /* Idle connections prepare it now; busy ones when they become idle. */
    for (int i = 0; i < pg->size; i++)
        if (pg->conns[i].state == C_IDLE)
            conn_setup(&pg->conns[i]);
    return TG_OK;
}

static tg_pg_req_t *pg_submit(tg_pg_t *pg, int stmt, const char *sql, int nparams, const char *const *params,
                              tg_pg_cb cb, void *ud) {
    size_t size = sizeof(tg_pg_req_t) + (size_t)nparams * sizeof(char *);
    for (int i = 0; i < nparams; i++)
        if (params[i])
            size += strlen(params[i]) + 1;
    if (sql)
        size += strlen(sql) + 1;
    tg_pg_req_t *req = calloc(1, size);
    if (!req)
        abort();
    req->pg = pg;
    req->cb = cb;
    req->ud = ud;
    req->stmt = stmt;
    req->nparams = nparams;
    req->params = (const char **)(req + 1);
    char *p = (char *)(req->params + nparams);
    for (int i = 0; i < nparams; i++) {
        if (!params[i])
            continue;
        size_t n = strlen(params[i]) + 1;
        memcpy(p, params[i], n);
        req->params[i] = p;
        p += n;
    }
    if (sql) {
        memcpy(p, sql, strlen(sql) + 1);
        req->sql = p;
    }
    pg->stats.requests++;
    if (pg_unreachable(pg)) {
        /* Fail fast: an admin write gets its 503 now, a settlement goes to the spool now. */
        pg->stats.unreachable++;
        pg_defer(pg, req, tg_pg_err_not_connected);
        return req;
    }
    if (pg->queue.n >= TG_PG_MAX_QUEUE) {
        pg->stats.busy++;
        pg_defer(pg, req, tg_pg_err_busy);
        return req;
    }
    req->state = R_QUEUED;
    req->deadline = uv_now(pg->loop) + (uint64_t)pg->timeout_ms;
    q_push(&pg->queue, req);
    t_push(&pg->pending, req);
    if (pg->pending.head == req)
        pg_arm(pg);
    pg_dispatch(pg);
    return req;
}

tg_pg_req_t *tg_pg_exec(tg_pg_t *pg, const char *stmt, int nparams, const char *const *params, tg_pg_cb cb,
                        void *ud) {
    if (!pg || pg->closing || !stmt || nparams < 0 || (nparams > 0 && !params))
        return NULL;
    for (int i = 0; i < pg->nstmts; i++) {
        if (strcmp(pg->stmts[i].name, stmt) != 0)
            continue;
        if (pg->stmts[i].nparams != nparams) {
            tg_log_error("pg: statement \"%s\" takes %d parameter(s), got %d", stmt, pg->stmts[i].nparams, nparams);
            return NULL;
        }
        return pg_submit(pg, i, NULL, nparams, params, cb, ud);
    }
    tg_log_error("pg: unknown statement \"%s\"", stmt);
    return NULL;
}

tg_pg_req_t *tg_pg_query(tg_pg_t *pg, const char *sql, int nparams, const char *const *params, tg_pg_cb cb,
                         void *ud) {
    if (!pg || pg->closing || !sql || nparams < 0 || nparams > PG_MAX_PARAMS || (nparams > 0 && !params))
        return NULL;
    return pg_submit(pg, -1, sql, nparams, params, cb, ud);
}

void tg_pg_cancel(tg_pg_req_t *req) {
    if (!req)
        return;
    tg_pg_t *pg = req->pg;
    switch (req->state) {
    case R_QUEUED:
        q_remove(&pg->queue, req);
        t_remove(&pg->pending, req);
        break;
    case R_RUNNING:
        /* The connection stays busy until the server answers; the answer is dropped. */
        t_remove(&pg->pending, req);
        req->conn->req = NULL;
        break;
    case R_DEFERRED:
        q_remove(&pg->deferred, req);
        break;
    default:
        return; /* inside its own callback */
    }
    free(req);
}

void tg_pg_reconnect_now(tg_pg_t *pg) {
    if (!pg || pg->closing)
        return;
    for (int i = 0; i < pg->size; i++) {
        tg_pg_conn_t *c = &pg->conns[i];
        if (c->state != C_DOWN)
            continue;
        /* Requests wait for this attempt instead of failing fast before it is made. */
        c->connect_failed = 0;
        uv_timer_stop(&c->timer);
        conn_start(c);
    }
}

int tg_pg_connected(const tg_pg_t *pg) {
    int n = 0;
    for (int i = 0; pg && i < pg->size; i++)
        if (pg->conns[i].state == C_IDLE || pg->conns[i].state == C_BUSY)
            n++;
    return n;
}

const tg_pg_stats_t *tg_pg_stats(const tg_pg_t *pg) { return &pg->stats; }
