/*
 * A request body validated in one pass, no tree built (tg_json.h, tg_json_scan).
 *
 * It accepts exactly what tg_json_loadb(body, JSON_REJECT_DUPLICATES) accepts (jansson
 * 2.14's grammar): an object or an array at the top, nothing after it but whitespace;
 * strings of strict UTF-8 without raw control bytes, whose escapes are the eight of
 * JSON and \uXXXX (never \u0000, surrogates only in pairs); numbers as JSON writes them,
 * integers within int64 and reals that do not overflow a double; no duplicate key in any object; nesting at most 2048 deep. What it would have
 * to decode or remember at length — an escaped key, an object past 32 keys, nesting past
 * 64, a number token past 64 bytes, a NUL byte in a body it would refuse — and
 * integers beyond int64 (which tg_json_loadb
 * parses a second time, rewritten) it leaves to jansson (TG_JSON_UNSURE).
 */
#include "tollgate/tg_json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tg_jscan_internal.h"

#define DEPTH_MAX 64 /* jansson's is 2048: deeper documents are left to it */
#define KEYS_MAX 32  /* per object */
#define KEYS_ALL 256 /* on the stack of open objects */
#define NUM_MAX 64

static const char *const top_names[TG_JTOP__COUNT] = {
    "model",      "stream",           "messages",             "input",   "max_completion_tokens",
    "max_tokens", "max_output_tokens", "prompt_cache_key", "previous_response_id", "metadata"};

static int hex4(const char *s, unsigned *v) {
    unsigned x = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        x <<= 4;
        if (c >= '0' && c <= '9')
            x |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            x |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            x |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *v = x;
    return 0;
}

/* The string that starts at s[*i] == '"': *i just past its closing quote. 0, or -1 when
 * jansson refuses it. */
static int scan_string(const char *s, size_t len, size_t *i, int *escaped) {
    size_t k = *i + 1;
    for (;;) {
        while (k < len && (unsigned char)s[k] >= 0x20 && (unsigned char)s[k] < 0x80 && s[k] != '"' && s[k] != '\\')
            k++;
        if (k >= len)
            return -1;
        unsigned char c = (unsigned char)s[k];
        if (c == '"') {
            *i = k + 1;
            return 0;
        }
        if (c < 0x20)
            return -1;
        if (c == '\\') {
            *escaped = 1;
            if (k + 1 >= len)
                return -1;
            char e = s[k + 1];
            if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                k += 2;
                continue;
            }
            unsigned u, lo;
            if (e != 'u' || k + 6 > len || hex4(s + k + 2, &u) != 0 || u == 0)
                return -1;
            k += 6;
            if (u >= 0xDC00 && u <= 0xDFFF)
                return -1;
            if (u >= 0xD800 && u <= 0xDBFF) {
                if (k + 6 > len || s[k] != '\\' || s[k + 1] != 'u' || hex4(s + k + 2, &lo) != 0 || lo < 0xDC00 ||
                    lo > 0xDFFF)
                    return -1;
                k += 6;
            }
            continue;
        }
        /* UTF-8: no overlong form, no surrogate, nothing past U+10FFFF. */
        int n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!n || k + (size_t)n > len)
            return -1;
        unsigned v = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
        for (int j = 1; j < n; j++) {
            unsigned char cc = (unsigned char)s[k + (size_t)j];
            if ((cc & 0xC0) != 0x80)
                return -1;
            v = v << 6 | (cc & 0x3F);
        }
        if ((n == 3 && v < 0x800) || (n == 4 && v < 0x10000) || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return -1;
        k += (size_t)n;
    }
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* The number at s[*i]: its kind (TG_JV_INT, TG_JV_REAL), 0 when jansson refuses it, -1
 * when it is left to jansson (an integer beyond int64: tg_json_loadb's second parse,
 * tg_json.c, decides; a long real). */
