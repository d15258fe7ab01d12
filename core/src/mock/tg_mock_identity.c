/*
 * The mock upstream's identity provider: token endpoints that issue access tokens with
 * a short, configurable lifetime, and the check of those tokens on the API routes
 * (401 once expired, or never issued). Tests read how many token requests came.
 *
 *   POST <anything>/token   (application/x-www-form-urlencoded), by grant_type:
 *     client_credentials    Microsoft Entra ID: client_id and client_secret must be a
 *                           registered client (else 401 invalid_client), scope required
 *                           (else 400 invalid_scope)
 *     urn:ietf:params:oauth:grant-type:jwt-bearer
 *                           Google: the assertion is an RS256 JWT whose signature is
 *                           verified with the registered public key of its "iss" (a
 *                           service account's client_email); aud, scope, iat and exp
 *                           (at most an hour after iat, not past) checked; else 400
 *                           invalid_grant
 *     refresh_token         the refresh token must be live (else 400 invalid_grant;
 *                           one that was rotated away counts as a reuse); with rotation
 *                           the answer carries a new refresh token and the old dies
 *   Answers {"access_token":"mt-...","token_type":"Bearer","expires_in":S} and, for the
 *   refresh_token grant, "refresh_token".
 *
 *   POST /_mock/identity {"lifetime_ms":N, "clients":{"<id>":"<secret>"},
 *        "service_accounts":{"<client_email>":"<public key PEM>"},
 *        "refresh_tokens":["rt-..."], "rotate":true}
 *        adds to the configuration (lifetime default 3600 s)
 *   GET  /_mock/identity {"token_requests","by_grant":{...},"issued","refused",
 *        "expired_presented","unknown_presented","refresh_reuse","refresh_tokens":[live],
 *        "issues":[{"grant":"c"|"j"|"r","at_ms"}]} (each token issued, in order)
 */
#include "tg_mock_internal.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *tok;
    int64_t exp_ms;
    int64_t at_ms;
    char grant; /* 'c' client credentials, 'j' JWT bearer, 'r' refresh token */
} issued_t;

typedef struct {
    char *email;
    EVP_PKEY *key;
} sa_t;

static struct {
    pthread_mutex_t mu;
    int64_t lifetime_ms;
    int rotate;
    json_t *clients;  /* id -> secret */
    sa_t *sas;
    size_t nsas;
    json_t *live_rt;  /* refresh token -> true */
    json_t *dead_rt;  /* rotated away */
    issued_t *issued;
    size_t nissued, capissued;
    uint64_t seq;
    long long requests, by_cc, by_jwt, by_rt, refused, expired, unknown, reuse;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .lifetime_ms = 3600000};

static void reset_locked(void) {
    json_decref(g.clients);
    json_decref(g.live_rt);
    json_decref(g.dead_rt);
    g.clients = g.live_rt = g.dead_rt = NULL;
    for (size_t i = 0; i < g.nsas; i++) {
        free(g.sas[i].email);
        EVP_PKEY_free(g.sas[i].key);
    }
    free(g.sas);
    g.sas = NULL;
    g.nsas = 0;
    for (size_t i = 0; i < g.nissued; i++)
        free(g.issued[i].tok);
    free(g.issued);
    g.issued = NULL;
    g.nissued = g.capissued = 0;
    g.lifetime_ms = 3600000;
    g.rotate = 0;
    g.requests = g.by_cc = g.by_jwt = g.by_rt = g.refused = g.expired = g.unknown = g.reuse = 0;
}

void tg_mock_id_reset(void) {
    pthread_mutex_lock(&g.mu);
    reset_locked();
    pthread_mutex_unlock(&g.mu);
}

static void ensure_locked(void) {
    if (!g.clients)
        g.clients = json_object();
    if (!g.live_rt)
        g.live_rt = json_object();
    if (!g.dead_rt)
        g.dead_rt = json_object();
}

