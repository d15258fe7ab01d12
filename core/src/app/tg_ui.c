/*
 * The operator's console (see tg_ui.h): serves the admin-ui/ build embedded in the binary
 * and keeps the browser sessions that stand in for the admin token.
 *
 * Why sessions at all: the console must not keep the admin token where JavaScript can
 * read it (an XSS would leak the one credential that controls everything). The token is
 * typed once, exchanged for an HttpOnly, SameSite=Strict cookie, and writes additionally
 * need a per-session CSRF token sent in a header, which a cross-site form cannot set.
 *
 * The session table is the only mutable state and is shared by all workers, so it sits
 * behind one mutex; every operation on it is a short scan of at most TG_UI_MAX_SESSIONS
 * entries and no I/O happens while it is held.
 */
#include "tollgate/tg_access_log.h"
#include "tollgate/tg_ui.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#define SESSION_COOKIE "tg_session"
/* Failed logins are counted per client address (an IPv6 client per /64): the first
 * LOGIN_FREE_FAILURES in a row cost nothing, each one after locks that address for
 * LOGIN_LOCK_BASE_MS, doubled per further failure up to LOGIN_LOCK_MAX_MS. A success
 * clears the address; one idle for LOGIN_FORGET_MS is forgotten. The table is bounded:
 * LOGIN_SETS sets of LOGIN_WAYS entries, indexed by a keyed hash of the address, so an
 * attacker with many addresses can only evict entries of the sets it lands in (never
 * grow the table), and a lock never reaches another address. */
#define LOGIN_FREE_FAILURES 5
#define LOGIN_LOCK_BASE_MS 2000u
#define LOGIN_LOCK_MAX_MS 900000u
#define LOGIN_FORGET_MS 3600000u
#define LOGIN_SETS 1024
#define LOGIN_WAYS 4

/* Sent with every answer of this module. */
#define SECURITY_HEADERS                                                                                       \
    "Content-Security-Policy: default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " \
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'\r\n"                   \
    "X-Content-Type-Options: nosniff\r\n"                                                                      \
    "Referrer-Policy: no-referrer\r\n"                                                                         \
    "X-Frame-Options: DENY\r\n"                                                                                \
    "Cross-Origin-Opener-Policy: same-origin\r\n"

typedef struct {
    int used;
    uint8_t id_hash[32];    /* SHA-256 of the cookie value */
    uint8_t token_hash[32]; /* SHA-256 of the admin token it was made with */
    char csrf[65];
    uint64_t created_ms;    /* monotonic */
    uint64_t expires_ms;    /* monotonic */
    uint64_t expires_wall_ms;
} session_t;

typedef struct {
    uint8_t addr[17];      /* family byte + the address (IPv4) or its /64 (IPv6); 0 = unused */
    uint32_t fails;        /* failures in a row */
    uint64_t locked_until; /* monotonic ms */
    uint64_t last_ms;      /* monotonic ms of the last failure */
} login_fail_t;

static struct {
    pthread_mutex_t mu;
    session_t s[TG_UI_MAX_SESSIONS];
    login_fail_t fails[LOGIN_SETS][LOGIN_WAYS];
    uint64_t hash_key[2]; /* random, drawn on first use */
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- small helpers ------------------------------------------------------------------- */

static void hex_encode(const uint8_t *p, size_t n, char *out) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[p[i] >> 4];
        out[2 * i + 1] = hex[p[i] & 15];
    }
    out[2 * n] = '\0';
}

static void random_hex32(char out[65]) {
    uint8_t raw[32];
    if (tg_random_bytes(raw, sizeof(raw)) != 0)
        abort(); /* no randomness: refuse to mint guessable sessions */
    hex_encode(raw, sizeof(raw), out);
}

static const char *admin_token(const tg_request_t *req) {
    const char *t = req->worker && req->worker->gw && req->worker->gw->cfg ? req->worker->gw->cfg->admin_token : NULL;
    return t && *t ? t : NULL;
}

/* The value of cookie `name` in the Cookie header, or 0 if absent. */
static int cookie_get(const tg_request_t *req, const char *name, tg_str_t *out) {
    const tg_str_t *h = tg_request_header(req, "cookie");
    if (!h)
        return 0;
    size_t nlen = strlen(name);
    const char *p = h->p, *end = h->p + h->len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == ';'))
            p++;
        const char *semi = memchr(p, ';', (size_t)(end - p));
        const char *e = semi ? semi : end;
        if ((size_t)(e - p) > nlen && !memcmp(p, name, nlen) && p[nlen] == '=') {
            out->p = p + nlen + 1;
            out->len = (size_t)(e - out->p);
            while (out->len && out->p[out->len - 1] == ' ')
                out->len--;
            return 1;
        }
        p = e;
    }
    return 0;
}