static int scan_number(const char *s, size_t len, size_t *i) {
    size_t k = *i, st = k;
    int real = 0;
    if (k < len && s[k] == '-')
        k++;
    if (k < len && s[k] == '0') {
        k++;
        if (k < len && is_digit(s[k]))
            return 0;
    } else if (k < len && is_digit(s[k])) {
        while (k < len && is_digit(s[k]))
            k++;
    } else {
        return 0;
    }
    if (k < len && s[k] == '.') {
        real = 1;
        k++;
        if (k >= len || !is_digit(s[k]))
            return 0;
        while (k < len && is_digit(s[k]))
            k++;
    }
    if (k < len && (s[k] == 'e' || s[k] == 'E')) {
        real = 1;
        k++;
        if (k < len && (s[k] == '+' || s[k] == '-'))
            k++;
        if (k >= len || !is_digit(s[k]))
            return 0;
        while (k < len && is_digit(s[k]))
            k++;
    }
    *i = k;
    size_t n = k - st;
    if (!real) {
        size_t nd = n - (s[st] == '-');
        const char *d = s + st + (s[st] == '-');
        const char *lim = s[st] == '-' ? "9223372036854775808" : "9223372036854775807";
        return nd > 19 || (nd == 19 && memcmp(d, lim, 19) > 0) ? -1 : TG_JV_INT;
    }
    if (n >= NUM_MAX)
        return -1;
    char buf[NUM_MAX];
    memcpy(buf, s + st, n);
    buf[n] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    if ((v == HUGE_VAL || v == -HUGE_VAL) && errno == ERANGE)
        return 0;
    return TG_JV_REAL;
}

static int scan_doc(const char *s, size_t len, tg_json_scan_top_t *top) {
    char kind[DEPTH_MAX];            /* '{' or '[' of each open container */
    int kbase[DEPTH_MAX];            /* where each open object's keys start in keys[] */
    size_t kst[KEYS_ALL], klen[KEYS_ALL];
    int nkeys = 0, depth = 0, member = -1;
    size_t i = 0;
    memset(top, 0, sizeof(*top));
    if (!s)
        return TG_JSON_INVALID;
    while (i < len && tg_js_is_ws(s[i]))
        i++;
    if (i >= len || (s[i] != '{' && s[i] != '['))
        return TG_JSON_INVALID;
    top->object = s[i] == '{';
value:
    /* A value starts at s[i] (whitespace skipped). */
    if (i >= len)
        return TG_JSON_INVALID;
    if (depth == 2 && member >= 0 && kind[1] == '[')
        top->m[member].count++;
    {
        size_t vs = i;
        int vkind, escaped = 0;
        char c = s[i];
        if (c == '{' || c == '[') {
            if (depth >= DEPTH_MAX)
                return TG_JSON_UNSURE;
            if (depth == 1 && member >= 0) {
                top->m[member].kind = c == '{' ? TG_JV_OBJECT : TG_JV_ARRAY;
                top->m[member].start = vs;
            }
            kind[depth] = c;
            kbase[depth] = nkeys;
            depth++;
            i++;
            while (i < len && tg_js_is_ws(s[i]))
                i++;
            if (i < len && s[i] == (c == '{' ? '}' : ']')) {
                i++;
                depth--;
                goto closed;
            }
            if (c == '{')
                goto key;
            goto value;
        }
        if (c == '"') {
            if (scan_string(s, len, &i, &escaped) != 0)
                return TG_JSON_INVALID;
            vkind = TG_JV_STRING;
            vs++;
        } else if (c == '-' || is_digit(c)) {
            vkind = scan_number(s, len, &i);
            if (vkind == 0)
                return TG_JSON_INVALID;
            if (vkind < 0)
                return TG_JSON_UNSURE;
        } else if (len - i >= 4 && !memcmp(s + i, "true", 4)) {
            vkind = TG_JV_TRUE;
            i += 4;
        } else if (len - i >= 5 && !memcmp(s + i, "false", 5)) {
            vkind = TG_JV_FALSE;
            i += 5;
        } else if (len - i >= 4 && !memcmp(s + i, "null", 4)) {
            vkind = TG_JV_NULL;
            i += 4;
        } else {
            return TG_JSON_INVALID;
        }
        /* A literal or number runs into no letter or digit (jansson reads "truex" and
         * "1x" as one token). */
        if (vkind != TG_JV_STRING && i < len && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
                                                 is_digit(s[i]) || s[i] == '.' || s[i] == '-' || s[i] == '+'))
            return TG_JSON_INVALID;
        if (depth == 1 && member >= 0) {
            tg_json_scan_val_t *m = &top->m[member];
            m->kind = vkind;
            m->escaped = escaped;
            m->start = vs;
            m->len = vkind == TG_JV_STRING ? i - 1 - vs : i - vs;
        }
    }
