/*
 * TLS over libuv streams with OpenSSL memory BIOs. The engine does no I/O of its own:
 * the owner feeds it ciphertext read from the socket and sends whatever ciphertext it
 * produces, so the same code serves the client listener and the upstream connections.
 */
#ifndef TOLLGATE_TG_TLS_H
#define TOLLGATE_TG_TLS_H

#include <openssl/ssl.h>

#include "tollgate/tg_common.h"

typedef struct tg_tls_s tg_tls_t;

/** A server context from PEM files. Returns NULL and fills err on failure. */
SSL_CTX *tg_tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen);
/** A client context that verifies peers against ca_file (NULL = system store) when verify. */
SSL_CTX *tg_tls_client_ctx(const char *ca_file, int verify, char *err, size_t errlen);

/** Creates an engine; `host` (client side) sets SNI and the name checked. Owner destroys. */
tg_tls_t *tg_tls_create(SSL_CTX *ctx, int is_server, const char *host);
void tg_tls_destroy(tg_tls_t *t);

/**
 * Feeds ciphertext from the network. Decrypted bytes are appended to `plain`; bytes
 * that must be sent to the peer (handshake, alerts) are appended to `net_out`.
 * Returns 0, or TG_ERROR when the session failed (the connection must be closed).
 */
int tg_tls_feed(tg_tls_t *t, const char *in, size_t n, tg_buf_t *plain, tg_buf_t *net_out);
/** Encrypts plaintext (buffered until the handshake completes) into net_out. */
int tg_tls_write(tg_tls_t *t, const char *p, size_t n, tg_buf_t *net_out);
/** Starts a client handshake; the ClientHello lands in net_out. */
int tg_tls_connect(tg_tls_t *t, tg_buf_t *net_out);
int tg_tls_handshake_done(const tg_tls_t *t);
/** Adds a client certificate chain and its key (PEM) to a client context. TG_OK, or
 *  TG_ERROR with the reason in err. */
int tg_tls_client_cert(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errlen);
/** Client side: the peer's certificate must name this IP address (an IP literal host:
 *  no SNI is sent for it, and tg_tls_create got NULL). TG_OK or TG_ERROR. */
int tg_tls_expect_ip(tg_tls_t *t, const char *ip);
/** Why the session failed, for a log line: the OpenSSL error and, when the peer's
 *  certificate was refused, the verification's verdict. Clears the error queue. */
void tg_tls_describe_error(const tg_tls_t *t, char *buf, size_t n);
/** The last OpenSSL error as text, for logs. */
const char *tg_tls_last_error(void);

#endif
