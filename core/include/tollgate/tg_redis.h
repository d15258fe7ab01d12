/*
 * The per-worker Redis client: hiredis 0.14's async API on the worker's uv_loop
 * (redisLibuvAttach), plus what hiredis 0.14 lacks: a timeout per command, a connect
 * timeout, reconnection with exponential backoff and jitter, Lua scripts run by SHA with
 * a transparent reload on NOSCRIPT, Pub/Sub on a second connection that re-subscribes
 * after a reconnect, and counters for metrics.
 *
 * Failure is reported, never hidden: while the connection is down a command fails on the
 * next loop turn with tg_redis_err_disconnected (nothing is queued for later), so the
 * caller (the limiter) applies its fail-open / fail-closed rule at once.
 *
 * Ownership: the client owns its connections, script sources and subscriptions, and each
 * request until its callback has returned (or it is cancelled). A reply handed to a
 * callback belongs to hiredis and is freed after the callback returns. Everything runs
 * in the loop's thread. tg_redis_destroy() may be called from inside a callback; the
 * memory is released from the loop afterwards, so run the loop once more.
 */
#ifndef TOLLGATE_TG_REDIS_H
#define TOLLGATE_TG_REDIS_H

#include <hiredis/hiredis.h>
#include <uv.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_metrics.h"

typedef struct tg_redis_s tg_redis_t;
typedef struct tg_redis_req_s tg_redis_req_t;

/* The `err` values besides a Redis error reply's text; compare by pointer or text. */
extern const char tg_redis_err_timeout[];      /* "timeout": the reply did not come in time */
extern const char tg_redis_err_disconnected[]; /* "disconnected" */
extern const char tg_redis_err_shutdown[];     /* "shutdown": tg_redis_destroy() was called */

/**
 * The result of one command. `reply` is valid only during the callback and is NULL when
 * `err` is one of the constants above. `err` is NULL on success; for a Redis error reply
 * (REDIS_REPLY_ERROR) `reply` is that reply and `err` its text. After "timeout" or
 * "disconnected" the command may or may not have run in Redis. On a cluster, a command
 * whose connection was lost after it was sent gets "timeout"; "disconnected" there means
 * it was never sent (its node unreachable, its slot unserved).
 */
typedef void (*tg_redis_cb)(void *ud, redisReply *reply, const char *err);

/** A Pub/Sub message. When the subscriber connection comes up after it was lost or
 *  failed to connect, each subscriber gets one call with msg NULL and len 0 once its
 *  channel is subscribed again: messages may have been missed (drop cached state). */
typedef void (*tg_redis_msg_cb)(void *ud, const char *msg, size_t len);

/** Counters for /metrics; read in the client's loop thread. */
typedef struct {
    uint64_t commands;    /* accepted by tg_redis_command / _eval / _publish */
    uint64_t failed_fast; /* failed at once because the connection was down */
    uint64_t timeouts;
    uint64_t disconnects; /* established connections lost (either connection) */
    uint64_t connects;    /* connections established (either connection) */
    uint64_t script_loads; /* NOSCRIPT answered by loading the script */
    uint64_t resends;      /* idempotent scripts sent again after a lost answer */
    uint64_t redirects;    /* cluster: MOVED and ASK followed */
    uint64_t cluster_retries; /* cluster: TRYAGAIN, CLUSTERDOWN or READONLY, sent again */
    uint64_t map_reads;    /* cluster: CLUSTER SHARDS (or SLOTS) sent */
} tg_redis_stats_t;

/** A Redis URL taken apart: "redis://[[user]:password@]host[:port][/db]" (host may be a
 *  bracketed IPv6 literal; "redis://secret@host" is a password alone),
 *  "unix:///path/to.sock", or a Redis Cluster's seed nodes
 *  "redis-cluster://[[user]:password@]host[:port][,host[:port]...]" (database 0 only).
 *  "rediss://" and "rediss-cluster://" are the same over TLS (tg_redis_tls.h; the
 *  settings are the process's, from tg_redis_tls_setup).
 *  The strings are owned by the struct (tg_redis_url_free). */
typedef struct {
    char *host;        /* NULL for a socket */
    char *path;        /* the socket's path, NULL for TCP */
    char *user, *pass; /* NULL when not given */
    int port;          /* 6379 when not given */
    int db;            /* 0 when not given */
    int cluster;       /* redis-cluster://: host and port are the first seed */
    char *seeds;       /* redis-cluster://: "host:port,host:port..." as given */
    int tls;           /* rediss:// or rediss-cluster:// */
} tg_redis_url_t;

