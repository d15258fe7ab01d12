/*
 * Anthropic Messages in the translation layer: a Messages request into the neutral form
 * and back, a message body into the neutral response and back, and the Messages stream
 * events into neutral stream calls and back.
 *
 * Shapes (https://docs.anthropic.com/en/api/messages):
 *   request   {model, max_tokens, system: string | [text blocks], messages:[{role: user |
 *             assistant, content: string | [text | image | document | tool_use |
 *             tool_result | thinking blocks]}], tools:[{name, description, input_schema}],
 *             tool_choice:{type: auto|any|tool|none, name, disable_parallel_tool_use},
 *             stop_sequences, temperature, top_p, top_k, metadata:{user_id}, stream}
 *   response  {id, type:"message", role, model, content:[blocks], stop_reason,
 *             stop_sequence, usage:{input_tokens, output_tokens, cache_*}}
 *   stream    message_start, then per block content_block_start / content_block_delta
 *             (text_delta, input_json_delta, ...) / content_block_stop, then
 *             message_delta (stop_reason, usage), message_stop; ping and error anywhere.
 * The Messages API wants the turns to alternate and all tool results of an assistant
 * turn first in the next user turn; the encoder merges and orders the turns so.
 */
#include "tg_translate_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- request: Anthropic -> neutral -------------------------------------------------- */

/* An image or document block's source as a neutral block (a text document as text). */
static json_t *source_block(const json_t *blk, const char *kind, const char *where, char *err, size_t errlen) {
    json_t *src = json_object_get(blk, "source");
    const char *st = tg__str(src, "type");
    json_t *b = NULL;
    if (st && !strcmp(st, "base64") && tg__str(src, "media_type") && tg__str(src, "data"))
        b = json_pack("{s:s,s:O,s:O}", "type", kind, "media_type", json_object_get(src, "media_type"), "data",
                      json_object_get(src, "data"));
    else if (st && !strcmp(st, "url") && tg__str(src, "url"))
        b = json_pack("{s:s,s:O}", "type", kind, "url", json_object_get(src, "url"));
    else if (st && !strcmp(st, "text") && !strcmp(kind, "document") && tg__str(src, "data"))
        return json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(src, "data"));
    if (!b) {
        tg__fail(err, errlen, "%s: %s source type \"%s\" cannot be translated; use base64 or url", where, kind,
                 st ? st : "(none)");
        return NULL;
    }
    if (!strcmp(kind, "document") && tg__str(blk, "title"))
        json_object_set(b, "filename", json_object_get(blk, "title"));
    return b;
}

static json_t *result_block(const json_t *blk, const char *where, char *err, size_t errlen) {
    const char *id = tg__str(blk, "tool_use_id");
    if (!id) {
        tg__fail(err, errlen, "%s: tool_result.tool_use_id must be a string", where);
        return NULL;
    }
    json_t *content = json_array();
    json_t *c = json_object_get(blk, "content");
    if (json_is_string(c)) {
        json_array_append_new(content, json_pack("{s:s,s:O}", "type", "text", "text", c));
    } else if (json_is_array(c)) {
        size_t i;
        json_t *p;
        json_array_foreach(c, i, p) {
            const char *type = tg__str(p, "type");
            json_t *nb = NULL;
            if (type && !strcmp(type, "text"))
                nb = tg__text_block(p, where, err, errlen);
            else if (type && (!strcmp(type, "image") || !strcmp(type, "document")))
                nb = source_block(p, type, where, err, errlen);
            else
                tg__fail(err, errlen, "%s: a tool_result may hold only text, image and document blocks", where);
            if (!nb) {
                json_decref(content);
                return NULL;
            }
            json_array_append_new(content, nb);
        }
    } else if (c && !json_is_null(c)) {
        json_decref(content);
        tg__fail(err, errlen, "%s: tool_result.content must be a string or an array", where);
        return NULL;
    }
    json_t *b = json_pack("{s:s,s:s,s:o}", "type", "tool_result", "tool_use_id", id, "content", content);
    if (json_is_true(json_object_get(blk, "is_error")))
        json_object_set_new(b, "is_error", json_true());
    return b;
}

