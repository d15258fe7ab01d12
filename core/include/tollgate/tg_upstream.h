/*
 * The upstream HTTP/1.1 client: one tg_upstream_t per (worker, upstream base URL), with
 * a pool of idle keep-alive connections, cached DNS (uv_getaddrinfo), optional TLS with
 * certificate verification, and connect / first-byte / idle timeouts.
 *
 * A call sends one request on one connection and reports, in order: on_head once, then
 * on_body any number of times (de-chunked), then exactly one of on_done or on_error.
 * After either the call object is gone. tg_upcall_abort() ends a call from the caller's
 * side at once (the connection is closed, so the upstream sees the disconnect) and
 * guarantees no further callbacks.
 */
#ifndef TOLLGATE_TG_UPSTREAM_H
#define TOLLGATE_TG_UPSTREAM_H

#include <openssl/ssl.h>
#include <uv.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_config.h"

typedef struct tg_upstream_s tg_upstream_t;
typedef struct tg_upcall_s tg_upcall_t;

typedef enum {
    TG_UPERR_CONNECT = 1,   /* DNS, TCP connect or TLS handshake failed */
    TG_UPERR_TIMEOUT_CONNECT,
    TG_UPERR_TIMEOUT_FIRST_BYTE,
    TG_UPERR_TIMEOUT_IDLE,
    TG_UPERR_RESET,         /* the connection closed before the response ended */
    TG_UPERR_PROTOCOL,      /* the response was not valid HTTP */
} tg_uperr_t;

/** The response head, valid during on_head. */
typedef struct {
    int status;
    const char *content_type;  /* NUL-terminated, or NULL */
    const char *retry_after;   /* NUL-terminated, or NULL */
    const char *extra_headers; /* forwardable headers as "Name: value\r\n" lines */
    int64_t content_length;    /* the body's length when the head states it, else -1 */
} tg_uphead_t;

typedef struct {
    void (*on_head)(void *ud, const tg_uphead_t *head);
    void (*on_body)(void *ud, const char *p, size_t n);
    void (*on_done)(void *ud);
    void (*on_error)(void *ud, tg_uperr_t err, const char *msg);
} tg_upcall_cbs_t;

/** Parses base_url and creates the per-worker client. NULL + err on a bad URL. */
tg_upstream_t *tg_upstream_create(uv_loop_t *loop, const tg_upstream_config_t *cfg,
                                  SSL_CTX *tls_ctx, char *err, size_t errlen);
/** Closes idle connections and frees the client once they are closed. No calls may be
 *  active. */
void tg_upstream_destroy(tg_upstream_t *u);
/** The path prefix of the base URL ("/v1"), and its Host header value. */
const char *tg_upstream_path_prefix(const tg_upstream_t *u);
const char *tg_upstream_host_header(const tg_upstream_t *u);
const char *tg_upstream_name(const tg_upstream_t *u);

/**
 * Starts a call. `request` holds the complete request bytes (head and body); the call
 * takes it over (the caller's buffer is emptied). Never fails synchronously: errors are
 * reported through on_error from a later loop turn.
 */
tg_upcall_t *tg_upcall_start(tg_upstream_t *u, tg_buf_t *request, const tg_upcall_cbs_t *cbs, void *ud);
/** Stops reading the response (back-pressure from a slow client) / resumes. */
void tg_upcall_pause(tg_upcall_t *c);
void tg_upcall_resume(tg_upcall_t *c);
/** Ends the call now; no callback runs afterwards. */
void tg_upcall_abort(tg_upcall_t *c);
/** Nanoseconds at which the request was fully written to the upstream (0 if not yet). */
uint64_t tg_upcall_sent_ns(const tg_upcall_t *c);

#endif
