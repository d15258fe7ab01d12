/*
 * Identities that expire (see tg_identity.h): the service account JWT, the checks the
 * admin API and apply share, and each worker's tokens with the fleet-wide refresh.
 */
#include "tollgate/tg_identity.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_crypto.h"
#include "tollgate/tg_pg.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_upstream.h"
#include "tollgate/tg_valid.h"

enum {
    LOCK_TTL_MS = 15000,      /* the refresh lock: longer than a token request may take */
    POLL_MS = 100,            /* a worker that lost the lock looks at the fleet's copy again */
    POLL_MAX_MS = 20000,      /* and gives up after this (the holder died: its lock expired) */
    MARGIN_MAX_MS = 300000,   /* refresh at most 5 minutes before the expiry */
    ANSWER_MAX = 65536,       /* a token endpoint's answer, at most */
    TOKEN_MAX = 16384,        /* an access token, at most */
    WRITE_TRIES = 3,
};

static const char *const auth_names[] = {"key", "entra", "service_account", "oauth", NULL};

int tg_auth_parse(const char *s) {
    for (int i = 0; s && auth_names[i]; i++)
        if (!strcmp(s, auth_names[i]))
            return i;
    return -1;
}

/* ---- the service account key and its JWT ----------------------------------------- */

static char *dup_str(const json_t *v) { return json_is_string(v) ? strdup(json_string_value(v)) : NULL; }

void tg_sa_key_free(tg_sa_key_t *k) {
    free(k->client_email);
    free(k->private_key_id);
    free(k->token_uri);
    EVP_PKEY_free(k->key);
    memset(k, 0, sizeof(*k));
}

int tg_sa_key_parse(const char *json, size_t n, tg_sa_key_t *out, char *err, size_t errlen) {
    memset(out, 0, sizeof(*out));
    json_error_t jerr;
    json_t *j = json_loadb(json, n, 0, &jerr);
    if (!json_is_object(j)) {
        snprintf(err, errlen, "the service account key is not a JSON object (%s)",
                 j ? "another JSON value" : jerr.text);
        json_decref(j);
        return TG_ERROR;
    }
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *pem = json_string_value(json_object_get(j, "private_key"));
    const char *email = json_string_value(json_object_get(j, "client_email"));
    const char *uri = json_string_value(json_object_get(j, "token_uri"));
    const char *why = NULL;
    if (!type || strcmp(type, "service_account") != 0)
        why = "the key's \"type\" is not \"service_account\" (download a key of a service account, JSON)";
    else if (!email || !*email || tg_valid_no_ctl(email, strlen(email)))
        why = "the key has no \"client_email\"";
    else if (!pem || !*pem)
        why = "the key has no \"private_key\"";
    else if (uri && (tg_valid_base_url(uri, strlen(uri))))
        why = "the key's \"token_uri\" is not an http(s) URL";
    if (why) {
        snprintf(err, errlen, "%s", why);
        json_decref(j);
        return TG_ERROR;
    }
    BIO *bio = BIO_new_mem_buf(pem, (int)strlen(pem));
    EVP_PKEY *key = bio ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    if (!key || EVP_PKEY_base_id(key) != EVP_PKEY_RSA) {
        snprintf(err, errlen, "the key's \"private_key\" is not an RSA private key in PEM (-----BEGIN PRIVATE KEY-----)");
        EVP_PKEY_free(key);
        json_decref(j);
        return TG_ERROR;
    }
    out->key = key;
    out->client_email = strdup(email);
    out->private_key_id = dup_str(json_object_get(j, "private_key_id"));
    if (!out->private_key_id)
        out->private_key_id = strdup("");
    out->token_uri = strdup(uri && *uri ? uri : TG_GOOGLE_TOKEN_URI);
    json_decref(j);
    return TG_OK;
}

/* base64url without padding (RFC 7515 section 2). */
static void b64url(tg_buf_t *out, const unsigned char *p, size_t n) {
    size_t cap = 4 * ((n + 2) / 3) + 1;
    tg_buf_reserve(out, cap);
    int len = EVP_EncodeBlock((unsigned char *)out->data + out->len, p, (int)n);
    char *s = out->data + out->len;
    while (len > 0 && s[len - 1] == '=')
        len--;
    for (int i = 0; i < len; i++)
        s[i] = s[i] == '+' ? '-' : s[i] == '/' ? '_' : s[i];
    out->len += (size_t)len;
    out->data[out->len] = '\0';
}

int tg_sa_jwt(const tg_sa_key_t *k, const char *aud, const char *scope, int64_t now_s, tg_buf_t *out) {
    json_t *h = json_pack("{s:s,s:s}", "alg", "RS256", "typ", "JWT");
    if (k->private_key_id && *k->private_key_id)
        json_object_set_new(h, "kid", json_string(k->private_key_id));
    json_t *c = json_pack("{s:s,s:s,s:s,s:I,s:I}", "iss", k->client_email, "scope", scope, "aud", aud, "iat",
                          (json_int_t)now_s, "exp", (json_int_t)(now_s + 3600));
    char *hs = json_dumps(h, JSON_COMPACT), *cs = json_dumps(c, JSON_COMPACT);
    json_decref(h);
    json_decref(c);
    size_t start = out->len;
    b64url(out, (const unsigned char *)hs, strlen(hs));
    tg_buf_appends(out, ".");
    b64url(out, (const unsigned char *)cs, strlen(cs));
    free(hs);
    free(cs);
    unsigned char sig[1024];
    size_t siglen = sizeof(sig);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int ok = md && EVP_PKEY_size(k->key) <= (int)sizeof(sig) &&
             EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, k->key) == 1 &&
             EVP_DigestSign(md, sig, &siglen, (const unsigned char *)out->data + start, out->len - start) == 1;
    EVP_MD_CTX_free(md);
    if (!ok)
        return TG_ERROR;
    tg_buf_appends(out, ".");
    b64url(out, sig, siglen);
    return TG_OK;
}

