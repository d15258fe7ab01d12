/*
 * OpenAI Chat Completions in the translation layer: a chat request into the neutral form
 * and back, a chat.completion body into the neutral response and back, and chat stream
 * chunks into neutral stream calls and back.
 *
 * Shapes (https://platform.openai.com/docs/api-reference/chat):
 *   request   {model, messages:[{role: system|developer|user|assistant|tool, content:
 *             string | [parts], tool_calls?, tool_call_id?}], tools:[{type:function,
 *             function:{name, description, parameters, strict}}], tool_choice, ...}
 *   response  {id, object:"chat.completion", created, model, choices:[{index, message:
 *             {role, content, tool_calls}, finish_reason}], usage}
 *   stream    data: {object:"chat.completion.chunk", choices:[{index, delta:{role, content,
 *             tool_calls:[{index, id, type, function:{name, arguments}}]},
 *             finish_reason}]} ... a usage chunk with "choices":[] ... data: [DONE]
 * Only the first choice is read: translated requests never ask for n > 1.
 */
#include "tg_translate_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- request: chat -> neutral ------------------------------------------------------- */

/* An image_url part ({"url": "...", "detail": ...} or a bare string) as a neutral block. */
static json_t *image_block(const json_t *iu, const char *where, char *err, size_t errlen) {
    const char *url = json_is_string(iu) ? json_string_value(iu) : tg__str(iu, "url");
    if (!url || !*url) {
        tg__fail(err, errlen, "%s: image_url.url must be a non-empty string", where);
        return NULL;
    }
    tg_str_t media, data;
    json_t *b;
    if (tg__data_url(url, &media, &data))
        b = json_pack("{s:s,s:s%,s:s%}", "type", "image", "media_type", media.p, media.len, "data",
                      data.p, data.len);
    else if (!strncmp(url, "data:", 5)) {
        tg__fail(err, errlen, "%s: an image data URL must be base64 (data:<type>;base64,...)", where);
        return NULL;
    } else
        b = json_pack("{s:s,s:s}", "type", "image", "url", url);
    const char *detail = tg__str(iu, "detail");
    if (detail)
        json_object_set_new(b, "detail", json_string(detail));
    return b;
}

/* A user content part as a neutral block; NULL and err set when it cannot be carried. */
static json_t *user_part(const json_t *part, const char *where, char *err, size_t errlen) {
    const char *type = tg__str(part, "type");
    if (!type) {
        tg__fail(err, errlen, "%s: a content part must be an object with a type", where);
        return NULL;
    }
    if (!strcmp(type, "text"))
        return tg__text_block(part, where, err, errlen);
    if (!strcmp(type, "image_url"))
        return image_block(json_object_get(part, "image_url"), where, err, errlen);
    if (!strcmp(type, "file")) {
        json_t *f = json_object_get(part, "file");
        const char *fd = tg__str(f, "file_data");
        tg_str_t media, data;
        if (!fd || !tg__data_url(fd, &media, &data)) {
            tg__fail(err, errlen,
                     "%s: only files given inline as file.file_data (a base64 data URL) can be "
                     "translated; file ids are specific to one provider",
                     where);
            return NULL;
        }
        json_t *b = json_pack("{s:s,s:s%,s:s%}", "type", "document", "media_type", media.p, media.len,
                              "data", data.p, data.len);
        if (tg__str(f, "filename"))
            json_object_set(b, "filename", json_object_get(f, "filename"));
        return b;
    }
    if (!strcmp(type, "input_audio")) {
        tg__fail(err, errlen, "%s: audio input cannot be translated to another provider's API", where);
        return NULL;
    }
    tg__fail(err, errlen, "%s: content part type \"%s\" cannot be translated", where, type);
    return NULL;
}

