/*
 * AWS Signature Version 4, the event-stream framing and Bedrock's InvokeModel for
 * Anthropic models (tollgate/tg_aws.h says what each part does).
 *
 * SigV4, as AWS documents it:
 *   CanonicalRequest = Method \n CanonicalURI \n CanonicalQuery \n
 *                      (name:value \n)* \n SignedHeaders \n HexSHA256(body)
 *   StringToSign     = "AWS4-HMAC-SHA256" \n amz-date \n scope \n HexSHA256(CanonicalRequest)
 *   scope            = YYYYMMDD/region/service/aws4_request
 *   kSigning         = HMAC(HMAC(HMAC(HMAC("AWS4" secret, YYYYMMDD), region), service), "aws4_request")
 *   Signature        = Hex(HMAC(kSigning, StringToSign))
 *
 * An event-stream message: total length (4, big-endian), headers length (4), CRC32 of
 * those 8 bytes (4), headers, payload, CRC32 of everything before it (4). A header:
 * name length (1), name, value type (1), value (type 7, a string: length (2) and bytes;
 * the other types have their own fixed or prefixed sizes). Bedrock's messages carry
 * :message-type (event, exception or error), :event-type (chunk) or :exception-type, and
 * :content-type; a chunk's payload is {"bytes":"<base64 of one Anthropic stream event>"}.
 */
#include "tollgate/tg_aws.h"
#include "tollgate/tg_json.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- CRC-32 --------------------------------------------------------------------------- */

static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
    __atomic_store_n(&crc_ready, 1, __ATOMIC_RELEASE);
}

uint32_t tg_crc32(uint32_t crc, const void *data, size_t n) {
    if (!__atomic_load_n(&crc_ready, __ATOMIC_ACQUIRE))
        crc_init(); /* idempotent: two threads write the same table */
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++)
        crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* ---- SigV4 ---------------------------------------------------------------------------- */

static const char HEX[] = "0123456789abcdef";

static void hex_of(const unsigned char *d, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = HEX[d[i] >> 4];
        out[2 * i + 1] = HEX[d[i] & 15];
    }
    out[2 * n] = '\0';
}

static int unreserved(unsigned char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.' || c == '~';
}

void tg_aws_uri_encode(tg_buf_t *b, const char *s, size_t n, int keep_slash) {
    static const char UP[] = "0123456789ABCDEF";
    tg_buf_reserve(b, n * 3);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (unreserved(c) || (keep_slash && c == '/')) {
            b->data[b->len++] = (char)c;
        } else {
            b->data[b->len++] = '%';
            b->data[b->len++] = UP[c >> 4];
            b->data[b->len++] = UP[c & 15];
        }
    }
    b->data[b->len] = '\0';
}

void tg_aws_canonical_uri(tg_buf_t *b, const char *path, size_t n) {
    if (!n) {
        tg_buf_appends(b, "/");
        return;
    }
    tg_aws_uri_encode(b, path, n, 1);
}

/* SHA-256 fetched once: OpenSSL 3's one-shot SHA256() and HMAC() fetch the algorithm
 * (and HMAC a MAC context) on every call, most of their cost on short inputs. */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static void sha256_fetch(void) { sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL); }

static void digest(EVP_MD_CTX *c, const void *a, size_t an, const void *b, size_t bn, unsigned char out[32]) {
    EVP_DigestInit_ex(c, sha256_md, NULL);
    EVP_DigestUpdate(c, a, an);
    if (bn)
        EVP_DigestUpdate(c, b, bn);
    EVP_DigestFinal_ex(c, out, NULL);
}

/* HMAC-SHA256 (RFC 2104) on the reused digest context. */
static void hmac(EVP_MD_CTX *c, const void *key, size_t klen, const void *msg, size_t mlen, unsigned char out[32]) {
    unsigned char k[64] = {0}, pad[64], inner[32];
    if (klen > 64)
        digest(c, key, klen, NULL, 0, k);
    else
        memcpy(k, key, klen);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x36;
    digest(c, pad, 64, msg, mlen, inner);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x5c;
    digest(c, pad, 64, inner, 32, out);
    OPENSSL_cleanse(k, sizeof(k));
    OPENSSL_cleanse(pad, sizeof(pad));
}

