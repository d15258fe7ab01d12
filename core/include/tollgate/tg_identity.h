/*
 * Identities that expire (issue #19): accounts whose upstream credential is an access
 * token the gateway obtains and renews — a Microsoft Entra ID app's client credentials
 * (Azure OpenAI), a Google service account's key (Vertex AI: an RS256-signed JWT
 * exchanged for a token) or an OAuth refresh token (the refresh_token grant; a rotated
 * refresh token replaces the stored one).
 *
 * Each worker keeps the current access token of each such account it used. A request
 * takes it with tg_identity_token: at once while it is valid (no I/O on the request
 * path), else it waits for the refresh. A refresh starts when the token enters its last
 * quarter of life (at most 5 minutes before it expires), while requests keep using it:
 *
 *   1. the fleet's copy, Redis {a:<id>}:token (sealed, with its expiry), if another
 *      worker or instance renewed it already;
 *   2. else the account's lock, {a:<id>}:token_lock (SET NX PX): one holder in the
 *      fleet at a time; the others poll step 1 until the holder has published;
 *   3. the holder re-reads the account from Postgres (so it always sends the latest
 *      refresh token, and takes a token renewed meanwhile instead of asking again),
 *      asks the token endpoint (non-blocking, on the worker's loop), writes the access
 *      token and a rotated refresh token sealed to Postgres, publishes the token in
 *      Redis with a TTL to its expiry, and releases the lock.
 *
 * A refresh that fails marks the account in Postgres (auth_error: invalid_grant,
 * invalid_client, network, ...), cools it down (cooldown_until) and tells every instance
 * to reload its snapshot; waiting requests get the reason. A token the upstream refused
 * (401) is never used again (tg_identity_rejected): the next request refreshes. Tokens
 * are never logged.
 */
#ifndef TOLLGATE_TG_IDENTITY_H
#define TOLLGATE_TG_IDENTITY_H

#include <openssl/evp.h>
#include <uv.h>

#include "tollgate/tg_accounts.h"
#include "tollgate/tg_metrics.h"
#include "tollgate/tg_state.h"

/* An account's identity kind (accounts.auth). */
enum { TG_AUTH_KEY = 0, TG_AUTH_ENTRA, TG_AUTH_SERVICE_ACCOUNT, TG_AUTH_OAUTH };
/** The kind named s ("key", "entra", "service_account", "oauth"), or -1. */
int tg_auth_parse(const char *s);

/** Microsoft Entra ID's token endpoint host and the scope of Azure OpenAI. */
#define TG_ENTRA_AUTHORITY "https://login.microsoftonline.com"
#define TG_ENTRA_SCOPE "https://cognitiveservices.azure.com/.default"
/** Google's token endpoint (a key's token_uri) and the scope Vertex AI takes. */
#define TG_GOOGLE_TOKEN_URI "https://oauth2.googleapis.com/token"
#define TG_GOOGLE_SCOPE "https://www.googleapis.com/auth/cloud-platform"
/** The Claude-on-Vertex request body's version (in the body, not a header). */
#define TG_VERTEX_ANTHROPIC_VERSION "vertex-2023-10-16"

/** A Google service account's JSON key, parsed. */
typedef struct {
    char *client_email;
    char *private_key_id; /* "" when the key has none */
    char *token_uri;      /* the key's, or TG_GOOGLE_TOKEN_URI */
    EVP_PKEY *key;        /* RSA */
} tg_sa_key_t;

/** Parses a service account key file's JSON. TG_OK, or TG_ERROR with one line in err
 *  (not JSON, not a service_account key, a field missing, a private key that is not an
 *  RSA key in PEM). */
int tg_sa_key_parse(const char *json, size_t n, tg_sa_key_t *out, char *err, size_t errlen);
void tg_sa_key_free(tg_sa_key_t *k);
/** Appends the signed assertion (RS256 JWT: iss, scope, aud, iat, exp = iat + 3600). */
int tg_sa_jwt(const tg_sa_key_t *k, const char *aud, const char *scope, int64_t now_s, tg_buf_t *out);

/**
 * Checks an account's identity as the admin API and apply write it: the kind against
 * the provider (a vertex account needs a service_account, entra an azure one), a
 * service account key that parses, the settings each kind needs (settings NULL: not
 * checked). `auth` NULL (not written): a JSON credential is read as a service account
 * key, anything else as a key.
 * Returns NULL, or why not (a static message or one written into msg).
 */
const char *tg_identity_check(const char *provider, const char *auth, const char *credential, size_t credlen,
                              const json_t *settings, char *msg, size_t msglen);

typedef struct tg_identity_s tg_identity_t;
typedef struct tg_identity_wait_s tg_identity_wait_t;
/** A waiting request's answer: err NULL when the account has a token now (ask again),
 *  else why the refresh failed. */
typedef void (*tg_identity_cb)(void *ud, const char *token, const char *err);

tg_identity_t *tg_identity_create(uv_loop_t *loop, tg_state_t *st, tg_accounts_t *accounts, const tg_config_t *cfg);
void tg_identity_destroy(tg_identity_t *id);
/**
 * The account's access token: TG_OK with *token (valid until the caller returns to the
 * loop) and *gen (which token it is, for tg_identity_rejected), TG_AGAIN with *wait (cb
 * runs once, from a later loop turn: ask again), or TG_ERROR with *token set to the
 * reason (the account's last refresh failed moments ago).
 */
int tg_identity_token(tg_identity_t *id, const tg_account_t *acc, tg_identity_cb cb, void *ud, const char **token,
                      uint64_t *gen, tg_identity_wait_t **wait);
/** Stops waiting: cb will not run. NULL is ignored. */
void tg_identity_cancel(tg_identity_wait_t *w);
/** The upstream refused this token (401): it is not used again; the next request
 *  refreshes. */
void tg_identity_rejected(tg_identity_t *id, int64_t account_id, uint64_t gen);
/** Registers the counters (tollgate_identity_*) on a worker's metrics. */
void tg_identity_metrics(tg_metrics_t *m, const tg_identity_t *id);
/** Appends per-account gauges: this worker's token expiry, and the snapshot's failed
 *  refreshes (tollgate_account_auth_error{reason}). */
void tg_identity_render(const tg_identity_t *id, const tg_snapshot_t *s, tg_buf_t *out);

#endif
