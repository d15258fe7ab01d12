/*
 * Byte-level edits of a JSON object that jansson has already accepted, and numbers kept
 * as written through a parse and a write (tg_json.h).
 *
 * Because the document is known to be valid, one pass that tracks string boundaries and
 * bracket depth is enough to find each top-level member's key and value spans; values
 * are never read, only copied or replaced. Numbers: jansson parses and writes; a pass
 * over its input (only when it refused an integer as too big) and one over its output
 * (string boundaries and number tokens) put the exact numbers back.
 */
#include "tollgate/tg_json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tg_jscan_internal.h"

int tg_json_set_members(const char *doc, size_t len, const char *const *keys, const char *const *values, int n,
                        tg_buf_t *out) {
    enum { MAXK = 8 };
    if (n < 0 || n > MAXK)
        return TG_ERROR;
    size_t i = 0;
    while (i < len && tg_js_is_ws(doc[i]))
        i++;
    if (i >= len || doc[i] != '{')
        return TG_ERROR;
    size_t open = i;
    /* Pass 1: the value span of each key that is present. */
    size_t vstart[MAXK], vend[MAXK];
    int found[MAXK] = {0};
    i++;
    for (;;) {
        while (i < len && (tg_js_is_ws(doc[i]) || doc[i] == ','))
            i++;
        if (i >= len)
            return TG_ERROR;
        if (doc[i] == '}')
            break;
        if (doc[i] != '"')
            return TG_ERROR;
        int escaped = 0;
        size_t kstart = i + 1;
        if (tg_js_skip_string(doc, len, &i, &escaped) != 0 || escaped)
            return TG_ERROR;
        size_t klen = i - 1 - kstart;
        while (i < len && (tg_js_is_ws(doc[i]) || doc[i] == ':'))
            i++;
        size_t vs = i;
        if (tg_js_skip_value(doc, len, &i) != 0)
            return TG_ERROR;
        for (int k = 0; k < n; k++)
            if (strlen(keys[k]) == klen && !memcmp(doc + kstart, keys[k], klen)) {
                found[k] = 1;
                vstart[k] = vs;
                vend[k] = i;
            }
    }
    /* Pass 2: copy, with the missing members first and the present ones replaced. */
    int added = 0;
    tg_buf_append(out, doc, open + 1);
    for (int k = 0; k < n; k++) {
        if (found[k])
            continue;
        if (added++)
            tg_buf_append(out, ",", 1);
        tg_buf_append(out, "\"", 1);
        tg_buf_appends(out, keys[k]);
        tg_buf_append(out, "\":", 2);
        tg_buf_appends(out, values[k]);
    }
    /* Whether the object had members at all: then a comma follows what was added. */
    size_t j = open + 1;
    while (j < len && tg_js_is_ws(doc[j]))
        j++;
    if (added && doc[j] != '}')
        tg_buf_append(out, ",", 1);
    size_t at = open + 1;
    for (;;) {
        /* The next replaced span after `at`, in document order. */
        int next = -1;
        for (int k = 0; k < n; k++)
            if (found[k] && vstart[k] >= at && (next < 0 || vstart[k] < vstart[next]))
                next = k;
        if (next < 0)
            break;
        tg_buf_append(out, doc + at, vstart[next] - at);
        tg_buf_appends(out, values[next]);
        at = vend[next];
    }
    tg_buf_append(out, doc + at, len - at);
    return TG_OK;
}

/* ---- numbers kept as written ------------------------------------------------------ */

/* A big number is the string MARK + its digits. MARK starts with a NUL, which a client's
 * string cannot hold: jansson refuses \u0000 unless told JSON_ALLOW_NUL, which only the
 * parse of the rewritten document below uses, after checking the client wrote none. */
#define MARK "\0tgbig:"
#define MARK_LEN 7
/* The mark as jansson writes it, after the opening quote. */
#define MARK_OUT "\\u0000tgbig:"
#define MARK_OUT_LEN 12

/* Whether the integer token s[0..n) (an optional '-' and digits) is beyond int64. */
static int int_overflows(const char *s, size_t n) {
    int neg = n && s[0] == '-';
    const char *d = s + neg;
    size_t nd = n - (size_t)neg;
    const char *lim = neg ? "9223372036854775808" : "9223372036854775807";
    return nd > 19 || (nd == 19 && memcmp(d, lim, 19) > 0);
}

static int is_num_char(char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* Whether the inside of a JSON string s[0..n) holds the escape \u0000. */
static int has_nul_escape(const char *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\')
            continue;
        if (s[i + 1] == 'u' && i + 6 <= n && !memcmp(s + i + 2, "0000", 4))
            return 1;
        i++; /* the escaped character */
    }
    return 0;
}