static void hex_digest(EVP_MD_CTX *c, const void *data, size_t n, char out[65]) {
    unsigned char d[32];
    digest(c, data, n, NULL, 0, d);
    hex_of(d, 32, out);
}

void tg_aws_sha256_hex(const void *data, size_t n, char out[65]) {
    pthread_once(&sha256_once, sha256_fetch);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || !sha256_md)
        abort();
    hex_digest(c, data, n, out);
    EVP_MD_CTX_free(c);
}

/* The derived signing key of (secret, day, region, service). It changes once a day, so
 * each thread keeps the last few it derived (four HMACs saved per request). */
#define KEY_CACHE 4
static __thread struct {
    char scope[96];  /* day/region/service */
    char secret[129];
    unsigned char key[32];
} key_cache[KEY_CACHE];
static __thread unsigned key_next;

static void signing_key(EVP_MD_CTX *c, const tg_sigv4_t *r, unsigned char k[32]) {
    char scope[96];
    int sn = snprintf(scope, sizeof(scope), "%.8s/%s/%s", r->amz_date, r->region, r->service);
    size_t sl = strlen(r->secret);
    int cacheable = sn > 0 && (size_t)sn < sizeof(scope) && sl < sizeof(key_cache[0].secret);
    for (int i = 0; cacheable && i < KEY_CACHE; i++)
        if (key_cache[i].scope[0] && !strcmp(key_cache[i].scope, scope) &&
            CRYPTO_memcmp(key_cache[i].secret, r->secret, sl + 1) == 0) {
            memcpy(k, key_cache[i].key, 32);
            return;
        }
    tg_buf_t ks;
    tg_buf_init(&ks);
    tg_buf_appends(&ks, "AWS4");
    tg_buf_appends(&ks, r->secret);
    hmac(c, ks.data, ks.len, r->amz_date, 8, k);
    OPENSSL_cleanse(ks.data, ks.len);
    tg_buf_free(&ks);
    hmac(c, k, 32, r->region, strlen(r->region), k);
    hmac(c, k, 32, r->service, strlen(r->service), k);
    hmac(c, k, 32, "aws4_request", 12, k);
    if (cacheable) {
        unsigned i = key_next++ % KEY_CACHE;
        OPENSSL_cleanse(key_cache[i].secret, sizeof(key_cache[i].secret));
        memcpy(key_cache[i].scope, scope, (size_t)sn + 1);
        memcpy(key_cache[i].secret, r->secret, sl + 1);
        memcpy(key_cache[i].key, k, 32);
    }
}

void tg_sigv4_signature(const tg_sigv4_t *r, char sig[65], tg_buf_t *canonical, tg_buf_t *to_sign) {
    tg_buf_t cr, sts;
    tg_buf_init(&cr);
    tg_buf_init(&sts);
    tg_buf_appends(&cr, r->method);
    tg_buf_appends(&cr, "\n");
    tg_buf_appends(&cr, r->canon_uri);
    tg_buf_appends(&cr, "\n");
    tg_buf_appends(&cr, r->canon_query ? r->canon_query : "");
    tg_buf_appends(&cr, "\n");
    for (size_t i = 0; i < r->nheaders; i++) {
        tg_buf_appends(&cr, r->headers[i].name);
        tg_buf_appends(&cr, ":");
        tg_buf_appends(&cr, r->headers[i].value);
        tg_buf_appends(&cr, "\n");
    }
    tg_buf_appends(&cr, "\n");
    for (size_t i = 0; i < r->nheaders; i++) {
        if (i)
            tg_buf_appends(&cr, ";");
        tg_buf_appends(&cr, r->headers[i].name);
    }
    tg_buf_appends(&cr, "\n");
    tg_buf_appends(&cr, r->payload_hash);
    pthread_once(&sha256_once, sha256_fetch);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || !sha256_md)
        abort();
    char crh[65];
    hex_digest(c, cr.data, cr.len, crh);

    tg_buf_appends(&sts, "AWS4-HMAC-SHA256\n");
    tg_buf_appends(&sts, r->amz_date);
    tg_buf_appends(&sts, "\n");
    tg_buf_append(&sts, r->amz_date, 8);
    tg_buf_printf(&sts, "/%s/%s/aws4_request\n%s", r->region, r->service, crh);

    unsigned char k[32];
    signing_key(c, r, k);
    unsigned char s[32];
    hmac(c, k, 32, sts.data, sts.len, s);
    OPENSSL_cleanse(k, sizeof(k));
    EVP_MD_CTX_free(c);
    hex_of(s, 32, sig);
    if (canonical)
        tg_buf_append(canonical, cr.data, cr.len);
    if (to_sign)
        tg_buf_append(to_sign, sts.data, sts.len);
    tg_buf_free(&cr);
    tg_buf_free(&sts);
}