/* ---- the checks the admin API and apply share ---------------------------------------- */

static const char *setting(const json_t *settings, const char *key) {
    const char *v = json_string_value(json_object_get(settings, key));
    return v && *v ? v : NULL;
}

const char *tg_identity_check(const char *provider, const char *auth, const char *credential, size_t credlen,
                              const json_t *settings, char *msg, size_t msglen) {
    int kind = auth ? tg_auth_parse(auth) : -2; /* -2: not given (a change of other fields) */
    if (kind == -1)
        return "field \"auth\" must be one of key, entra, service_account, oauth";
    int sa_text = credential && credential[strspn(credential, " \t\r\n")] == '{';
    if (kind == -2)
        kind = (provider && !strcmp(provider, "vertex")) || sa_text ? TG_AUTH_SERVICE_ACCOUNT : TG_AUTH_KEY;
    if (provider && !strcmp(provider, "vertex") && kind != TG_AUTH_SERVICE_ACCOUNT && kind != TG_AUTH_OAUTH)
        return "a vertex account authenticates with a service account key: set \"auth\": \"service_account\" and "
               "the key file's JSON as its credential";
    if (kind == TG_AUTH_ENTRA && provider && strcmp(provider, "azure") != 0)
        return "\"auth\": \"entra\" (Microsoft Entra ID) is for azure accounts";
    if (kind == TG_AUTH_SERVICE_ACCOUNT && provider && strcmp(provider, "vertex") != 0)
        return "\"auth\": \"service_account\" (a Google service account key) is for vertex accounts";
    if (settings && kind == TG_AUTH_ENTRA && (!setting(settings, "tenant_id") || !setting(settings, "client_id")))
        return "an entra account needs settings.tenant_id and settings.client_id (its credential is the client secret)";
    if (settings && kind == TG_AUTH_OAUTH && !setting(settings, "token_url"))
        return "an oauth account needs settings.token_url (its credential is the refresh token)";
    if (settings && provider && !strcmp(provider, "vertex") && (!setting(settings, "project") || !setting(settings, "region")))
        return "a vertex account needs settings.project and settings.region (us-east5, europe-west1, global, ...)";
    if (credential && kind == TG_AUTH_SERVICE_ACCOUNT) {
        tg_sa_key_t k;
        char err[256];
        if (tg_sa_key_parse(credential, credlen, &k, err, sizeof(err)) != TG_OK) {
            snprintf(msg, msglen, "field \"credential\": %s", err);
            return msg;
        }
        tg_sa_key_free(&k);
    } else if (credential && tg_valid_no_ctl(credential, credlen)) {
        /* Anything but a service account key may end up in a header line. */
        snprintf(msg, msglen, "field \"credential\" %s", tg_valid_no_ctl(credential, credlen));
        return msg;
    }
    return NULL;
}

/* ---- a worker's tokens ----------------------------------------------------------------- */

typedef struct entry_s entry_t;

struct tg_identity_wait_s {
    tg_identity_wait_t *next;
    entry_t *e;
    tg_identity_cb cb;
    void *ud;
};

typedef struct {
    uint64_t token_requests; /* sent to a token endpoint by this worker */
    uint64_t refreshed;      /* tokens this worker obtained */
    uint64_t failed;         /* refreshes that failed */
    uint64_t from_fleet;     /* tokens taken from another worker or instance */
    uint64_t waits;          /* requests that waited for a token */
    uint64_t rejected;       /* tokens the upstream refused (401) */
} id_stats_t;

struct entry_s {
    tg_identity_t *id;
    int64_t account;
    char *token;
    int64_t exp_ms, life_ms;
    char *rejected;   /* the last token an upstream refused */
    uint64_t gen;     /* of the current token */
    int cur_rejected; /* the current token is the refused one */
    int busy;
    int holder;       /* holds the fleet's lock */
    int64_t poll_until;
    int64_t failed_until;
    char reason[64];
    tg_identity_wait_t *waiters;
    tg_redis_req_t *rq;
    tg_pg_req_t *pq;
    tg_upcall_t *call;
    uv_timer_t *timer;
    char lock_val[40];
    /* The refresh in progress (the holder's). */
    int kind;
    int had_error;
    int writes;
    int status;
    tg_buf_t answer;
    char *new_token, *new_refresh;
    int64_t new_exp, new_life;
};

struct tg_identity_s {
    uv_loop_t *loop;
    tg_state_t *st;
    tg_accounts_t *accounts;
    const tg_config_t *cfg;
    entry_t **e;
    size_t n, cap;
    int unlock_script;
    uint8_t key[32];
    int have_key;
    id_stats_t stats;
};

