/*
 * Unit tests of the byte buffers and string helpers in core/src/base/tg_common.c: growth,
 * NUL termination, consume/reset, printf past the stack buffer, and the JSON escaping
 * that every access-log line and error body goes through.
 */
#include "tollgate/tg_common.h"

#include "tg_test.h"

TG_TEST(buf, append_grows_and_stays_terminated) {
    tg_buf_t b;
    tg_buf_init(&b);
    ASSERT(b.data == NULL);
    tg_buf_append(&b, "", 0);
    ASSERT(b.data != NULL);
    ASSERT_EQ_STR(b.data, "");
    for (int i = 0; i < 1000; i++)
        tg_buf_append(&b, "abc", 3);
    ASSERT_EQ_INT(b.len, 3000);
    ASSERT(b.cap > b.len);
    ASSERT_EQ_INT(b.data[3000], '\0');
    ASSERT(memcmp(b.data + 2997, "abc", 3) == 0);
    tg_buf_appends(&b, "xyz");
    ASSERT_EQ_STR(b.data + 2997, "abcxyz");
    tg_buf_free(&b);
    ASSERT(b.data == NULL);
    ASSERT_EQ_INT(b.len, 0);
    ASSERT_EQ_INT(b.cap, 0);
}

TG_TEST(buf, reserve_keeps_content) {
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_appends(&b, "keep");
    tg_buf_reserve(&b, 100000);
    ASSERT(b.cap >= 100005);
    ASSERT_EQ_INT(b.len, 4);
    ASSERT_EQ_STR(b.data, "keep");
    tg_buf_free(&b);
}

