/*
 * Translation between OpenAI Chat Completions, Anthropic Messages and OpenAI Responses:
 * the public entry points, the neutral request form, the shared helpers and the stream
 * translator's sequencing. The protocol files (tg_translate_chat.c, _anthropic.c,
 * _responses.c) each decode their protocol into the neutral form and encode it back;
 * translating is decoding with one and encoding with another.
 *
 * Streams: the upstream protocol's decoder turns each event into neutral calls (start,
 * text, tool_start, tool_args, block_end, stop, end, error). The tg__x_* functions here
 * keep the invariants every client encoder relies on, so the encoders stay simple:
 * start comes first and once; text and tool calls come only between start and stop;
 * tool arguments only while a tool call is open; stop comes once, after the open block
 * is closed; end comes once, after stop; nothing comes after end or an error.
 */
#include "tg_translate_internal.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* ---- small helpers ------------------------------------------------------------------ */

int tg__fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return TG_ERROR;
}

const char *tg__str(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return tg_json_is_big(v, NULL, NULL) ? NULL : json_string_value(v);
}

int64_t tg__int(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

json_t *tg__schema(const json_t *params) {
    return params ? json_incref((json_t *)params) : json_pack("{s:s,s:{}}", "type", "object", "properties");
}

/*
 * JSON string escaping, copying runs of plain bytes at once (this is on the path of every
 * streamed token). Bytes >= 0x80 are copied as they are: callers pass strings that came
 * out of jansson (valid UTF-8) or were made valid with utf8_sanitize.
 */
void tg__put_str(tg_buf_t *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    tg_buf_reserve(b, n + 2);
    b->data[b->len++] = '"';
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f)
            continue;
        tg_buf_append(b, s + run, i - run);
        run = i + 1;
        char e[6] = {'\\', (char)c, 0, 0, 0, 0};
        size_t en = 2;
        switch (c) {
        case '"': case '\\': break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default:
            e[1] = 'u';
            e[2] = '0';
            e[3] = '0';
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            en = 6;
        }
        tg_buf_append(b, e, en);
    }
    tg_buf_append(b, s + run, n - run);
    tg_buf_append(b, "\"", 1);
}

void tg__put_cstr(tg_buf_t *b, const char *s) {
    if (s)
        tg__put_str(b, s, strlen(s));
    else
        tg_buf_append(b, "null", 4);
}

void tg__sse_begin(tg_buf_t *b, const char *event) {
    tg_buf_appends(b, "event: ");
    tg_buf_appends(b, event);
    tg_buf_append(b, "\ndata: ", 7);
}

int tg__data_url(const char *url, tg_str_t *media, tg_str_t *data) {
    if (!url || strncmp(url, "data:", 5) != 0)
        return 0;
    const char *comma = strchr(url + 5, ',');
    if (!comma)
        return 0;
    const char *b64 = strstr(url + 5, ";base64");
    if (!b64 || b64 + 7 != comma)
        return 0;
    media->p = url + 5;
    media->len = (size_t)(b64 - (url + 5));
    data->p = comma + 1;
    data->len = strlen(comma + 1);
    return media->len > 0;
}

json_t *tg__text_block(const json_t *part, const char *where, char *err, size_t errlen) {
    json_t *t = json_object_get(part, "text");
    if (!json_is_string(t)) {
        tg__fail(err, errlen, "%s: text must be a string", where);
        return NULL;
    }
    json_t *b = json_pack("{s:s,s:O}", "type", "text", "text", t);
    json_t *cc = json_object_get(part, "cache_control");
    if (json_is_object(cc))
        json_object_set(b, "cache_control", cc);
    return b;
}