void tg_sigv4_authorization(tg_buf_t *b, const tg_sigv4_t *r, const char *access_key, const char *sig) {
    tg_buf_appends(b, "AWS4-HMAC-SHA256 Credential=");
    tg_buf_appends(b, access_key);
    tg_buf_appends(b, "/");
    tg_buf_append(b, r->amz_date, 8);
    tg_buf_printf(b, "/%s/%s/aws4_request, SignedHeaders=", r->region, r->service);
    for (size_t i = 0; i < r->nheaders; i++) {
        if (i)
            tg_buf_appends(b, ";");
        tg_buf_appends(b, r->headers[i].name);
    }
    tg_buf_appends(b, ", Signature=");
    tg_buf_appends(b, sig);
}

void tg_aws_amz_date(time_t t, char out[17]) {
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

/* ---- the event-stream framing --------------------------------------------------------- */

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

void tg_es_init(tg_es_decoder_t *d, size_t max, tg_es_cb cb, void *ud) {
    memset(d, 0, sizeof(*d));
    tg_buf_init(&d->buf);
    d->max = max < 16 ? 16 : max;
    d->cb = cb;
    d->ud = ud;
}

void tg_es_free(tg_es_decoder_t *d) { tg_buf_free(&d->buf); }

int tg_es_partial(const tg_es_decoder_t *d) { return !d->failed && d->buf.len > 0; }

static int es_fail(tg_es_decoder_t *d, const char *why) {
    d->failed = 1;
    snprintf(d->why, sizeof(d->why), "%s", why);
    tg_buf_free(&d->buf);
    return TG_ERROR;
}

/* Checks the prelude of a message (12 bytes); its total length, or 0 when it is bad. */
static uint32_t prelude_ok(tg_es_decoder_t *d, const unsigned char *p) {
    uint32_t total = be32(p), hlen = be32(p + 4);
    if (tg_crc32(0, p, 8) != be32(p + 8)) {
        es_fail(d, "prelude CRC mismatch");
        return 0;
    }
    if (total < 16 || total > d->max || hlen > total - 16) {
        es_fail(d, total > d->max ? "a message longer than allowed" : "inconsistent lengths");
        return 0;
    }
    return total;
}

/* One whole message (its prelude checked): the headers read, the message CRC checked. */
static int es_message(tg_es_decoder_t *d, const unsigned char *p, uint32_t total) {
    if (tg_crc32(0, p, total - 4) != be32(p + total - 4))
        return es_fail(d, "message CRC mismatch");
    uint32_t hlen = be32(p + 4);
    tg_es_msg_t m;
    memset(&m, 0, sizeof(m));
    const unsigned char *h = p + 12, *hend = h + hlen;
    while (h < hend) {
        size_t nl = *h++;
        if ((size_t)(hend - h) < nl + 1)
            return es_fail(d, "a header runs past the headers");
        const char *name = (const char *)h;
        h += nl;
        unsigned type = *h++;
        size_t vl;
        switch (type) {
        case 0: case 1: vl = 0; break;          /* bool true / false */
        case 2: vl = 1; break;                  /* byte */
        case 3: vl = 2; break;                  /* short */
        case 4: vl = 4; break;                  /* integer */
        case 5: case 8: vl = 8; break;          /* long, timestamp */
        case 9: vl = 16; break;                 /* uuid */
        case 6: case 7:                         /* byte array, string: 2-byte length */
            if (hend - h < 2)
                return es_fail(d, "a header runs past the headers");
            vl = (size_t)h[0] << 8 | h[1];
            h += 2;
            break;
        default:
            return es_fail(d, "a header of an unknown type");
        }
        if ((size_t)(hend - h) < vl)
            return es_fail(d, "a header runs past the headers");
        if (type == 7) {
#define HDR(lit, field)                                                                          \
    if (nl == sizeof(lit) - 1 && !memcmp(name, lit, nl)) {                                       \
        m.field = (const char *)h;                                                               \
        m.field##_len = vl;                                                                      \
    }
            HDR(":event-type", event_type)
            else HDR(":message-type", message_type)
            else HDR(":exception-type", exception_type)
            else HDR(":error-code", error_code)
            else HDR(":error-message", error_message)
#undef HDR
        }
        h += vl;
    }
    m.payload = (const char *)hend;
    m.payload_len = total - 16 - hlen;
    d->cb(d->ud, &m);
    return TG_OK;
}

int tg_es_feed(tg_es_decoder_t *d, const void *data, size_t n) {
    const unsigned char *p = data, *end = p + n;
    while (p < end && !d->failed) {
        if (!d->buf.len) {
            /* Whole messages in the input are read where they are. */
            if (end - p >= 12) {
                uint32_t total = prelude_ok(d, p);
                if (!total)
                    return TG_ERROR;
                if ((size_t)(end - p) >= total) {
                    if (es_message(d, p, total) != TG_OK)
                        return TG_ERROR;
                    p += total;
                    continue;
                }
            }
            tg_buf_append(&d->buf, p, (size_t)(end - p));
            p = end;
            if (d->buf.len >= 12 && !prelude_ok(d, (const unsigned char *)d->buf.data))
                return TG_ERROR;
            break;
        }
        /* A message begun in an earlier piece: the prelude first, then the rest. */
        size_t want = 12;
        if (d->buf.len >= 12)
            want = be32((const unsigned char *)d->buf.data);
        size_t take = TG_MIN(want - d->buf.len, (size_t)(end - p));
        tg_buf_append(&d->buf, p, take);
        p += take;
        if (d->buf.len == 12 && want == 12) {
            if (!prelude_ok(d, (const unsigned char *)d->buf.data))
                return TG_ERROR;
            continue;
        }
        if (d->buf.len >= 12 && d->buf.len == be32((const unsigned char *)d->buf.data)) {
            int rc = es_message(d, (const unsigned char *)d->buf.data, (uint32_t)d->buf.len);
            d->buf.len = 0;
            if (rc != TG_OK)
                return TG_ERROR;
        }
    }
    return d->failed ? TG_ERROR : TG_OK;
}

static void put_be32(tg_buf_t *b, uint32_t v) {
    unsigned char x[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    tg_buf_append(b, x, 4);
}

void tg_es_encode(tg_buf_t *out, const char *const *names, const char *const *values, size_t nh, const void *payload,
                  size_t n) {
    size_t hlen = 0;
    for (size_t i = 0; i < nh; i++)
        hlen += 1 + strlen(names[i]) + 1 + 2 + strlen(values[i]);
    size_t start = out->len;
    put_be32(out, (uint32_t)(16 + hlen + n));
    put_be32(out, (uint32_t)hlen);
    put_be32(out, tg_crc32(0, out->data + start, 8));
    for (size_t i = 0; i < nh; i++) {
        size_t nl = strlen(names[i]), vl = strlen(values[i]);
        unsigned char x = (unsigned char)nl;
        tg_buf_append(out, &x, 1);
        tg_buf_append(out, names[i], nl);
        unsigned char t[3] = {7, (unsigned char)(vl >> 8), (unsigned char)vl};
        tg_buf_append(out, t, 3);
        tg_buf_append(out, values[i], vl);
    }
    tg_buf_append(out, payload, n);
    put_be32(out, tg_crc32(0, out->data + start, out->len - start));
}

/* ---- Bedrock -------------------------------------------------------------------------- */

void tg_bedrock_path(tg_buf_t *b, const char *model_id, int stream) {
    tg_buf_appends(b, "/model/");
    tg_aws_uri_encode(b, model_id ? model_id : "", model_id ? strlen(model_id) : 0, 0);
    tg_buf_appends(b, stream ? "/invoke-with-response-stream" : "/invoke");
}

char *tg_bedrock_body(json_t *messages_body) {
    json_t *doc = json_copy(messages_body);
    if (!doc)
        return NULL;
    json_object_del(doc, "model");
    json_object_del(doc, "stream");
    if (!json_is_string(json_object_get(doc, "anthropic_version")))
        json_object_set_new(doc, "anthropic_version", json_string(TG_BEDROCK_ANTHROPIC_VERSION));
    char *s = tg_json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return s;
}

static int all_of(const char *s, const char *set, size_t max) {
    size_t n = s ? strlen(s) : 0;
    return n > 0 && n <= max && strspn(s, set) == n;
}

const char *tg_bedrock_check(const json_t *settings) {
    if (!all_of(json_string_value(json_object_get(settings, "region")), "abcdefghijklmnopqrstuvwxyz0123456789-", 32))
        return "settings.region must name the AWS region (e.g. us-east-1)";
    if (!all_of(json_string_value(json_object_get(settings, "access_key_id")), "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
                128))
        return "settings.access_key_id must be the AWS access key id (e.g. AKIA...)";
    return NULL;
}

void tg_aws_creds_split(const char *credential, tg_aws_creds_t *c) {
    const char *colon = credential ? strchr(credential, ':') : NULL;
    c->secret = credential ? credential : "";
    c->secret_len = colon ? (size_t)(colon - credential) : strlen(c->secret);
    c->token = colon && colon[1] ? colon + 1 : NULL;
}

/* Signs one request (content_type NULL: none signed) and appends its header lines. */
static void aws_sign(tg_buf_t *head, const tg_aws_creds_t *c, const char *method, const char *service,
                     const char *host, const char *path, const char *query, const char *content_type, const void *body,
                     size_t len, time_t now) {
    char date[17], phash[65], sig[65];
    tg_aws_amz_date(now, date);
    tg_aws_sha256_hex(body, len, phash);
    tg_buf_t uri, secret;
    tg_buf_init(&uri);
    tg_buf_init(&secret);
    const char *q = strchr(path, '?');
    tg_aws_canonical_uri(&uri, path, q ? (size_t)(q - path) : strlen(path));
    tg_buf_append(&secret, c->secret, c->secret_len);
    tg_aws_header_t h[4];
    size_t nh = 0;
    if (content_type)
        h[nh++] = (tg_aws_header_t){"content-type", content_type};
    h[nh++] = (tg_aws_header_t){"host", host};
    h[nh++] = (tg_aws_header_t){"x-amz-date", date};
    if (c->token)
        h[nh++] = (tg_aws_header_t){"x-amz-security-token", c->token};
    tg_sigv4_t r = {method, uri.data, query, h, nh, phash, date, c->region, service, secret.data ? secret.data : ""};
    tg_sigv4_signature(&r, sig, NULL, NULL);
    tg_buf_appends(head, "\r\nX-Amz-Date: ");
    tg_buf_appends(head, date);
    if (c->token) {
        tg_buf_appends(head, "\r\nX-Amz-Security-Token: ");
        tg_buf_appends(head, c->token);
    }
    tg_buf_appends(head, "\r\nAuthorization: ");
    tg_sigv4_authorization(head, &r, c->access_key, sig);
    if (secret.data)
        OPENSSL_cleanse(secret.data, secret.len);
    tg_buf_free(&secret);
    tg_buf_free(&uri);
}

void tg_bedrock_sign(tg_buf_t *head, const tg_aws_creds_t *c, const char *host, const char *path, const void *body,
                     size_t len, time_t now) {
    aws_sign(head, c, "POST", "bedrock", host, path, "", "application/json", body, len, now);
}

void tg_aws_sign_get(tg_buf_t *head, const tg_aws_creds_t *c, const char *service, const char *host, const char *path,
                     const char *query, time_t now) {
    aws_sign(head, c, "GET", service, host, path, query ? query : "", NULL, "", 0, now);
}

/* The string value of the top-level member `key` of a JSON object, as it is written
 * (between its quotes, escapes not undone; *escaped says whether it has any); 0 when
 * absent or not a string. A structural scan: no allocation, no tree. */
static int top_string(const char *s, size_t n, const char *key, const char **v, size_t *vlen, int *escaped) {
    size_t kl = strlen(key);
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            depth--;
        } else if (ch == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != '"')
                j += s[j] == '\\' ? 2 : 1;
            if (j >= n)
                return 0;
            int is_key = depth == 1 && j - i - 1 == kl && !memcmp(s + i + 1, key, kl);
            i = j;
            if (!is_key)
                continue;
            size_t k = j + 1;
            while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r'))
                k++;
            if (k >= n || s[k] != ':')
                continue; /* a string value that looks like the key */
            k++;
            while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r'))
                k++;
            if (k >= n || s[k] != '"')
                return 0;
            size_t b = ++k;
            *escaped = 0;
            while (k < n && s[k] != '"') {
                if (s[k] == '\\')
                    *escaped = 1, k++;
                k++;
            }
            if (k >= n)
                return 0;
            *v = s + b;
            *vlen = k - b;
            return 1;
        }
    }
    return 0;
}