static int decode_block(const json_t *blk, const char *role, const char *where, tg__ir_t *ir, char *err,
                        size_t errlen) {
    const char *type = tg__str(blk, "type");
    if (!type)
        return tg__fail(err, errlen, "%s: a content block must be an object with a type", where);
    json_t *b = NULL;
    if (!strcmp(type, "text")) {
        b = tg__text_block(blk, where, err, errlen);
    } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
        b = source_block(blk, type, where, err, errlen);
    } else if (!strcmp(type, "tool_use")) {
        const char *id = tg__str(blk, "id"), *name = tg__str(blk, "name");
        if (!id || !name)
            return tg__fail(err, errlen, "%s: tool_use needs an id and a name", where);
        json_t *input = json_object_get(blk, "input");
        char *args = json_is_object(input) ? tg_json_dumps(input, JSON_COMPACT) : NULL;
        b = json_pack("{s:s,s:s,s:s,s:s}", "type", "tool_use", "id", id, "name", name, "arguments",
                      args ? args : "{}");
        free(args);
    } else if (!strcmp(type, "tool_result")) {
        b = result_block(blk, where, err, errlen);
    } else if (!strcmp(type, "thinking") || !strcmp(type, "redacted_thinking")) {
        return TG_OK; /* signed for the provider that made it; dropped */
    } else {
        return tg__fail(err, errlen, "%s: content block type \"%s\" cannot be translated", where, type);
    }
    if (!b)
        return TG_ERROR;
    tg__ir_add(ir, role, b);
    return TG_OK;
}

int tg__anthropic_req_decode(const json_t *body, tg__ir_t *ir, char *err, size_t errlen) {
    json_t *messages = json_object_get(body, "messages");
    if (!json_is_array(messages))
        return tg__fail(err, errlen, "messages must be an array");
    char where[96];
    size_t i, j;
    json_t *system = json_object_get(body, "system"), *v;
    if (json_is_string(system)) {
        if (json_string_length(system))
            json_array_append(ir->system, system);
    } else if (json_is_array(system)) {
        json_array_foreach(system, i, v) {
            const char *t = tg__str(v, "text");
            if (!t || strcmp(tg__str(v, "type") ? tg__str(v, "type") : "", "text"))
                return tg__fail(err, errlen, "system[%zu]: the system prompt may hold only text blocks", i);
            if (*t)
                json_array_append(ir->system, json_object_get(v, "text"));
        }
    } else if (system && !json_is_null(system)) {
        return tg__fail(err, errlen, "system must be a string or an array of text blocks");
    }
    json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = tg__str(m, "role");
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
            return tg__fail(err, errlen, "messages[%zu].role must be \"user\" or \"assistant\"", i);
        json_t *content = json_object_get(m, "content");
        if (json_is_string(content)) {
            tg__ir_add(ir, role, json_pack("{s:s,s:O}", "type", "text", "text", content));
            continue;
        }
        if (!json_is_array(content))
            return tg__fail(err, errlen, "messages[%zu].content must be a string or an array", i);
        json_array_foreach(content, j, v) {
            snprintf(where, sizeof(where), "messages[%zu].content[%zu]", i, j);
            if (decode_block(v, role, where, ir, err, errlen) != TG_OK)
                return TG_ERROR;
        }
    }
    json_t *servers = json_object_get(body, "mcp_servers");
    if (json_array_size(servers))
        return tg__fail(err, errlen, "mcp_servers: MCP connectors cannot be translated to another provider's API");

    json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return tg__fail(err, errlen, "tools must be an array");
        ir->tools = json_array();
        json_array_foreach(tools, i, v) {
            const char *type = tg__str(v, "type"), *name = tg__str(v, "name");
            if (type && strcmp(type, "custom"))
                return tg__fail(err, errlen, "tools[%zu]: server tool \"%s\" cannot be translated; only custom tools",
                                i, type);
            if (!name)
                return tg__fail(err, errlen, "tools[%zu].name must be a string", i);
            json_t *nt = json_pack("{s:s}", "name", name);
            if (tg__str(v, "description"))
                json_object_set(nt, "description", json_object_get(v, "description"));
            if (json_is_object(json_object_get(v, "input_schema")))
                json_object_set(nt, "parameters", json_object_get(v, "input_schema"));
            json_array_append_new(ir->tools, nt);
        }
    }
    json_t *tc = json_object_get(body, "tool_choice");
    const char *tct = tg__str(tc, "type");
    if (tct) {
        if (!strcmp(tct, "auto"))
            ir->tool_choice = TG__TC_AUTO;
        else if (!strcmp(tct, "any"))
            ir->tool_choice = TG__TC_REQUIRED;
        else if (!strcmp(tct, "none"))
            ir->tool_choice = TG__TC_NONE;
        else if (!strcmp(tct, "tool") && tg__str(tc, "name")) {
            ir->tool_choice = TG__TC_NAMED;
            ir->tool_name = tg__str(tc, "name");
        } else
            return tg__fail(err, errlen, "tool_choice type \"%s\" cannot be translated", tct);
        if (json_is_boolean(json_object_get(tc, "disable_parallel_tool_use")))
            ir->parallel = !json_is_true(json_object_get(tc, "disable_parallel_tool_use"));
    }
    json_t *mt = json_object_get(body, "max_tokens");
    if (json_is_integer(mt))
        ir->max_tokens = json_integer_value(mt);
    if (json_is_number(json_object_get(body, "temperature")))
        ir->temperature = json_object_get(body, "temperature");
    if (json_is_number(json_object_get(body, "top_p")))
        ir->top_p = json_object_get(body, "top_p");
    json_t *stop = json_object_get(body, "stop_sequences");
    if (json_array_size(stop)) {
        json_array_foreach(stop, i, v)
            if (!json_is_string(v))
                return tg__fail(err, errlen, "stop_sequences must be an array of strings");
        ir->stop = json_copy(stop);
    }
    ir->stream = json_is_true(json_object_get(body, "stream"));
    ir->user = tg__str(json_object_get(body, "metadata"), "user_id");
    return TG_OK;
}

