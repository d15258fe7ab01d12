/*
 * libFuzzer target for the log escaper (tg_buf_append_log_safe in core/src/base/tg_common.c):
 * the UTF-8 validator that decides which client bytes may reach a log line raw.
 *
 * Input: byte 0 picks the mode (bit 0: JSON), the rest is the text. The invariants:
 *   - text mode: the output has no control byte (below 0x20, or 0x7f) and is valid
 *     UTF-8, checked here by an independent decoder (code points, not byte patterns);
 *   - JSON mode, as the access log uses it (a JSON-escaped field, then the whole line
 *     through the escaper): the result is one valid JSON string (jansson reads it), and
 *     reads back as the input when the input was valid UTF-8;
 *   - input that is already printable, valid UTF-8 comes out unchanged, in both modes;
 *   - the output is at most 6 bytes per input byte.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_common.h"

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_log_safe invariant failed: %s\n", what);
        abort();
    }
}

/* 1 if s is valid UTF-8 with no control character: decode each code point, refuse
 * overlongs, surrogates and anything above U+10FFFF. */
static int clean_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        unsigned cp, need;
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7f)
                return 0;
            i++;
            continue;
        }
        if ((c & 0xe0) == 0xc0)
            cp = c & 0x1f, need = 1;
        else if ((c & 0xf0) == 0xe0)
            cp = c & 0x0f, need = 2;
        else if ((c & 0xf8) == 0xf0)
            cp = c & 0x07, need = 3;
        else
            return 0;
        if (n - i <= need)
            return 0;
        for (unsigned k = 1; k <= need; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        static const unsigned min[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[need] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += need + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    int json = data[0] & 1;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_append_log_safe(&b, s, n, json);
    check(b.len <= 6 * n, "output more than 6 bytes per input byte");
    int input_clean = clean_utf8((const unsigned char *)s, n);
    if (input_clean)
        check(b.len == n && (n == 0 || memcmp(b.data, s, n) == 0), "clean input was changed");
    if (!json) {
        check(clean_utf8((const unsigned char *)b.data, b.len), "text output has a control byte or bad UTF-8");
    } else {
        tg_buf_t line;
        tg_buf_init(&line);
        tg_buf_append(&line, "\"", 1);
        tg_buf_append_json_escaped(&line, s, n);
        tg_buf_append(&line, "\"", 1);
        tg_buf_reset(&b);
        tg_buf_append_log_safe(&b, line.data, line.len, 1);
        tg_buf_free(&line);
        json_error_t err;
        json_t *v = json_loadb(b.data, b.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        check(v != NULL && json_is_string(v), "a JSON-escaped field through the escaper is not valid JSON");
        /* Valid UTF-8 (controls allowed, they are \u escapes by then) reads back whole. */
        tg_buf_t ctl;
        tg_buf_init(&ctl);
        for (size_t k = 0; k < n; k++)
            tg_buf_append(&ctl, data[k + 1] < 0x20 || data[k + 1] == 0x7f ? "a" : s + k, 1);
        if (clean_utf8((const unsigned char *)ctl.data, ctl.len))
            check(json_string_length(v) == n && memcmp(json_string_value(v), s, n) == 0,
                  "valid UTF-8 did not read back unchanged");
        tg_buf_free(&ctl);
        json_decref(v);
    }
    tg_buf_free(&b);
    return 0;
}