static const char UNLOCK_LUA[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
                                 "return 0\n";

tg_identity_t *tg_identity_create(uv_loop_t *loop, tg_state_t *st, tg_accounts_t *accounts, const tg_config_t *cfg) {
    tg_identity_t *id = calloc(1, sizeof(*id));
    id->loop = loop;
    id->st = st;
    id->accounts = accounts;
    id->cfg = cfg;
    id->have_key = tg_crypto_key(cfg->secret_key, id->key) == TG_OK;
    id->unlock_script = -1;
    if (tg_state_redis(st))
        id->unlock_script = tg_redis_script_register(tg_state_redis(st), UNLOCK_LUA);
    return id;
}

static void timer_close_cb(uv_handle_t *h) { free(h); }

static void scrub(char **s) {
    if (*s) {
        OPENSSL_cleanse(*s, strlen(*s));
        free(*s);
        *s = NULL;
    }
}

static void entry_stop(entry_t *e) {
    tg_redis_cancel(e->rq);
    e->rq = NULL;
    tg_pg_cancel(e->pq);
    e->pq = NULL;
    if (e->call)
        tg_upcall_abort(e->call);
    e->call = NULL;
    if (e->timer)
        uv_timer_stop(e->timer);
}

void tg_identity_destroy(tg_identity_t *id) {
    if (!id)
        return;
    for (size_t i = 0; i < id->n; i++) {
        entry_t *e = id->e[i];
        entry_stop(e);
        if (e->timer)
            uv_close((uv_handle_t *)e->timer, timer_close_cb);
        while (e->waiters) {
            tg_identity_wait_t *w = e->waiters;
            e->waiters = w->next;
            free(w);
        }
        scrub(&e->token);
        scrub(&e->rejected);
        scrub(&e->new_token);
        scrub(&e->new_refresh);
        tg_buf_free(&e->answer);
        free(e);
    }
    free(id->e);
    OPENSSL_cleanse(id->key, sizeof(id->key));
    free(id);
}

static entry_t *entry_find(const tg_identity_t *id, int64_t account) {
    for (size_t i = 0; i < id->n; i++)
        if (id->e[i]->account == account)
            return id->e[i];
    return NULL;
}

static entry_t *entry_get(tg_identity_t *id, int64_t account) {
    entry_t *e = entry_find(id, account);
    if (e)
        return e;
    if (id->n == id->cap) {
        id->cap = id->cap ? id->cap * 2 : 8;
        id->e = realloc(id->e, id->cap * sizeof(*id->e));
    }
    e = calloc(1, sizeof(*e));
    e->id = id;
    e->account = account;
    tg_buf_init(&e->answer);
    id->e[id->n++] = e;
    return e;
}

/* Refresh when a quarter of the token's life is left (at most 5 minutes before). */
static int64_t margin_ms(int64_t life) {
    int64_t m = life > 0 ? life / 4 : 60000;
    return m > MARGIN_MAX_MS ? MARGIN_MAX_MS : m < 200 ? 200 : m;
}

/* A token is used while more than a quarter of its margin is left. */
static int usable(const entry_t *e, int64_t now) {
    return e->token && !e->cur_rejected && e->exp_ms - now > margin_ms(e->life_ms) / 4;
}

static int fresh(const char *tok, int64_t exp, int64_t life, const entry_t *e, int64_t now) {
    return tok && *tok && !(e->rejected && !strcmp(e->rejected, tok)) && exp - now > margin_ms(life);
}

static void adopt(entry_t *e, const char *tok, int64_t exp, int64_t life) {
    if (!e->token || strcmp(e->token, tok) != 0) {
        scrub(&e->token);
        e->token = strdup(tok);
        e->gen++;
        e->cur_rejected = 0;
    }
    e->exp_ms = exp;
    e->life_ms = life;
}

static void finish(entry_t *e, const char *err) {
    e->busy = 0;
    e->holder = 0;
    tg_buf_reset(&e->answer);
    scrub(&e->new_token);
    scrub(&e->new_refresh);
    tg_identity_wait_t *w = e->waiters;
    e->waiters = NULL;
    while (w) {
        tg_identity_wait_t *next = w->next;
        w->cb(w->ud, e->token, err);
        free(w);
        w = next;
    }
}

static void key_name(char *out, size_t n, const entry_t *e, const char *what) {
    snprintf(out, n, "{a:%lld}:%s", (long long)e->account, what);
}

static void release_lock(entry_t *e) {
    tg_redis_t *r = tg_state_redis(e->id->st);
    if (!r || !e->holder || e->id->unlock_script < 0)
        return;
    char key[48];
    key_name(key, sizeof(key), e, "token_lock");
    const char *argv[2] = {key, e->lock_val};
    tg_redis_eval(r, e->id->unlock_script, 1, 2, argv, NULL, NULL, NULL);
    e->holder = 0;
}

static void step_fleet(entry_t *e);

static void timer_cb(uv_timer_t *t) { step_fleet(t->data); }

static void later(entry_t *e, uint64_t ms) {
    if (!e->timer) {
        e->timer = malloc(sizeof(*e->timer));
        uv_timer_init(e->id->loop, e->timer);
        e->timer->data = e;
    }
    uv_timer_start(e->timer, timer_cb, ms, 0);
}

/* ---- a failed refresh: marked, cooled, shared ---- */

static void fail_written(void *ud, const PGresult *res, const char *err) {
    TG_UNUSED(res);
    entry_t *e = ud;
    e->pq = NULL;
    if (err)
        tg_log_error("identity: account %lld: recording the failed refresh failed: %s", (long long)e->account, err);
    else
        tg_state_publish_accounts(e->id->st);
    release_lock(e);
    char why[80];
    snprintf(why, sizeof(why), "%s", e->reason);
    finish(e, why);
}

static void refresh_failed(entry_t *e, const char *reason, const char *detail) {
    tg_identity_t *id = e->id;
    id->stats.failed++;
    snprintf(e->reason, sizeof(e->reason), "%s", reason);
    int64_t cool = id->cfg->routing.cooldown_auth_ms > 0 ? id->cfg->routing.cooldown_auth_ms : 30000;
    e->failed_until = (int64_t)tg_wall_ms() + (cool < 5000 ? cool : 5000);
    tg_log_warn("identity: account %lld: the token refresh failed: %s%s%s; the account cools down for %lld ms",
                (long long)e->account, reason, detail ? ": " : "", detail ? detail : "", (long long)cool);
    tg_pg_t *pg = tg_state_pg(id->st);
    char acc[24], ms[24];
    snprintf(acc, sizeof(acc), "%lld", (long long)e->account);
    snprintf(ms, sizeof(ms), "%lld", (long long)cool);
    const char *params[3] = {acc, reason, ms};
    e->pq = pg ? tg_pg_query(pg,
                             "UPDATE accounts SET auth_error = $2, auth_error_at = now(), cooldown_until = "
                             "greatest(coalesce(cooldown_until, to_timestamp(0)), now() + $3::bigint * interval '1 "
                             "millisecond') WHERE id = $1::bigint",
                             3, params, fail_written, e)
               : NULL;
    if (!e->pq)
        fail_written(e, NULL, "no database");
}

/* ---- publishing a token to the fleet ---- */

static void publish(entry_t *e) {
    tg_redis_t *r = tg_state_redis(e->id->st);
    int64_t ttl = e->exp_ms - (int64_t)tg_wall_ms();
    if (!r || !e->id->have_key || ttl <= 0)
        return;
    tg_buf_t sealed, v;
    tg_buf_init(&sealed);
    tg_buf_init(&v);
    tg_crypto_seal(e->id->key, e->token, strlen(e->token), &sealed);
    tg_buf_printf(&v, "%lld:%lld:", (long long)e->exp_ms, (long long)e->life_ms);
    for (size_t i = 0; i < sealed.len; i++)
        tg_buf_printf(&v, "%02x", (unsigned char)sealed.data[i]);
    char key[48], px[24];
    key_name(key, sizeof(key), e, "token");
    snprintf(px, sizeof(px), "%lld", (long long)ttl);
    const char *argv[5] = {"SET", key, v.data, "PX", px};
    size_t lens[5] = {3, strlen(key), v.len, 2, strlen(px)};
    tg_redis_command(r, NULL, NULL, 5, argv, lens);
    tg_buf_free(&sealed);
    tg_buf_free(&v);
}

/* Opens "<exp>:<life>:<sealed hex>"; 1 with the token in *tok (malloc'd). */
static int fleet_value(const tg_identity_t *id, const char *s, size_t n, char **tok, int64_t *exp, int64_t *life) {
    char *end;
    *exp = strtoll(s, &end, 10);
    if (*end != ':')
        return 0;
    *life = strtoll(end + 1, &end, 10);
    if (*end != ':' || !id->have_key)
        return 0;
    const char *hex = end + 1;
    size_t hn = n - (size_t)(hex - s);
    if (hn % 2 || hn > 2 * (TOKEN_MAX + TG_SEAL_OVERHEAD))
        return 0;
    uint8_t *raw = malloc(hn / 2 + 1);
    for (size_t i = 0; i < hn / 2; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            free(raw);
            return 0;
        }
        raw[i] = (uint8_t)v;
    }
    tg_buf_t plain;
    tg_buf_init(&plain);
    int ok = tg_crypto_open(id->key, raw, hn / 2, &plain) == TG_OK && plain.len && !tg_valid_no_ctl(plain.data, plain.len);
    free(raw);
    if (!ok) {
        tg_buf_free(&plain);
        return 0;
    }
    *tok = plain.data;
    return 1;
}

