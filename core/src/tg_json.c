/*
 * Byte-level edits of a JSON object that jansson has already accepted (tg_json.h).
 *
 * Because the document is known to be valid, one pass that tracks string boundaries and
 * bracket depth is enough to find each top-level member's key and value spans; values
 * are never read, only copied or replaced.
 */
#include "tollgate/tg_json.h"

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