/* ---- request: neutral -> Anthropic -------------------------------------------------- */

/* A tool-call id as Anthropic accepts it: [A-Za-z0-9_-]+. */
static json_t *safe_id(const char *id) {
    size_t n = strlen(id);
    char *s = malloc(n + 2);
    if (!s)
        abort();
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        s[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'
                   ? c
                   : '_';
    }
    if (!n)
        s[n++] = '_';
    json_t *v = json_stringn(s, n);
    free(s);
    return v;
}

static json_t *anthropic_source(const json_t *b) {
    if (tg__str(b, "url"))
        return json_pack("{s:s,s:O}", "type", "url", "url", json_object_get(b, "url"));
    return json_pack("{s:s,s:O,s:O}", "type", "base64", "media_type", json_object_get(b, "media_type"), "data",
                     json_object_get(b, "data"));
}

/* A neutral block as an Anthropic block; NULL (and no error) for an empty text. */
static json_t *anthropic_block(const json_t *b, int *failed, char *err, size_t errlen) {
    const char *type = tg__str(b, "type");
    json_t *out = NULL;
    if (!strcmp(type, "text")) {
        if (!json_string_length(json_object_get(b, "text")))
            return NULL; /* Anthropic refuses empty text blocks */
        out = json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(b, "text"));
    } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
        out = json_pack("{s:s,s:o}", "type", type, "source", anthropic_source(b));
        if (!strcmp(type, "document") && tg__str(b, "filename"))
            json_object_set(out, "title", json_object_get(b, "filename"));
    } else if (!strcmp(type, "tool_use")) {
        json_error_t jerr;
        const char *args = tg__str(b, "arguments");
        json_t *input = tg_json_loadb(args, json_string_length(json_object_get(b, "arguments")), 0, &jerr);
        if (!json_is_object(input)) {
            json_decref(input);
            *failed = 1;
            tg__fail(err, errlen, "the arguments of tool call \"%s\" are not a JSON object", tg__str(b, "id"));
            return NULL;
        }
        out = json_pack("{s:s,s:o,s:O,s:o}", "type", "tool_use", "id", safe_id(tg__str(b, "id")), "name",
                        json_object_get(b, "name"), "input", input);
    } else if (!strcmp(type, "tool_result")) {
        json_t *content = json_array();
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(b, "content"), i, c) {
            json_t *nb = anthropic_block(c, failed, err, errlen);
            if (nb)
                json_array_append_new(content, nb);
        }
        out = json_pack("{s:s,s:o}", "type", "tool_result", "tool_use_id", safe_id(tg__str(b, "tool_use_id")));
        json_t *first = json_array_get(content, 0);
        if (json_array_size(content) == 1 && !strcmp(tg__str(first, "type"), "text"))
            json_object_set(out, "content", json_object_get(first, "text"));
        else if (json_array_size(content))
            json_object_set(out, "content", content);
        json_decref(content);
        if (json_is_true(json_object_get(b, "is_error")))
            json_object_set_new(out, "is_error", json_true());
    }
    json_t *cc = json_object_get(b, "cache_control");
    if (out && cc)
        json_object_set(out, "cache_control", cc);
    return out;
}

