/*
 * Token usage extraction: turns whatever a provider reports (a non-stream body, or the
 * data of one streamed event) into the normalised tg_usage_t that pricing and the ledger
 * use.
 *
 * Where each protocol puts its usage:
 *   OpenAI chat   body / final stream chunk: "usage": {prompt_tokens, completion_tokens,
 *                 prompt_tokens_details.cached_tokens,
 *                 completion_tokens_details.reasoning_tokens}; other chunks carry
 *                 "usage": null or nothing.
 *   Anthropic     body: "usage"; stream: message_start's "message"."usage" (input and
 *                 cache counts) and message_delta's top-level "usage" (output so far,
 *                 sometimes the input counts again). Later values overwrite earlier.
 *   Responses     body: "usage" {input_tokens, output_tokens,
 *                 input_tokens_details.cached_tokens,
 *                 output_tokens_details.reasoning_tokens}; stream: the terminal events
 *                 (response.completed, response.incomplete, response.failed) carry it in
 *                 "response"."usage".
 *   Embeddings    "usage": {prompt_tokens}; there is no output.
 *   Gemini        body and every stream chunk: "usageMetadata" {promptTokenCount (cache
 *                 hits included), cachedContentTokenCount, candidatesTokenCount,
 *                 thoughtsTokenCount (not in candidates), toolUsePromptTokenCount};
 *                 later chunks repeat and complete the counts. input = prompt - cached +
 *                 tool-use prompt, cache_read = cached, output = candidates + thoughts,
 *                 reasoning = thoughts.
 *
 * OpenAI counts cached tokens inside prompt/input tokens; they are moved to cache_read
 * here so that `input` means the same thing (uncached input) for every provider, as it
 * does in Anthropic's reports. A count that is absent, null, negative or not an integer
 * is unknown and leaves the field alone: unknown is not zero.
 *
 * Streams send hundreds of events and only one or two carry usage, so a document that
 * does not contain the bytes "usage" is answered without parsing it (and so without
 * noticing if it is malformed). A document that does is scanned once for its structure
 * (brackets, strings, separators — not the scalars) to find the byte span of its usage
 * object, and jansson parses only that span: a whole-document jansson parse cost about
 * 100 instructions per byte, a third of the gateway's user CPU per non-stream request
 * (spec/bench/RESULTS.md). The scan is not a JSON parser: it reads no values, and
 * whatever it cannot judge cheaply (escaped keys, nesting deeper than 64) goes to the
 * full parse, tg_usage_merge_json_full, which is also the reference the fuzz target
 * holds it to.
 */
#include "tollgate/tg_usage.h"
#include "tollgate/tg_json.h"

#include <inttypes.h>
#include <jansson.h>
#include <string.h> /* memrchr: the build defines _GNU_SOURCE */

#include "tg_jscan_internal.h"

/*
 * Where the counts are read from: a usage object parsed by jansson, or the members the
 * fast reader (below) collected from the usage object's bytes. Either way, the last of
 * duplicate keys wins, as in jansson.
 */
typedef struct {
    const char *key;
    size_t klen;
    int parent;  /* index of the enclosing member, or -1 at the usage object's top */
    int kind;    /* M_INT, M_OBJECT or M_OTHER */
    int64_t v;
} member_t;

enum { M_INT, M_OBJECT, M_OTHER };
#define MEMBERS_MAX 64

typedef struct {
    const json_t *obj; /* when set, read through jansson */
    const member_t *m;
    int n;
} usrc_t;

static int key_is(const member_t *m, const char *key) { return m->klen == strlen(key) && !memcmp(m->key, key, m->klen); }

/* The index of the last member named key under parent, or -1. */
static int member_find(const usrc_t *src, int parent, const char *key) {
    for (int i = src->n - 1; i >= 0; i--)
        if (src->m[i].parent == parent && key_is(&src->m[i], key))
            return i;
    return -1;
}

static int int_of(const json_t *v, int64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (int64_t)json_integer_value(v);
    return 1;
}

/* Reads a non-negative integer member; returns 1 and sets *out, or 0 when unknown. */
static int usage_int(const usrc_t *src, const char *key, int64_t *out) {
    if (src->obj)
        return int_of(json_object_get(src->obj, key), out);
    int i = member_find(src, -1, key);
    if (i < 0 || src->m[i].kind != M_INT || src->m[i].v < 0)
        return 0;
    *out = src->m[i].v;
    return 1;
}