static const char *anthropic_error_type(const char *ex, size_t n) {
#define IS(lit) (n == sizeof(lit) - 1 && !memcmp(ex, lit, n))
    if (IS("throttlingException"))
        return "rate_limit_error";
    if (IS("serviceUnavailableException"))
        return "overloaded_error";
    if (IS("validationException"))
        return "invalid_request_error";
    if (IS("accessDeniedException"))
        return "permission_error";
    return "api_error";
#undef IS
}

/* Gives an Anthropic error event and ends the stream. */
static void stream_error(tg_bedrock_stream_t *s, const char *type, const char *what, size_t wlen, const char *msg,
                         size_t mlen) {
    tg_buf_t e;
    tg_buf_init(&e);
    tg_buf_appends(&e, "{\"type\":\"error\",\"error\":{\"type\":\"");
    tg_buf_appends(&e, type);
    tg_buf_appends(&e, "\",\"message\":\"Bedrock: ");
    tg_buf_append_json_escaped(&e, what, wlen);
    if (mlen) {
        tg_buf_appends(&e, ": ");
        tg_buf_append_json_escaped(&e, msg, mlen);
    }
    tg_buf_appends(&e, "\"}}");
    s->ended = 1;
    s->cb(s->ud, "error", 5, e.data, e.len);
    tg_buf_free(&e);
}