json_t *tg__join_text(const json_t *content, const char *sep) {
    if (tg_json_is_big(content, NULL, NULL))
        return NULL; /* a number, not text */
    if (json_is_string(content))
        return json_incref((json_t *)content);
    if (!json_is_array(content))
        return NULL;
    tg_buf_t b;
    tg_buf_init(&b);
    size_t i;
    json_t *part;
    json_array_foreach(content, i, part) {
        const json_t *t = part;
        if (!json_is_string(part) || tg_json_is_big(part, NULL, NULL)) {
            const char *type = tg__str(part, "type");
            t = json_object_get(part, "text");
            if (!type || !json_is_string(t) ||
                (strcmp(type, "text") && strcmp(type, "input_text") && strcmp(type, "output_text"))) {
                tg_buf_free(&b);
                return NULL;
            }
        }
        if (i)
            tg_buf_appends(&b, sep);
        tg_buf_append(&b, json_string_value(t), json_string_length(t));
    }
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    tg_buf_free(&b);
    return s;
}

static int64_t usage_get(const tg_usage_t *u, unsigned bit, int64_t v) {
    return (u->known & bit) ? v : 0;
}

/* Input tokens as OpenAI counts them: everything read, cache hits and writes included. */
static int64_t usage_prompt(const tg_usage_t *u) {
    return usage_get(u, TG_USAGE_INPUT, u->input) + usage_get(u, TG_USAGE_CACHE_READ, u->cache_read) +
           usage_get(u, TG_USAGE_CACHE_WRITE, u->cache_write);
}

void tg__usage_chat(const tg_usage_t *u, tg_buf_t *b) {
    int64_t in = usage_prompt(u), out = usage_get(u, TG_USAGE_OUTPUT, u->output);
    tg_buf_printf(b, "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld",
                  (long long)in, (long long)out, (long long)(in + out));
    if (u->known & TG_USAGE_CACHE_READ)
        tg_buf_printf(b, ",\"prompt_tokens_details\":{\"cached_tokens\":%lld}", (long long)u->cache_read);
    if (u->known & TG_USAGE_REASONING)
        tg_buf_printf(b, ",\"completion_tokens_details\":{\"reasoning_tokens\":%lld}",
                      (long long)u->reasoning);
    tg_buf_append(b, "}", 1);
}

void tg__usage_anthropic(const tg_usage_t *u, tg_buf_t *b) {
    /* Anthropic always reports both cache counts; an unreported one is 0. */
    tg_buf_printf(b,
                  "{\"input_tokens\":%lld,\"cache_creation_input_tokens\":%lld,\"cache_read_input_tokens\":%lld,"
                  "\"output_tokens\":%lld}",
                  (long long)usage_get(u, TG_USAGE_INPUT, u->input),
                  (long long)usage_get(u, TG_USAGE_CACHE_WRITE, u->cache_write),
                  (long long)usage_get(u, TG_USAGE_CACHE_READ, u->cache_read),
                  (long long)usage_get(u, TG_USAGE_OUTPUT, u->output));
}

void tg__usage_responses(const tg_usage_t *u, tg_buf_t *b) {
    int64_t in = usage_prompt(u), out = usage_get(u, TG_USAGE_OUTPUT, u->output);
    tg_buf_printf(b,
                  "{\"input_tokens\":%lld,\"input_tokens_details\":{\"cached_tokens\":%lld},"
                  "\"output_tokens\":%lld,\"output_tokens_details\":{\"reasoning_tokens\":%lld},"
                  "\"total_tokens\":%lld}",
                  (long long)in, (long long)usage_get(u, TG_USAGE_CACHE_READ, u->cache_read),
                  (long long)out, (long long)usage_get(u, TG_USAGE_REASONING, u->reasoning),
                  (long long)(in + out));
}

/* ---- stop reasons ------------------------------------------------------------------- */

int tg__fin_from_chat(const char *s) {
    if (!s)
        return TG__FIN_NONE;
    if (!strcmp(s, "length"))
        return TG__FIN_LENGTH;
    if (!strcmp(s, "tool_calls") || !strcmp(s, "function_call"))
        return TG__FIN_TOOL_USE;
    if (!strcmp(s, "content_filter"))
        return TG__FIN_FILTER;
    return TG__FIN_STOP;
}