/* The same, for obj.key1.key2 (an absent or null middle object means unknown). */
static int usage_int2(const usrc_t *src, const char *key1, const char *key2, int64_t *out) {
    if (src->obj) {
        json_t *inner = json_object_get(src->obj, key1);
        return json_is_object(inner) ? int_of(json_object_get(inner, key2), out) : 0;
    }
    int outer = member_find(src, -1, key1);
    if (outer < 0 || src->m[outer].kind != M_OBJECT)
        return 0;
    int i = member_find(src, outer, key2);
    if (i < 0 || src->m[i].kind != M_INT || src->m[i].v < 0)
        return 0;
    *out = src->m[i].v;
    return 1;
}

static void usage_set(tg_usage_t *u, unsigned bit, int64_t v) {
    switch (bit) {
    case TG_USAGE_INPUT: u->input = v; break;
    case TG_USAGE_OUTPUT: u->output = v; break;
    case TG_USAGE_CACHE_READ: u->cache_read = v; break;
    case TG_USAGE_CACHE_WRITE: u->cache_write = v; break;
    case TG_USAGE_REASONING: u->reasoning = v; break;
    }
    u->known |= bit;
}

/* The usage object at doc.<key>, or else at doc.<outer>.<key> (outer may be NULL). */
static json_t *usage_find(json_t *doc, const char *key, const char *outer) {
    json_t *us = json_object_get(doc, key);
    if (json_is_object(us))
        return us;
    if (outer) {
        json_t *o = json_object_get(doc, outer);
        if (json_is_object(o)) {
            us = json_object_get(o, key);
            if (json_is_object(us))
                return us;
        }
    }
    return NULL;
}

/*
 * OpenAI chat and Responses share a shape: total input including cache hits, cache hits
 * in a details object, output including reasoning, reasoning in another details object.
 */
static unsigned usage_openai(tg_usage_t *u, const usrc_t *us, const char *in_key,
                             const char *out_key, const char *in_details,
                             const char *out_details) {
    unsigned found = 0;
    int64_t in = 0, cached = 0, out = 0, reasoning = 0;
    int has_in = usage_int(us, in_key, &in);
    int has_cached = usage_int2(us, in_details, "cached_tokens", &cached);
    if (has_cached) {
        usage_set(u, TG_USAGE_CACHE_READ, cached);
        found |= TG_USAGE_CACHE_READ;
    }
    if (has_in) {
        usage_set(u, TG_USAGE_INPUT, has_cached ? (in > cached ? in - cached : 0) : in);
        found |= TG_USAGE_INPUT;
    }
    if (usage_int(us, out_key, &out)) {
        usage_set(u, TG_USAGE_OUTPUT, out);
        found |= TG_USAGE_OUTPUT;
    }
    if (usage_int2(us, out_details, "reasoning_tokens", &reasoning)) {
        usage_set(u, TG_USAGE_REASONING, reasoning);
        found |= TG_USAGE_REASONING;
    }
    return found;
}

static unsigned usage_anthropic(tg_usage_t *u, const usrc_t *us) {
    static const struct {
        const char *key;
        unsigned bit;
    } fields[] = {
        {"input_tokens", TG_USAGE_INPUT},
        {"output_tokens", TG_USAGE_OUTPUT},
        {"cache_read_input_tokens", TG_USAGE_CACHE_READ},
        {"cache_creation_input_tokens", TG_USAGE_CACHE_WRITE},
    };
    unsigned found = 0;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        int64_t v;
        if (usage_int(us, fields[i].key, &v)) {
            usage_set(u, fields[i].bit, v);
            found |= fields[i].bit;
        }
    }
    return found;
}

static unsigned usage_embeddings(tg_usage_t *u, const usrc_t *us) {
    int64_t in;
    if (!usage_int(us, "prompt_tokens", &in))
        return 0;
    usage_set(u, TG_USAGE_INPUT, in);
    usage_set(u, TG_USAGE_OUTPUT, 0);
    return TG_USAGE_INPUT | TG_USAGE_OUTPUT;
}