/* ---- the holder: the token endpoint ---- */

static void write_token(entry_t *e);

static void written(void *ud, const PGresult *res, const char *err) {
    TG_UNUSED(res);
    entry_t *e = ud;
    e->pq = NULL;
    if (err && ++e->writes < WRITE_TRIES) {
        tg_log_warn("identity: account %lld: writing the new token failed (%s); trying again", (long long)e->account, err);
        write_token(e);
        return;
    }
    adopt(e, e->new_token, e->new_exp, e->new_life);
    if (err) {
        /* The token works; a rotated refresh token is kept in this worker only until the
         * next refresh, which this worker then does (it keeps the lock until it expires). */
        tg_log_error("identity: account %lld: the new token could not be written to Postgres: %s",
                     (long long)e->account, err);
        e->holder = 0;
    } else if (e->had_error) {
        tg_state_publish_accounts(e->id->st); /* the mark is gone: the console shows it */
    }
    publish(e);
    release_lock(e);
    e->id->stats.refreshed++;
    finish(e, NULL);
}

static char *seal_hex(const tg_identity_t *id, const char *plain) {
    tg_buf_t sealed, hex;
    tg_buf_init(&sealed);
    tg_buf_init(&hex);
    tg_crypto_seal(id->key, plain, strlen(plain), &sealed);
    tg_buf_appends(&hex, "\\x");
    for (size_t i = 0; i < sealed.len; i++)
        tg_buf_printf(&hex, "%02x", (unsigned char)sealed.data[i]);
    tg_buf_free(&sealed);
    return hex.data;
}

