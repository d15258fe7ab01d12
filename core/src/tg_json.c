/*
 * Byte-level edits of a JSON object that jansson has already accepted (tg_json.h).
 *
 * Because the document is known to be valid, one pass that tracks string boundaries and
 * bracket depth is enough to find each top-level member's key and value spans; values
 * are never read, only copied or replaced.
 */
#include "tollgate/tg_json.h"

#include <string.h>

/* s[i] == '"': returns the index just past the closing quote; *escaped when it held one. */
static size_t skip_string(const char *s, size_t len, size_t i, int *escaped) {
    for (i++; i < len; i++) {
        if (s[i] == '\\') {
            *escaped = 1;
            i++;
        } else if (s[i] == '"') {
            return i + 1;
        }
    }
    return len;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int tg_json_set_members(const char *doc, size_t len, const char *const *keys, const char *const *values, int n,
                        tg_buf_t *out) {
    enum { MAXK = 8 };
    if (n < 0 || n > MAXK)
        return TG_ERROR;
    size_t i = 0;
    while (i < len && is_ws(doc[i]))
        i++;
    if (i >= len || doc[i] != '{')
        return TG_ERROR;
    size_t open = i;
    /* Pass 1: the value span of each key that is present. */
    size_t vstart[MAXK], vend[MAXK];
    int found[MAXK] = {0};
    i++;
    for (;;) {
        while (i < len && (is_ws(doc[i]) || doc[i] == ','))
            i++;
        if (i >= len)
            return TG_ERROR;
        if (doc[i] == '}')
            break;
        if (doc[i] != '"')
            return TG_ERROR;
        int escaped = 0;
        size_t kstart = i + 1;
        i = skip_string(doc, len, i, &escaped);
        if (escaped)
            return TG_ERROR;
        size_t klen = i - 1 - kstart;
        while (i < len && (is_ws(doc[i]) || doc[i] == ':'))
            i++;
        size_t vs = i;
        int depth = 0;
        while (i < len) {
            char c = doc[i];
            if (c == '"') {
                int esc = 0;
                i = skip_string(doc, len, i, &esc);
                if (depth == 0)
                    break;
                continue;
            }
            if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (depth == 0)
                    break; /* a scalar ended at the object's end */
                if (--depth == 0) {
                    i++;
                    break;
                }
            } else if (depth == 0 && (c == ',' || is_ws(c))) {
                break;
            }
            i++;
        }
        if (i > len)
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
    while (j < len && is_ws(doc[j]))
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