static unsigned usage_gemini(tg_usage_t *u, const usrc_t *us) {
    int64_t prompt = 0, cached = 0, tool = 0, cand = 0, thoughts = 0;
    int has_prompt = usage_int(us, "promptTokenCount", &prompt);
    int has_cached = usage_int(us, "cachedContentTokenCount", &cached);
    int has_tool = usage_int(us, "toolUsePromptTokenCount", &tool);
    int has_cand = usage_int(us, "candidatesTokenCount", &cand);
    int has_thoughts = usage_int(us, "thoughtsTokenCount", &thoughts);
    unsigned found = 0;
    if (has_cached) {
        usage_set(u, TG_USAGE_CACHE_READ, cached);
        found |= TG_USAGE_CACHE_READ;
    }
    if (has_prompt) {
        int64_t in = prompt > cached ? prompt - cached : 0;
        usage_set(u, TG_USAGE_INPUT, has_tool && tool < INT64_MAX / 4 && in < INT64_MAX / 4 ? in + tool : in);
        found |= TG_USAGE_INPUT;
    }
    if (has_thoughts) {
        usage_set(u, TG_USAGE_REASONING, thoughts);
        found |= TG_USAGE_REASONING;
    }
    /* A chunk before any output reports no candidates: output stays unknown until one
     * does (thoughts alone count too). */
    if (has_cand || has_thoughts) {
        int64_t out = (has_cand ? cand : 0);
        if (has_thoughts && thoughts < INT64_MAX / 4 && out < INT64_MAX / 4)
            out += thoughts;
        usage_set(u, TG_USAGE_OUTPUT, out);
        found |= TG_USAGE_OUTPUT;
    }
    return found;
}

static unsigned usage_read(tg_usage_t *u, tg_proto_t proto, const usrc_t *us) {
    switch (proto) {
    case TG_PROTO_OPENAI_CHAT:
        return usage_openai(u, us, "prompt_tokens", "completion_tokens", "prompt_tokens_details",
                            "completion_tokens_details");
    case TG_PROTO_ANTHROPIC: return usage_anthropic(u, us);
    case TG_PROTO_RESPONSES:
        return usage_openai(u, us, "input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details");
    case TG_PROTO_EMBEDDINGS: return usage_embeddings(u, us);
    case TG_PROTO_GEMINI: return usage_gemini(u, us);
    }
    return 0;
}

/* The usage object's key: Gemini's usageMetadata, everyone else's usage. */
static const char *usage_key(tg_proto_t proto) { return proto == TG_PROTO_GEMINI ? "usageMetadata" : "usage"; }

/* Where each protocol may nest its usage one level down (NULL: only at the top). */
static const char *usage_outer(tg_proto_t proto) {
    return proto == TG_PROTO_ANTHROPIC ? "message" : proto == TG_PROTO_RESPONSES ? "response" : NULL;
}

/* Whether "usage" occurs in s: searched from the end, where every provider puts its
 * usage object in a reply (memmem from the start read the whole content first). */
static int mentions_usage(const char *s, size_t len) {
    while (len >= 5) {
        const char *u = memrchr(s, 'u', len - 4);
        if (!u)
            return 0;
        if (memcmp(u, "usage", 5) == 0)
            return 1;
        len = (size_t)(u - s) + 4; /* the next 'u' to look at starts before this one */
    }
    return 0;
}

int tg_usage_merge_json_full(tg_usage_t *u, tg_proto_t proto, const char *json, size_t len) {
    if (!json || !mentions_usage(json, len))
        return 0;
    json_error_t err;
    json_t *doc = tg_json_loadb(json, len, 0, &err);
    if (!doc)
        return TG_ERROR;
    json_t *us = usage_find(doc, usage_key(proto), usage_outer(proto));
    usrc_t src = {.obj = us};
    unsigned found = us ? usage_read(u, proto, &src) : 0;
    json_decref(doc);
    return found ? 1 : 0;
}

/* ---- the structural scan ---------------------------------------------------------------- */

typedef struct {
    const char *p;
    size_t n;
} span_t;

enum { SCAN_OK = 0, SCAN_BAD = -1, SCAN_FULL = 1 };

/*
 * One pass over the document: checks that brackets nest, strings close, keys are
 * followed by ':' and members separated by ',', and nothing but whitespace follows the
 * top-level value; records the spans of doc.usage and doc.<outer>.usage when they are
 * objects (the last of duplicate keys wins, as in jansson).
 */
