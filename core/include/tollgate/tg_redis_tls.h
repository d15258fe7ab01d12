/*
 * TLS to Redis for hiredis 0.14, which has none: an in-process tunnel per connection.
 * hiredis talks plaintext RESP over a local unix socket whose other end the tunnel owns;
 * the tunnel pumps those bytes through the TLS engine (tg_tls) to the Redis node over
 * TCP, on the same libuv loop. For the async client the socket is a one-shot listener
 * in a private directory (mode 0700, created once per process, each path unlinked as
 * soon as hiredis is connected), because hiredis 0.14 cannot adopt a connected fd in
 * async mode; blocking callers (`tollgate ledger`, `apply`) get a socketpair and a
 * thread that runs the tunnel on a loop of its own (hiredis's redisConnectFd).
 *
 * Settings are process-wide (tg_redis_tls_setup, from the config's redis_tls table, once
 * before any worker starts): one SSL_CTX, shared read-only by every worker.
 */
#ifndef TOLLGATE_TG_REDIS_TLS_H
#define TOLLGATE_TG_REDIS_TLS_H

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <uv.h>

#include "tollgate/tg_common.h"

typedef struct {
    const char *ca_file;     /* NULL: the system's CA store */
    const char *cert, *key;  /* a client certificate (mutual TLS), both or neither */
    const char *server_name; /* SNI and the name checked; NULL: the node's host */
    int verify;              /* 1: verify the certificate and the name (the default) */
} tg_redis_tls_opts_t;

/** Builds the process-wide client context. TG_OK, or TG_ERROR with the reason in err.
 *  Call once, before any thread uses a rediss:// URL. */
int tg_redis_tls_setup(const tg_redis_tls_opts_t *o, char *err, size_t errlen);
/** 1 once tg_redis_tls_setup has succeeded. */
int tg_redis_tls_ready(void);

typedef struct tg_rtls_s tg_rtls_t;
/** The tunnel could not be set up (connect or handshake failed): `why` for the log. */
typedef void (*tg_rtls_fail_cb)(void *ud, const char *why);
/** The tunnel's handles are all closed; t is freed after this returns. */
typedef void (*tg_rtls_closed_cb)(void *ud, tg_rtls_t *t);

/**
 * An async hiredis context connected through a new tunnel to host:port. NULL with the
 * reason in err (nothing to close). Otherwise *tun is the tunnel: it closes itself when
 * either side ends (hiredis then sees the connection closed); `fail` runs at most once,
 * before the handshake completed; `closed` runs exactly once, last.
 */
redisAsyncContext *tg_redis_tls_connect_async(uv_loop_t *loop, const char *host, int port, tg_rtls_t **tun,
                                              tg_rtls_fail_cb fail, tg_rtls_closed_cb closed, void *ud, char *err,
                                              size_t errlen);
/** The owner lets go: no more `fail` calls; the tunnel closes (`closed` still runs). */
void tg_rtls_close(tg_rtls_t *t);

/** A blocking hiredis context through a tunnel on a thread of its own, handshake done
 *  (waits at most timeout_ms). NULL with the reason in err. */
redisContext *tg_redis_tls_connect_sync(const char *host, int port, int timeout_ms, char *err, size_t errlen);

#endif