/* A write must not come from another origin: when the browser names one, it must be ours. */
static int origin_ok(const tg_request_t *req) {
    const tg_str_t *o = tg_request_header(req, "origin");
    if (!o)
        return 1;
    const tg_str_t *host = tg_request_header(req, "host");
    size_t skip = 0;
    if (o->len > 8 && !strncasecmp(o->p, "https://", 8))
        skip = 8;
    else if (o->len > 7 && !strncasecmp(o->p, "http://", 7))
        skip = 7;
    if (!skip || !host)
        return 0;
    return o->len - skip == host->len && !strncasecmp(o->p + skip, host->p, host->len);
}

static int is_read(const tg_request_t *req) { return req->method == HTTP_GET || req->method == HTTP_HEAD; }

/* ---- the session table --------------------------------------------------------------- */

/* Index of the live session whose id hashes to id_hash (expired ones are dropped on the
 * way), or -1. Called with the mutex held. */
static int session_find_locked(const uint8_t id_hash[32], uint64_t now) {
    int found = -1;
    for (int i = 0; i < TG_UI_MAX_SESSIONS; i++) {
        session_t *s = &S.s[i];
        if (!s->used)
            continue;
        if (s->expires_ms <= now) {
            memset(s, 0, sizeof(*s));
            continue;
        }
        if (found < 0 && CRYPTO_memcmp(s->id_hash, id_hash, 32) == 0)
            found = i;
    }
    return found;
}

/* Looks the request's session up; on success copies its CSRF token into csrf (if not
 * NULL) and returns 1. A session made with another admin token than the current one is
 * not valid. */
static int session_lookup(const tg_request_t *req, char csrf[65], uint64_t *expires_wall_ms) {
    const char *token = admin_token(req);
    tg_str_t v;
    if (!token || !cookie_get(req, SESSION_COOKIE, &v) || v.len != 64)
        return 0;
    uint8_t id_hash[32], token_hash[32];
    SHA256((const unsigned char *)v.p, v.len, id_hash);
    SHA256((const unsigned char *)token, strlen(token), token_hash);
    int ok = 0;
    pthread_mutex_lock(&S.mu);
    int i = session_find_locked(id_hash, tg_now_ms());
    if (i >= 0 && CRYPTO_memcmp(S.s[i].token_hash, token_hash, 32) == 0) {
        ok = 1;
        if (csrf)
            memcpy(csrf, S.s[i].csrf, 65);
        if (expires_wall_ms)
            *expires_wall_ms = S.s[i].expires_wall_ms;
    }
    pthread_mutex_unlock(&S.mu);
    return ok;
}

/* Makes a session; writes the cookie value and the CSRF token. */
static void session_create(const char *token, char id[65], char csrf[65], uint64_t *expires_wall_ms) {
    random_hex32(id);
    random_hex32(csrf);
    session_t n = {.used = 1};
    SHA256((const unsigned char *)id, 64, n.id_hash);
    SHA256((const unsigned char *)token, strlen(token), n.token_hash);
    memcpy(n.csrf, csrf, 65);
    n.created_ms = tg_now_ms();
    n.expires_ms = n.created_ms + (uint64_t)TG_UI_SESSION_TTL_S * 1000;
    n.expires_wall_ms = tg_wall_ms() + (uint64_t)TG_UI_SESSION_TTL_S * 1000;
    *expires_wall_ms = n.expires_wall_ms;
    pthread_mutex_lock(&S.mu);
    int slot = -1, oldest = 0;
    for (int i = 0; i < TG_UI_MAX_SESSIONS; i++) {
        session_t *s = &S.s[i];
        if (s->used && s->expires_ms <= n.created_ms)
            memset(s, 0, sizeof(*s));
        if (!s->used) {
            slot = i;
            break;
        }
        if (s->created_ms < S.s[oldest].created_ms)
            oldest = i;
    }
    if (slot < 0) {
        tg_log_warn("admin-ui: %d sessions live; the oldest is logged out", TG_UI_MAX_SESSIONS);
        slot = oldest;
    }
    S.s[slot] = n;
    pthread_mutex_unlock(&S.mu);
}