static void write_token(entry_t *e) {
    tg_identity_t *id = e->id;
    char acc[24], exp[24];
    snprintf(acc, sizeof(acc), "%lld", (long long)e->account);
    snprintf(exp, sizeof(exp), "%lld", (long long)e->new_exp);
    char *tok = seal_hex(id, e->new_token);
    char *rt = e->new_refresh ? seal_hex(id, e->new_refresh) : NULL;
    char life[24];
    snprintf(life, sizeof(life), "%lld", (long long)e->new_life);
    const char *params[5] = {acc, tok, exp, rt, life};
    e->pq = tg_pg_query(tg_state_pg(id->st),
                        "UPDATE accounts SET access_token = $2::bytea, token_expires_at = to_timestamp($3::bigint / "
                        "1000.0), token_refreshed_at = to_timestamp(($3::bigint - $5::bigint) / 1000.0), "
                        "refresh_token = coalesce($4::bytea, refresh_token), auth_error = NULL, auth_error_at = NULL "
                        "WHERE id = $1::bigint",
                        5, params, written, e);
    free(tok);
    free(rt);
    if (!e->pq)
        written(e, NULL, "no database");
}

static void tok_head(void *ud, const tg_uphead_t *h) { ((entry_t *)ud)->status = h->status; }

static void tok_body(void *ud, const char *p, size_t n) {
    entry_t *e = ud;
    if (e->answer.len + n <= ANSWER_MAX)
        tg_buf_append(&e->answer, p, n);
}

static void tok_done(void *ud) {
    entry_t *e = ud;
    e->call = NULL;
    int64_t now = (int64_t)tg_wall_ms();
    json_t *j = e->answer.len ? json_loadb(e->answer.data, e->answer.len, 0, NULL) : NULL;
    const char *tok = json_string_value(json_object_get(j, "access_token"));
    json_t *ein = json_object_get(j, "expires_in");
    int64_t secs = json_is_integer(ein) ? (int64_t)json_integer_value(ein)
                   : json_is_string(ein) ? atoll(json_string_value(ein)) /* Entra's v1 endpoint */
                                         : 3600;
    if (e->status == 200 && tok && *tok && strlen(tok) <= TOKEN_MAX && !tg_valid_no_ctl(tok, strlen(tok)) && secs > 0) {
        e->new_token = strdup(tok);
        const char *rt = json_string_value(json_object_get(j, "refresh_token"));
        if (e->kind == TG_AUTH_OAUTH && rt && *rt && strlen(rt) <= TOKEN_MAX && !tg_valid_no_ctl(rt, strlen(rt)))
            e->new_refresh = strdup(rt); /* rotated: it replaces the stored one */
        /* Counted from when the answer came, less the time it may have taken: a
         * tenth of the lifetime, at most a second. */
        e->new_life = secs * 1000;
        e->new_exp = now + e->new_life - (e->new_life / 10 < 1000 ? e->new_life / 10 : 1000);
        json_decref(j);
        e->writes = 0;
        write_token(e);
        return;
    }
    /* RFC 6749 section 5.2: {"error": "invalid_grant", ...}. */
    const char *code = json_string_value(json_object_get(j, "error"));
    char reason[64];
    int named = code && *code && strlen(code) < 40;
    for (const char *c = code; named && *c; c++)
        named = (*c >= 'a' && *c <= 'z') || *c == '_';
    if (named)
        snprintf(reason, sizeof(reason), "%s", code);
    else if (e->status == 200)
        snprintf(reason, sizeof(reason), "bad_response");
    else
        snprintf(reason, sizeof(reason), "http_%d", e->status);
    char detail[64];
    snprintf(detail, sizeof(detail), "the token endpoint answered HTTP %d", e->status);
    json_decref(j);
    refresh_failed(e, reason, detail);
}

static void tok_error(void *ud, tg_uperr_t err, const char *msg) {
    TG_UNUSED(err);
    entry_t *e = ud;
    e->call = NULL;
    refresh_failed(e, "network", msg);
}

static const tg_upcall_cbs_t tok_cbs = {tok_head, tok_body, tok_done, tok_error};