TG_TEST(buf, printf_short_and_long) {
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_printf(&b, "%s=%d", "n", 42);
    ASSERT_EQ_STR(b.data, "n=42");
    /* Longer than the 512-byte stack buffer: the second formatting path. */
    char big[2000];
    memset(big, 'q', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    tg_buf_printf(&b, "[%s]", big);
    ASSERT_EQ_INT(b.len, 4 + 2 + 1999);
    ASSERT_EQ_INT(b.data[4], '[');
    ASSERT_EQ_INT(b.data[b.len - 1], ']');
    ASSERT_EQ_INT(b.data[b.len], '\0');
    ASSERT_EQ_INT(strlen(b.data), b.len);
    tg_buf_free(&b);
}

TG_TEST(buf, consume_and_reset) {
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_consume(&b, 5); /* on an empty, unallocated buffer: a no-op */
    ASSERT_EQ_INT(b.len, 0);
    tg_buf_appends(&b, "hello world");
    tg_buf_consume(&b, 6);
    ASSERT_EQ_STR(b.data, "world");
    ASSERT_EQ_INT(b.len, 5);
    tg_buf_consume(&b, 100);
    ASSERT_EQ_INT(b.len, 0);
    ASSERT_EQ_STR(b.data, "");
    tg_buf_appends(&b, "again");
    size_t cap = b.cap;
    tg_buf_reset(&b);
    ASSERT_EQ_INT(b.len, 0);
    ASSERT_EQ_STR(b.data, "");
    ASSERT_EQ_INT(b.cap, cap);
    tg_buf_free(&b);
}

TG_TEST(buf, json_escaped) {
    tg_buf_t b;
    tg_buf_init(&b);
    static const char in[] = "a\"b\\c\n\t\x01\x1f\x7f/é\xf0\x9f\x98\x80";
    tg_buf_append_json_escaped(&b, in, sizeof(in) - 1);
    ASSERT_EQ_STR(b.data, "a\\\"b\\\\c\\u000a\\u0009\\u0001\\u001f\\u007f/é\xf0\x9f\x98\x80");
    tg_buf_free(&b);
}

TG_TEST(buf, json_escaped_nul_and_long) {
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_appends(&b, "\"");
    tg_buf_append_json_escaped(&b, "x\0y", 3);
    tg_buf_appends(&b, "\"");
    ASSERT_EQ_STR(b.data, "\"x\\u0000y\"");
    tg_buf_reset(&b);
    /* Every byte escaped: the output is six times the input and still terminated. */
    char ctl[3000];
    memset(ctl, '\x02', sizeof(ctl));
    tg_buf_append_json_escaped(&b, ctl, sizeof(ctl));
    ASSERT_EQ_INT(b.len, 6 * sizeof(ctl));
    ASSERT_EQ_INT(strlen(b.data), b.len);
    ASSERT(memcmp(b.data + b.len - 6, "\\u0002", 6) == 0);
    tg_buf_free(&b);
}

TG_TEST(buf, log_safe_escapes_controls_and_bad_utf8) {
    tg_buf_t b;
    tg_buf_init(&b);
    /* Valid UTF-8 (2, 3 and 4 bytes) and printable ASCII pass through untouched. */
    static const char ok[] = "plain \"text\" \\ é € \xf0\x9f\x98\x80";
    tg_buf_append_log_safe(&b, ok, sizeof(ok) - 1, 0);
    ASSERT_EQ_STR(b.data, ok);
    tg_buf_reset(&b);
    /* Text mode: CR/LF/tab by name, other controls and bad bytes as \xNN. */
    static const char bad[] = "a\r\nb\t\x01\x7f\xff\xc3(\xed\xa0\x80\xe2\x82";
    tg_buf_append_log_safe(&b, bad, sizeof(bad) - 1, 0);
    ASSERT_EQ_STR(b.data, "a\\r\\nb\\t\\x01\\x7f\\xff\\xc3(\\xed\\xa0\\x80\\xe2\\x82");
    tg_buf_reset(&b);
    /* JSON mode: controls as \u00XX, bad bytes as an escaped backslash + xNN. */
    tg_buf_append_log_safe(&b, "x\n\xc0\xaf\"", 5, 1);
    ASSERT_EQ_STR(b.data, "x\\u000a\\\\xc0\\\\xaf\"");
    tg_buf_reset(&b);
    /* Overlong, above U+10FFFF, lone continuation: all escaped byte by byte. */
    tg_buf_append_log_safe(&b, "\xe0\x80\x80\xf4\x90\x80\x80\x80", 8, 0);
    ASSERT_EQ_STR(b.data, "\\xe0\\x80\\x80\\xf4\\x90\\x80\\x80\\x80");
    tg_buf_free(&b);
}

TG_TEST(buf, log_allow_once_per_key_per_window) {
    uint64_t held = 99, t = 1000000;
    ASSERT(tg_log_allow("model-a", 7, t, &held));
    ASSERT_EQ_INT(held, 0);
    for (int i = 0; i < 5; i++)
        ASSERT(!tg_log_allow("model-a", 7, t + 10 + (uint64_t)i, &held));
    ASSERT(tg_log_allow("model-b", 7, t + 20, &held)); /* another key is not held */
    ASSERT_EQ_INT(held, 0);
    ASSERT(!tg_log_allow("model-a", 7, t + TG_LOG_EVERY_MS - 1, &held));
    ASSERT(tg_log_allow("model-a", 7, t + TG_LOG_EVERY_MS, &held));
    ASSERT_EQ_INT(held, 6); /* the ones held back since the last line */
    ASSERT(!tg_log_allow("model-a", 7, t + TG_LOG_EVERY_MS + 1, &held));
}

TG_TEST(buf, str_ieq) {
    ASSERT(tg_str_ieq(TG_STR("Content-Length"), "content-length"));
    ASSERT(!tg_str_ieq(TG_STR("Content-Length"), "content-lengt"));
    ASSERT(!tg_str_ieq(TG_STR("Content"), "content-length"));
    ASSERT(tg_str_ieq((tg_str_t){"", 0}, ""));
}

/* The printf-free formatters of the hot path agree with snprintf, cuts included. */
TG_TEST(buf, fmt_key_copy_i64z_as_snprintf) {
    const int64_t vals[] = {0, 7, -7, 42, INT64_MAX, INT64_MIN, 1234567890123LL};
    char a[64], b[64];
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        size_t n = tg_fmt_i64z(a, vals[i]);
        snprintf(b, sizeof(b), "%lld", (long long)vals[i]);
        ASSERT_EQ_STR(a, b);
        ASSERT_EQ_INT(n, strlen(b));
        for (size_t cap = 0; cap <= 24; cap++) {
            memset(a, 'x', sizeof(a));
            memset(b, 'x', sizeof(b));
            n = tg_fmt_key(a, cap, "{a:", vals[i], "}:conc");
            snprintf(b, cap, "{a:%lld}:conc", (long long)vals[i]);
            ASSERT(!memcmp(a, b, sizeof(a))); /* the same bytes written, none past cap */
            if (cap)
                ASSERT_EQ_INT(n, strlen(a));
        }
    }
    for (size_t cap = 0; cap <= 8; cap++) {
        memset(a, 'x', sizeof(a));
        memset(b, 'x', sizeof(b));
        const char *volatile src = "group-name"; /* opaque: the cut is what is compared */
        size_t n = tg_copy(a, cap, src);
        snprintf(b, cap, "%s", src);
        ASSERT(!memcmp(a, b, sizeof(a)));
        if (cap)
            ASSERT_EQ_INT(n, strlen(a));
    }
}