int tg__fin_from_anthropic(const char *s) {
    if (!s)
        return TG__FIN_NONE;
    if (!strcmp(s, "max_tokens") || !strcmp(s, "model_context_window_exceeded"))
        return TG__FIN_LENGTH;
    if (!strcmp(s, "tool_use"))
        return TG__FIN_TOOL_USE;
    if (!strcmp(s, "stop_sequence"))
        return TG__FIN_STOP_SEQUENCE;
    if (!strcmp(s, "refusal"))
        return TG__FIN_FILTER;
    return TG__FIN_STOP; /* end_turn, pause_turn, anything newer */
}

const char *tg__fin_chat(int fin) {
    switch (fin) {
    case TG__FIN_LENGTH: return "length";
    case TG__FIN_TOOL_USE: return "tool_calls";
    case TG__FIN_FILTER: return "content_filter";
    default: return "stop";
    }
}

const char *tg__fin_anthropic(int fin) {
    switch (fin) {
    case TG__FIN_LENGTH: return "max_tokens";
    case TG__FIN_TOOL_USE: return "tool_use";
    case TG__FIN_STOP_SEQUENCE: return "stop_sequence";
    case TG__FIN_FILTER: return "refusal";
    default: return "end_turn";
    }
}

/* ---- protocols ---------------------------------------------------------------------- */

static int proto_valid(tg_proto_t p) {
    return p == TG_PROTO_OPENAI_CHAT || p == TG_PROTO_ANTHROPIC || p == TG_PROTO_RESPONSES ||
           p == TG_PROTO_EMBEDDINGS || p == TG_PROTO_GEMINI;
}

int tg_translate_supported(tg_proto_t from, tg_proto_t to) {
    if (!proto_valid(from) || !proto_valid(to))
        return 0;
    if (from == to)
        return from != TG_PROTO_GEMINI; /* an upstream protocol only: never the client's */
    return from != TG_PROTO_EMBEDDINGS && to != TG_PROTO_EMBEDDINGS;
}

const char *tg_translate_path(tg_proto_t proto) {
    switch (proto) {
    case TG_PROTO_OPENAI_CHAT: return "/chat/completions";
    case TG_PROTO_ANTHROPIC: return "/messages";
    case TG_PROTO_RESPONSES: return "/responses";
    case TG_PROTO_EMBEDDINGS: return "/embeddings";
    case TG_PROTO_GEMINI: return "/models"; /* the model and method follow: tg_translate_gemini_path */
    }
    return "/chat/completions";
}

const char *tg_translate_proto_name(tg_proto_t proto) {
    switch (proto) {
    case TG_PROTO_OPENAI_CHAT: return "openai_chat";
    case TG_PROTO_ANTHROPIC: return "anthropic";
    case TG_PROTO_RESPONSES: return "responses";
    case TG_PROTO_EMBEDDINGS: return "embeddings";
    case TG_PROTO_GEMINI: return "gemini";
    }
    return "unknown";
}

static const char *proto_title(tg_proto_t proto) {
    switch (proto) {
    case TG_PROTO_OPENAI_CHAT: return "an OpenAI chat";
    case TG_PROTO_ANTHROPIC: return "an Anthropic";
    case TG_PROTO_RESPONSES: return "an OpenAI Responses";
    case TG_PROTO_GEMINI: return "a Gemini";
    default: return "an embeddings";
    }
}

/* ---- the neutral request ------------------------------------------------------------ */

void tg__ir_init(tg__ir_t *ir) {
    memset(ir, 0, sizeof(*ir));
    ir->system = json_array();
    ir->messages = json_array();
    ir->parallel = -1;
    ir->max_tokens = -1;
}

void tg__ir_free(tg__ir_t *ir) {
    json_decref(ir->system);
    json_decref(ir->messages);
    json_decref(ir->tools);
    json_decref(ir->stop);
    json_decref(ir->format);
    memset(ir, 0, sizeof(*ir));
}