static void form_add(tg_buf_t *b, const char *k, const char *v) {
    if (b->len)
        tg_buf_appends(b, "&");
    tg_buf_appends(b, k);
    tg_buf_appends(b, "=");
    for (const unsigned char *c = (const unsigned char *)v; *c; c++) {
        if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("-._~", *c))
            tg_buf_append(b, c, 1);
        else
            tg_buf_printf(b, "%%%02X", *c);
    }
}

/* Sends the token request of the account read from Postgres (the holder's). */
static void ask(entry_t *e, const json_t *settings, const char *credential, const char *refresh) {
    tg_identity_t *id = e->id;
    tg_buf_t form, url;
    tg_buf_init(&form);
    tg_buf_init(&url);
    const char *why = NULL;
    const char *token_url = setting(settings, "token_url");
    if (e->kind == TG_AUTH_ENTRA) {
        /* Client credentials (Microsoft identity platform, v2.0 endpoint). */
        const char *tenant = setting(settings, "tenant_id"), *client = setting(settings, "client_id");
        if (!tenant || !client || !credential)
            why = "settings.tenant_id, settings.client_id and the client secret (credential) are needed";
        else {
            if (token_url)
                tg_buf_appends(&url, token_url);
            else
                tg_buf_printf(&url, "%s/%s/oauth2/v2.0/token", setting(settings, "authority") ? setting(settings, "authority")
                                                                                            : TG_ENTRA_AUTHORITY,
                              tenant);
            form_add(&form, "client_id", client);
            form_add(&form, "scope", setting(settings, "scope") ? setting(settings, "scope") : TG_ENTRA_SCOPE);
            form_add(&form, "client_secret", credential);
            form_add(&form, "grant_type", "client_credentials");
        }
    } else if (e->kind == TG_AUTH_SERVICE_ACCOUNT) {
        /* The JWT bearer grant (RFC 7523) with an assertion signed by the key. */
        tg_sa_key_t k;
        char err[256];
        if (!credential || tg_sa_key_parse(credential, strlen(credential), &k, err, sizeof(err)) != TG_OK)
            why = "the service account key cannot be read";
        else {
            tg_buf_appends(&url, token_url ? token_url : k.token_uri);
            tg_buf_t jwt;
            tg_buf_init(&jwt);
            if (tg_sa_jwt(&k, k.token_uri, setting(settings, "scope") ? setting(settings, "scope") : TG_GOOGLE_SCOPE,
                          (int64_t)(tg_wall_ms() / 1000), &jwt) != TG_OK)
                why = "the service account key cannot sign";
            form_add(&form, "grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer");
            form_add(&form, "assertion", jwt.data ? jwt.data : "");
            tg_buf_free(&jwt);
            tg_sa_key_free(&k);
        }
    } else {
        /* The refresh_token grant (RFC 6749 section 6): the latest refresh token. */
        const char *client = setting(settings, "client_id");
        if (!token_url || !refresh)
            why = "settings.token_url and a refresh token (credential) are needed";
        else {
            tg_buf_appends(&url, token_url);
            form_add(&form, "grant_type", "refresh_token");
            form_add(&form, "refresh_token", refresh);
            if (client)
                form_add(&form, "client_id", client);
            if (setting(settings, "scope"))
                form_add(&form, "scope", setting(settings, "scope"));
        }
    }
    /* The URL: its origin makes the client, its path the request line. */
    const char *u = url.data ? url.data : "";
    const char *host = strstr(u, "://");
    const char *path = host ? strchr(host + 3, '/') : NULL;
    char origin[512];
    if (!why && (!host || tg_valid_base_url(u, url.len)))
        why = "the token endpoint's URL is not an http(s) URL";
    tg_upstream_t *up = NULL;
    if (!why) {
        snprintf(origin, sizeof(origin), "%.*s", (int)(path ? (size_t)(path - u) : url.len), u);
        up = tg_accounts_upstream(id->accounts, origin);
        if (!up)
            why = "no client for the token endpoint's URL";
    }
    if (why) {
        OPENSSL_cleanse(form.data ? form.data : "", form.len);
        tg_buf_free(&form);
        tg_buf_free(&url);
        refresh_failed(e, "config", why);
        return;
    }
    tg_buf_t req;
    tg_buf_init(&req);
    tg_buf_printf(&req,
                  "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                  "Accept: application/json\r\nContent-Length: %zu\r\n\r\n",
                  path ? path : "/", tg_upstream_host_header(up), form.len);
    tg_buf_append(&req, form.data, form.len);
    OPENSSL_cleanse(form.data, form.len);
    tg_buf_free(&form);
    tg_buf_free(&url);
    e->status = 0;
    tg_buf_reset(&e->answer);
    id->stats.token_requests++;
    e->call = tg_upcall_start(up, &req, &tok_cbs, e);
    tg_buf_free(&req);
}

static char *open_col(const tg_identity_t *id, const PGresult *res, int col) {
    if (PQgetisnull(res, 0, col) || !id->have_key)
        return NULL;
    size_t n = 0;
    unsigned char *raw = PQunescapeBytea((const unsigned char *)PQgetvalue(res, 0, col), &n);
    tg_buf_t plain;
    tg_buf_init(&plain);
    int ok = raw && tg_crypto_open(id->key, raw, n, &plain) == TG_OK;
    PQfreemem(raw);
    if (!ok) {
        tg_buf_free(&plain);
        return NULL;
    }
    if (!plain.data)
        tg_buf_appends(&plain, "");
    return plain.data;
}

