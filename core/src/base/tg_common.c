/*
 * The small shared pieces every module uses: byte buffers, clocks, randomness and the
 * stderr logger. Nothing here allocates except tg_buf_*.
 */
#include "tollgate/tg_common.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

int tg_log_level = TG_LOG_INFO;

int tg_str_ieq(tg_str_t s, const char *cstr) {
    size_t n = strlen(cstr);
    return n == s.len && strncasecmp(s.p, cstr, n) == 0;
}

void tg_buf_init(tg_buf_t *b) {
    b->data = NULL;
    b->len = b->cap = 0;
}

void tg_buf_free(tg_buf_t *b) {
    free(b->data);
    tg_buf_init(b);
}

void tg_buf_reserve(tg_buf_t *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        abort();
    b->data = p;
    b->cap = cap;
}

void tg_buf_append(tg_buf_t *b, const void *p, size_t n) {
    tg_buf_reserve(b, n);
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void tg_buf_appends(tg_buf_t *b, const char *s) { tg_buf_append(b, s, strlen(s)); }

void tg_buf_printf(tg_buf_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(tmp)) {
        tg_buf_append(b, tmp, (size_t)n);
        return;
    }
    tg_buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

size_t tg_fmt_u64(char *out, uint64_t v) {
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

size_t tg_fmt_i64z(char *out, int64_t v) {
    size_t m = 0;
    if (v < 0)
        out[m++] = '-';
    m += tg_fmt_u64(out + m, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
    out[m] = '\0';
    return m;
}

/* Appends len bytes of s at out[*n], cut to leave room for the NUL. */
static void put_cut(char *out, size_t cap, size_t *n, const char *s, size_t len) {
    if (*n + 1 >= cap)
        return;
    len = TG_MIN(len, cap - 1 - *n);
    memcpy(out + *n, s, len);
    *n += len;
}

size_t tg_fmt_key(char *out, size_t cap, const char *pre, int64_t v, const char *post) {
    char d[24];
    size_t n = 0, k = tg_fmt_i64z(d, v);
    if (!cap)
        return 0;
    put_cut(out, cap, &n, pre, strlen(pre));
    put_cut(out, cap, &n, d, k);
    put_cut(out, cap, &n, post, strlen(post));
    out[n] = '\0';
    return n;
}

size_t tg_copy(char *out, size_t cap, const char *s) {
    size_t n = 0;
    if (!cap)
        return 0;
    put_cut(out, cap, &n, s, strlen(s));
    out[n] = '\0';
    return n;
}

void tg_buf_append_u64(tg_buf_t *b, uint64_t v) {
    tg_buf_reserve(b, 20);
    b->len += tg_fmt_u64(b->data + b->len, v);
    b->data[b->len] = '\0';
}

void tg_buf_append_i64(tg_buf_t *b, int64_t v) {
    tg_buf_reserve(b, 21);
    b->len += tg_fmt_i64z(b->data + b->len, v);
}

void tg_buf_append_hex(tg_buf_t *b, uint64_t v) {
    static const char hex[] = "0123456789abcdef";
    char tmp[16];
    size_t n = 0;
    do {
        tmp[n++] = hex[v & 15];
        v >>= 4;
    } while (v);
    tg_buf_reserve(b, n);
    for (size_t i = 0; i < n; i++)
        b->data[b->len++] = tmp[n - 1 - i];
    b->data[b->len] = '\0';
}

void tg_buf_append_json_escaped(tg_buf_t *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    tg_buf_reserve(b, n + 8);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            tg_buf_append(b, e, 2);
        } else if (c < 0x20 || c == 0x7f) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            tg_buf_append(b, e, 6);
        } else {
            tg_buf_append(b, &s[i], 1);
        }
    }
}

/* The length of the valid UTF-8 sequence at s (1-4), or 0 if the byte there does not
 * start one (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF). */
size_t tg_utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

/* The length of the printable-ASCII run at s. Every access-log line passes here, so the
 * common case is checked 16 bytes at a time (SSE2: a byte below 0x20 or at/above 0x80
 * is below 0x20 as a signed byte; 0x7f separately), else 8 at a time (a word is skipped
 * when none of its bytes is >= 0x80, < 0x20 or 0x7f; a borrow can only flag a byte too
 * many, which the byte loop then settles). */
static size_t ascii_run(const unsigned char *s, size_t n) {
    size_t i = 0;
#ifdef __SSE2__
    const __m128i lo = _mm_set1_epi8(0x20), del = _mm_set1_epi8(0x7f);
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
        if (_mm_movemask_epi8(_mm_or_si128(_mm_cmplt_epi8(v, lo), _mm_cmpeq_epi8(v, del))))
            break;
    }
#else
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    for (; i + 8 <= n; i += 8) {
        uint64_t w, d;
        memcpy(&w, s + i, 8);
        d = w ^ (0x7f * ones);
        if ((w & highs) | ((w - 0x20 * ones) & ~w & highs) | ((d - ones) & ~d & highs))
            break;
    }
#endif
    while (i < n && s[i] >= 0x20 && s[i] < 0x7f)
        i++;
    return i;
}