/** The one parser of Redis URLs (the client, `tollgate ledger`). TG_OK, or TG_ERROR for
 *  anything else (*u then holds nothing to free). */
int tg_redis_url_parse(const char *url, tg_redis_url_t *u);
void tg_redis_url_free(tg_redis_url_t *u);

/**
 * A blocking hiredis connection for one-shot commands (`tollgate ledger`), set up as the
 * client's are: AUTH with the URL's password (and user), SELECT its database. Each
 * step, and every later command, waits at most timeout_ms. Returns the context (the
 * caller frees it with redisFree), or NULL with the reason in err.
 */
redisContext *tg_redis_connect_sync(const char *url, int timeout_ms, char *err, size_t errlen);

/** tg_redis_connect_sync to node host:port with the URL's credentials; host NULL: the
 *  URL's own node (a cluster's: the first seed that answers). */
redisContext *tg_redis_connect_sync_node(const char *url, const char *host, int port, int timeout_ms, char *err,
                                         size_t errlen);

/** 1 for a redis-cluster:// URL. */
int tg_redis_url_is_cluster(const char *url);

/** redisCommandArgv on *c following MOVED (*c is replaced by a connection to the named
 *  node) and ASK, 5 times at most; the reply (the caller frees it) or NULL. */
redisReply *tg_redis_sync_argv(redisContext **c, const char *url, int timeout_ms, int argc, const char **argv,
                               const size_t *argvlen);

struct tg_redis_slotmap_s;
/** The slot map as node c tells it (CLUSTER SHARDS, else CLUSTER SLOTS); an empty host
 *  becomes c's. TG_OK or TG_ERROR. */
int tg_redis_sync_map(redisContext *c, struct tg_redis_slotmap_s *m);

/**
 * Creates the client and starts connecting. `url` is "redis://[[user]:password@]host
 * [:port][/db]", "unix:///path/to.sock" or "redis-cluster://[[user]:password@]host:port
 * [,host:port...]". Each connection starts with AUTH (when a password is given), SELECT
 * (db > 0) and CLIENT SETNAME tollgate:<pid>:cmd|sub, and is up once they have
 * succeeded. `timeout_ms` bounds each command from submission to reply; connecting
 * (setup included) may take max(timeout_ms, 1000). Returns NULL (logged) for a bad URL
 * or arguments. Host names are resolved with a blocking lookup on each connect: prefer
 * an address or a socket. Commands issued before the first connection attempt has
 * finished wait for it (within their timeout); later ones fail at once while the
 * connection is down.
 *
 * A redis-cluster:// URL makes the client cluster-aware: it reads the slot map from a
 * seed (CLUSTER SHARDS, or CLUSTER SLOTS before Redis 7), keeps one command connection
 * per primary, sends each command to the primary of its first key's slot (a script's
 * keys must share a hash tag), follows MOVED and ASK, sends again on TRYAGAIN /
 * CLUSTERDOWN / READONLY within the command's timeout, and reads the map again after a
 * redirection, a lost primary and every 5 s. Pub/Sub uses classic SUBSCRIBE on any one
 * node (a cluster forwards every PUBLISH to every node). Before the first map, commands
 * wait for it within their timeout.
 */
tg_redis_t *tg_redis_create(uv_loop_t *loop, const char *url, int timeout_ms);

/** Closes both connections. Every request whose callback has not run gets it now with
 *  tg_redis_err_shutdown (from inside this call). Safe to call from a callback. */
void tg_redis_destroy(tg_redis_t *r);

/**
 * Sends one command (binary-safe argv; argvlen may be NULL for C strings). The callback
 * runs exactly once, never from inside this call, unless the request is cancelled first.
 * Returns the request (valid until its callback returns or it is cancelled), or NULL
 * without calling back for bad arguments or a client being destroyed.
 */
tg_redis_req_t *tg_redis_command(tg_redis_t *r, tg_redis_cb cb, void *ud, int argc, const char **argv,
                                 const size_t *argvlen);

/** Registers a Lua script (the source is copied) and returns its id (>= 0), or TG_ERROR.
 *  Registering the same source twice returns the same id. */
int tg_redis_script_register(tg_redis_t *r, const char *lua_source);

/**
 * Runs script `script_id` with EVALSHA; `argv` holds the `nkeys` keys followed by the
 * other arguments (argc in all). On NOSCRIPT (after SCRIPT FLUSH or a failover) the
 * script is sent with EVAL, which loads it, and the command retried transparently,
 * within the same timeout. Same contract as tg_redis_command; NULL for an unknown id.
 */