static int scan(const char *s, size_t len, const char *ukey, const char *outer, span_t *top, span_t *nested) {
    enum { VALUE, FIRST_KEY, KEY, COLON, NEXT, FIRST_VALUE } want = VALUE;
    uint64_t is_obj = 0; /* bit d: the container at depth d+1 is an object */
    int depth = 0, done = 0;
    int key_usage = 0, key_outer = 0; /* the member key just read */
    int in_outer = 0;                 /* depth 2 is the top object's <outer> object */
    size_t top_start = 0, nested_start = 0;
    int top_open = 0, nested_open = 0;
    size_t olen = outer ? strlen(outer) : 0, ulen = strlen(ukey);
    for (size_t i = 0; i < len;) {
        char c = s[i];
        if (tg_js_is_ws(c)) {
            i++;
            continue;
        }
        if (done)
            return SCAN_BAD; /* something after the top-level value */
        switch (want) {
        case FIRST_KEY:
        case KEY:
            if (c == '}' && want == FIRST_KEY)
                goto close;
            if (c != '"')
                return SCAN_BAD;
            {
                size_t start = i;
                int escaped = 0;
                if (tg_js_skip_string(s, len, &i, &escaped) != SCAN_OK)
                    return SCAN_BAD;
                if (escaped)
                    return SCAN_FULL; /* "\u0075sage" is "usage" too: let jansson decide */
                size_t klen = i - start - 2;
                key_usage = klen == ulen && !memcmp(s + start + 1, ukey, ulen);
                key_outer = outer && klen == olen && !memcmp(s + start + 1, outer, olen);
            }
            want = COLON;
            continue;
        case COLON:
            if (c != ':')
                return SCAN_BAD;
            i++;
            want = VALUE;
            continue;
        case NEXT:
            if (c == ',') {
                i++;
                want = (is_obj >> (depth - 1)) & 1 ? KEY : VALUE;
                continue;
            }
            if (c == '}' || c == ']')
                goto close;
            return SCAN_BAD;
        case FIRST_VALUE:
            if (c == ']')
                goto close;
            /* fall through */
        case VALUE:
            break;
        }
        /* A value. Which member it is matters only at depths 1 and 2. */
        int in_object = depth > 0 && ((is_obj >> (depth - 1)) & 1);
        int as_top_usage = depth == 1 && in_object && key_usage;
        int as_outer = depth == 1 && in_object && key_outer;
        int as_nested_usage = depth == 2 && in_object && in_outer && key_usage;
        key_usage = key_outer = 0;
        if (as_top_usage)
            top->p = NULL;
        if (as_outer) {
            nested->p = NULL;
            in_outer = 0;
        }
        if (as_nested_usage)
            nested->p = NULL;
        if (c == '{' || c == '[') {
            if (depth == 64)
                return SCAN_FULL;
            if (c == '{') {
                is_obj |= 1ull << depth;
                if (as_top_usage)
                    top_open = 1, top_start = i;
                if (as_outer)
                    in_outer = 1;
                if (as_nested_usage)
                    nested_open = 1, nested_start = i;
            } else {
                is_obj &= ~(1ull << depth);
            }
            depth++;
            i++;
            want = c == '{' ? FIRST_KEY : FIRST_VALUE;
            continue;
        }
        if (c == '"') {
            int escaped = 0;
            if (tg_js_skip_string(s, len, &i, &escaped) != SCAN_OK)
                return SCAN_BAD;
        } else if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
            /* A number or literal: its bytes are checked only if it sits in the usage
             * object, by jansson. */
            while (i < len && !tg_js_is_ws(s[i]) && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ':' &&
                   s[i] != '"' && s[i] != '{' && s[i] != '[')
                i++;
        } else {
            return SCAN_BAD;
        }
        if (depth == 0)
            return SCAN_BAD; /* a scalar document: jansson refuses one without JSON_DECODE_ANY */
        want = NEXT;
        continue;
    close:
        if ((c == '}') != (int)((is_obj >> (depth - 1)) & 1))
            return SCAN_BAD;
        depth--;
        i++;
        if (depth == 1 && top_open) {
            top_open = 0;
            top->p = s + top_start;
            top->n = i - top_start;
        }
        if (depth == 2 && nested_open) {
            nested_open = 0;
            nested->p = s + nested_start;
            nested->n = i - nested_start;
        }
        if (depth == 1 && in_outer)
            in_outer = 0;
        if (depth == 0)
            done = 1;
        want = NEXT;
    }
    return done ? SCAN_OK : SCAN_BAD;
}

static void skip_ws(const char *s, size_t len, size_t *i) {
    while (*i < len && tg_js_is_ws(s[*i]))
        (*i)++;
}

/*
 * Reads an integer the way JSON writes one (-?(0|[1-9][0-9]*)). Returns M_INT, M_OTHER
 * for any other number (a fraction or exponent: a real to jansson, so not a count), or
 * SCAN_FULL when it does not fit in 63 bits (jansson refuses the document then).
 */