void tg_buf_append_log_safe(tg_buf_t *b, const char *s, size_t n, int json) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* The clean run (printable ASCII and valid UTF-8) is copied in one piece. */
        size_t start = i, len;
        for (;;) {
            i += ascii_run(u + i, n - i);
            if (i < n && u[i] >= 0x80 && (len = tg_utf8_seq(u + i, n - i)) > 0) {
                i += len;
                continue;
            }
            break;
        }
        if (i > start)
            tg_buf_append(b, s + start, i - start);
        if (i >= n)
            break;
        unsigned char c = u[i++];
        char e[8];
        size_t en = 0;
        if (c < 0x20 || c == 0x7f) {
            if (json) {
                e[0] = '\\', e[1] = 'u', e[2] = '0', e[3] = '0', e[4] = hex[c >> 4], e[5] = hex[c & 15];
                en = 6;
            } else if (c == '\n' || c == '\r' || c == '\t') {
                e[0] = '\\', e[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
                en = 2;
            } else {
                e[0] = '\\', e[1] = 'x', e[2] = hex[c >> 4], e[3] = hex[c & 15];
                en = 4;
            }
        } else if (json) {
            e[0] = '\\', e[1] = '\\', e[2] = 'x', e[3] = hex[c >> 4], e[4] = hex[c & 15];
            en = 5;
        } else {
            e[0] = '\\', e[1] = 'x', e[2] = hex[c >> 4], e[3] = hex[c & 15];
            en = 4;
        }
        tg_buf_append(b, e, en);
    }
}

void tg_buf_consume(tg_buf_t *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data)
        b->data[b->len] = '\0';
}

void tg_buf_reset(tg_buf_t *b) {
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

uint64_t tg_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tg_now_ms(void) { return tg_now_ns() / 1000000ull; }

uint64_t tg_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

int tg_random_bytes(void *out, size_t n) {
    unsigned char *p = out;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

void tg_random_id(char out[33]) {
    static const char hex[] = "0123456789abcdef";
    /* Request ids come from a per-thread pool refilled 4 KiB at a time: one getrandom
     * per 256 requests instead of one per request. */
    static __thread unsigned char pool[4096];
    static __thread size_t left;
    if (left < 16) {
        if (tg_random_bytes(pool, sizeof(pool)) != 0)
            abort();
        left = sizeof(pool);
    }
    const unsigned char *raw = pool + sizeof(pool) - left;
    left -= 16;
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[32] = '\0';
}

void tg_request_id(char out[33]) {
    static const char hex[] = "0123456789abcdef";
    char rnd[33];
    tg_random_id(rnd);
    uint64_t ms = tg_wall_ms();
    for (int i = 11; i >= 0; i--, ms >>= 4)
        out[i] = hex[ms & 15];
    out[12] = '-';
    memcpy(out + 13, rnd, 18);
    out[31] = '\0';
}

static const char *level_names[] = {"error", "warn", "info", "debug"};

int tg_log_level_parse(const char *name) {
    for (int i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

/*
 * A stderr line is "<time> <level> <message>": the message is escaped (control bytes and
 * invalid UTF-8, tg_buf_append_log_safe), so a model name or header value with CR/LF in
 * it can never start a line of its own (a forged log line).
 */
void tg_log_write(int level, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    size_t mlen = m < 0 ? 0 : TG_MIN((size_t)m, sizeof(msg) - 1);
    char line[4096];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, level_names[level < 0 ? 0 : level > 3 ? 3 : level]);
    size_t len = (size_t)n;
    /* Fast path: printable ASCII (the common case) is copied as is. */
    size_t i = 0;
    while (i < mlen && (unsigned char)msg[i] >= 0x20 && (unsigned char)msg[i] < 0x7f)
        i++;
    if (i == mlen) {
        memcpy(line + len, msg, mlen);
        len += mlen;
    } else {
        tg_buf_t b;
        tg_buf_init(&b);
        tg_buf_append_log_safe(&b, msg, mlen, 0);
        size_t take = TG_MIN(b.len, sizeof(line) - len - 1);
        memcpy(line + len, b.data, take);
        len += take;
        tg_buf_free(&b);
    }
    line[len++] = '\n';
    (void)!write(STDERR_FILENO, line, len);
}

void tg_log_raw(const char *line, size_t len) {
    /* One write per line so concurrent workers never interleave inside a line. */
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_append_log_safe(&b, line, len, 1);
    tg_buf_append(&b, "\n", 1);
    (void)!write(STDOUT_FILENO, b.data, b.len);
    tg_buf_free(&b);
}

/* Per thread: a small table of keys (by hash) and when each was last logged. A key
 * that collides with another takes its slot over: at worst a line more, never fewer. */
#define LOG_ALLOW_SLOTS 64
typedef struct {
    uint64_t hash;
    uint64_t last_ms;
    uint64_t suppressed;
    int used;
} log_allow_t;

int tg_log_allow(const char *key, size_t n, uint64_t now_ms, uint64_t *suppressed) {
    static __thread log_allow_t slots[LOG_ALLOW_SLOTS];
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)key[i]) * 1099511628211ull;
    log_allow_t *s = &slots[h % LOG_ALLOW_SLOTS];
    if (s->used && s->hash == h && now_ms - s->last_ms < TG_LOG_EVERY_MS) {
        s->suppressed++;
        return 0;
    }
    *suppressed = s->used && s->hash == h ? s->suppressed : 0;
    s->used = 1;
    s->hash = h;
    s->last_ms = now_ms;
    s->suppressed = 0;
    return 1;
}

int tg_err_at(char *err, size_t errlen, const char *pre, const char *path, const char *fmt, ...) {
    int n = snprintf(err, errlen, "%s%s: ", pre, path);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < errlen)
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return TG_ERROR;
}
