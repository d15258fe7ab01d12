/*
 * The byte-level JSON scanning that tg_json.c (member edits of a body jansson accepted)
 * and tg_usage.c (the usage object's spans in an upstream reply) share: whitespace, a
 * string, and one whole value. Internal to core/src.
 */
#ifndef TG_JSCAN_INTERNAL_H
#define TG_JSCAN_INTERNAL_H

#include <stddef.h>

static inline int tg_js_is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Skips the string that starts at s[*i] == '"'. On success (0) *i is just past the
 * closing quote and *escaped is set when the string holds a backslash. -1 for a string
 * that does not end or holds a raw control byte, as JSON forbids. */
static inline int tg_js_skip_string(const char *s, size_t len, size_t *i, int *escaped) {
    /* 1 for the bytes that need a look: the quote, the backslash and control bytes. */
    static const unsigned char special[256] = {
        [0 ... 0x1f] = 1, ['"'] = 1, ['\\'] = 1,
    };
    size_t k = *i + 1;
    while (k < len) {
        while (k < len && !special[(unsigned char)s[k]])
            k++;
        if (k >= len)
            break;
        unsigned char c = (unsigned char)s[k];
        if (c == '"') {
            *i = k + 1;
            return 0;
        }
        if (c < 0x20)
            return -1;
        *escaped = 1;
        k += 2; /* the backslash and the byte it escapes */
    }
    return -1;
}

/* Skips one value starting at s[*i] of a document whose structure is already known to be
 * good: only string boundaries and bracket depth are tracked. A container ends just past
 * its closing bracket; a scalar at the ',', whitespace or closing bracket after it. 0, or
 * -1 when the document ends first. */
static inline int tg_js_skip_value(const char *s, size_t len, size_t *i) {
    int depth = 0, escaped = 0;
    while (*i < len) {
        char c = s[*i];
        if (c == '"') {
            if (tg_js_skip_string(s, len, i, &escaped) != 0)
                return -1;
            if (depth == 0)
                return 0;
            continue;
        }
        if (c == '}' || c == ']') {
            if (depth == 0)
                return 0; /* a scalar ended at its container's end */
            (*i)++;
            if (--depth == 0)
                return 0;
            continue;
        }
        if (c == '{' || c == '[')
            depth++;
        else if (depth == 0 && (c == ',' || tg_js_is_ws(c)))
            return 0;
        (*i)++;
    }
    return depth == 0 ? 0 : -1;
}

#endif