tg_redis_req_t *tg_redis_eval(tg_redis_t *r, int script_id, int nkeys, int argc, const char **argv,
                              const size_t *argvlen, tg_redis_cb cb, void *ud);

/** How many more times tg_redis_eval_idempotent sends a script whose answer was lost:
 *  0.5 s, 1 s, 2 s, 4 s and 8 s after each loss. */
#define TG_REDIS_RESEND_TRIES 5
/** How many idempotent scripts one client keeps for a resend at once (bounded memory
 *  while Redis is away); beyond, a script is sent once. */
#define TG_REDIS_RESEND_PENDING_MAX 4096

/**
 * tg_redis_eval for a script that is idempotent (a second run changes nothing: it gives
 * back a lease or a hold that is already back): when its answer is lost
 * (tg_redis_err_timeout or tg_redis_err_disconnected, after which it may or may not have
 * run) it is sent again, TG_REDIS_RESEND_TRIES times at most, each resend counted in
 * stats.resends. For work nobody else would redo while this gateway lives. The callback
 * (may be NULL) runs once, never from inside this call, with the last answer: a reply, a
 * Redis error, the loss after the last try, or tg_redis_err_shutdown when the client is
 * destroyed meanwhile. Returns TG_OK, or TG_ERROR without calling back (bad arguments, a
 * client being destroyed). There is no cancel: the caller keeps `ud` alive until then.
 */
int tg_redis_eval_idempotent(tg_redis_t *r, int script_id, int nkeys, int argc, const char **argv,
                             const size_t *argvlen, tg_redis_cb cb, void *ud);

/** tg_redis_eval_idempotent for one plain command (a ZREM of a lease: a second run
 *  changes nothing). Same contract. */
int tg_redis_command_idempotent(tg_redis_t *r, int argc, const char **argv, const size_t *argvlen, tg_redis_cb cb,
                                void *ud);

/** The callback will not run; a late reply is dropped. Call it only before the callback
 *  has run (inside its own callback it does nothing). NULL is ignored. */
void tg_redis_cancel(tg_redis_req_t *req);

/** 1 when the command connection is up (cluster: a map is known and every primary's
 *  connection is up), else 0. */
int tg_redis_connected(const tg_redis_t *r);

/** The number of primaries commands go to: 1 for a single node; for a cluster, the
 *  map's (0 before it is known). */
int tg_redis_primaries(const tg_redis_t *r);

/** 1 when a script may name keys under different hash tags: a single node (a redis://
 *  URL) that answered INFO cluster with cluster_enabled:0 on its current connection; 0
 *  for a cluster, a node in cluster mode behind a redis:// URL, or before it is known. */
int tg_redis_one_keyspace(const tg_redis_t *r);

/** tg_redis_command sent to primary `primary` (0 <= primary < tg_redis_primaries)
 *  rather than by its key: for what reads one node's keyspace (SCAN). NULL for a
 *  primary out of range. Indexes follow the current map, which may change between
 *  calls: a scan over all of them may visit a node twice or miss one that joined. */
tg_redis_req_t *tg_redis_command_at(tg_redis_t *r, int primary, tg_redis_cb cb, void *ud, int argc, const char **argv,
                                    const size_t *argvlen);

/**
 * Subscribes `cb` to `channel` on the Pub/Sub connection (opened on first use, and
 * re-subscribed after every reconnect). Several callbacks may share a channel. There is
 * no unsubscribe: subscriptions live as long as the client. Returns TG_OK or TG_ERROR.
 */
int tg_redis_subscribe(tg_redis_t *r, const char *channel, tg_redis_msg_cb cb, void *ud);

/** PUBLISH on the command connection; the reply is the number of receivers. */
tg_redis_req_t *tg_redis_publish(tg_redis_t *r, const char *channel, const char *msg, size_t len, tg_redis_cb cb,
                                 void *ud);

/**
 * Commands issued during a loop iteration are written together just before the loop
 * polls, by a uv_prepare of the client's own. A loop owner that corks output of its own
 * can take that over: after tg_redis_owner_flushes(), the owner must call
 * tg_redis_flush() from a uv_prepare that runs on every iteration, after its own output.
 * The gateway's workers do this so that a response's bytes leave before the Redis
 * bookkeeping of the request they end (the limits release), not just behind it.
 */
void tg_redis_owner_flushes(tg_redis_t *r);
void tg_redis_flush(tg_redis_t *r);

/** The client's counters. */
const tg_redis_stats_t *tg_redis_stats(const tg_redis_t *r);
/** Registers the client's collector (tollgate_redis_total) on a worker's metrics; NULL r: none. */
void tg_redis_metrics(tg_metrics_t *m, const tg_redis_t *r);

#endif