static int read_int(const char *s, size_t len, size_t *i, int64_t *out) {
    size_t k = *i;
    int neg = s[k] == '-';
    if (neg)
        k++;
    if (k >= len || s[k] < '0' || s[k] > '9')
        return SCAN_FULL;
    if (s[k] == '0' && k + 1 < len && s[k + 1] >= '0' && s[k + 1] <= '9')
        return SCAN_FULL; /* a leading zero: not JSON */
    uint64_t v = 0;
    for (; k < len && s[k] >= '0' && s[k] <= '9'; k++) {
        v = v * 10 + (uint64_t)(s[k] - '0');
        if (v > (uint64_t)INT64_MAX)
            return SCAN_FULL;
    }
    if (k < len && (s[k] == '.' || s[k] == 'e' || s[k] == 'E'))
        return M_OTHER;
    *i = k;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return M_INT;
}

/*
 * Collects the members of a usage object (s[0] == '{', already checked by scan) and of
 * the objects directly inside it: names and integer values. Anything unusual — an
 * escaped name, an integer out of range, more members than fit — returns SCAN_FULL and
 * the caller lets jansson parse the object instead.
 */
static int read_members(const char *s, size_t len, member_t *m, int *nm) {
    int n = 0, parent = -1;
    size_t i = 1;
    for (;;) {
        skip_ws(s, len, &i);
        if (i >= len)
            return SCAN_FULL;
        if (s[i] == ',') {
            i++;
            continue;
        }
        if (s[i] == '}') {
            if (parent < 0)
                break;
            parent = -1; /* the end of a nested object */
            i++;
            continue;
        }
        if (s[i] != '"' || n == MEMBERS_MAX)
            return SCAN_FULL;
        size_t start = i;
        int escaped = 0;
        if (tg_js_skip_string(s, len, &i, &escaped) != SCAN_OK || escaped)
            return SCAN_FULL;
        member_t *e = &m[n];
        e->key = s + start + 1;
        e->klen = i - start - 2;
        e->parent = parent;
        e->kind = M_OTHER;
        e->v = 0;
        skip_ws(s, len, &i);
        if (i >= len || s[i] != ':')
            return SCAN_FULL;
        i++;
        skip_ws(s, len, &i);
        if (i >= len)
            return SCAN_FULL;
        char c = s[i];
        if (c == '{' && parent < 0) {
            e->kind = M_OBJECT;
            parent = n++;
            i++;
            continue;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            int k = read_int(s, len, &i, &e->v);
            if (k == SCAN_FULL)
                return SCAN_FULL;
            e->kind = k;
            if (k == M_INT) {
                n++;
                continue;
            }
        }
        n++;
        if (tg_js_skip_value(s, len, &i) != SCAN_OK)
            return SCAN_FULL;
    }
    *nm = n;
    return SCAN_OK;
}

int tg_usage_merge_json(tg_usage_t *u, tg_proto_t proto, const char *json, size_t len) {
    if (!json || !mentions_usage(json, len))
        return 0;
    span_t top = {0}, nested = {0};
    int r = scan(json, len, usage_key(proto), usage_outer(proto), &top, &nested);
    if (r == SCAN_BAD)
        return TG_ERROR;
    if (r == SCAN_FULL)
        return tg_usage_merge_json_full(u, proto, json, len);
    const span_t *sp = top.p ? &top : nested.p ? &nested : NULL;
    if (!sp)
        return 0;
    member_t m[MEMBERS_MAX];
    usrc_t src = {.m = m};
    if (read_members(sp->p, sp->n, m, &src.n) == SCAN_OK)
        return usage_read(u, proto, &src) ? 1 : 0;
    /* Something the reader leaves to jansson: parse the usage object alone. */
    json_error_t err;
    json_t *us = json_loadb(sp->p, sp->n, 0, &err);
    if (!us)
        return TG_ERROR; /* a malformed scalar inside the usage object */
    src = (usrc_t){.obj = us};
    unsigned found = usage_read(u, proto, &src);
    json_decref(us);
    return found ? 1 : 0;
}

void tg_usage_append_json(const tg_usage_t *u, tg_buf_t *b) {
    const struct {
        const char *key;
        unsigned bit;
        int64_t v;
    } fields[] = {
        {"input", TG_USAGE_INPUT, u->input},
        {"output", TG_USAGE_OUTPUT, u->output},
        {"cache_read", TG_USAGE_CACHE_READ, u->cache_read},
        {"cache_write", TG_USAGE_CACHE_WRITE, u->cache_write},
        {"reasoning", TG_USAGE_REASONING, u->reasoning},
    };
    tg_buf_append(b, "{", 1);
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (i)
            tg_buf_append(b, ",", 1);
        if (u->known & fields[i].bit)
            tg_buf_printf(b, "\"%s\":%" PRId64, fields[i].key, fields[i].v);
        else
            tg_buf_printf(b, "\"%s\":null", fields[i].key);
    }
    tg_buf_append(b, "}", 1);
}