/* Moves the tool_result blocks of a user turn to the front, keeping their order. */
static void results_first(json_t *content) {
    json_t *sorted = json_array();
    size_t i;
    json_t *b;
    for (int pass = 0; pass < 2; pass++)
        json_array_foreach(content, i, b)
            if ((strcmp(tg__str(b, "type"), "tool_result") == 0) == (pass == 0))
                json_array_append(sorted, b);
    json_array_clear(content);
    json_array_extend(content, sorted);
    json_decref(sorted);
}

int tg__anthropic_req_encode(const tg__ir_t *ir, json_t *out, char *err, size_t errlen) {
    if (ir->format)
        return tg__fail(err, errlen, "response_format: JSON output formats cannot be sent to an Anthropic upstream");
    json_object_set_new(out, "max_tokens",
                        json_integer(ir->max_tokens >= 0 ? ir->max_tokens : TG_TRANSLATE_DEFAULT_MAX_TOKENS));
    if (json_array_size(ir->system))
        json_object_set_new(out, "system", tg__join_text(ir->system, "\n\n"));
    json_t *messages = json_array();
    json_object_set_new(out, "messages", messages);
    size_t i, j;
    json_t *turn, *b;
    json_t *last = NULL;
    int failed = 0;
    json_array_foreach(ir->messages, i, turn) {
        const char *role = tg__str(turn, "role");
        json_t *content = json_array();
        json_array_foreach(json_object_get(turn, "content"), j, b) {
            json_t *nb = anthropic_block(b, &failed, err, errlen);
            if (failed) {
                json_decref(content);
                return TG_ERROR;
            }
            if (nb)
                json_array_append_new(content, nb);
        }
        if (!json_array_size(content)) {
            json_decref(content);
            continue;
        }
        if (last && !strcmp(tg__str(last, "role"), role)) {
            json_array_extend(json_object_get(last, "content"), content);
            json_decref(content);
        } else {
            last = json_pack("{s:s,s:o}", "role", role, "content", content);
            json_array_append_new(messages, last);
        }
    }
    json_array_foreach(messages, i, turn)
        if (!strcmp(tg__str(turn, "role"), "user"))
            results_first(json_object_get(turn, "content"));

    if (ir->tools && json_array_size(ir->tools)) {
        json_t *tools = json_array();
        json_t *t;
        json_array_foreach(ir->tools, i, t) {
            json_t *nt = json_pack("{s:O}", "name", json_object_get(t, "name"));
            if (json_object_get(t, "description"))
                json_object_set(nt, "description", json_object_get(t, "description"));
            json_t *params = json_object_get(t, "parameters");
            json_object_set_new(nt, "input_schema", tg__schema(params));
            json_array_append_new(tools, nt);
        }
        json_object_set_new(out, "tools", tools);
    }
    json_t *tc = NULL;
    switch (ir->tool_choice) {
    case TG__TC_AUTO: tc = json_pack("{s:s}", "type", "auto"); break;
    case TG__TC_NONE: tc = json_pack("{s:s}", "type", "none"); break;
    case TG__TC_REQUIRED: tc = json_pack("{s:s}", "type", "any"); break;
    case TG__TC_NAMED: tc = json_pack("{s:s,s:s}", "type", "tool", "name", ir->tool_name); break;
    }
    if (ir->parallel == 0 && json_object_get(out, "tools")) {
        if (!tc)
            tc = json_pack("{s:s}", "type", "auto");
        if (ir->tool_choice != TG__TC_NONE)
            json_object_set_new(tc, "disable_parallel_tool_use", json_true());
    }
    if (tc)
        json_object_set_new(out, "tool_choice", tc);
    if (ir->temperature) {
        /* OpenAI's range is 0..2, Anthropic's 0..1. */
        double t = json_number_value(ir->temperature);
        json_object_set_new(out, "temperature", t > 1.0 ? json_real(1.0) : json_incref(ir->temperature));
    }
    if (ir->top_p)
        json_object_set(out, "top_p", ir->top_p);
    if (ir->stop)
        json_object_set(out, "stop_sequences", ir->stop);
    if (ir->user)
        json_object_set_new(out, "metadata", json_pack("{s:s}", "user_id", ir->user));
    if (ir->stream)
        json_object_set_new(out, "stream", json_true());
    return TG_OK;
}