static void session_delete(const tg_request_t *req) {
    tg_str_t v;
    if (!cookie_get(req, SESSION_COOKIE, &v) || v.len != 64)
        return;
    uint8_t id_hash[32];
    SHA256((const unsigned char *)v.p, v.len, id_hash);
    pthread_mutex_lock(&S.mu);
    int i = session_find_locked(id_hash, tg_now_ms());
    if (i >= 0)
        memset(&S.s[i], 0, sizeof(S.s[i]));
    pthread_mutex_unlock(&S.mu);
}

int tg_ui_authorized(const tg_request_t *req) {
    char csrf[65];
    if (!session_lookup(req, csrf, NULL))
        return 0;
    if (is_read(req))
        return 1;
    const tg_str_t *h = tg_request_header(req, "x-csrf-token");
    int ok = h && h->len == 64 && CRYPTO_memcmp(h->p, csrf, 64) == 0 && origin_ok(req);
    OPENSSL_cleanse(csrf, sizeof(csrf));
    return ok;
}

/* ---- answers ------------------------------------------------------------------------- */

static void ui_send(tg_request_t *req, int status, const char *ctype, const char *headers, const void *body, size_t n) {
    tg_buf_t h;
    tg_buf_init(&h);
    tg_buf_appends(&h, SECURITY_HEADERS);
    if (headers)
        tg_buf_appends(&h, headers);
    tg_response_start(req, status, ctype, h.data, (int64_t)n);
    if (req->method != HTTP_HEAD)
        tg_response_body(req, body, n);
    tg_response_end(req);
    tg_buf_free(&h);
}

static void send_json(tg_request_t *req, int status, const char *headers, const tg_buf_t *body) {
    tg_buf_t h;
    tg_buf_init(&h);
    tg_buf_appends(&h, "Cache-Control: no-store\r\n");
    if (headers)
        tg_buf_appends(&h, headers);
    ui_send(req, status, "application/json", h.data, body->data, body->len);
    tg_buf_free(&h);
}

static void send_error(tg_request_t *req, int status, const char *code, const char *msg, const char *headers) {
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_appends(&b, "{\"error\":{\"message\":\"");
    tg_buf_append_json_escaped(&b, msg, strlen(msg));
    tg_buf_printf(&b, "\",\"type\":\"%s\",\"code\":\"%s\"}}", status >= 500 ? "server_error" : "invalid_request_error",
                  code);
    send_json(req, status, headers, &b);
    tg_buf_free(&b);
}

static void append_cookie(tg_buf_t *h, const tg_request_t *req, const char *value, int max_age) {
    tg_buf_printf(h, "Set-Cookie: " SESSION_COOKIE "=%s; HttpOnly; SameSite=Strict; Path=/admin; Max-Age=%d%s\r\n",
                  value, max_age, req->tls ? "; Secure" : "");
}

/* ---- login, session, logout ---------------------------------------------------------- */

/* The lockout key of a client address: an IPv4 address whole (also when written as
 * ::ffff:a.b.c.d), an IPv6 one by its /64; anything else (a unix socket) shares one. */
static void login_addr(const char *ip, uint8_t out[17]) {
    memset(out, 0, 17);
    uint8_t a6[16];
    if (inet_pton(AF_INET, ip, out + 1) == 1) {
        out[0] = 4;
    } else if (inet_pton(AF_INET6, ip, a6) == 1) {
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!memcmp(a6, mapped, 12)) {
            out[0] = 4;
            memcpy(out + 1, a6 + 12, 4);
        } else {
            out[0] = 6;
            memcpy(out + 1, a6, 8);
        }
    } else {
        out[0] = 1;
    }
}

/* The set of a key: FNV-1a over the key mixed with a per-process random key, so which
 * addresses share a set cannot be chosen from outside. Called with the mutex held. */
static login_fail_t *login_set(const uint8_t addr[17]) {
    if (!S.hash_key[0] && !S.hash_key[1] && tg_random_bytes(S.hash_key, sizeof(S.hash_key)) != 0)
        S.hash_key[0] = 1;
    uint64_t h = 1469598103934665603ull ^ S.hash_key[0];
    for (int i = 0; i < 17; i++)
        h = (h ^ addr[i]) * 1099511628211ull;
    h ^= S.hash_key[1];
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return S.fails[h % LOGIN_SETS];
}