json_t *tg_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err) {
    json_error_t own;
    if (!err)
        err = &own; /* json_error_code reads it */
    json_t *v = json_loadb(buf, len, flags, err);
    if (v || json_error_code(err) != json_error_numeric_overflow)
        return v;
    /* Rare: write each integer beyond int64 as a marked string and parse again. */
    tg_buf_t b;
    tg_buf_init(&b);
    size_t i = 0, run = 0;
    while (i < len) {
        char c = buf[i];
        if (c == '"') {
            int escaped = 0;
            size_t st = i;
            if (tg_js_skip_string(buf, len, &i, &escaped) != 0)
                break; /* jansson reports it */
            if (escaped && !(flags & JSON_ALLOW_NUL) && has_nul_escape(buf + st + 1, i - st - 2)) {
                tg_buf_free(&b);
                return NULL; /* jansson would refuse it; err says why it stopped first */
            }
            continue;
        }
        if (c != '-' && !(c >= '0' && c <= '9')) {
            i++;
            continue;
        }
        size_t s = i;
        int is_int = 1;
        while (i < len && is_num_char(buf[i])) {
            if (buf[i] == '.' || buf[i] == 'e' || buf[i] == 'E' || buf[i] == '+' || (buf[i] == '-' && i > s))
                is_int = 0;
            i++;
        }
        if (!is_int || !int_overflows(buf + s, i - s))
            continue;
        tg_buf_append(&b, buf + run, s - run);
        tg_buf_append(&b, "\"\\u0000tgbig:", 13);
        tg_buf_append(&b, buf + s, i - s);
        tg_buf_append(&b, "\"", 1);
        run = i;
    }
    if (!b.len) /* nothing to rewrite: the overflow was a real (1e400) */
        return NULL;
    tg_buf_append(&b, buf + run, len - run);
    v = json_loadb(b.data, b.len, flags | JSON_ALLOW_NUL, err);
    tg_buf_free(&b);
    return v;
}

int tg_json_is_big(const json_t *v, const char **text, size_t *len) {
    if (!json_is_string(v) || json_string_length(v) <= MARK_LEN)
        return 0;
    const char *s = json_string_value(v);
    if (s[0] != '\0' || memcmp(s, MARK, MARK_LEN) != 0)
        return 0;
    if (text)
        *text = s + MARK_LEN;
    if (len)
        *len = json_string_length(v) - MARK_LEN;
    return 1;
}

/* The shortest "%.*g" of d that reads back as d, written as jansson writes reals (a
 * ".0" when it would read as an integer, no '+' or leading zeros in the exponent). */
static size_t real_shortest(double d, char *out, size_t n) {
    int len = 0;
    for (int prec = 1; prec <= 17; prec++) {
        len = snprintf(out, n, "%.*g", prec, d);
        if (strtod(out, NULL) == d)
            break;
    }
    if (len <= 0 || (size_t)len >= n - 3)
        return 0;
    if (!strchr(out, '.') && !strchr(out, 'e')) {
        memcpy(out + len, ".0", 3);
        len += 2;
    }
    char *e = strchr(out, 'e');
    if (e) {
        char *start = e + 1, *end = start;
        if (*start == '-')
            start++, end++;
        if (*end == '+')
            end++;
        while (*end == '0' && end[1])
            end++;
        if (end != start) {
            memmove(start, end, strlen(end) + 1);
            len = (int)strlen(out);
        }
    }
    return (size_t)len;
}

int tg_json_dump_buf(const json_t *v, size_t flags, tg_buf_t *out) {
    char *s = json_dumps(v, flags);
    if (!s)
        return TG_ERROR;
    size_t len = strlen(s), i = 0, run = 0;
    tg_buf_reserve(out, len);
    while (i < len) {
        char c = s[i];
        if (c == '"') {
            size_t st = i;
            int escaped = 0;
            if (st + 1 + MARK_OUT_LEN < len && s[st + 1] == '\\' && !memcmp(s + st + 1, MARK_OUT, MARK_OUT_LEN)) {
                /* a big number: its digits, unquoted */
                size_t d = st + 1 + MARK_OUT_LEN, e = d;
                while (e < len && ((s[e] >= '0' && s[e] <= '9') || (e == d && s[e] == '-')))
                    e++;
                if (e < len && s[e] == '"' && e > d) {
                    tg_buf_append(out, s + run, st - run);
                    tg_buf_append(out, s + d, e - d);
                    i = run = e + 1;
                    continue;
                }
            }
            if (tg_js_skip_string(s, len, &i, &escaped) != 0)
                break;
            continue;
        }
        if (c != '-' && !(c >= '0' && c <= '9')) {
            i++;
            continue;
        }
        size_t st = i;
        int real = 0;
        while (i < len && is_num_char(s[i])) {
            if (s[i] == '.' || s[i] == 'e' || s[i] == 'E')
                real = 1;
            i++;
        }
        if (!real)
            continue;
        char num[40];
        size_t n = real_shortest(strtod(s + st, NULL), num, sizeof(num));
        if (!n || (n == i - st && !memcmp(num, s + st, n)))
            continue;
        tg_buf_append(out, s + run, st - run);
        tg_buf_append(out, num, n);
        run = i;
    }
    tg_buf_append(out, s + run, len - run);
    free(s);
    return TG_OK;
}

char *tg_json_dumps(const json_t *v, size_t flags) {
    tg_buf_t b;
    tg_buf_init(&b);
    if (tg_json_dump_buf(v, flags, &b) != TG_OK) {
        tg_buf_free(&b);
        return NULL;
    }
    tg_buf_append(&b, "", 1);
    return b.data;
}