/* ---- response: Anthropic <-> neutral ------------------------------------------------ */

int tg__anthropic_resp_decode(const json_t *doc, tg__resp_t *r) {
    json_t *content = json_object_get(doc, "content");
    if (!json_is_array(content))
        return TG_ERROR;
    r->id = tg__str(doc, "id");
    r->model = tg__str(doc, "model");
    size_t i;
    json_t *b;
    json_array_foreach(content, i, b) {
        const char *type = tg__str(b, "type");
        if (type && !strcmp(type, "text") && json_string_length(json_object_get(b, "text"))) {
            json_array_append_new(r->content,
                                  json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(b, "text")));
        } else if (type && !strcmp(type, "tool_use")) {
            json_t *input = json_object_get(b, "input");
            char *args = input ? tg_json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            json_array_append_new(r->content,
                                  json_pack("{s:s,s:s,s:s,s:s}", "type", "tool_use", "id",
                                            tg__str(b, "id") ? tg__str(b, "id") : "", "name",
                                            tg__str(b, "name") ? tg__str(b, "name") : "", "arguments",
                                            args ? args : "{}"));
            free(args);
        }
    }
    r->fin = tg__fin_from_anthropic(tg__str(doc, "stop_reason"));
    if (r->fin == TG__FIN_NONE)
        r->fin = TG__FIN_STOP;
    return TG_OK;
}