/* The entry of addr in its set, or NULL; forgotten ones are cleared on the way. */
static login_fail_t *login_find_locked(const uint8_t addr[17], uint64_t now) {
    login_fail_t *set = login_set(addr), *found = NULL;
    for (int i = 0; i < LOGIN_WAYS; i++) {
        login_fail_t *e = &set[i];
        if (!e->addr[0])
            continue;
        if (e->locked_until <= now && now - e->last_ms >= LOGIN_FORGET_MS) {
            memset(e, 0, sizeof(*e));
            continue;
        }
        if (!found && !memcmp(e->addr, addr, 17))
            found = e;
    }
    return found;
}

/* 0 when the client may try a token now, else the seconds until it may (Retry-After). */
static unsigned login_wait_s(const tg_request_t *req) {
    uint8_t addr[17];
    login_addr(req->client_ip, addr);
    uint64_t now = tg_now_ms();
    pthread_mutex_lock(&S.mu);
    login_fail_t *e = login_find_locked(addr, now);
    unsigned wait = e && e->locked_until > now ? (unsigned)((e->locked_until - now + 999) / 1000) : 0;
    pthread_mutex_unlock(&S.mu);
    return wait;
}

/* Records a login's outcome for its client address: a success clears it, a failure
 * counts and may lock it. Where the set is full, a failure takes the place of the entry
 * whose lock ends first (an unlocked one before any locked one). */
static void login_record(const tg_request_t *req, int failed) {
    uint8_t addr[17];
    login_addr(req->client_ip, addr);
    uint64_t now = tg_now_ms();
    pthread_mutex_lock(&S.mu);
    login_fail_t *e = login_find_locked(addr, now);
    if (!failed) {
        if (e)
            memset(e, 0, sizeof(*e));
        pthread_mutex_unlock(&S.mu);
        return;
    }
    if (!e) {
        login_fail_t *set = login_set(addr);
        for (int i = 0; i < LOGIN_WAYS && !e; i++)
            if (!set[i].addr[0])
                e = &set[i];
        if (!e) {
            e = &set[0];
            for (int i = 1; i < LOGIN_WAYS; i++)
                if (set[i].locked_until < e->locked_until ||
                    (set[i].locked_until == e->locked_until && set[i].last_ms < e->last_ms))
                    e = &set[i];
        }
        memset(e, 0, sizeof(*e));
        memcpy(e->addr, addr, 17);
    }
    if (e->fails < 64)
        e->fails++;
    e->last_ms = now;
    if (e->fails >= LOGIN_FREE_FAILURES) {
        uint32_t shift = e->fails - LOGIN_FREE_FAILURES;
        uint64_t lock = shift >= 20 ? LOGIN_LOCK_MAX_MS : (uint64_t)LOGIN_LOCK_BASE_MS << shift;
        e->locked_until = now + TG_MIN(lock, (uint64_t)LOGIN_LOCK_MAX_MS);
    }
    pthread_mutex_unlock(&S.mu);
}

static void handle_login(tg_request_t *req) {
    const char *token = admin_token(req);
    if (!token) {
        send_error(req, 403, "admin_disabled", "the admin API is disabled: set admin_token or TOLLGATE_ADMIN_TOKEN",
                   NULL);
        return;
    }
    if (!origin_ok(req)) {
        send_error(req, 403, "cross_origin", "login from another site is refused", NULL);
        return;
    }
    unsigned wait = login_wait_s(req);
    if (wait) {
        /* The token is not even looked at: a locked address learns nothing. */
        char msg[128], hdr[48];
        snprintf(msg, sizeof(msg), "too many failed logins from this address; try again in %u s", wait);
        snprintf(hdr, sizeof(hdr), "Retry-After: %u\r\n", wait);
        send_error(req, 429, "too_many_attempts", msg, hdr);
        return;
    }
    json_error_t jerr;
    json_t *body = json_loadb(req->body.data ? req->body.data : "", req->body.len, 0, &jerr);
    json_t *t = json_object_get(body, "token");
    if (!json_is_string(t)) {
        json_decref(body);
        send_error(req, 400, "invalid_json", "send {\"token\": \"<admin token>\"}", NULL);
        return;
    }
    /* Compare digests so neither the content nor the length leaks through timing. */
    uint8_t a[32], b[32];
    SHA256((const unsigned char *)json_string_value(t), json_string_length(t), a);
    SHA256((const unsigned char *)token, strlen(token), b);
    json_decref(body);
    if (CRYPTO_memcmp(a, b, 32) != 0) {
        login_record(req, 1);
        tg_log_warn("admin-ui %s: failed login from %s", req->id, req->client_ip);
        send_error(req, 401, "invalid_admin_token", "wrong admin token", NULL);
        return;
    }
    login_record(req, 0);
    char id[65], csrf[65];
    uint64_t expires;
    session_create(token, id, csrf, &expires);
    tg_buf_t h, out;
    tg_buf_init(&h);
    tg_buf_init(&out);
    append_cookie(&h, req, id, TG_UI_SESSION_TTL_S);
    tg_buf_printf(&out, "{\"csrf\":\"%s\",\"expires_at_ms\":%llu}", csrf, (unsigned long long)expires);
    tg_log_info("admin-ui %s: login from %s", req->id, req->client_ip);
    send_json(req, 200, h.data, &out);
    OPENSSL_cleanse(id, sizeof(id));
    OPENSSL_cleanse(h.data, h.len);
    tg_buf_free(&h);
    tg_buf_free(&out);
}