static int decode_message(const json_t *m, size_t i, tg__ir_t *ir, char *err, size_t errlen) {
    char where[96];
    const char *role = tg__str(m, "role");
    if (!role)
        return tg__fail(err, errlen, "messages[%zu].role must be a string", i);
    json_t *content = json_object_get(m, "content");
    if (!strcmp(role, "system") || !strcmp(role, "developer")) {
        json_t *text = tg__join_text(content, "\n");
        if (!text)
            return tg__fail(err, errlen, "messages[%zu].content: a %s message must be text", i, role);
        if (json_string_length(text))
            json_array_append(ir->system, text);
        json_decref(text);
        return TG_OK;
    }
    if (!strcmp(role, "user")) {
        if (json_is_string(content)) {
            tg__ir_add(ir, "user", json_pack("{s:s,s:O}", "type", "text", "text", content));
            return TG_OK;
        }
        if (!json_is_array(content))
            return tg__fail(err, errlen, "messages[%zu].content must be a string or an array", i);
        size_t j;
        json_t *part;
        json_array_foreach(content, j, part) {
            snprintf(where, sizeof(where), "messages[%zu].content[%zu]", i, j);
            json_t *b = user_part(part, where, err, errlen);
            if (!b)
                return TG_ERROR;
            tg__ir_add(ir, "user", b);
        }
        return TG_OK;
    }
    if (!strcmp(role, "assistant")) {
        if (json_object_get(m, "function_call") && !json_is_null(json_object_get(m, "function_call")))
            return tg__fail(err, errlen,
                            "messages[%zu].function_call: legacy function calls cannot be translated; "
                            "use tool_calls",
                            i);
        if (json_object_get(m, "audio") && !json_is_null(json_object_get(m, "audio")))
            return tg__fail(err, errlen,
                            "messages[%zu].audio: audio cannot be translated to another provider's API", i);
        if (json_is_string(content)) {
            tg__ir_add(ir, "assistant", json_pack("{s:s,s:O}", "type", "text", "text", content));
        } else if (json_is_array(content)) {
            size_t j;
            json_t *part;
            json_array_foreach(content, j, part) {
                const char *type = tg__str(part, "type");
                const char *text = type && !strcmp(type, "text")      ? tg__str(part, "text")
                                   : type && !strcmp(type, "refusal") ? tg__str(part, "refusal")
                                                                      : NULL;
                if (!text)
                    return tg__fail(err, errlen,
                                    "messages[%zu].content[%zu]: an assistant message may hold only "
                                    "text and refusal parts",
                                    i, j);
                tg__ir_add(ir, "assistant", json_pack("{s:s,s:s}", "type", "text", "text", text));
            }
        } else if (content && !json_is_null(content)) {
            return tg__fail(err, errlen, "messages[%zu].content must be a string, an array or null", i);
        }
        /* A refused turn holds its text in "refusal" (content null): it is what the
         * model said, and dropping it would merge the user turns around it. */
        json_t *refusal = json_object_get(m, "refusal");
        if (json_is_string(refusal) && json_string_length(refusal))
            tg__ir_add(ir, "assistant", json_pack("{s:s,s:O}", "type", "text", "text", refusal));
        json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls) && !json_is_array(calls))
            return tg__fail(err, errlen, "messages[%zu].tool_calls must be an array", i);
        size_t j;
        json_t *tc;
        json_array_foreach(calls, j, tc) {
            const char *type = tg__str(tc, "type");
            json_t *fn = json_object_get(tc, "function");
            const char *id = tg__str(tc, "id"), *name = tg__str(fn, "name");
            if (type && strcmp(type, "function"))
                return tg__fail(err, errlen,
                                "messages[%zu].tool_calls[%zu]: tool call type \"%s\" cannot be translated",
                                i, j, type);
            if (!id || !name)
                return tg__fail(err, errlen,
                                "messages[%zu].tool_calls[%zu] needs an id and a function.name", i, j);
            const char *args = tg__str(fn, "arguments");
            tg__ir_add(ir, "assistant",
                       json_pack("{s:s,s:s,s:s,s:s}", "type", "tool_use", "id", id, "name", name, "arguments",
                                 args && *args ? args : "{}"));
        }
        return TG_OK;
    }
    if (!strcmp(role, "tool")) {
        const char *id = tg__str(m, "tool_call_id");
        if (!id)
            return tg__fail(err, errlen, "messages[%zu].tool_call_id must be a string", i);
        json_t *text = content && !json_is_null(content) ? tg__join_text(content, "\n") : json_string("");
        if (!text)
            return tg__fail(err, errlen, "messages[%zu].content: a tool message must be text", i);
        tg__ir_add(ir, "user",
                   json_pack("{s:s,s:s,s:[{s:s,s:o}]}", "type", "tool_result", "tool_use_id", id, "content",
                             "type", "text", "text", text));
        return TG_OK;
    }
    if (!strcmp(role, "function"))
        return tg__fail(err, errlen,
                        "messages[%zu]: legacy function messages cannot be translated; use tool messages", i);
    return tg__fail(err, errlen, "messages[%zu].role \"%s\" is not a chat role", i, role);
}