static void stream_msg(void *ud, const tg_es_msg_t *m) {
    tg_bedrock_stream_t *s = ud;
    if (s->ended)
        return;
    int exception = m->message_type_len == 9 && !memcmp(m->message_type, "exception", 9);
    int error = m->message_type_len == 5 && !memcmp(m->message_type, "error", 5);
    if (exception || error) {
        /* Rare: the payload's {"message"} read with a real parse. */
        json_t *doc = error && m->error_message_len ? NULL : json_loadb(m->payload, m->payload_len, 0, NULL);
        const char *msg = error && m->error_message_len ? m->error_message
                                                        : json_string_value(json_object_get(doc, "message"));
        size_t mlen = error && m->error_message_len ? m->error_message_len
                                                    : msg ? json_string_length(json_object_get(doc, "message")) : 0;
        const char *what = exception ? m->exception_type : m->error_code;
        size_t wlen = exception ? m->exception_type_len : m->error_code_len;
        stream_error(s, exception ? anthropic_error_type(what, wlen) : "api_error", wlen ? what : "exception",
                     wlen ? wlen : 9, msg ? msg : "", mlen);
        json_decref(doc);
        return;
    }
    if (!(m->event_type_len == 5 && !memcmp(m->event_type, "chunk", 5)))
        return; /* initial-response and other events carry nothing for the client */
    const char *b64;
    size_t blen;
    int esc;
    if (!top_string(m->payload, m->payload_len, "bytes", &b64, &blen, &esc)) {
        stream_error(s, "api_error", "a chunk without its bytes", 25, "", 0);
        return;
    }
    if (esc) {
        /* Base64 may come with its slashes escaped ("\/"); nothing else is escaped in it. */
        tg_buf_reset(&s->b64);
        for (size_t i = 0; i < blen; i++) {
            if (b64[i] == '\\') {
                if (++i >= blen || b64[i] != '/') {
                    stream_error(s, "api_error", "a chunk without its bytes", 25, "", 0);
                    return;
                }
            }
            tg_buf_append(&s->b64, b64 + i, 1);
        }
        b64 = s->b64.data;
        blen = s->b64.len;
    }
    int got = -1;
    if (blen && blen % 4 == 0) {
        tg_buf_reset(&s->json);
        tg_buf_reserve(&s->json, blen / 4 * 3 + 1);
        got = EVP_DecodeBlock((unsigned char *)s->json.data, (const unsigned char *)b64, (int)blen);
        if (got >= 0) {
            got -= b64[blen - 1] == '=' ? (b64[blen - 2] == '=' ? 2 : 1) : 0;
            s->json.len = (size_t)got;
            s->json.data[s->json.len] = '\0';
        }
    }
    const char *type;
    size_t tlen;
    if (got <= 0 || !top_string(s->json.data, s->json.len, "type", &type, &tlen, &esc) || !tlen || esc) {
        stream_error(s, "api_error", "a chunk that is not an Anthropic stream event", 45, "", 0);
        return;
    }
    /* An Anthropic error event ends the stream, whoever sent it. */
    int is_error = tlen == 5 && !memcmp(type, "error", 5);
    s->cb(s->ud, type, tlen, s->json.data, s->json.len);
    s->ended |= is_error;
}