static void handle_session(tg_request_t *req) {
    char csrf[65];
    uint64_t expires;
    if (!session_lookup(req, csrf, &expires)) {
        send_error(req, 401, "no_session", "not logged in", NULL);
        return;
    }
    tg_buf_t out;
    tg_buf_init(&out);
    tg_buf_printf(&out, "{\"csrf\":\"%s\",\"expires_at_ms\":%llu}", csrf, (unsigned long long)expires);
    send_json(req, 200, NULL, &out);
    tg_buf_free(&out);
}

static void handle_logout(tg_request_t *req) {
    char csrf[65];
    if (session_lookup(req, csrf, NULL)) {
        const tg_str_t *h = tg_request_header(req, "x-csrf-token");
        if (!h || h->len != 64 || CRYPTO_memcmp(h->p, csrf, 64) != 0 || !origin_ok(req)) {
            send_error(req, 403, "invalid_csrf_token", "missing or wrong x-csrf-token header", NULL);
            return;
        }
        session_delete(req);
    }
    tg_buf_t h;
    tg_buf_init(&h);
    tg_buf_appends(&h, "Cache-Control: no-store\r\n");
    append_cookie(&h, req, "", 0);
    ui_send(req, 204, NULL, h.data, NULL, 0);
    tg_buf_free(&h);
}

/* ---- static files -------------------------------------------------------------------- */

static const tg_ui_asset_t *asset_find(const char *path, size_t len) {
    for (const tg_ui_asset_t *a = tg_ui_assets; a->path; a++)
        if (strlen(a->path) == len && !memcmp(a->path, path, len))
            return a;
    return NULL;
}

/* True when the client lists gzip in Accept-Encoding with a q-value above zero. */
static int accepts_gzip(const tg_request_t *req) {
    const tg_str_t *h = tg_request_header(req, "accept-encoding");
    if (!h)
        return 0;
    size_t i = 0, n = h->len;
    const char *s = h->p;
    while (i < n) {
        size_t end = i; /* this list element is s[i, end) */
        while (end < n && s[end] != ',')
            end++;
        while (i < end && s[i] == ' ')
            i++;
        size_t name_end = i;
        while (name_end < end && s[name_end] != ';' && s[name_end] != ' ')
            name_end++;
        if (name_end - i == 4 && !strncasecmp(s + i, "gzip", 4)) {
            /* ";q=0", ";q=0.000" refuse; no q or any other value accepts. */
            size_t q = name_end;
            while (q < end && (s[q] == ' ' || s[q] == ';'))
                q++;
            if (q + 2 > end || (s[q] != 'q' && s[q] != 'Q') || s[q + 1] != '=')
                return 1;
            for (q += 2; q < end && s[q] != ' '; q++)
                if (s[q] >= '1' && s[q] <= '9')
                    return 1;
            return 0;
        }
        i = end + 1;
    }
    return 0;
}

static int etag_matches(const tg_request_t *req, const char *etag) {
    const tg_str_t *h = tg_request_header(req, "if-none-match");
    if (!h || !etag)
        return 0;
    size_t n = strlen(etag);
    for (size_t i = 0; i + n <= h->len; i++)
        if (!memcmp(h->p + i, etag, n))
            return 1;
    return 0;
}

