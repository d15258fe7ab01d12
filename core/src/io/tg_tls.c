/*
 * TLS engine over memory BIOs (see tg_tls.h). Plaintext written before the handshake
 * completes is kept in `pending` and flushed when it does.
 */
#include "tollgate/tg_tls.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>

struct tg_tls_s {
    SSL *ssl;
    BIO *rbio; /* network -> SSL */
    BIO *wbio; /* SSL -> network */
    tg_buf_t pending;
    int done;
};

static __thread char tls_errbuf[256];

const char *tg_tls_last_error(void) {
    unsigned long e = ERR_get_error();
    if (!e)
        return "unknown TLS error";
    ERR_error_string_n(e, tls_errbuf, sizeof(tls_errbuf));
    ERR_clear_error();
    return tls_errbuf;
}

SSL_CTX *tg_tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx)
        goto fail;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
        goto fail;
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)
        goto fail;
    if (SSL_CTX_check_private_key(ctx) != 1)
        goto fail;
    return ctx;
fail:
    snprintf(err, errlen, "tls: %s", tg_tls_last_error());
    SSL_CTX_free(ctx);
    return NULL;
}

SSL_CTX *tg_tls_client_ctx(const char *ca_file, int verify, char *err, size_t errlen) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        goto fail;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        int ok = ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
                         : SSL_CTX_set_default_verify_paths(ctx);
        if (ok != 1)
            goto fail;
    }
    return ctx;
fail:
    snprintf(err, errlen, "tls: %s", tg_tls_last_error());
    SSL_CTX_free(ctx);
    return NULL;
}

tg_tls_t *tg_tls_create(SSL_CTX *ctx, int is_server, const char *host) {
    tg_tls_t *t = calloc(1, sizeof(*t));
    if (!t)
        abort();
    t->ssl = SSL_new(ctx);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (!t->ssl || !t->rbio || !t->wbio)
        abort();
    BIO_set_mem_eof_return(t->rbio, -1);
    SSL_set_bio(t->ssl, t->rbio, t->wbio);
    if (is_server) {
        SSL_set_accept_state(t->ssl);
    } else {
        SSL_set_connect_state(t->ssl);
        if (host) {
            SSL_set_tlsext_host_name(t->ssl, host);
            SSL_set1_host(t->ssl, host);
        }
    }
    tg_buf_init(&t->pending);
    return t;
}

void tg_tls_destroy(tg_tls_t *t) {
    if (!t)
        return;
    SSL_free(t->ssl); /* frees both BIOs */
    tg_buf_free(&t->pending);
    free(t);
}

static void drain_wbio(tg_tls_t *t, tg_buf_t *net_out) {
    char tmp[16384];
    int n;
    while ((n = BIO_read(t->wbio, tmp, sizeof(tmp))) > 0)
        tg_buf_append(net_out, tmp, (size_t)n);
}

static int encrypt_all(tg_tls_t *t, const char *p, size_t n, tg_buf_t *net_out) {
    while (n > 0) {
        int w = SSL_write(t->ssl, p, (int)TG_MIN(n, (size_t)1 << 30));
        if (w <= 0)
            return TG_ERROR;
        p += w;
        n -= (size_t)w;
        drain_wbio(t, net_out);
    }
    return TG_OK;
}

static int advance(tg_tls_t *t, tg_buf_t *plain, tg_buf_t *net_out) {
    if (!t->done) {
        int r = SSL_do_handshake(t->ssl);
        drain_wbio(t, net_out);
        if (r != 1) {
            int e = SSL_get_error(t->ssl, r);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
                return TG_OK;
            return TG_ERROR;
        }
        t->done = 1;
        if (t->pending.len) {
            int rc = encrypt_all(t, t->pending.data, t->pending.len, net_out);
            tg_buf_free(&t->pending);
            if (rc != TG_OK)
                return rc;
        }
    }
    for (;;) {
        tg_buf_reserve(plain, 16384);
        int r = SSL_read(t->ssl, plain->data + plain->len, 16384);
        if (r > 0) {
            plain->len += (size_t)r;
            plain->data[plain->len] = '\0';
            continue;
        }
        drain_wbio(t, net_out);
        int e = SSL_get_error(t->ssl, r);
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
            return TG_OK;
        if (e == SSL_ERROR_ZERO_RETURN)
            return TG_OK;
        return TG_ERROR;
    }
}

int tg_tls_feed(tg_tls_t *t, const char *in, size_t n, tg_buf_t *plain, tg_buf_t *net_out) {
    while (n > 0) {
        int w = BIO_write(t->rbio, in, (int)TG_MIN(n, (size_t)1 << 30));
        if (w <= 0)
            return TG_ERROR;
        in += w;
        n -= (size_t)w;
    }
    return advance(t, plain, net_out);
}

int tg_tls_write(tg_tls_t *t, const char *p, size_t n, tg_buf_t *net_out) {
    if (!t->done) {
        tg_buf_append(&t->pending, p, n);
        return TG_OK;
    }
    return encrypt_all(t, p, n, net_out);
}

int tg_tls_connect(tg_tls_t *t, tg_buf_t *net_out) {
    int r = SSL_do_handshake(t->ssl);
    drain_wbio(t, net_out);
    if (r == 1) {
        t->done = 1;
        return TG_OK;
    }
    int e = SSL_get_error(t->ssl, r);
    return (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) ? TG_OK : TG_ERROR;
}

int tg_tls_handshake_done(const tg_tls_t *t) { return t->done; }

int tg_tls_client_cert(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errlen) {
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1 || SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, errlen, "tls: client certificate: %s", tg_tls_last_error());
        ERR_clear_error();
        return TG_ERROR;
    }
    return TG_OK;
}

int tg_tls_expect_ip(tg_tls_t *t, const char *ip) {
    return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), ip) == 1 ? TG_OK : TG_ERROR;
}

void tg_tls_describe_error(const tg_tls_t *t, char *buf, size_t n) {
    long v = SSL_get_verify_result(t->ssl);
    const char *e = ERR_peek_error() ? tg_tls_last_error() : "the session failed";
    if (v != X509_V_OK)
        snprintf(buf, n, "%s (certificate: %s)", e, X509_verify_cert_error_string(v));
    else
        snprintf(buf, n, "%s", e);
    ERR_clear_error();
}