void tg_bedrock_stream_init(tg_bedrock_stream_t *s, size_t max, tg_bedrock_event_cb cb, void *ud) {
    memset(s, 0, sizeof(*s));
    tg_es_init(&s->es, max, stream_msg, s);
    tg_buf_init(&s->json);
    tg_buf_init(&s->b64);
    s->cb = cb;
    s->ud = ud;
}

void tg_bedrock_stream_feed(tg_bedrock_stream_t *s, const void *data, size_t n) {
    if (s->ended)
        return;
    if (tg_es_feed(&s->es, data, n) != TG_OK && !s->ended)
        stream_error(s, "api_error", "the event stream is corrupt", 27, s->es.why, strlen(s->es.why));
}

void tg_bedrock_stream_free(tg_bedrock_stream_t *s) {
    tg_es_free(&s->es);
    tg_buf_free(&s->json);
    tg_buf_free(&s->b64);
}

int tg_bedrock_metrics_usage(tg_usage_t *u, const char *data, size_t len) {
    static const char KEY[] = "\"amazon-bedrock-invocationMetrics\"";
    if (!memmem(data, len, KEY, sizeof(KEY) - 1))
        return 0;
    json_t *doc = json_loadb(data, len, 0, NULL);
    json_t *m = json_object_get(doc, "amazon-bedrock-invocationMetrics");
    static const struct {
        const char *key;
        unsigned bit;
    } f[] = {{"inputTokenCount", TG_USAGE_INPUT},
             {"outputTokenCount", TG_USAGE_OUTPUT},
             {"cacheReadInputTokenCount", TG_USAGE_CACHE_READ},
             {"cacheWriteInputTokenCount", TG_USAGE_CACHE_WRITE}};
    int filled = 0;
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]) && json_is_object(m); i++) {
        json_t *v = json_object_get(m, f[i].key);
        if ((u->known & f[i].bit) || !json_is_integer(v) || json_integer_value(v) < 0)
            continue;
        int64_t x = json_integer_value(v);
        switch (f[i].bit) {
        case TG_USAGE_INPUT: u->input = x; break;
        case TG_USAGE_OUTPUT: u->output = x; break;
        case TG_USAGE_CACHE_READ: u->cache_read = x; break;
        default: u->cache_write = x; break;
        }
        u->known |= f[i].bit;
        filled = 1;
    }
    json_decref(doc);
    return filled;
}