const char *tg_mock_id_config(const char *body, size_t len) {
    json_t *j = json_loadb(body, len, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return "the body must be a JSON object";
    }
    const char *err = NULL;
    pthread_mutex_lock(&g.mu);
    ensure_locked();
    json_t *v;
    if (json_is_integer(v = json_object_get(j, "lifetime_ms")) && json_integer_value(v) > 0)
        g.lifetime_ms = json_integer_value(v);
    if ((v = json_object_get(j, "rotate")))
        g.rotate = json_is_true(v);
    const char *k;
    json_t *e;
    json_object_foreach(json_object_get(j, "clients"), k, e) if (json_is_string(e))
        json_object_set(g.clients, k, e);
    size_t i;
    json_array_foreach(json_object_get(j, "refresh_tokens"), i, e) if (json_is_string(e))
        json_object_set_new(g.live_rt, json_string_value(e), json_true());
    json_object_foreach(json_object_get(j, "service_accounts"), k, e) {
        const char *pem = json_string_value(e);
        BIO *bio = pem ? BIO_new_mem_buf(pem, (int)strlen(pem)) : NULL;
        EVP_PKEY *key = bio ? PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL) : NULL;
        BIO_free(bio);
        if (!key) {
            err = "a service account's public key is not a PEM public key";
            continue;
        }
        g.sas = realloc(g.sas, (g.nsas + 1) * sizeof(*g.sas));
        g.sas[g.nsas++] = (sa_t){strdup(k), key};
    }
    pthread_mutex_unlock(&g.mu);
    json_decref(j);
    return err;
}

void tg_mock_id_stats(tg_buf_t *out) {
    pthread_mutex_lock(&g.mu);
    tg_buf_printf(out,
                  "{\"token_requests\":%lld,\"by_grant\":{\"client_credentials\":%lld,\"jwt_bearer\":%lld,"
                  "\"refresh_token\":%lld},\"issued\":%zu,\"refused\":%lld,\"expired_presented\":%lld,"
                  "\"unknown_presented\":%lld,\"refresh_reuse\":%lld,\"refresh_tokens\":[",
                  g.requests, g.by_cc, g.by_jwt, g.by_rt, g.nissued, g.refused, g.expired, g.unknown, g.reuse);
    const char *k;
    json_t *e;
    int first = 1;
    if (g.live_rt)
        json_object_foreach(g.live_rt, k, e) {
            tg_buf_appends(out, first ? "\"" : ",\"");
            first = 0;
            tg_buf_append_json_escaped(out, k, strlen(k));
            tg_buf_appends(out, "\"");
        }
    tg_buf_appends(out, "],\"issues\":[");
    for (size_t i = 0; i < g.nissued; i++)
        tg_buf_printf(out, "%s{\"grant\":\"%c\",\"at_ms\":%lld}", i ? "," : "", g.issued[i].grant,
                      (long long)g.issued[i].at_ms);
    tg_buf_appends(out, "]}");
    pthread_mutex_unlock(&g.mu);
}

int tg_mock_id_is_token_path(const char *path, size_t n) { return n >= 6 && !memcmp(path + n - 6, "/token", 6); }

/* The value of form field `name` (decoded) into out; 0 if absent. */
static int form_get(const char *body, size_t n, const char *name, tg_buf_t *out) {
    size_t nl = strlen(name);
    out->len = 0;
    for (const char *p = body, *end = body + n; p < end;) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *e = amp ? amp : end;
        if ((size_t)(e - p) > nl && !memcmp(p, name, nl) && p[nl] == '=') {
            for (const char *c = p + nl + 1; c < e; c++) {
                unsigned v;
                if (*c == '%' && e - c >= 3 && sscanf(c + 1, "%2x", &v) == 1) {
                    char ch = (char)v;
                    tg_buf_append(out, &ch, 1);
                    c += 2;
                } else {
                    tg_buf_append(out, *c == '+' ? " " : c, 1);
                }
            }
            tg_buf_append(out, "", 1);
            out->len--;
            return 1;
        }
        p = e + 1;
    }
    return 0;
}

static int b64url_dec(const char *s, size_t n, tg_buf_t *out) {
    tg_buf_t t;
    tg_buf_init(&t);
    for (size_t i = 0; i < n; i++)
        tg_buf_append(&t, s[i] == '-' ? "+" : s[i] == '_' ? "/" : &s[i], 1);
    while (t.len % 4)
        tg_buf_append(&t, "=", 1);
    tg_buf_reserve(out, t.len);
    int len = EVP_DecodeBlock((unsigned char *)out->data, (const unsigned char *)t.data, (int)t.len);
    int pad = t.len >= 2 ? (t.data[t.len - 1] == '=') + (t.data[t.len - 2] == '=') : 0;
    tg_buf_free(&t);
    if (len < 0)
        return -1;
    out->len = (size_t)(len - pad);
    out->data[out->len] = '\0';
    return 0;
}