/* The refused parameters: each would change what the client gets back. */
static int check_refused(const json_t *body, char *err, size_t errlen) {
    json_t *n = json_object_get(body, "n");
    if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1))
        return tg__fail(err, errlen, "n: only one choice (n = 1) can be translated to another provider's API");
    if (json_is_true(json_object_get(body, "logprobs")) ||
        (json_object_get(body, "top_logprobs") && !json_is_null(json_object_get(body, "top_logprobs"))))
        return tg__fail(err, errlen, "logprobs: log probabilities cannot be translated to another provider's API");
    json_t *audio = json_object_get(body, "audio");
    if (audio && !json_is_null(audio))
        return tg__fail(err, errlen, "audio: audio output cannot be translated to another provider's API");
    size_t i;
    json_t *mod;
    json_array_foreach(json_object_get(body, "modalities"), i, mod)
        if (json_is_string(mod) && strcmp(json_string_value(mod), "text"))
            return tg__fail(err, errlen, "modalities: only text output can be translated to another provider's API");
    if (json_object_get(body, "functions") || json_object_get(body, "function_call"))
        return tg__fail(err, errlen, "functions: legacy function calling cannot be translated; use tools");
    json_t *ws = json_object_get(body, "web_search_options");
    if (ws && !json_is_null(ws))
        return tg__fail(err, errlen,
                        "web_search_options: web search cannot be translated to another provider's API "
                        "(as web search tools cannot)");
    return TG_OK;
}

int tg__chat_req_decode(const json_t *body, tg__ir_t *ir, char *err, size_t errlen) {
    json_t *messages = json_object_get(body, "messages");
    if (!json_is_array(messages))
        return tg__fail(err, errlen, "messages must be an array");
    if (check_refused(body, err, errlen) != TG_OK)
        return TG_ERROR;
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (!json_is_object(m))
            return tg__fail(err, errlen, "messages[%zu] must be an object", i);
        if (decode_message(m, i, ir, err, errlen) != TG_OK)
            return TG_ERROR;
    }

    json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return tg__fail(err, errlen, "tools must be an array");
        ir->tools = json_array();
        json_t *t;
        json_array_foreach(tools, i, t) {
            const char *type = tg__str(t, "type");
            json_t *fn = json_object_get(t, "function");
            if (!type || strcmp(type, "function"))
                return tg__fail(err, errlen, "tools[%zu]: tool type \"%s\" cannot be translated; only function tools",
                                i, type ? type : "(none)");
            const char *name = tg__str(fn, "name");
            if (!name)
                return tg__fail(err, errlen, "tools[%zu].function.name must be a string", i);
            json_t *nt = json_pack("{s:s}", "name", name);
            if (tg__str(fn, "description"))
                json_object_set(nt, "description", json_object_get(fn, "description"));
            json_t *params = json_object_get(fn, "parameters");
            if (json_is_object(params))
                json_object_set(nt, "parameters", params);
            if (json_is_boolean(json_object_get(fn, "strict")))
                json_object_set(nt, "strict", json_object_get(fn, "strict"));
            json_array_append_new(ir->tools, nt);
        }
    }
    json_t *tc = json_object_get(body, "tool_choice");
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        ir->tool_choice = !strcmp(s, "none") ? TG__TC_NONE : !strcmp(s, "required") ? TG__TC_REQUIRED : TG__TC_AUTO;
    } else if (json_is_object(tc)) {
        const char *type = tg__str(tc, "type");
        const char *name = tg__str(json_object_get(tc, "function"), "name");
        if (!type || strcmp(type, "function") || !name)
            return tg__fail(err, errlen, "tool_choice: only \"auto\", \"none\", \"required\" or a named function "
                                         "can be translated");
        ir->tool_choice = TG__TC_NAMED;
        ir->tool_name = name;
    }
    json_t *par = json_object_get(body, "parallel_tool_calls");
    if (json_is_boolean(par))
        ir->parallel = json_is_true(par);

    json_t *mt = json_object_get(body, "max_completion_tokens");
    if (!json_is_integer(mt))
        mt = json_object_get(body, "max_tokens");
    if (json_is_integer(mt))
        ir->max_tokens = json_integer_value(mt);
    if (json_is_number(json_object_get(body, "temperature")))
        ir->temperature = json_object_get(body, "temperature");
    if (json_is_number(json_object_get(body, "top_p")))
        ir->top_p = json_object_get(body, "top_p");
    json_t *stop = json_object_get(body, "stop");
    if (json_is_string(stop)) {
        ir->stop = json_pack("[O]", stop);
    } else if (json_is_array(stop) && json_array_size(stop)) {
        json_t *s;
        json_array_foreach(stop, i, s)
            if (!json_is_string(s))
                return tg__fail(err, errlen, "stop must be a string or an array of strings");
        ir->stop = json_copy(stop);
    }
    ir->stream = json_is_true(json_object_get(body, "stream"));
    ir->user = tg__str(body, "user");

    json_t *rf = json_object_get(body, "response_format");
    const char *rft = tg__str(rf, "type");
    if (rft && !strcmp(rft, "json_object")) {
        ir->format = json_pack("{s:s}", "type", "json_object");
    } else if (rft && !strcmp(rft, "json_schema")) {
        json_t *js = json_object_get(rf, "json_schema");
        if (!tg__str(js, "name") || !json_is_object(json_object_get(js, "schema")))
            return tg__fail(err, errlen, "response_format.json_schema needs a name and a schema");
        ir->format = json_pack("{s:s,s:O,s:O}", "type", "json_schema", "name", json_object_get(js, "name"),
                               "schema", json_object_get(js, "schema"));
        if (json_is_boolean(json_object_get(js, "strict")))
            json_object_set(ir->format, "strict", json_object_get(js, "strict"));
        if (tg__str(js, "description"))
            json_object_set(ir->format, "description", json_object_get(js, "description"));
    } else if (rft && strcmp(rft, "text")) {
        return tg__fail(err, errlen, "response_format type \"%s\" cannot be translated", rft);
    }
    ir->effort = tg__str(body, "reasoning_effort");
    return TG_OK;
}

