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

void tg_buf_append_u64(tg_buf_t *b, uint64_t v) {
    tg_buf_reserve(b, 20);
    b->len += tg_fmt_u64(b->data + b->len, v);
    b->data[b->len] = '\0';
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

static const char *level_names[] = {"error", "warn", "info", "debug"};

int tg_log_level_parse(const char *name) {
    for (int i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

void tg_log_write(int level, const char *fmt, ...) {
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, level_names[level < 0 ? 0 : level > 3 ? 3 : level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : TG_MIN((size_t)m, sizeof(line) - (size_t)n - 2));
    line[len++] = '\n';
    (void)!write(STDERR_FILENO, line, len);
}

void tg_log_raw(const char *line, size_t len) {
    /* One write per line so concurrent workers never interleave inside a line. */
    char stackbuf[4096];
    if (len + 1 <= sizeof(stackbuf)) {
        memcpy(stackbuf, line, len);
        stackbuf[len] = '\n';
        (void)!write(STDOUT_FILENO, stackbuf, len + 1);
    } else {
        char *p = malloc(len + 1);
        if (!p)
            return;
        memcpy(p, line, len);
        p[len] = '\n';
        (void)!write(STDOUT_FILENO, p, len + 1);
        free(p);
    }
}
