/*
 * An asynchronous Postgres connection pool for one worker: `size` libpq connections in
 * non-blocking mode, each driven by a uv_poll on its socket, all in the worker's loop
 * thread (no locks). Requests queue FIFO while every connection is busy or down; a
 * connection that drops is re-established with exponential backoff and jitter, and the
 * queued requests run when one comes back, each until its own timeout — unless every
 * connection's latest attempt to connect failed: then requests fail at once with
 * tg_pg_err_not_connected until one connects. Each connect takes the conninfo anew, so a
 * multi-host conninfo with target_session_attrs=read-write follows a promoted standby.
 *
 * Ownership: the pool owns its connections, its copies of every string passed in, and
 * each request until that request's callback has returned (or it is cancelled). A
 * PGresult handed to a callback belongs to the pool and is PQclear()ed after the callback
 * returns. tg_pg_destroy() may be called from inside a callback; the pool's memory is
 * released from the loop once its handles have closed, so run the loop afterwards.
 */
#ifndef TOLLGATE_TG_PG_H
#define TOLLGATE_TG_PG_H

#include <libpq-fe.h>
#include <uv.h>

#include "tollgate/tg_common.h"

typedef struct tg_pg_s tg_pg_t;
typedef struct tg_pg_req_s tg_pg_req_t;

/** Requests waiting for a connection, at most; one more fails with tg_pg_err_busy. */
#define TG_PG_MAX_QUEUE 10000
/** How long establishing a connection (and preparing its statements) may take. */
#define TG_PG_CONNECT_TIMEOUT_MS 5000

/*
 * The `err` values a callback can get besides a server error text. They are constants:
 * compare by pointer (or by text).
 */
/** The request's timeout expired. If it was on the wire, the statement was cancelled
 *  (best effort, PQcancel) and may or may not have taken effect. */
extern const char tg_pg_err_timeout[];       /* "timeout" */
/** The timeout expired while no connection was up, or the pool is unreachable (every
 *  connection down and its latest attempt to connect failed: such a request fails on
 *  the next loop turn, and so does every queued one when the pool becomes unreachable):
 *  the statement never ran. */
extern const char tg_pg_err_not_connected[]; /* "not connected" */
/** The queue was full (TG_PG_MAX_QUEUE): the statement never ran. */
extern const char tg_pg_err_busy[];          /* "busy" */
/** tg_pg_destroy() was called: the statement never ran or its result is unknown. */
extern const char tg_pg_err_shutdown[];      /* "shutdown" */
/** The connection broke while the statement was on the wire: it may or may not have
 *  taken effect (settle by asking). `res`, when non-NULL, holds libpq's error result. */
extern const char tg_pg_err_conn_lost[];     /* "connection lost" */

/**
 * The result of one request. `res` is valid only during the callback (the pool
 * PQclear()s it). `err` is NULL on success; otherwise one of the constants above or the
 * server's error text (PG_DIAG_MESSAGE_PRIMARY), in which case `res` is non-NULL and
 * PQresultErrorField(res, PG_DIAG_SQLSTATE) gives the SQLSTATE (e.g. "23505").
 */
typedef void (*tg_pg_cb)(void *ud, const PGresult *res, const char *err);

/** Counters for /metrics; read in the pool's loop thread. */
typedef struct {
    uint64_t requests;    /* accepted by tg_pg_exec / tg_pg_query */
    uint64_t errors;      /* answered with a server error */
    uint64_t timeouts;    /* tg_pg_err_timeout and tg_pg_err_not_connected */
    uint64_t busy;        /* refused with tg_pg_err_busy */
    uint64_t disconnects; /* live connections lost (timeouts reset one, too) */
    uint64_t connects;    /* connections established */
    uint64_t unreachable; /* failed fast with tg_pg_err_not_connected: no server to try */
} tg_pg_stats_t;

/**
 * Creates the pool and starts connecting `size` connections to `conninfo` (a libpq
 * conninfo string or URI). Returns NULL only on bad arguments. `query_timeout_ms` bounds
 * each request from submission to answer, queueing included. Host names in conninfo
 * are resolved with a blocking lookup on each connect: prefer an address (hostaddr=) or
 * a unix socket directory.
 */
tg_pg_t *tg_pg_create(uv_loop_t *loop, const char *conninfo, int size, int query_timeout_ms);

/**
 * Closes the connections. Every request whose callback has not run gets it now, with
 * tg_pg_err_shutdown (from inside this call). The memory is released from the loop once
 * the handles have closed. Safe to call from a pool callback.
 */
void tg_pg_destroy(tg_pg_t *pg);

/**
 * Registers a prepared statement `name` with `nparams` parameters. It is prepared on
 * every connection (again after each reconnect) before that connection runs anything
 * else, so it may be registered before or after the connections come up. A statement
 * that fails to prepare is logged; running it then fails with the server's error.
 * Returns TG_OK, or TG_ERROR for a duplicate name or bad arguments.
 */
int tg_pg_prepare(tg_pg_t *pg, const char *name, const char *sql, int nparams);

/**
 * Runs the registered statement `stmt` with text parameters (a NULL entry is SQL NULL);
 * the strings are copied. The callback runs exactly once, never from inside this call,
 * unless the request is cancelled first. Returns the request (valid until its callback
 * returns or it is cancelled), or NULL without calling back when the call is wrong: an
 * unknown statement, a parameter count that differs from the registered one, or a pool
 * being destroyed.
 */
tg_pg_req_t *tg_pg_exec(tg_pg_t *pg, const char *stmt, int nparams, const char *const *params,
                        tg_pg_cb cb, void *ud);

/** Ad-hoc SQL (one statement) with $1.. text parameters. Same contract as tg_pg_exec. */
tg_pg_req_t *tg_pg_query(tg_pg_t *pg, const char *sql, int nparams, const char *const *params,
                         tg_pg_cb cb, void *ud);

/**
 * The caller no longer wants the result: the callback will not run. A request already on
 * the wire completes in the server and its result is discarded. Call it only before the
 * callback has run (inside its own callback it does nothing). NULL is ignored.
 */
void tg_pg_cancel(tg_pg_req_t *req);

/**
 * Connections that are down try again now instead of after their backoff, and requests
 * wait for that attempt. For a sign that a server takes writes again (another instance
 * wrote: a failover is over). Runs no callback.
 */
void tg_pg_reconnect_now(tg_pg_t *pg);

/** The number of connections that are up and ready (statements prepared). */
int tg_pg_connected(const tg_pg_t *pg);

/** The pool's counters. */
const tg_pg_stats_t *tg_pg_stats(const tg_pg_t *pg);

#endif