/* ---- request: neutral -> chat ------------------------------------------------------- */

static json_t *data_url(const json_t *b) {
    const char *media = tg__str(b, "media_type"), *data = tg__str(b, "data");
    size_t ml = strlen(media), dl = json_string_length(json_object_get(b, "data"));
    tg_buf_t u;
    tg_buf_init(&u);
    tg_buf_reserve(&u, ml + dl + 13);
    tg_buf_appends(&u, "data:");
    tg_buf_append(&u, media, ml);
    tg_buf_appends(&u, ";base64,");
    tg_buf_append(&u, data, dl);
    json_t *s = json_stringn(u.data, u.len);
    tg_buf_free(&u);
    return s;
}

/* A neutral text / image / document block as a chat user content part. */
static json_t *chat_part(const json_t *b, char *err, size_t errlen) {
    const char *type = tg__str(b, "type");
    if (!strcmp(type, "text")) {
        json_t *p = json_pack("{s:s,s:O}", "type", "text", "text", json_object_get(b, "text"));
        return p;
    }
    if (!strcmp(type, "image")) {
        json_t *url = tg__str(b, "url") ? json_incref(json_object_get(b, "url")) : data_url(b);
        json_t *iu = json_pack("{s:o}", "url", url);
        if (tg__str(b, "detail"))
            json_object_set(iu, "detail", json_object_get(b, "detail"));
        return json_pack("{s:s,s:o}", "type", "image_url", "image_url", iu);
    }
    if (!strcmp(type, "document")) {
        if (!tg__str(b, "data")) {
            tg__fail(err, errlen, "a document given by URL cannot be sent to an OpenAI chat upstream");
            return NULL;
        }
        json_t *f = json_pack("{s:o}", "file_data", data_url(b));
        if (tg__str(b, "filename"))
            json_object_set(f, "filename", json_object_get(b, "filename"));
        return json_pack("{s:s,s:o}", "type", "file", "file", f);
    }
    tg__fail(err, errlen, "a \"%s\" block cannot be sent to an OpenAI chat upstream", type);
    return NULL;
}

/* Appends a user message with `parts`, as a plain string when it is one text. */
static void push_user(json_t *messages, json_t *parts) {
    if (!json_array_size(parts))
        return;
    json_t *first = json_array_get(parts, 0);
    json_t *content = json_array_size(parts) == 1 && !strcmp(tg__str(first, "type"), "text")
                          ? json_incref(json_object_get(first, "text"))
                          : json_incref(parts);
    json_array_append_new(messages, json_pack("{s:s,s:o}", "role", "user", "content", content));
}