static void serve_asset(tg_request_t *req, const tg_ui_asset_t *a) {
    tg_buf_t h;
    tg_buf_init(&h);
    tg_buf_appends(&h, a->immutable ? "Cache-Control: public, max-age=31536000, immutable\r\n" : "Cache-Control: no-cache\r\n");
    if (a->etag)
        tg_buf_printf(&h, "ETag: %s\r\n", a->etag);
    if (a->gz)
        tg_buf_appends(&h, "Vary: Accept-Encoding\r\n");
    int gz = a->gz && accepts_gzip(req);
    if (gz)
        tg_buf_appends(&h, "Content-Encoding: gzip\r\n");
    if (etag_matches(req, a->etag)) {
        /* No body; Content-Length is what a 200 would have carried (RFC 9110 8.6). */
        tg_buf_appends(&h, SECURITY_HEADERS);
        tg_response_start(req, 304, NULL, h.data, (int64_t)(gz ? a->gz_len : a->len));
        tg_response_end(req);
    } else {
        ui_send(req, 200, a->content_type, h.data, gz ? a->gz : a->data, gz ? a->gz_len : a->len);
    }
    tg_buf_free(&h);
}

static const char not_built_html[] =
    "<!doctype html><meta charset=utf-8><title>tollgate admin</title>"
    "<h1>The admin console was not built</h1>"
    "<p>When this binary was built, npm was missing or could not install the console's packages "
    "(the build printed a warning saying which), so the web console is not inside it. "
    "Install Node.js and npm, then configure and build again. "
    "The admin API under <code>/admin/api/v1/</code> works without it.</p>\n";

/* A path that names a file (has an extension in its last segment, or is under assets/)
 * gets 404 when missing; anything else is a console route and gets index.html. */
static int looks_like_file(const char *rel) {
    if (!strncmp(rel, "assets/", 7))
        return 1;
    const char *slash = strrchr(rel, '/');
    const char *last = slash ? slash + 1 : rel;
    return strchr(last, '.') != NULL;
}

static void serve_static(tg_request_t *req, const char *path) {
    if (!is_read(req)) {
        tg_buf_t b;
        tg_buf_init(&b);
        tg_buf_appends(&b, "{\"error\":{\"message\":\"use GET\",\"type\":\"invalid_request_error\","
                           "\"code\":\"method_not_allowed\"}}");
        send_json(req, 405, "Allow: GET, HEAD\r\n", &b);
        tg_buf_free(&b);
        return;
    }
    const char *rel = path + strlen("/admin/");
    const tg_ui_asset_t *a = *rel ? asset_find(rel, strlen(rel)) : NULL;
    if (!a && *rel && looks_like_file(rel)) {
        static const char msg[] = "not found\n";
        ui_send(req, 404, "text/plain; charset=utf-8", "Cache-Control: no-cache\r\n", msg, sizeof(msg) - 1);
        return;
    }
    if (!a)
        a = asset_find("index.html", 10);
    if (!a) {
        ui_send(req, 503, "text/html; charset=utf-8", "Cache-Control: no-cache\r\n", not_built_html,
             sizeof(not_built_html) - 1);
        return;
    }
    serve_asset(req, a);
}

/* ---- dispatch ------------------------------------------------------------------------ */

static void ui_finish(tg_request_t *req, int aborted) {
    tg_access_line_t line = {.route = "admin_ui"};
    tg_access_log(req, aborted, &line);
}

void tg_ui_handle(tg_request_t *req, const char *path) {
    req->route = TG_ROUTE_ADMIN;
    req->handler_data = NULL;
    req->abort_cb = NULL;
    req->drain_cb = NULL;
    req->finish_cb = ui_finish;
    if (!strcmp(path, "/admin")) {
        ui_send(req, 308, NULL, "Location: /admin/\r\nCache-Control: no-cache\r\n", NULL, 0);
        return;
    }
    if (!strcmp(path, "/admin/login") && req->method == HTTP_POST) {
        handle_login(req);
        return;
    }
    if (!strcmp(path, "/admin/logout") && req->method == HTTP_POST) {
        handle_logout(req);
        return;
    }
    if (!strcmp(path, "/admin/session") && is_read(req)) {
        handle_session(req);
        return;
    }
    serve_static(req, path);
}