static void read_cb(void *ud, const PGresult *res, const char *err) {
    entry_t *e = ud;
    tg_identity_t *id = e->id;
    e->pq = NULL;
    if (err || PQntuples(res) != 1) {
        release_lock(e);
        snprintf(e->reason, sizeof(e->reason), "%s", err ? "database" : "no such account");
        e->failed_until = (int64_t)tg_wall_ms() + 1000;
        finish(e, e->reason);
        return;
    }
    int64_t now = (int64_t)tg_wall_ms();
    e->kind = tg_auth_parse(PQgetvalue(res, 0, 0));
    e->had_error = !PQgetisnull(res, 0, 6);
    char *access = open_col(id, res, 3);
    int64_t exp = atoll(PQgetvalue(res, 0, 4)), life = atoll(PQgetvalue(res, 0, 5));
    if (fresh(access, exp, life, e, now)) {
        /* Renewed meanwhile by a holder whose fleet copy is gone: no request. */
        adopt(e, access, exp, life);
        scrub(&access);
        publish(e);
        release_lock(e);
        id->stats.from_fleet++;
        finish(e, NULL);
        return;
    }
    scrub(&access);
    if (e->kind <= TG_AUTH_KEY) {
        release_lock(e);
        finish(e, "the account has no identity to refresh");
        return;
    }
    json_t *settings = json_loads(PQgetvalue(res, 0, 1), 0, NULL);
    char *cred = open_col(id, res, 2), *rt = open_col(id, res, 7);
    char *refresh = NULL;
    if (e->kind == TG_AUTH_OAUTH)
        refresh = rt ? rt : cred; /* the latest (rotated) one, else the operator's */
    ask(e, settings, e->kind == TG_AUTH_OAUTH ? NULL : cred, refresh);
    json_decref(settings);
    scrub(&cred);
    scrub(&rt);
}

static void step_read(entry_t *e) {
    tg_pg_t *pg = tg_state_pg(e->id->st);
    char acc[24];
    snprintf(acc, sizeof(acc), "%lld", (long long)e->account);
    const char *params[1] = {acc};
    e->pq = pg ? tg_pg_query(pg,
                             "SELECT auth, settings::text, credential, access_token, coalesce((extract(epoch FROM "
                             "token_expires_at) * 1000)::bigint, 0), coalesce((extract(epoch FROM token_expires_at - "
                             "token_refreshed_at) * 1000)::bigint, 0), auth_error, refresh_token FROM accounts "
                             "WHERE id = $1::bigint",
                             1, params, read_cb, e)
               : NULL;
    if (!e->pq) {
        release_lock(e);
        finish(e, "no database");
    }
}

static void lock_cb(void *ud, redisReply *reply, const char *err) {
    entry_t *e = ud;
    e->rq = NULL;
    if (!err && reply && reply->type == REDIS_REPLY_STATUS) {
        e->holder = 1;
        step_read(e);
    } else if (err) {
        /* Redis is away: no fleet to coordinate with; Postgres still has the latest
         * refresh token. */
        step_read(e);
    } else if ((int64_t)tg_wall_ms() < e->poll_until) {
        later(e, POLL_MS); /* another holder: wait for its token */
    } else {
        snprintf(e->reason, sizeof(e->reason), "lock_timeout");
        finish(e, "another gateway holds the account's refresh lock and published no token");
    }
}

static void fleet_cb(void *ud, redisReply *reply, const char *err) {
    entry_t *e = ud;
    tg_identity_t *id = e->id;
    e->rq = NULL;
    int64_t now = (int64_t)tg_wall_ms();
    char *tok = NULL;
    int64_t exp = 0, life = 0;
    if (!err && reply && reply->type == REDIS_REPLY_STRING &&
        fleet_value(id, reply->str, reply->len, &tok, &exp, &life) && fresh(tok, exp, life, e, now)) {
        adopt(e, tok, exp, life);
        scrub(&tok);
        id->stats.from_fleet++;
        finish(e, NULL);
        return;
    }
    scrub(&tok);
    tg_redis_t *r = tg_state_redis(id->st);
    if (err) {
        step_read(e);
        return;
    }
    char key[48], px[16];
    key_name(key, sizeof(key), e, "token_lock");
    uint64_t rnd[2];
    tg_random_bytes(rnd, sizeof(rnd));
    snprintf(e->lock_val, sizeof(e->lock_val), "%016llx%016llx", (unsigned long long)rnd[0], (unsigned long long)rnd[1]);
    snprintf(px, sizeof(px), "%d", LOCK_TTL_MS);
    const char *argv[6] = {"SET", key, e->lock_val, "NX", "PX", px};
    e->rq = tg_redis_command(r, lock_cb, e, 6, argv, NULL);
    if (!e->rq)
        step_read(e);
}

static void step_fleet(entry_t *e) {
    tg_redis_t *r = tg_state_redis(e->id->st);
    if (!r) {
        step_read(e);
        return;
    }
    char key[48];
    key_name(key, sizeof(key), e, "token");
    const char *argv[2] = {"GET", key};
    e->rq = tg_redis_command(r, fleet_cb, e, 2, argv, NULL);
    if (!e->rq)
        step_read(e);
}