/* Verifies a service account's assertion; NULL or why not. */
static const char *jwt_check_locked(const char *jwt) {
    const char *d1 = strchr(jwt, '.'), *d2 = d1 ? strchr(d1 + 1, '.') : NULL;
    if (!d1 || !d2 || strchr(d2 + 1, '.'))
        return "the assertion is not a JWT";
    tg_buf_t h, c, sig;
    tg_buf_init(&h);
    tg_buf_init(&c);
    tg_buf_init(&sig);
    const char *why = NULL;
    json_t *hj = NULL, *cj = NULL;
    if (b64url_dec(jwt, (size_t)(d1 - jwt), &h) || b64url_dec(d1 + 1, (size_t)(d2 - d1 - 1), &c) ||
        b64url_dec(d2 + 1, strlen(d2 + 1), &sig))
        why = "the assertion is not base64url";
    if (!why) {
        hj = json_loadb(h.data, h.len, 0, NULL);
        cj = json_loadb(c.data, c.len, 0, NULL);
        const char *alg = json_string_value(json_object_get(hj, "alg"));
        if (!alg || strcmp(alg, "RS256") != 0)
            why = "the assertion's alg is not RS256";
    }
    const char *iss = json_string_value(json_object_get(cj, "iss"));
    EVP_PKEY *key = NULL;
    for (size_t i = 0; !why && iss && i < g.nsas; i++)
        if (!strcmp(g.sas[i].email, iss))
            key = g.sas[i].key;
    if (!why && !key)
        why = "no such service account (iss)";
    if (!why) {
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        int ok = EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, key) == 1 &&
                 EVP_DigestVerify(md, (const unsigned char *)sig.data, sig.len, (const unsigned char *)jwt,
                                  (size_t)(d2 - jwt)) == 1;
        EVP_MD_CTX_free(md);
        if (!ok)
            why = "Invalid JWT Signature.";
    }
    if (!why) {
        int64_t now = (int64_t)(tg_wall_ms() / 1000);
        json_t *iat = json_object_get(cj, "iat"), *exp = json_object_get(cj, "exp");
        const char *aud = json_string_value(json_object_get(cj, "aud"));
        const char *scope = json_string_value(json_object_get(cj, "scope"));
        if (!aud || strlen(aud) < 6 || strcmp(aud + strlen(aud) - 6, "/token") != 0)
            why = "the assertion's aud is not a token endpoint";
        else if (!scope || !*scope)
            why = "the assertion has no scope";
        else if (!json_is_integer(iat) || !json_is_integer(exp) || json_integer_value(exp) <= now ||
                 json_integer_value(iat) > now + 60 || json_integer_value(exp) - json_integer_value(iat) > 3600)
            why = "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe.";
    }
    json_decref(hj);
    json_decref(cj);
    tg_buf_free(&h);
    tg_buf_free(&c);
    tg_buf_free(&sig);
    return why;
}

static void oauth_error(tg_buf_t *out, const char *code, const char *desc) {
    tg_buf_printf(out, "{\"error\":\"%s\",\"error_description\":\"", code);
    tg_buf_append_json_escaped(out, desc, strlen(desc));
    tg_buf_appends(out, "\"}");
}

static void new_token(tg_buf_t *out, const char *prefix) {
    unsigned char r[12];
    tg_random_bytes(r, sizeof(r));
    tg_buf_printf(out, "%s%llu-", prefix, (unsigned long long)++g.seq);
    for (size_t i = 0; i < sizeof(r); i++)
        tg_buf_printf(out, "%02x", r[i]);
}