void tg__ir_add(tg__ir_t *ir, const char *role, json_t *block) {
    size_t n = json_array_size(ir->messages);
    json_t *last = n ? json_array_get(ir->messages, n - 1) : NULL;
    const char *lr = tg__str(last, "role");
    if (!lr || strcmp(lr, role) != 0) {
        last = json_pack("{s:s,s:[]}", "role", role, "content");
        json_array_append_new(ir->messages, last);
    }
    json_array_append_new(json_object_get(last, "content"), block);
}

typedef int (*req_decode_fn)(const json_t *, tg__ir_t *, char *, size_t);
typedef int (*req_encode_fn)(const tg__ir_t *, json_t *, char *, size_t);

int tg_translate_request(tg_proto_t from, tg_proto_t to, const json_t *body, const char *model,
                         json_t **out, char *err, size_t errlen) {
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (!json_is_object(body))
        return tg__fail(err, errlen, "request body must be a JSON object");
    if (!tg_translate_supported(from, to) || from == TG_PROTO_GEMINI)
        return tg__fail(err, errlen, "%s request cannot be sent to %s upstream",
                        tg_translate_proto_name(from), proto_title(to));
    if (from == to) {
        json_t *copy = json_deep_copy(body);
        if (model)
            json_object_set_new(copy, "model", json_string(model));
        *out = copy;
        return TG_OK;
    }
    static const req_decode_fn dec[] = {tg__chat_req_decode, tg__anthropic_req_decode,
                                        tg__responses_req_decode};
    static const req_encode_fn enc[] = {tg__chat_req_encode, tg__anthropic_req_encode,
                                        tg__responses_req_encode, NULL, tg__gemini_req_encode};
    const char *m = model ? model : tg__str(body, "model");
    if (!m || !*m)
        return tg__fail(err, errlen, "you must provide a model parameter");
    tg__ir_t ir;
    tg__ir_init(&ir);
    json_t *doc = json_object();
    json_object_set_new(doc, "model", json_string(m));
    int rc = dec[from](body, &ir, err, errlen);
    if (rc == TG_OK)
        rc = enc[to](&ir, doc, err, errlen);
    tg__ir_free(&ir);
    if (rc != TG_OK) {
        json_decref(doc);
        return TG_ERROR;
    }
    *out = doc;
    return TG_OK;
}

/* ---- non-stream responses ----------------------------------------------------------- */

typedef int (*resp_decode_fn)(const json_t *, tg__resp_t *);
typedef void (*resp_encode_fn)(const tg__resp_t *, const char *, tg_buf_t *);

int tg_translate_response(tg_proto_t from_upstream, tg_proto_t to_client, const char *body,
                          size_t len, const char *client_model, tg_buf_t *out) {
    if (!tg_translate_supported(from_upstream, to_client) || to_client == TG_PROTO_GEMINI)
        return TG_ERROR;
    if (from_upstream == to_client) {
        tg_buf_append(out, body, len);
        return TG_OK;
    }
    static const resp_decode_fn dec[] = {tg__chat_resp_decode, tg__anthropic_resp_decode,
                                         tg__responses_resp_decode, NULL, tg__gemini_resp_decode};
    static const resp_encode_fn enc[] = {tg__chat_resp_encode, tg__anthropic_resp_encode,
                                         tg__responses_resp_encode};
    json_error_t jerr;
    json_t *doc = body ? tg_json_loadb(body, len, 0, &jerr) : NULL;
    if (!json_is_object(doc)) {
        json_decref(doc);
        return TG_ERROR;
    }
    tg__resp_t r;
    memset(&r, 0, sizeof(r));
    r.content = json_array();
    int rc = dec[from_upstream](doc, &r);
    if (rc == TG_OK) {
        tg_usage_merge_json(&r.usage, from_upstream, body, len);
        if (r.fin == TG__FIN_STOP) {
            /* Tool calls in the answer mean the model is waiting for their results. */
            size_t i;
            json_t *blk;
            json_array_foreach(r.content, i, blk)
                if (!strcmp(tg__str(blk, "type"), "tool_use"))
                    r.fin = TG__FIN_TOOL_USE;
        }
        if (!r.created)
            r.created = (int64_t)time(NULL);
        enc[to_client](&r, client_model ? client_model : r.model, out);
    }
    json_decref(r.content);
    json_decref(doc);
    return rc;
}