static void start_refresh(entry_t *e) {
    e->busy = 1;
    e->poll_until = (int64_t)tg_wall_ms() + POLL_MAX_MS;
    step_fleet(e);
}

int tg_identity_token(tg_identity_t *id, const tg_account_t *acc, tg_identity_cb cb, void *ud, const char **token,
                      uint64_t *gen, tg_identity_wait_t **wait) {
    *wait = NULL;
    entry_t *e = entry_get(id, acc->id);
    int64_t now = (int64_t)tg_wall_ms();
    if (usable(e, now)) {
        *token = e->token;
        *gen = e->gen;
        if (!e->busy && e->exp_ms - now <= margin_ms(e->life_ms) && now >= e->failed_until)
            start_refresh(e);
        return TG_OK;
    }
    if (!e->busy && now < e->failed_until) {
        *token = e->reason;
        return TG_ERROR;
    }
    tg_identity_wait_t *w = calloc(1, sizeof(*w));
    w->e = e;
    w->cb = cb;
    w->ud = ud;
    w->next = e->waiters;
    e->waiters = w;
    id->stats.waits++;
    if (!e->busy)
        start_refresh(e);
    *wait = w;
    return TG_AGAIN;
}

void tg_identity_cancel(tg_identity_wait_t *w) {
    if (!w)
        return;
    for (tg_identity_wait_t **pp = &w->e->waiters; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            free(w);
            return;
        }
}

void tg_identity_rejected(tg_identity_t *id, int64_t account_id, uint64_t gen) {
    entry_t *e = entry_find(id, account_id);
    if (!e || !e->token || e->gen != gen || e->cur_rejected)
        return;
    id->stats.rejected++;
    e->cur_rejected = 1;
    scrub(&e->rejected);
    e->rejected = strdup(e->token);
}

/* ---- /metrics ---- */

static void id_collect(const void *const *stats, int n, tg_buf_t *out) {
    id_stats_t s;
    tg_metrics_sum_u64(stats, n, TG_METRICS_NFIELDS(id_stats_t), (uint64_t *)&s);
    tg_buf_printf(out,
                  "# HELP tollgate_identity_token_requests_total Requests this instance sent to token endpoints.\n"
                  "# TYPE tollgate_identity_token_requests_total counter\n"
                  "tollgate_identity_token_requests_total %llu\n"
                  "# HELP tollgate_identity_refreshes_total Token refreshes by outcome: obtained here, taken from "
                  "the fleet, failed.\n"
                  "# TYPE tollgate_identity_refreshes_total counter\n"
                  "tollgate_identity_refreshes_total{result=\"obtained\"} %llu\n"
                  "tollgate_identity_refreshes_total{result=\"fleet\"} %llu\n"
                  "tollgate_identity_refreshes_total{result=\"failed\"} %llu\n"
                  "# HELP tollgate_identity_waits_total Requests that waited for an account's token.\n"
                  "# TYPE tollgate_identity_waits_total counter\n"
                  "tollgate_identity_waits_total %llu\n"
                  "# HELP tollgate_identity_rejected_total Tokens an upstream refused (401), each refreshed.\n"
                  "# TYPE tollgate_identity_rejected_total counter\n"
                  "tollgate_identity_rejected_total %llu\n",
                  (unsigned long long)s.token_requests, (unsigned long long)s.refreshed,
                  (unsigned long long)s.from_fleet, (unsigned long long)s.failed, (unsigned long long)s.waits,
                  (unsigned long long)s.rejected);
}

void tg_identity_metrics(tg_metrics_t *m, const tg_identity_t *id) {
    if (id)
        tg_metrics_collector_add(m, id_collect, &id->stats);
}

void tg_identity_render(const tg_identity_t *id, const tg_snapshot_t *s, tg_buf_t *out) {
    int64_t now = (int64_t)tg_wall_ms();
    tg_buf_appends(out, "# HELP tollgate_account_token_expires_seconds Seconds until the account's access token "
                        "(as this worker has it) expires.\n# TYPE tollgate_account_token_expires_seconds gauge\n");
    for (size_t i = 0; id && i < id->n; i++)
        if (id->e[i]->token)
            tg_buf_printf(out, "tollgate_account_token_expires_seconds{account=\"%lld\"} %.3f\n",
                          (long long)id->e[i]->account,
                          id->e[i]->exp_ms > now ? (double)(id->e[i]->exp_ms - now) / 1000.0 : 0.0);
    tg_buf_appends(out, "# HELP tollgate_account_auth_error The account's last token refresh failed, with the "
                        "reason (it is cooled down until a refresh succeeds).\n"
                        "# TYPE tollgate_account_auth_error gauge\n");
    size_t n = tg_snapshot_size(s);
    for (size_t i = 0; i < n; i++) {
        const tg_account_t *a = tg_snapshot_account_at(s, i);
        if (a && a->auth_error) {
            tg_buf_printf(out, "tollgate_account_auth_error{account=\"%lld\",reason=\"", (long long)a->id);
            tg_buf_append_log_safe(out, a->auth_error, strlen(a->auth_error), 1);
            tg_buf_appends(out, "\"} 1\n");
        }
    }
}
