/*
 * Shared vocabulary of the core: pipeline results, growable byte buffers, clocks and
 * logging. Every other header includes this one.
 *
 * Two kinds of result are never mixed: the request pipeline returns TG_OK, TG_DECLINED,
 * TG_AGAIN, TG_DONE or TG_ERROR; I/O functions return libuv's negative error codes.
 */
#ifndef TOLLGATE_TG_COMMON_H
#define TOLLGATE_TG_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TG_OK 0
#define TG_ERROR (-1)
#define TG_AGAIN (-2)
#define TG_DECLINED (-3)
#define TG_DONE (-4)

#define TG_UNUSED(x) ((void)(x))
#define TG_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TG_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TG_CONTAINER_OF(ptr, type, field) ((type *)((char *)(ptr)-offsetof(type, field)))

/** A pointer+length view of bytes owned by someone else. */
typedef struct {
    const char *p;
    size_t len;
} tg_str_t;

#define TG_STR(lit) ((tg_str_t){(lit), sizeof(lit) - 1})

/** True when the view equals the C string, ignoring ASCII case. */
int tg_str_ieq(tg_str_t s, const char *cstr);

/**
 * A growable byte buffer. The buffer owns `data` (malloc'd); tg_buf_free releases it.
 * Appends abort() on allocation failure: the gateway cannot run out of memory safely.
 */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
} tg_buf_t;

void tg_buf_init(tg_buf_t *b);
void tg_buf_free(tg_buf_t *b);
void tg_buf_reserve(tg_buf_t *b, size_t extra);
void tg_buf_append(tg_buf_t *b, const void *p, size_t n);
void tg_buf_appends(tg_buf_t *b, const char *s);
void tg_buf_printf(tg_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes "<pre><path>: <message>" into err (errlen bytes, cut to fit) and returns
 * TG_ERROR: the error of a parser that names where in its input it failed. */
int tg_err_at(char *err, size_t errlen, const char *pre, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/** Appends v in decimal (with its sign) / lowercase hex: the hot path's headers without printf. */
void tg_buf_append_u64(tg_buf_t *b, uint64_t v);
void tg_buf_append_i64(tg_buf_t *b, int64_t v);
void tg_buf_append_hex(tg_buf_t *b, uint64_t v);
/** Writes v in decimal to out (room for 20 digits); returns the digits written. */
size_t tg_fmt_u64(char *out, uint64_t v);
/*
 * The hot path's small strings without printf (snprintf costs ~1,000 instructions a
 * call; a request made a dozen): each writes a NUL and cuts to cap as snprintf cuts.
 * tg_fmt_i64z: v with its sign (out has room for 21 bytes). tg_fmt_key: pre, v, post
 * (a Redis key such as "{a:12}:conc"). tg_copy: s ("%s"). Each returns strlen(out).
 */
size_t tg_fmt_i64z(char *out, int64_t v);
size_t tg_fmt_key(char *out, size_t cap, const char *pre, int64_t v, const char *post);
size_t tg_copy(char *out, size_t cap, const char *s);
/** Appends `s` as the inside of a JSON string (no quotes), escaping as needed. */
void tg_buf_append_json_escaped(tg_buf_t *b, const char *s, size_t n);
/**
 * Appends s made safe for a log line: control bytes (below 0x20, and 0x7f) and bytes
 * that are not valid UTF-8 are escaped, everything else is copied. With json set the
 * result stays valid JSON inside a string (a control byte as \u00XX, a bad byte as
 * \\xNN, which reads back as the text \xNN); otherwise \n, \r, \t and \xNN. Valid,
 * printable input is appended as is, in one piece.
 */
void tg_buf_append_log_safe(tg_buf_t *b, const char *s, size_t n, int json);
/** The length of the valid UTF-8 sequence at s (n bytes available; 1 for ASCII), 0
 *  when the bytes there are not one. */
size_t tg_utf8_seq(const unsigned char *s, size_t n);
/** Removes the first n bytes. */
void tg_buf_consume(tg_buf_t *b, size_t n);
void tg_buf_reset(tg_buf_t *b);

/*
 * Marks memory kept for reuse (a recycled request) as unaddressable under ASan, so a
 * use after "free" of a recycled object is still caught; no-ops otherwise.
 */
#if defined(__SANITIZE_ADDRESS__)
#define TG_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TG_ASAN 1
#endif
#endif
#ifdef TG_ASAN
#include <sanitizer/asan_interface.h>
#define TG_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define TG_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define TG_POISON(p, n) ((void)(p), (void)(n))
#define TG_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/** Monotonic clock in nanoseconds / milliseconds. */
uint64_t tg_now_ns(void);
uint64_t tg_now_ms(void);
/** Wall clock in milliseconds since the epoch. */
uint64_t tg_wall_ms(void);

/** Fills `out` with n random bytes from the OS; returns 0 or a negative errno. */
int tg_random_bytes(void *out, size_t n);
/** Writes a 32-hex-digit random id plus NUL into out[33]. */
void tg_random_id(char out[33]);
/** Writes a request id plus NUL into out[33]: `<start, Unix ms, 12 hex digits>-<18
 *  random hex digits>`. Postgres reads the start back (tg_request_started, sql/0009)
 *  and files the request's usage row in that day's partition. */
void tg_request_id(char out[33]);

/* Logging: one line per event on stderr; the level check happens before formatting. */
enum { TG_LOG_ERROR = 0, TG_LOG_WARN = 1, TG_LOG_INFO = 2, TG_LOG_DEBUG = 3 };
extern int tg_log_level;
void tg_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Writes one already-formatted line (an access-log JSON object) followed by '\n'. */
void tg_log_raw(const char *line, size_t len);
int tg_log_level_parse(const char *name);
/**
 * Rate limit for a warning that a client can repeat at will (an unpriced model): 1 if
 * the line for `key` may be written now, then *suppressed is how many were held back
 * since the last one; 0 to hold it back. One line per key per TG_LOG_EVERY_MS on each
 * thread (a small fixed table, no allocation, no lock).
 */
#define TG_LOG_EVERY_MS 60000
int tg_log_allow(const char *key, size_t n, uint64_t now_ms, uint64_t *suppressed);

#define tg_log(level, ...)                                                                  \
    do {                                                                                    \
        if ((level) <= tg_log_level)                                                        \
            tg_log_write((level), __VA_ARGS__);                                             \
    } while (0)
#define tg_log_error(...) tg_log(TG_LOG_ERROR, __VA_ARGS__)
#define tg_log_warn(...) tg_log(TG_LOG_WARN, __VA_ARGS__)
#define tg_log_info(...) tg_log(TG_LOG_INFO, __VA_ARGS__)
#define tg_log_debug(...) tg_log(TG_LOG_DEBUG, __VA_ARGS__)

#endif