after:
    /* A value ended at s[i]. */
    while (i < len && tg_js_is_ws(s[i]))
        i++;
    if (depth == 0)
        return i == len ? TG_JSON_VALID : TG_JSON_INVALID;
    if (i >= len)
        return TG_JSON_INVALID;
    if (kind[depth - 1] == '[') {
        if (s[i] == ']') {
            i++;
            depth--;
            goto closed;
        }
        if (s[i] != ',')
            return TG_JSON_INVALID;
        i++;
        while (i < len && tg_js_is_ws(s[i]))
            i++;
        goto value;
    }
    if (s[i] == '}') {
        i++;
        depth--;
        nkeys = kbase[depth];
        goto closed;
    }
    if (s[i] != ',')
        return TG_JSON_INVALID;
    i++;
    while (i < len && tg_js_is_ws(s[i]))
        i++;
key:
    /* An object's key at s[i], then ':' and its value. */
    if (i >= len || s[i] != '"')
        return TG_JSON_INVALID;
    {
        int escaped = 0;
        size_t ks = i + 1;
        if (scan_string(s, len, &i, &escaped) != 0)
            return TG_JSON_INVALID;
        if (escaped)
            return TG_JSON_UNSURE; /* its decoded form could repeat another key */
        size_t kl = i - 1 - ks;
        int base = kbase[depth - 1];
        if (nkeys - base >= KEYS_MAX || nkeys >= KEYS_ALL)
            return TG_JSON_UNSURE;
        for (int k = base; k < nkeys; k++)
            if (klen[k] == kl && !memcmp(s + kst[k], s + ks, kl))
                return TG_JSON_INVALID; /* a duplicate */
        kst[nkeys] = ks;
        klen[nkeys++] = kl;
        if (depth == 1)
            member = -1;
        if (depth == 1 && top->object)
            for (int m = 0; m < TG_JTOP__COUNT; m++)
                if (strlen(top_names[m]) == kl && !memcmp(top_names[m], s + ks, kl)) {
                    member = m;
                    break;
                }
        while (i < len && tg_js_is_ws(s[i]))
            i++;
        if (i >= len || s[i] != ':')
            return TG_JSON_INVALID;
        i++;
        while (i < len && tg_js_is_ws(s[i]))
            i++;
        goto value;
    }
closed:
    /* A container closed: it is the value of its parent's member, or the document. */
    if (depth == 1 && member >= 0)
        top->m[member].len = i - top->m[member].start;
    goto after;
}

int tg_json_scan(const char *s, size_t len, tg_json_scan_top_t *top) {
    int rc = scan_doc(s, len, top);
    /* jansson's reader takes a NUL byte for an empty buffer after it has put a byte back
     * (the end of a number or literal) and skips it: a body with a NUL byte that the scan
     * refuses is left to jansson. */
    if (rc == TG_JSON_INVALID && s && memchr(s, '\0', len))
        return TG_JSON_UNSURE;
    return rc;
}