static int encode_user(const json_t *turn, json_t *messages, char *err, size_t errlen) {
    json_t *parts = json_array();
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(turn, "content"), i, b) {
        if (strcmp(tg__str(b, "type"), "tool_result")) {
            json_t *p = chat_part(b, err, errlen);
            if (!p)
                goto fail;
            json_array_append_new(parts, p);
            continue;
        }
        /* A tool result: its text becomes a tool message; images and documents go into the
         * user message that follows (chat tool messages carry text only). */
        tg_buf_t text;
        tg_buf_init(&text);
        /* A chat tool message has no error flag: the content says it. */
        int is_error = json_is_true(json_object_get(b, "is_error"));
        if (is_error)
            tg_buf_appends(&text, TG__TOOL_ERROR_PREFIX);
        size_t start = text.len, j;
        json_t *c;
        json_array_foreach(json_object_get(b, "content"), j, c) {
            if (!strcmp(tg__str(c, "type"), "text")) {
                if (text.len > start)
                    tg_buf_appends(&text, "\n");
                tg_buf_append(&text, tg__str(c, "text"), json_string_length(json_object_get(c, "text")));
            } else {
                json_t *p = chat_part(c, err, errlen);
                if (!p) {
                    tg_buf_free(&text);
                    goto fail;
                }
                json_array_append_new(parts, p);
            }
        }
        json_array_append_new(messages, json_pack("{s:s,s:O,s:s%}", "role", "tool", "tool_call_id",
                                                  json_object_get(b, "tool_use_id"), "content",
                                                  text.data ? text.data : "", text.len));
        tg_buf_free(&text);
    }
    push_user(messages, parts);
    json_decref(parts);
    return TG_OK;
fail:
    json_decref(parts);
    return TG_ERROR;
}

static int encode_assistant(const json_t *turn, json_t *messages, char *err, size_t errlen) {
    tg_buf_t text;
    tg_buf_init(&text);
    json_t *calls = json_array();
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(turn, "content"), i, b) {
        const char *type = tg__str(b, "type");
        if (!strcmp(type, "text")) {
            tg_buf_append(&text, tg__str(b, "text"), json_string_length(json_object_get(b, "text")));
        } else if (!strcmp(type, "tool_use")) {
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", json_object_get(b, "id"),
                                                   "type", "function", "function", "name",
                                                   json_object_get(b, "name"), "arguments",
                                                   json_object_get(b, "arguments")));
        } else {
            tg_buf_free(&text);
            json_decref(calls);
            return tg__fail(err, errlen,
                            "an assistant turn cannot carry a \"%s\" block to an OpenAI chat upstream", type);
        }
    }
    json_t *m = json_pack("{s:s}", "role", "assistant");
    /* content is null only beside tool calls, as OpenAI sends it. */
    json_t *content = text.len || !json_array_size(calls) ? json_stringn(text.data ? text.data : "", text.len)
                                                          : json_null();
    json_object_set_new(m, "content", content);
    if (json_array_size(calls))
        json_object_set(m, "tool_calls", calls);
    json_array_append_new(messages, m);
    json_decref(calls);
    tg_buf_free(&text);
    return TG_OK;
}