/* ---- errors ------------------------------------------------------------------------- */

static const char *openai_type_for(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

static const char *openai_code_for(int status) {
    switch (status) {
    case 401: return "invalid_api_key";
    case 403: return "permission_denied";
    case 404: return "not_found";
    case 413: return "request_too_large";
    case 429: return "rate_limit_exceeded";
    case 503: return "service_unavailable";
    case 504: return "upstream_timeout";
    case 529: return "overloaded";
    default: return status >= 500 ? "upstream_error" : "invalid_request";
    }
}

static const char *anthropic_type_for(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 402: return "billing_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 504: return "timeout_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

static int anthropic_type_known(const char *t) {
    static const char *const known[] = {
        "invalid_request_error", "authentication_error", "billing_error", "permission_error",
        "not_found_error", "request_too_large", "rate_limit_error", "api_error",
        "overloaded_error", "timeout_error"};
    for (size_t i = 0; t && i < sizeof(known) / sizeof(known[0]); i++)
        if (!strcmp(t, known[i]))
            return 1;
    return 0;
}

/* Copies text that may not be UTF-8 (a plain-text error page), replacing bad bytes and
 * control characters with '?', at most max bytes, trimmed. */
static void text_sanitize(tg_buf_t *b, const char *s, size_t n, size_t max) {
    while (n && (unsigned char)s[0] <= ' ')
        s++, n--;
    while (n && (unsigned char)s[n - 1] <= ' ')
        n--;
    for (size_t i = 0; i < n && b->len < max;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = k && i + k <= n;
        for (size_t j = 1; ok && j < k; j++)
            ok = ((unsigned char)s[i + j] >> 6) == 2;
        if (ok && k == 1 && (c < 0x20 || c == 0x7f))
            ok = 0;
        if (!ok) {
            tg_buf_append(b, "?", 1);
            i++;
        } else {
            tg_buf_append(b, s + i, k);
            i += k;
        }
    }
}

void tg_translate_error(tg_proto_t to_client, int status, const char *body, size_t len,
                        tg_buf_t *out) {
    json_error_t jerr;
    json_t *doc = body && len ? json_loadb(body, len, 0, &jerr) : NULL;
    const char *msg = NULL, *type = NULL, *code = NULL;
    char codebuf[32];
    json_t *e = json_object_get(doc, "error");
    if (json_is_object(e)) {
        msg = tg__str(e, "message");
        type = tg__str(e, "type");
        json_t *c = json_object_get(e, "code");
        code = json_string_value(c);
        if (json_is_integer(c)) {
            snprintf(codebuf, sizeof(codebuf), "%lld", (long long)json_integer_value(c));
            code = codebuf;
        }
    } else if (json_is_string(e)) {
        msg = json_string_value(e);
    }
    if (!msg)
        msg = tg__str(doc, "message");
    if (!msg)
        msg = tg__str(doc, "detail");
    tg_buf_t text;
    tg_buf_init(&text);
    if (msg)
        tg_buf_appends(&text, msg);
    else if (!doc && body && len)
        text_sanitize(&text, body, len, 512);
    if (!text.len)
        tg_buf_printf(&text, "the upstream answered HTTP %d", status);

    if (to_client == TG_PROTO_ANTHROPIC) {
        tg_buf_appends(out, "{\"type\":\"error\",\"error\":{\"type\":");
        /* The status decides where it has a type of its own (401 is authentication_error
         * even when an OpenAI body says invalid_request_error); else keep the body's. */
        const char *by_status = anthropic_type_for(status);
        int generic = !strcmp(by_status, "invalid_request_error") || !strcmp(by_status, "api_error");
        tg__put_cstr(out, generic && anthropic_type_known(type) ? type : by_status);
        tg_buf_appends(out, ",\"message\":");
        tg__put_str(out, text.data, text.len);
        tg_buf_appends(out, "}}");
    } else {
        /* Anthropic's server-side types have no OpenAI twin; the rest share names. */
        if (type && (!strcmp(type, "api_error") || !strcmp(type, "overloaded_error") ||
                     !strcmp(type, "timeout_error")))
            type = "server_error";
        tg_buf_appends(out, "{\"error\":{\"message\":");
        tg__put_str(out, text.data, text.len);
        tg_buf_appends(out, ",\"type\":");
        tg__put_cstr(out, type ? type : openai_type_for(status));
        tg_buf_appends(out, ",\"param\":null,\"code\":");
        tg__put_cstr(out, code ? code : openai_code_for(status));
        tg_buf_appends(out, "}}");
    }
    tg_buf_free(&text);
    json_decref(doc);
}

/* ---- token estimate ----------------------------------------------------------------- */

typedef struct {
    int64_t bytes;
    int64_t extra; /* per-message and per-image tokens */
} estimate_t;

static void estimate_walk(estimate_t *e, const json_t *v, int depth);

static void estimate_value_text(estimate_t *e, const json_t *v) {
    /* Schemas and tool inputs count as the JSON text the model reads. */
    char *s = tg_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (s) {
        e->bytes += (int64_t)strlen(s);
        free(s);
    }
}

static void estimate_walk(estimate_t *e, const json_t *v, int depth) {
    if (depth > 64)
        return;
    if (json_is_string(v)) {
        e->bytes += (int64_t)json_string_length(v);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) estimate_walk(e, x, depth + 1);
    } else if (json_is_object(v)) {
        const char *type = tg__str(v, "type");
        if (type && (!strcmp(type, "image") || !strcmp(type, "image_url") || !strcmp(type, "input_image") ||
                     !strcmp(type, "document") || !strcmp(type, "file") || !strcmp(type, "input_file"))) {
            e->extra += 1600;
            return;
        }
        if (json_object_get(v, "role") || (type && (!strcmp(type, "function_call") ||
                                                    !strcmp(type, "function_call_output"))))
            e->extra += 3;
        const char *key;
        json_t *x;
        json_object_foreach((json_t *)v, key, x) {
            if (!strcmp(key, "text") || !strcmp(key, "content") || !strcmp(key, "arguments") ||
                !strcmp(key, "output") || !strcmp(key, "tool_calls") || !strcmp(key, "function") ||
                !strcmp(key, "name") || !strcmp(key, "description") || !strcmp(key, "refusal"))
                estimate_walk(e, x, depth + 1);
            else if (!strcmp(key, "input") || !strcmp(key, "parameters") || !strcmp(key, "input_schema"))
                json_is_object(x) ? estimate_value_text(e, x) : estimate_walk(e, x, depth + 1);
        }
    }
}

int64_t tg_estimate_tokens(tg_proto_t proto, const json_t *body) {
    if (!json_is_object(body))
        return TG_ERROR;
    TG_UNUSED(proto);
    estimate_t e = {0, 0};
    static const char *const keys[] = {"system", "instructions", "messages", "input", "tools"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        const json_t *v = json_object_get(body, keys[i]);
        if (!v)
            continue;
        if (!strcmp(keys[i], "tools") && json_is_array(v)) {
            size_t j;
            json_t *t;
            json_array_foreach(v, j, t) estimate_value_text(&e, t);
        } else {
            estimate_walk(&e, v, 0);
        }
    }
    int64_t n = (e.bytes + 3) / 4 + e.extra;
    return n < 1 ? 1 : n;
}

/* ---- the stream translator ---------------------------------------------------------- */

tg_xlate_t *tg_xlate_create(tg_proto_t from_upstream, tg_proto_t to_client,
                            const char *client_model, const char *request_id) {
    if (!tg_translate_supported(from_upstream, to_client) || from_upstream == TG_PROTO_EMBEDDINGS ||
        to_client == TG_PROTO_EMBEDDINGS || to_client == TG_PROTO_GEMINI)
        return NULL;
    tg_xlate_t *x = calloc(1, sizeof(*x));
    if (!x)
        abort();
    x->from = from_upstream;
    x->to = to_client;
    if (from_upstream != to_client)
        x->enc = to_client == TG_PROTO_OPENAI_CHAT ? &tg__chat_enc
                 : to_client == TG_PROTO_ANTHROPIC ? &tg__anthropic_enc
                                                   : &tg__responses_enc;
    /* The request id goes into generated ids: keep it to [A-Za-z0-9_-]. */
    snprintf(x->req_id, sizeof(x->req_id), "%s", request_id && *request_id ? request_id : "tollgate");
    for (char *c = x->req_id; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-'))
            *c = '_';
    if (client_model && *client_model) {
        tg_buf_appends(&x->model, client_model);
        x->model_fixed = 1;
    }
    x->created = (int64_t)time(NULL);
    x->usage_chunk = 1;
    x->d_index = -1;
    x->e_index = -1;
    return x;
}

void tg_xlate_set_usage_chunk(tg_xlate_t *x, int on) { x->usage_chunk = on != 0; }

const tg_usage_t *tg_xlate_usage(const tg_xlate_t *x) { return tg__x_u(x); }

void tg_xlate_use_usage(tg_xlate_t *x, const tg_usage_t *u) { x->billed = u; }

void tg_xlate_destroy(tg_xlate_t *x) {
    if (!x)
        return;
    tg_buf_free(&x->id);
    tg_buf_free(&x->model);
    tg_buf_free(&x->e_text);
    tg_buf_free(&x->e_call);
    tg_buf_free(&x->e_name);
    tg_buf_free(&x->e_items);
    free(x);
}

/* Passthrough (from == to): the event goes out as it came in. */
static void passthrough(const char *event, size_t elen, const char *data, size_t dlen, tg_buf_t *out) {
    if (elen) {
        tg_buf_append(out, "event: ", 7);
        tg_buf_append(out, event, elen);
        tg_buf_append(out, "\n", 1);
    }
    const char *s = data, *end = data + dlen;
    for (;;) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        tg_buf_append(out, "data: ", 6);
        tg_buf_append(out, s, (size_t)(e - s));
        tg_buf_append(out, "\n", 1);
        if (!nl)
            break;
        s = nl + 1;
    }
    tg_buf_append(out, "\n", 1);
}

void tg_xlate_event(tg_xlate_t *x, const char *event, size_t elen, const char *data, size_t dlen,
                    tg_buf_t *out) {
    if (!data)
        data = "", dlen = 0;
    /* The usage is the fold over every event, as the proxy bills it (tg_proxy_relay.c):
     * also an error event's, one the translator cannot read, and one after the end —
     * folded here once, for every protocol, never by the decoders; or not at all when
     * the caller shares the fold it makes anyway (tg_xlate_use_usage). */
    if (!x->billed)
        tg_usage_merge_json(&x->usage, x->from, data, dlen);
    if (x->ended)
        return;
    if (!x->enc) {
        passthrough(event ? event : "", event ? elen : 0, data, dlen, out);
        return;
    }
    if (x->from == TG_PROTO_OPENAI_CHAT && dlen == 6 && !memcmp(data, "[DONE]", 6)) {
        tg__x_end(x, out);
        return;
    }
    json_error_t jerr;
    json_t *doc = json_loadb(data, dlen, 0, &jerr);
    if (json_is_object(doc)) {
        if (x->from == TG_PROTO_OPENAI_CHAT)
            tg__chat_dec(x, doc, out);
        else if (x->from == TG_PROTO_ANTHROPIC)
            tg__anthropic_dec(x, doc, out);
        else if (x->from == TG_PROTO_GEMINI)
            tg__gemini_dec(x, doc, out);
        else
            tg__responses_dec(x, doc, out);
    }
    json_decref(doc);
}

void tg_xlate_finish(tg_xlate_t *x, tg_buf_t *out) {
    if (x->ended)
        return;
    if (!x->enc) {
        x->ended = 1;
        return;
    }
    if (x->stopped)
        tg__x_end(x, out);
    else
        tg__x_error(x, "api_error", "the upstream stream ended before the response was complete", out);
}

void tg__x_meta(tg_xlate_t *x, const char *id, const char *model, int64_t created) {
    if (x->started)
        return;
    if (id && *id && !x->id.len)
        tg_buf_appends(&x->id, id);
    if (model && *model && !x->model_fixed) {
        tg_buf_reset(&x->model);
        tg_buf_appends(&x->model, model);
    }
    if (created > 0)
        x->created = created;
}

void tg__x_start(tg_xlate_t *x, tg_buf_t *out) {
    if (x->started || x->ended)
        return;
    if (!x->id.len) {
        const char *prefix = x->to == TG_PROTO_OPENAI_CHAT ? "chatcmpl-"
                             : x->to == TG_PROTO_ANTHROPIC ? "msg_"
                                                           : "resp_";
        tg_buf_printf(&x->id, "%s%s", prefix, x->req_id);
    }
    if (!x->model.len)
        tg_buf_appends(&x->model, "unknown");
    x->started = 1;
    x->enc->start(x, out);
}

void tg__x_text(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out) {
    if (!n || x->stopped || x->ended)
        return;
    tg__x_start(x, out);
    if (x->e_kind != TG__BLK_TEXT)
        tg__x_block_end(x, out);
    x->enc->text(x, s, n, out);
    assert(x->e_kind == TG__BLK_TEXT);
}

void tg__x_tool_start(tg_xlate_t *x, const char *id, size_t idn, const char *name, size_t nn,
                      tg_buf_t *out) {
    if (x->stopped || x->ended)
        return;
    tg__x_start(x, out);
    tg__x_block_end(x, out);
    char gen[96];
    if (!idn) {
        /* A tool call must have an id for its result to refer to. */
        idn = (size_t)snprintf(gen, sizeof(gen), "call_%.64s_%d", x->req_id, x->tools);
        id = gen;
    }
    x->enc->tool_start(x, id, idn, name ? name : "", name ? nn : 0, out);
    x->e_args = 0;
    x->tools++;
    assert(x->e_kind == TG__BLK_TOOL);
}

void tg__x_tool_args(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out) {
    if (!n || x->stopped || x->ended || x->e_kind != TG__BLK_TOOL)
        return;
    x->e_args = 1;
    x->enc->tool_args(x, s, n, out);
}

void tg__x_block_end(tg_xlate_t *x, tg_buf_t *out) {
    if (x->e_kind == TG__BLK_NONE || x->ended)
        return;
    /* A call without arguments (Anthropic streams input {} and an empty delta) still
     * gets a JSON object, as OpenAI sends it and as the non-stream answer has it. */
    if (x->e_kind == TG__BLK_TOOL && !x->e_args)
        x->enc->tool_args(x, "{}", 2, out);
    x->enc->block_end(x, out);
    x->e_kind = TG__BLK_NONE;
}

void tg__x_stop(tg_xlate_t *x, int fin, tg_buf_t *out) {
    if (x->stopped || x->ended)
        return;
    tg__x_start(x, out);
    tg__x_block_end(x, out);
    if (fin == TG__FIN_NONE || (fin == TG__FIN_STOP && x->tools > 0))
        fin = x->tools > 0 ? TG__FIN_TOOL_USE : TG__FIN_STOP;
    x->fin = fin;
    x->stopped = 1;
    x->enc->stop(x, out);
}

void tg__x_end(tg_xlate_t *x, tg_buf_t *out) {
    if (x->ended)
        return;
    tg__x_stop(x, TG__FIN_NONE, out);
    x->ended = 1;
    x->enc->end(x, out);
}

void tg__x_error(tg_xlate_t *x, const char *type, const char *msg, tg_buf_t *out) {
    if (x->ended)
        return;
    x->ended = 1;
    if (!msg || !*msg)
        msg = "the upstream reported an error";
    x->enc->error(x, type && *type ? type : "api_error", msg, strlen(msg), out);
}