int tg_mock_id_token(const char *path, size_t plen, const char *body, size_t blen, tg_buf_t *out) {
    tg_buf_t grant, a, b;
    tg_buf_init(&grant);
    tg_buf_init(&a);
    tg_buf_init(&b);
    int status = 200;
    pthread_mutex_lock(&g.mu);
    ensure_locked();
    g.requests++;
    const char *rotated = NULL;
    tg_buf_t rt;
    tg_buf_init(&rt);
    form_get(body, blen, "grant_type", &grant);
    const char *gt = grant.data ? grant.data : "";
    if (!strcmp(gt, "client_credentials")) {
        g.by_cc++;
        form_get(body, blen, "client_id", &a);
        form_get(body, blen, "client_secret", &b);
        const char *want = a.data ? json_string_value(json_object_get(g.clients, a.data)) : NULL;
        if (!memmem(path, plen, "/oauth2/v2.0/token", 18))
            status = 404, oauth_error(out, "invalid_request", "not the v2.0 token endpoint");
        else if (!want || !b.data || strcmp(want, b.data) != 0)
            status = 401, oauth_error(out, "invalid_client", "AADSTS7000215: Invalid client secret provided.");
        else if (!form_get(body, blen, "scope", &a) || !strstr(a.data, "/.default"))
            status = 400, oauth_error(out, "invalid_scope", "AADSTS1002012: The provided value for scope is not valid.");
    } else if (!strcmp(gt, "urn:ietf:params:oauth:grant-type:jwt-bearer")) {
        g.by_jwt++;
        const char *why = form_get(body, blen, "assertion", &a) ? jwt_check_locked(a.data) : "no assertion";
        if (why)
            status = 400, oauth_error(out, "invalid_grant", why);
    } else if (!strcmp(gt, "refresh_token")) {
        g.by_rt++;
        form_get(body, blen, "refresh_token", &a);
        if (!a.data || !json_object_get(g.live_rt, a.data)) {
            if (a.data && json_object_get(g.dead_rt, a.data))
                g.reuse++;
            status = 400, oauth_error(out, "invalid_grant", "the refresh token is invalid, expired or revoked");
        } else if (g.rotate) {
            new_token(&rt, "rt-");
            json_object_del(g.live_rt, a.data);
            json_object_set_new(g.dead_rt, a.data, json_true());
            json_object_set_new(g.live_rt, rt.data, json_true());
            rotated = rt.data;
        }
    } else {
        status = 400, oauth_error(out, "unsupported_grant_type", "grant_type is not supported");
    }
    if (status == 200) {
        tg_buf_t tok;
        tg_buf_init(&tok);
        new_token(&tok, "mt-");
        if (g.nissued == g.capissued) {
            g.capissued = g.capissued ? g.capissued * 2 : 64;
            g.issued = realloc(g.issued, g.capissued * sizeof(*g.issued));
        }
        g.issued[g.nissued++] = (issued_t){strdup(tok.data), (int64_t)tg_wall_ms() + g.lifetime_ms,
                                           (int64_t)tg_wall_ms(), gt[0] == 'c' ? 'c' : gt[0] == 'u' ? 'j' : 'r'};
        tg_buf_printf(out, "{\"access_token\":\"%s\",\"token_type\":\"Bearer\",\"expires_in\":%lld", tok.data,
                      (long long)((g.lifetime_ms + 999) / 1000));
        if (rotated)
            tg_buf_printf(out, ",\"refresh_token\":\"%s\"", rotated);
        tg_buf_appends(out, "}");
        tg_buf_free(&tok);
    } else {
        g.refused++;
    }
    pthread_mutex_unlock(&g.mu);
    tg_buf_free(&rt);
    tg_buf_free(&grant);
    tg_buf_free(&a);
    tg_buf_free(&b);
    return status;
}

const char *tg_mock_id_check(const char *tok, size_t n) {
    if (n < 3 || memcmp(tok, "mt-", 3) != 0)
        return NULL;
    const char *why = "mock: the access token is not one this issuer gave out";
    pthread_mutex_lock(&g.mu);
    for (size_t i = g.nissued; i-- > 0;)
        if (strlen(g.issued[i].tok) == n && !memcmp(g.issued[i].tok, tok, n)) {
            why = g.issued[i].exp_ms > (int64_t)tg_wall_ms() ? NULL : "mock: the access token has expired";
            break;
        }
    if (why && strstr(why, "expired"))
        g.expired++;
    else if (why)
        g.unknown++;
    pthread_mutex_unlock(&g.mu);
    return why;
}