int tg__chat_req_encode(const tg__ir_t *ir, json_t *out, char *err, size_t errlen) {
    json_t *messages = json_array();
    json_object_set_new(out, "messages", messages);
    if (json_array_size(ir->system)) {
        json_t *sys = json_pack("{s:s,s:o}", "role", "system", "content", tg__join_text(ir->system, "\n\n"));
        json_array_append_new(messages, sys);
    }
    size_t i;
    json_t *turn;
    json_array_foreach(ir->messages, i, turn) {
        int rc = !strcmp(tg__str(turn, "role"), "user") ? encode_user(turn, messages, err, errlen)
                                                        : encode_assistant(turn, messages, err, errlen);
        if (rc != TG_OK)
            return TG_ERROR;
    }
    if (ir->tools && json_array_size(ir->tools)) {
        json_t *tools = json_array();
        json_t *t;
        json_array_foreach(ir->tools, i, t) {
            json_t *fn = json_pack("{s:O}", "name", json_object_get(t, "name"));
            if (json_object_get(t, "description"))
                json_object_set(fn, "description", json_object_get(t, "description"));
            json_t *params = json_object_get(t, "parameters");
            json_object_set_new(fn, "parameters", tg__schema(params));
            if (json_object_get(t, "strict"))
                json_object_set(fn, "strict", json_object_get(t, "strict"));
            json_array_append_new(tools, json_pack("{s:s,s:o}", "type", "function", "function", fn));
        }
        json_object_set_new(out, "tools", tools);
        if (ir->parallel >= 0)
            json_object_set_new(out, "parallel_tool_calls", json_boolean(ir->parallel));
    }
    switch (ir->tool_choice) {
    case TG__TC_AUTO: json_object_set_new(out, "tool_choice", json_string("auto")); break;
    case TG__TC_NONE: json_object_set_new(out, "tool_choice", json_string("none")); break;
    case TG__TC_REQUIRED: json_object_set_new(out, "tool_choice", json_string("required")); break;
    case TG__TC_NAMED:
        json_object_set_new(out, "tool_choice",
                            json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name", ir->tool_name));
        break;
    }
    if (ir->max_tokens >= 0)
        json_object_set_new(out, "max_completion_tokens", json_integer(ir->max_tokens));
    if (ir->temperature)
        json_object_set(out, "temperature", ir->temperature);
    if (ir->top_p)
        json_object_set(out, "top_p", ir->top_p);
    if (json_array_size(ir->stop) > 4)
        return tg__fail(err, errlen, "stop_sequences: an OpenAI chat upstream accepts at most 4 stop sequences, got %zu",
                        json_array_size(ir->stop));
    if (ir->stop)
        json_object_set(out, "stop", ir->stop);
    if (ir->user)
        json_object_set_new(out, "user", json_string(ir->user));
    if (ir->format) {
        const char *t = tg__str(ir->format, "type");
        if (!strcmp(t, "json_object")) {
            json_object_set_new(out, "response_format", json_pack("{s:s}", "type", "json_object"));
        } else {
            json_t *js = json_deep_copy(ir->format);
            json_object_del(js, "type");
            json_object_set_new(out, "response_format",
                                json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
        }
    }
    if (ir->effort)
        json_object_set_new(out, "reasoning_effort", json_string(ir->effort));
    if (ir->stream) {
        json_object_set_new(out, "stream", json_true());
        json_object_set_new(out, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    return TG_OK;
}

/* ---- response: chat <-> neutral ----------------------------------------------------- */

static const json_t *first_choice(const json_t *doc) {
    json_t *choices = json_object_get(doc, "choices");
    size_t i;
    json_t *c;
    json_array_foreach(choices, i, c) {
        json_t *idx = json_object_get(c, "index");
        if (!idx || (json_is_integer(idx) && json_integer_value(idx) == 0))
            return c;
    }
    return NULL;
}

int tg__chat_resp_decode(const json_t *doc, tg__resp_t *r) {
    if (!json_is_array(json_object_get(doc, "choices")))
        return TG_ERROR;
    r->id = tg__str(doc, "id");
    r->model = tg__str(doc, "model");
    r->created = tg__int(doc, "created");
    const json_t *c = first_choice(doc);
    json_t *msg = json_object_get(c, "message");
    json_t *text = tg__join_text(json_object_get(msg, "content"), "");
    if (text && json_string_length(text))
        json_array_append_new(r->content, json_pack("{s:s,s:O}", "type", "text", "text", text));
    json_decref(text);
    const char *refusal = tg__str(msg, "refusal");
    if (refusal && *refusal)
        json_array_append_new(r->content, json_pack("{s:s,s:s}", "type", "text", "text", refusal));
    size_t i;
    json_t *tc;
    json_array_foreach(json_object_get(msg, "tool_calls"), i, tc) {
        json_t *fn = json_object_get(tc, "function");
        const char *args = tg__str(fn, "arguments");
        json_array_append_new(r->content, json_pack("{s:s,s:s,s:s,s:s}", "type", "tool_use", "id",
                                                    tg__str(tc, "id") ? tg__str(tc, "id") : "", "name",
                                                    tg__str(fn, "name") ? tg__str(fn, "name") : "",
                                                    "arguments", args && *args ? args : "{}"));
    }
    r->fin = tg__fin_from_chat(tg__str(c, "finish_reason"));
    if (r->fin == TG__FIN_NONE)
        r->fin = TG__FIN_STOP;
    if (refusal && *refusal)
        r->fin = TG__FIN_FILTER;
    return TG_OK;
}

void tg__chat_resp_encode(const tg__resp_t *r, const char *model, tg_buf_t *out) {
    tg_buf_appends(out, "{\"id\":");
    tg__put_cstr(out, r->id ? r->id : "chatcmpl-tollgate");
    tg_buf_printf(out, ",\"object\":\"chat.completion\",\"created\":%lld,\"model\":", (long long)r->created);
    tg__put_cstr(out, model ? model : "unknown");
    tg_buf_appends(out, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    tg_buf_t text;
    tg_buf_init(&text);
    int calls = 0;
    size_t i;
    json_t *b;
    json_array_foreach(r->content, i, b) {
        if (!strcmp(tg__str(b, "type"), "text"))
            tg_buf_append(&text, tg__str(b, "text"), json_string_length(json_object_get(b, "text")));
        else
            calls++;
    }
    if (text.len || !calls)
        tg__put_str(out, text.data ? text.data : "", text.len);
    else
        tg_buf_appends(out, "null");
    tg_buf_free(&text);
    tg_buf_appends(out, ",\"refusal\":null");
    if (calls) {
        tg_buf_appends(out, ",\"tool_calls\":[");
        int k = 0;
        json_array_foreach(r->content, i, b) {
            if (strcmp(tg__str(b, "type"), "tool_use"))
                continue;
            tg_buf_appends(out, k++ ? ",{\"id\":" : "{\"id\":");
            tg__put_cstr(out, tg__str(b, "id"));
            tg_buf_appends(out, ",\"type\":\"function\",\"function\":{\"name\":");
            tg__put_cstr(out, tg__str(b, "name"));
            tg_buf_appends(out, ",\"arguments\":");
            tg__put_str(out, tg__str(b, "arguments"), json_string_length(json_object_get(b, "arguments")));
            tg_buf_appends(out, "}}");
        }
        tg_buf_appends(out, "]");
    }
    tg_buf_printf(out, "},\"logprobs\":null,\"finish_reason\":\"%s\"}]", tg__fin_chat(r->fin));
    if (r->usage.known) {
        tg_buf_appends(out, ",\"usage\":");
        tg__usage_chat(&r->usage, out);
    }
    tg_buf_appends(out, "}");
}

/* ---- stream: chat chunks -> neutral ------------------------------------------------- */

/* The Anthropic error type closest to an OpenAI error type (for the neutral error). */
static const char *error_type(const char *t) {
    if (!t)
        return "api_error";
    if (!strcmp(t, "invalid_request_error") || !strcmp(t, "authentication_error") ||
        !strcmp(t, "permission_error") || !strcmp(t, "not_found_error") || !strcmp(t, "rate_limit_error"))
        return t;
    return "api_error";
}

static void chat_tool_delta(tg_xlate_t *x, const json_t *tc, size_t pos, tg_buf_t *out) {
    json_t *jidx = json_object_get(tc, "index");
    int64_t idx = json_is_integer(jidx) ? json_integer_value(jidx) : (int64_t)pos;
    json_t *fn = json_object_get(tc, "function");
    json_t *id = json_object_get(tc, "id"), *name = json_object_get(fn, "name");
    int named = json_is_string(id) || json_is_string(name);
    if (idx != x->d_index || x->d_kind != TG__BLK_TOOL) {
        /* A new tool call. Fragments of an earlier call after a later one began (no
         * provider sends them) are dropped: the client's blocks are sequential. */
        if (!named || idx < x->d_index)
            return;
        tg__x_tool_start(x, json_string_value(id), json_string_length(id), json_string_value(name),
                         json_string_length(name), out);
        x->d_index = idx;
        x->d_kind = TG__BLK_TOOL;
    }
    json_t *args = json_object_get(fn, "arguments");
    if (json_is_string(args))
        tg__x_tool_args(x, json_string_value(args), json_string_length(args), out);
}

void tg__chat_dec(tg_xlate_t *x, const json_t *doc, tg_buf_t *out) {
    json_t *e = json_object_get(doc, "error");
    if (e && !json_is_null(e)) {
        const char *msg = json_is_string(e) ? json_string_value(e) : tg__str(e, "message");
        tg__x_error(x, error_type(tg__str(e, "type")), msg, out);
        return;
    }
    tg__x_meta(x, tg__str(doc, "id"), tg__str(doc, "model"), tg__int(doc, "created"));
    const json_t *c = first_choice(doc);
    if (!c)
        return;
    tg__x_start(x, out);
    json_t *delta = json_object_get(c, "delta");
    json_t *content = json_object_get(delta, "content");
    if (json_is_string(content))
        tg__x_text(x, json_string_value(content), json_string_length(content), out);
    json_t *refusal = json_object_get(delta, "refusal");
    if (json_is_string(refusal) && json_string_length(refusal)) {
        x->d_refusal = 1;
        tg__x_text(x, json_string_value(refusal), json_string_length(refusal), out);
    }
    json_t *calls = json_object_get(delta, "tool_calls");
    size_t i;
    json_t *tc;
    json_array_foreach(calls, i, tc) chat_tool_delta(x, tc, i, out);
    const char *fr = tg__str(c, "finish_reason");
    if (fr) {
        int fin = tg__fin_from_chat(fr);
        /* A refusal ends with "stop" at OpenAI; the non-stream decoder says the same. */
        tg__x_stop(x, x->d_refusal && fin == TG__FIN_STOP ? TG__FIN_FILTER : fin, out);
    }
}

/* ---- stream: neutral -> chat chunks ------------------------------------------------- */

static void chunk_begin(tg_xlate_t *x, tg_buf_t *out) {
    tg_buf_appends(out, "data: {\"id\":");
    tg__put_str(out, x->id.data, x->id.len);
    tg_buf_printf(out, ",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":", (long long)x->created);
    tg__put_str(out, x->model.data, x->model.len);
}

/* Opens a chunk up to the inside of "delta":{ (with the role in the first chunk). */
static void delta_begin(tg_xlate_t *x, tg_buf_t *out) {
    chunk_begin(x, out);
    tg_buf_appends(out, ",\"choices\":[{\"index\":0,\"delta\":{");
    if (!x->e_count) {
        tg_buf_appends(out, "\"role\":\"assistant\",");
        x->e_count = 1;
    }
}

static void delta_end(tg_buf_t *out, const char *finish) {
    /* Drop the comma a field list left behind. */
    if (out->len && out->data[out->len - 1] == ',')
        out->len--;
    tg_buf_appends(out, "},\"logprobs\":null,\"finish_reason\":");
    if (finish)
        tg_buf_printf(out, "\"%s\"", finish);
    else
        tg_buf_appends(out, "null");
    tg_buf_appends(out, "}]}\n\n");
}

static void chat_start(tg_xlate_t *x, tg_buf_t *out) {
    delta_begin(x, out);
    tg_buf_appends(out, "\"content\":\"\"");
    delta_end(out, NULL);
}

static void chat_text(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out) {
    x->e_kind = TG__BLK_TEXT;
    delta_begin(x, out);
    tg_buf_appends(out, "\"content\":");
    tg__put_str(out, s, n);
    delta_end(out, NULL);
}

static void chat_tool_start(tg_xlate_t *x, const char *id, size_t idn, const char *name, size_t nn, tg_buf_t *out) {
    x->e_kind = TG__BLK_TOOL;
    x->e_index = x->tools;
    delta_begin(x, out);
    tg_buf_printf(out, "\"tool_calls\":[{\"index\":%d,\"id\":", x->e_index);
    tg__put_str(out, id, idn);
    tg_buf_appends(out, ",\"type\":\"function\",\"function\":{\"name\":");
    tg__put_str(out, name, nn);
    tg_buf_appends(out, ",\"arguments\":\"\"}}]");
    delta_end(out, NULL);
}

static void chat_tool_args(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out) {
    delta_begin(x, out);
    tg_buf_printf(out, "\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", x->e_index);
    tg__put_str(out, s, n);
    tg_buf_appends(out, "}}]");
    delta_end(out, NULL);
}

static void chat_block_end(tg_xlate_t *x, tg_buf_t *out) {
    TG_UNUSED(x);
    TG_UNUSED(out);
}

static void chat_stop(tg_xlate_t *x, tg_buf_t *out) {
    delta_begin(x, out);
    delta_end(out, tg__fin_chat(x->fin));
}

static void chat_end(tg_xlate_t *x, tg_buf_t *out) {
    if (x->usage_chunk) {
        chunk_begin(x, out);
        tg_buf_appends(out, ",\"choices\":[],\"usage\":");
        tg__usage_chat(tg__x_u(x), out);
        tg_buf_appends(out, "}\n\n");
    }
    tg_buf_appends(out, "data: [DONE]\n\n");
}

static void chat_error(tg_xlate_t *x, const char *type, const char *msg, size_t n, tg_buf_t *out) {
    TG_UNUSED(x);
    const char *otype = !strcmp(type, "api_error") || !strcmp(type, "overloaded_error") ? "server_error" : type;
    const char *code = !strcmp(type, "overloaded_error")   ? "overloaded"
                       : !strcmp(type, "rate_limit_error") ? "rate_limit_exceeded"
                                                           : "upstream_error";
    tg_buf_appends(out, "data: {\"error\":{\"message\":");
    tg__put_str(out, msg, n);
    tg_buf_appends(out, ",\"type\":");
    tg__put_cstr(out, otype);
    tg_buf_printf(out, ",\"param\":null,\"code\":\"%s\"}}\n\n", code);
}

const tg__enc_t tg__chat_enc = {chat_start, chat_text, chat_tool_start, chat_tool_args,
                                chat_block_end, chat_stop, chat_end, chat_error};