void tg__anthropic_resp_encode(const tg__resp_t *r, const char *model, tg_buf_t *out) {
    tg_buf_appends(out, "{\"id\":");
    tg__put_cstr(out, r->id ? r->id : "msg_tollgate");
    tg_buf_appends(out, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    tg__put_cstr(out, model ? model : "unknown");
    tg_buf_appends(out, ",\"content\":[");
    size_t i;
    json_t *b;
    json_array_foreach(r->content, i, b) {
        if (i)
            tg_buf_appends(out, ",");
        if (!strcmp(tg__str(b, "type"), "text")) {
            tg_buf_appends(out, "{\"type\":\"text\",\"text\":");
            tg__put_str(out, tg__str(b, "text"), json_string_length(json_object_get(b, "text")));
            tg_buf_appends(out, "}");
            continue;
        }
        /* The arguments' own bytes when they are a JSON object (numbers stay as the
         * model wrote them); a cut answer's arguments become {}. */
        json_error_t jerr;
        const char *args = tg__str(b, "arguments");
        size_t alen = json_string_length(json_object_get(b, "arguments"));
        json_t *input = tg_json_loadb(args, alen, 0, &jerr);
        int ok = json_is_object(input);
        json_decref(input);
        tg_buf_appends(out, "{\"type\":\"tool_use\",\"id\":");
        tg__put_cstr(out, tg__str(b, "id"));
        tg_buf_appends(out, ",\"name\":");
        tg__put_cstr(out, tg__str(b, "name"));
        tg_buf_appends(out, ",\"input\":");
        if (ok)
            tg_buf_append(out, args, alen);
        else
            tg_buf_appends(out, "{}");
        tg_buf_appends(out, "}");
    }
    tg_buf_printf(out, "],\"stop_reason\":\"%s\",\"stop_sequence\":null,\"usage\":", tg__fin_anthropic(r->fin));
    tg__usage_anthropic(&r->usage, out);
    tg_buf_appends(out, "}");
}

/* ---- stream: Anthropic events -> neutral -------------------------------------------- */

void tg__anthropic_dec(tg_xlate_t *x, const json_t *doc, tg_buf_t *out) {
    const char *type = tg__str(doc, "type");
    if (!type)
        return;
    json_t *jidx = json_object_get(doc, "index");
    int64_t index = json_is_integer(jidx) ? json_integer_value(jidx) : -1;
    if (!strcmp(type, "content_block_delta")) {
        if (index != x->d_index)
            return;
        json_t *d = json_object_get(doc, "delta");
        const char *dt = tg__str(d, "type");
        if (!dt)
            return;
        json_t *v;
        if (x->d_kind == TG__BLK_TEXT && !strcmp(dt, "text_delta") && json_is_string(v = json_object_get(d, "text")))
            tg__x_text(x, json_string_value(v), json_string_length(v), out);
        else if (x->d_kind == TG__BLK_TOOL && !strcmp(dt, "input_json_delta") &&
                 json_is_string(v = json_object_get(d, "partial_json")))
            tg__x_tool_args(x, json_string_value(v), json_string_length(v), out);
    } else if (!strcmp(type, "content_block_start")) {
        json_t *cb = json_object_get(doc, "content_block");
        const char *bt = tg__str(cb, "type");
        x->d_index = index;
        x->d_kind = TG__BLK_SKIP; /* thinking, server tools: not carried */
        if (bt && !strcmp(bt, "text")) {
            x->d_kind = TG__BLK_TEXT;
            json_t *t = json_object_get(cb, "text");
            tg__x_start(x, out);
            if (json_is_string(t))
                tg__x_text(x, json_string_value(t), json_string_length(t), out);
        } else if (bt && !strcmp(bt, "tool_use")) {
            x->d_kind = TG__BLK_TOOL;
            json_t *id = json_object_get(cb, "id"), *name = json_object_get(cb, "name");
            tg__x_tool_start(x, json_string_value(id), json_string_length(id), json_string_value(name),
                             json_string_length(name), out);
            json_t *input = json_object_get(cb, "input");
            if (json_object_size(input)) {
                char *s = tg_json_dumps(input, JSON_COMPACT);
                if (s)
                    tg__x_tool_args(x, s, strlen(s), out);
                free(s);
            }
        }
    } else if (!strcmp(type, "content_block_stop")) {
        if (index == x->d_index && (x->d_kind == TG__BLK_TEXT || x->d_kind == TG__BLK_TOOL))
            tg__x_block_end(x, out);
        x->d_kind = TG__BLK_NONE;
    } else if (!strcmp(type, "message_start")) {
        json_t *m = json_object_get(doc, "message");
        tg__x_meta(x, tg__str(m, "id"), tg__str(m, "model"), 0);
        tg__x_start(x, out);
    } else if (!strcmp(type, "message_delta")) {
        const char *sr = tg__str(json_object_get(doc, "delta"), "stop_reason");
        if (sr)
            tg__x_stop(x, tg__fin_from_anthropic(sr), out);
    } else if (!strcmp(type, "message_stop")) {
        tg__x_end(x, out);
    } else if (!strcmp(type, "error")) {
        json_t *e = json_object_get(doc, "error");
        const char *msg = tg__str(e, "message");
        tg__x_error(x, tg__str(e, "type"), msg, out);
    }
}

/* ---- stream: neutral -> Anthropic events -------------------------------------------- */

static void an_start(tg_xlate_t *x, tg_buf_t *out) {
    tg__sse_begin(out, "message_start");
    tg_buf_appends(out, "{\"type\":\"message_start\",\"message\":{\"id\":");
    tg__put_str(out, x->id.data, x->id.len);
    tg_buf_appends(out, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    tg__put_str(out, x->model.data, x->model.len);
    tg_buf_appends(out, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":");
    tg__usage_anthropic(tg__x_u(x), out);
    tg_buf_appends(out, "}}\n\n");
}

static void an_open(tg_xlate_t *x, int kind, tg_buf_t *out) {
    x->e_kind = kind;
    x->e_index = x->e_count++;
    tg__sse_begin(out, "content_block_start");
    tg_buf_printf(out, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":", x->e_index);
}

static void an_text(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out) {
    if (x->e_kind != TG__BLK_TEXT) {
        an_open(x, TG__BLK_TEXT, out);
        tg_buf_appends(out, "{\"type\":\"text\",\"text\":\"\"}}\n\n");
    }
    tg__sse_begin(out, "content_block_delta");
    tg_buf_printf(out, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"text_delta\",\"text\":",
                  x->e_index);
    tg__put_str(out, s, n);
    tg_buf_appends(out, "}}\n\n");
}

static void an_tool_start(tg_xlate_t *x, const char *id, size_t idn, const char *name, size_t nn, tg_buf_t *out) {
    an_open(x, TG__BLK_TOOL, out);
    tg_buf_appends(out, "{\"type\":\"tool_use\",\"id\":");
    tg__put_str(out, id, idn);
    tg_buf_appends(out, ",\"name\":");
    tg__put_str(out, name, nn);
    tg_buf_appends(out, ",\"input\":{}}}\n\n");
}

static void an_tool_args(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out) {
    tg__sse_begin(out, "content_block_delta");
    tg_buf_printf(out,
                  "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"input_json_delta\","
                  "\"partial_json\":",
                  x->e_index);
    tg__put_str(out, s, n);
    tg_buf_appends(out, "}}\n\n");
}

static void an_block_end(tg_xlate_t *x, tg_buf_t *out) {
    tg__sse_begin(out, "content_block_stop");
    tg_buf_printf(out, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", x->e_index);
}

static void an_stop(tg_xlate_t *x, tg_buf_t *out) {
    /* message_delta waits for end: an OpenAI upstream sends its usage after the stop. */
    TG_UNUSED(x);
    TG_UNUSED(out);
}

static void an_end(tg_xlate_t *x, tg_buf_t *out) {
    tg__sse_begin(out, "message_delta");
    tg_buf_printf(out,
                  "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":null},"
                  "\"usage\":",
                  tg__fin_anthropic(x->fin));
    tg__usage_anthropic(tg__x_u(x), out);
    tg_buf_appends(out, "}\n\n");
    tg__sse_begin(out, "message_stop");
    tg_buf_appends(out, "{\"type\":\"message_stop\"}\n\n");
}

static void an_error(tg_xlate_t *x, const char *type, const char *msg, size_t n, tg_buf_t *out) {
    TG_UNUSED(x);
    tg__sse_begin(out, "error");
    tg_buf_appends(out, "{\"type\":\"error\",\"error\":{\"type\":");
    tg__put_cstr(out, type);
    tg_buf_appends(out, ",\"message\":");
    tg__put_str(out, msg, n);
    tg_buf_appends(out, "}}\n\n");
}

const tg__enc_t tg__anthropic_enc = {an_start, an_text, an_tool_start, an_tool_args,
                                     an_block_end, an_stop, an_end, an_error};
