/*
 * OpenAI Responses in the translation layer: a Responses request into the neutral form
 * and back, a response object into the neutral response and back, and the Responses
 * stream events into neutral stream calls and back.
 *
 * Shapes (https://platform.openai.com/docs/api-reference/responses):
 *   request   {model, instructions, input: string | [items], tools:[{type:function, name,
 *             description, parameters, strict}], tool_choice, max_output_tokens, text:
 *             {format}, reasoning:{effort}, previous_response_id, store, stream, ...}
 *             items: {type:message, role, content: string | [input_text | input_image |
 *             input_file | output_text | refusal]}, {type:function_call, call_id, name,
 *             arguments}, {type:function_call_output, call_id, output}, {type:reasoning}
 *   response  {id, object:"response", created_at, status: completed | incomplete |
 *             failed, incomplete_details:{reason}, model, output:[items], usage}
 *   stream    response.created, response.in_progress, per item
 *             response.output_item.added, (response.content_part.added,
 *             response.output_text.delta..., response.output_text.done,
 *             response.content_part.done | response.function_call_arguments.delta...,
 *             response.function_call_arguments.done), response.output_item.done, then
 *             response.completed | response.incomplete | response.failed; error.
 * previous_response_id refers to conversation state stored at OpenAI: it cannot be
 * translated, and a translated request asks a Responses upstream not to store (store:
 * false), since its client could not refer to that state anyway.
 */
#include "tg_translate_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- request: Responses -> neutral -------------------------------------------------- */

static json_t *image_part(const json_t *p, const char *where, char *err, size_t errlen) {
    const char *url = tg__str(p, "image_url");
    if (!url) {
        tg__fail(err, errlen, "%s: only images given by image_url can be translated; file ids are specific to "
                              "one provider", where);
        return NULL;
    }
    tg_str_t media, data;
    json_t *b = tg__data_url(url, &media, &data)
                    ? json_pack("{s:s,s:s%,s:s%}", "type", "image", "media_type", media.p, media.len, "data",
                                data.p, data.len)
                    : json_pack("{s:s,s:s}", "type", "image", "url", url);
    if (tg__str(p, "detail"))
        json_object_set(b, "detail", json_object_get(p, "detail"));
    return b;
}

static json_t *file_part(const json_t *p, const char *where, char *err, size_t errlen) {
    const char *fd = tg__str(p, "file_data"), *fu = tg__str(p, "file_url");
    tg_str_t media, data;
    json_t *b = NULL;
    if (fd && tg__data_url(fd, &media, &data))
        b = json_pack("{s:s,s:s%,s:s%}", "type", "document", "media_type", media.p, media.len, "data", data.p,
                      data.len);
    else if (fu)
        b = json_pack("{s:s,s:s}", "type", "document", "url", fu);
    if (!b) {
        tg__fail(err, errlen, "%s: only files given as file_data (a base64 data URL) or file_url can be "
                              "translated", where);
        return NULL;
    }
    if (tg__str(p, "filename"))
        json_object_set(b, "filename", json_object_get(p, "filename"));
    return b;
}

/* A content part of an input message or a function_call_output as a neutral block. */
static json_t *content_part(const json_t *p, const char *where, char *err, size_t errlen) {
    const char *type = tg__str(p, "type");
    if (!type) {
        tg__fail(err, errlen, "%s: a content part must be an object with a type", where);
        return NULL;
    }
    if (!strcmp(type, "input_text") || !strcmp(type, "output_text") || !strcmp(type, "text") ||
        !strcmp(type, "refusal")) {
        json_t *t = json_object_get(p, !strcmp(type, "refusal") ? "refusal" : "text");
        if (!json_is_string(t)) {
            tg__fail(err, errlen, "%s: text must be a string", where);
            return NULL;
        }
        return json_pack("{s:s,s:O}", "type", "text", "text", t);
    }
    if (!strcmp(type, "input_image"))
        return image_part(p, where, err, errlen);
    if (!strcmp(type, "input_file"))
        return file_part(p, where, err, errlen);
    if (!strcmp(type, "input_audio")) {
        tg__fail(err, errlen, "%s: audio input cannot be translated to another provider's API", where);
        return NULL;
    }
    tg__fail(err, errlen, "%s: content part type \"%s\" cannot be translated", where, type);
    return NULL;
}

static int decode_item(const json_t *it, size_t i, tg__ir_t *ir, char *err, size_t errlen) {
    char where[96];
    const char *type = tg__str(it, "type");
    const char *role = tg__str(it, "role");
    if (!type && role)
        type = "message";
    if (!type)
        return tg__fail(err, errlen, "input[%zu] must be an object with a type or a role", i);
    if (!strcmp(type, "message")) {
        if (!role)
            return tg__fail(err, errlen, "input[%zu].role must be a string", i);
        json_t *content = json_object_get(it, "content");
        if (!strcmp(role, "system") || !strcmp(role, "developer")) {
            json_t *text = tg__join_text(content, "\n");
            if (!text)
                return tg__fail(err, errlen, "input[%zu].content: a %s message must be text", i, role);
            if (json_string_length(text))
                json_array_append(ir->system, text);
            json_decref(text);
            return TG_OK;
        }
        if (strcmp(role, "user") && strcmp(role, "assistant"))
            return tg__fail(err, errlen, "input[%zu].role \"%s\" is not a message role", i, role);
        if (json_is_string(content)) {
            tg__ir_add(ir, role, json_pack("{s:s,s:O}", "type", "text", "text", content));
            return TG_OK;
        }
        if (!json_is_array(content))
            return tg__fail(err, errlen, "input[%zu].content must be a string or an array", i);
        size_t j;
        json_t *p;
        json_array_foreach(content, j, p) {
            snprintf(where, sizeof(where), "input[%zu].content[%zu]", i, j);
            json_t *b = content_part(p, where, err, errlen);
            if (!b)
                return TG_ERROR;
            if (!strcmp(role, "assistant") && strcmp(tg__str(b, "type"), "text")) {
                json_decref(b);
                return tg__fail(err, errlen, "%s: an assistant message may hold only text", where);
            }
            tg__ir_add(ir, role, b);
        }
        return TG_OK;
    }
    if (!strcmp(type, "function_call")) {
        const char *id = tg__str(it, "call_id"), *name = tg__str(it, "name"), *args = tg__str(it, "arguments");
        if (!id || !name)
            return tg__fail(err, errlen, "input[%zu]: a function_call needs a call_id and a name", i);
        tg__ir_add(ir, "assistant", json_pack("{s:s,s:s,s:s,s:s}", "type", "tool_use", "id", id, "name", name,
                                              "arguments", args && *args ? args : "{}"));
        return TG_OK;
    }
    if (!strcmp(type, "function_call_output")) {
        const char *id = tg__str(it, "call_id");
        if (!id)
            return tg__fail(err, errlen, "input[%zu]: a function_call_output needs a call_id", i);
        json_t *output = json_object_get(it, "output"), *content = json_array();
        if (json_is_string(output)) {
            json_array_append_new(content, json_pack("{s:s,s:O}", "type", "text", "text", output));
        } else if (json_is_array(output)) {
            size_t j;
            json_t *p;
            json_array_foreach(output, j, p) {
                snprintf(where, sizeof(where), "input[%zu].output[%zu]", i, j);
                json_t *b = content_part(p, where, err, errlen);
                if (!b) {
                    json_decref(content);
                    return TG_ERROR;
                }
                json_array_append_new(content, b);
            }
        } else {
            json_decref(content);
            return tg__fail(err, errlen, "input[%zu].output must be a string or an array", i);
        }
        tg__ir_add(ir, "user",
                   json_pack("{s:s,s:s,s:o}", "type", "tool_result", "tool_use_id", id, "content", content));
        return TG_OK;
    }
    if (!strcmp(type, "reasoning"))
        return TG_OK; /* encrypted for the provider that made it; dropped */
    if (!strcmp(type, "item_reference"))
        return tg__fail(err, errlen, "input[%zu]: item_reference refers to state stored at OpenAI and cannot be "
                                     "translated; send the items themselves", i);
    return tg__fail(err, errlen, "input[%zu]: item type \"%s\" cannot be translated", i, type);
}

int tg__responses_req_decode(const json_t *body, tg__ir_t *ir, char *err, size_t errlen) {
    json_t *prev = json_object_get(body, "previous_response_id");
    if (prev && !json_is_null(prev))
        return tg__fail(err, errlen, "previous_response_id: stored conversation state cannot be used with this "
                                     "model's provider; send the whole conversation in input");
    json_t *conv = json_object_get(body, "conversation");
    if (conv && !json_is_null(conv))
        return tg__fail(err, errlen, "conversation: stored conversations cannot be used with this model's provider");
    if (json_is_true(json_object_get(body, "background")))
        return tg__fail(err, errlen, "background: background responses cannot be translated");
    json_t *prompt = json_object_get(body, "prompt");
    if (prompt && !json_is_null(prompt))
        return tg__fail(err, errlen, "prompt: stored prompt templates cannot be used with this model's provider");
    const char *trunc = tg__str(body, "truncation");
    if (trunc && strcmp(trunc, "disabled"))
        return tg__fail(err, errlen, "truncation: \"%s\" (dropping input to fit the context window) cannot be "
                                     "translated to another provider's API", trunc);
    json_t *instr = json_object_get(body, "instructions");
    if (json_is_string(instr) && json_string_length(instr))
        json_array_append(ir->system, instr);
    json_t *input = json_object_get(body, "input");
    size_t i;
    json_t *v;
    if (json_is_string(input)) {
        tg__ir_add(ir, "user", json_pack("{s:s,s:O}", "type", "text", "text", input));
    } else if (json_is_array(input)) {
        json_array_foreach(input, i, v) {
            if (!json_is_object(v))
                return tg__fail(err, errlen, "input[%zu] must be an object", i);
            if (decode_item(v, i, ir, err, errlen) != TG_OK)
                return TG_ERROR;
        }
    } else {
        return tg__fail(err, errlen, "input must be a string or an array");
    }

    json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return tg__fail(err, errlen, "tools must be an array");
        ir->tools = json_array();
        json_array_foreach(tools, i, v) {
            const char *type = tg__str(v, "type"), *name = tg__str(v, "name");
            if (!type || strcmp(type, "function"))
                return tg__fail(err, errlen, "tools[%zu]: tool type \"%s\" cannot be translated; only function tools",
                                i, type ? type : "(none)");
            if (!name)
                return tg__fail(err, errlen, "tools[%zu].name must be a string", i);
            json_t *nt = json_pack("{s:s}", "name", name);
            if (tg__str(v, "description"))
                json_object_set(nt, "description", json_object_get(v, "description"));
            if (json_is_object(json_object_get(v, "parameters")))
                json_object_set(nt, "parameters", json_object_get(v, "parameters"));
            if (json_is_boolean(json_object_get(v, "strict")))
                json_object_set(nt, "strict", json_object_get(v, "strict"));
            json_array_append_new(ir->tools, nt);
        }
    }
    json_t *tc = json_object_get(body, "tool_choice");
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        ir->tool_choice = !strcmp(s, "none") ? TG__TC_NONE : !strcmp(s, "required") ? TG__TC_REQUIRED : TG__TC_AUTO;
    } else if (json_is_object(tc)) {
        const char *type = tg__str(tc, "type"), *name = tg__str(tc, "name");
        if (!type || strcmp(type, "function") || !name)
            return tg__fail(err, errlen, "tool_choice: only \"auto\", \"none\", \"required\" or a named function "
                                         "can be translated");
        ir->tool_choice = TG__TC_NAMED;
        ir->tool_name = name;
    }
    json_t *par = json_object_get(body, "parallel_tool_calls");
    if (json_is_boolean(par))
        ir->parallel = json_is_true(par);
    json_t *mt = json_object_get(body, "max_output_tokens");
    if (json_is_integer(mt))
        ir->max_tokens = json_integer_value(mt);
    if (json_is_number(json_object_get(body, "temperature")))
        ir->temperature = json_object_get(body, "temperature");
    if (json_is_number(json_object_get(body, "top_p")))
        ir->top_p = json_object_get(body, "top_p");
    ir->stream = json_is_true(json_object_get(body, "stream"));
    ir->user = tg__str(body, "user");
    json_t *fmt = json_object_get(json_object_get(body, "text"), "format");
    const char *ft = tg__str(fmt, "type");
    if (ft && !strcmp(ft, "json_object")) {
        ir->format = json_pack("{s:s}", "type", "json_object");
    } else if (ft && !strcmp(ft, "json_schema")) {
        if (!tg__str(fmt, "name") || !json_is_object(json_object_get(fmt, "schema")))
            return tg__fail(err, errlen, "text.format: a json_schema format needs a name and a schema");
        ir->format = json_deep_copy(fmt);
    } else if (ft && strcmp(ft, "text")) {
        return tg__fail(err, errlen, "text.format type \"%s\" cannot be translated", ft);
    }
    ir->effort = tg__str(json_object_get(body, "reasoning"), "effort");
    return TG_OK;
}

/* ---- request: neutral -> Responses -------------------------------------------------- */

static json_t *data_url_of(const json_t *b) {
    const char *media = tg__str(b, "media_type"), *data = tg__str(b, "data");
    tg_buf_t u;
    tg_buf_init(&u);
    tg_buf_printf(&u, "data:%s;base64,", media);
    tg_buf_append(&u, data, json_string_length(json_object_get(b, "data")));
    json_t *s = json_stringn(u.data, u.len);
    tg_buf_free(&u);
    return s;
}

/* A neutral text / image / document block as an input part. */
static json_t *input_part(const json_t *b, const char *text_type) {
    const char *type = tg__str(b, "type");
    if (!strcmp(type, "text"))
        return json_pack("{s:s,s:O}", "type", text_type, "text", json_object_get(b, "text"));
    if (!strcmp(type, "image")) {
        json_t *url = tg__str(b, "url") ? json_incref(json_object_get(b, "url")) : data_url_of(b);
        const char *detail = tg__str(b, "detail");
        return json_pack("{s:s,s:o,s:s}", "type", "input_image", "image_url", url, "detail",
                         detail ? detail : "auto");
    }
    /* a document */
    json_t *p = json_pack("{s:s}", "type", "input_file");
    if (tg__str(b, "url")) {
        json_object_set(p, "file_url", json_object_get(b, "url"));
    } else {
        json_object_set_new(p, "file_data", data_url_of(b));
        const char *media = tg__str(b, "media_type");
        /* Responses wants a file name beside inline data. */
        if (!tg__str(b, "filename"))
            json_object_set_new(p, "filename",
                                json_string(!strcmp(media, "application/pdf") ? "document.pdf" : "document"));
    }
    if (tg__str(b, "filename"))
        json_object_set(p, "filename", json_object_get(b, "filename"));
    return p;
}

/* Appends the message being gathered (if any) to the input items. */
static void flush_message(json_t *input, const char *role, json_t **parts) {
    if (*parts && json_array_size(*parts))
        json_array_append_new(input, json_pack("{s:s,s:s,s:O}", "type", "message", "role", role, "content", *parts));
    json_decref(*parts);
    *parts = NULL;
}

static void encode_turn(const json_t *turn, json_t *input) {
    const char *role = tg__str(turn, "role");
    int user = !strcmp(role, "user");
    json_t *parts = NULL;
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(turn, "content"), i, b) {
        const char *type = tg__str(b, "type");
        if (!strcmp(type, "tool_use")) {
            flush_message(input, role, &parts);
            json_array_append_new(input, json_pack("{s:s,s:O,s:O,s:O}", "type", "function_call", "call_id",
                                                   json_object_get(b, "id"), "name", json_object_get(b, "name"),
                                                   "arguments", json_object_get(b, "arguments")));
        } else if (!strcmp(type, "tool_result")) {
            flush_message(input, role, &parts);
            json_t *content = json_object_get(b, "content");
            json_t *output = tg__join_text(content, "\n");
            /* function_call_output has no error flag: the output says it. */
            int is_error = json_is_true(json_object_get(b, "is_error"));
            if (output && is_error) {
                json_t *s = json_pack("s+", TG__TOOL_ERROR_PREFIX, json_string_value(output));
                json_decref(output);
                output = s;
            } else if (!output) {
                output = json_array();
                if (is_error)
                    json_array_append_new(output, json_pack("{s:s,s:s}", "type", "input_text", "text",
                                                            TG__TOOL_ERROR_PREFIX));
                size_t j;
                json_t *c;
                json_array_foreach(content, j, c) json_array_append_new(output, input_part(c, "input_text"));
            }
            json_array_append_new(input, json_pack("{s:s,s:O,s:o}", "type", "function_call_output", "call_id",
                                                   json_object_get(b, "tool_use_id"), "output", output));
        } else {
            if (!parts)
                parts = json_array();
            json_array_append_new(parts, input_part(b, user ? "input_text" : "output_text"));
        }
    }
    flush_message(input, role, &parts);
}

int tg__responses_req_encode(const tg__ir_t *ir, json_t *out, char *err, size_t errlen) {
    if (ir->stop)
        return tg__fail(err, errlen, "stop sequences cannot be sent to an OpenAI Responses upstream");
    if (json_array_size(ir->system))
        json_object_set_new(out, "instructions", tg__join_text(ir->system, "\n\n"));
    json_t *input = json_array();
    json_object_set_new(out, "input", input);
    size_t i;
    json_t *turn;
    json_array_foreach(ir->messages, i, turn) encode_turn(turn, input);
    if (ir->tools && json_array_size(ir->tools)) {
        json_t *tools = json_array();
        json_t *t;
        json_array_foreach(ir->tools, i, t) {
            json_t *nt = json_pack("{s:s,s:O}", "type", "function", "name", json_object_get(t, "name"));
            if (json_object_get(t, "description"))
                json_object_set(nt, "description", json_object_get(t, "description"));
            json_t *params = json_object_get(t, "parameters");
            json_object_set_new(nt, "parameters", tg__schema(params));
            /* Responses makes function tools strict unless told otherwise, and a strict
             * tool refuses the schemas chat and Anthropic clients usually send. */
            json_t *strict = json_object_get(t, "strict");
            json_object_set_new(nt, "strict", strict ? json_incref(strict) : json_false());
            json_array_append_new(tools, nt);
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
        json_object_set_new(out, "tool_choice", json_pack("{s:s,s:s}", "type", "function", "name", ir->tool_name));
        break;
    }
    if (ir->max_tokens >= 0)
        json_object_set_new(out, "max_output_tokens", json_integer(ir->max_tokens));
    if (ir->temperature)
        json_object_set(out, "temperature", ir->temperature);
    if (ir->top_p)
        json_object_set(out, "top_p", ir->top_p);
    if (ir->user)
        json_object_set_new(out, "user", json_string(ir->user));
    if (ir->format)
        json_object_set_new(out, "text", json_pack("{s:O}", "format", ir->format));
    if (ir->effort)
        json_object_set_new(out, "reasoning", json_pack("{s:s}", "effort", ir->effort));
    json_object_set_new(out, "store", json_false());
    if (ir->stream)
        json_object_set_new(out, "stream", json_true());
    return TG_OK;
}

/* ---- response: Responses <-> neutral ------------------------------------------------ */

static int fin_from_status(const json_t *resp) {
    const char *status = tg__str(resp, "status");
    if (status && !strcmp(status, "incomplete")) {
        const char *reason = tg__str(json_object_get(resp, "incomplete_details"), "reason");
        return reason && !strcmp(reason, "content_filter") ? TG__FIN_FILTER : TG__FIN_LENGTH;
    }
    return TG__FIN_STOP;
}

int tg__responses_resp_decode(const json_t *doc, tg__resp_t *r) {
    json_t *output = json_object_get(doc, "output");
    const char *status = tg__str(doc, "status");
    if (!json_is_array(output) || (status && !strcmp(status, "failed")))
        return TG_ERROR;
    r->id = tg__str(doc, "id");
    r->model = tg__str(doc, "model");
    r->created = tg__int(doc, "created_at");
    r->fin = fin_from_status(doc);
    size_t i, j;
    json_t *it, *p;
    json_array_foreach(output, i, it) {
        const char *type = tg__str(it, "type");
        if (type && !strcmp(type, "message")) {
            json_array_foreach(json_object_get(it, "content"), j, p) {
                const char *pt = tg__str(p, "type");
                json_t *t = json_object_get(p, pt && !strcmp(pt, "refusal") ? "refusal" : "text");
                if (!pt || !json_is_string(t) || !json_string_length(t))
                    continue;
                if (!strcmp(pt, "refusal"))
                    r->fin = TG__FIN_FILTER;
                json_array_append_new(r->content, json_pack("{s:s,s:O}", "type", "text", "text", t));
            }
        } else if (type && !strcmp(type, "function_call")) {
            const char *args = tg__str(it, "arguments");
            json_array_append_new(r->content, json_pack("{s:s,s:s,s:s,s:s}", "type", "tool_use", "id",
                                                        tg__str(it, "call_id") ? tg__str(it, "call_id") : "", "name",
                                                        tg__str(it, "name") ? tg__str(it, "name") : "", "arguments",
                                                        args && *args ? args : "{}"));
        }
    }
    return TG_OK;
}

static void put_status(tg_buf_t *out, int fin) {
    if (fin == TG__FIN_LENGTH || fin == TG__FIN_FILTER)
        tg_buf_printf(out, "\"status\":\"incomplete\",\"error\":null,\"incomplete_details\":{\"reason\":\"%s\"}",
                      fin == TG__FIN_LENGTH ? "max_output_tokens" : "content_filter");
    else
        tg_buf_appends(out, "\"status\":\"completed\",\"error\":null,\"incomplete_details\":null");
}

static void put_text_item(tg_buf_t *out, const char *id, size_t idn, const char *status, const char *text, size_t n) {
    tg_buf_appends(out, "{\"id\":");
    tg__put_str(out, id, idn);
    tg_buf_printf(out, ",\"type\":\"message\",\"status\":\"%s\",\"content\":[{\"type\":\"output_text\","
                       "\"annotations\":[],\"logprobs\":[],\"text\":",
                  status);
    tg__put_str(out, text, n);
    tg_buf_appends(out, "}],\"role\":\"assistant\"}");
}

static void put_call_item(tg_buf_t *out, const char *id, size_t idn, const char *status, const char *call,
                          size_t calln, const char *name, size_t nn, const char *args, size_t an) {
    tg_buf_appends(out, "{\"id\":");
    tg__put_str(out, id, idn);
    tg_buf_printf(out, ",\"type\":\"function_call\",\"status\":\"%s\",\"arguments\":", status);
    tg__put_str(out, args, an);
    tg_buf_appends(out, ",\"call_id\":");
    tg__put_str(out, call, calln);
    tg_buf_appends(out, ",\"name\":");
    tg__put_str(out, name, nn);
    tg_buf_appends(out, "}");
}

void tg__responses_resp_encode(const tg__resp_t *r, const char *model, tg_buf_t *out) {
    const char *rid = r->id ? r->id : "resp_tollgate";
    tg_buf_appends(out, "{\"id\":");
    tg__put_cstr(out, rid);
    tg_buf_printf(out, ",\"object\":\"response\",\"created_at\":%lld,", (long long)r->created);
    put_status(out, r->fin);
    tg_buf_appends(out, ",\"model\":");
    tg__put_cstr(out, model ? model : "unknown");
    tg_buf_appends(out, ",\"output\":[");
    tg_buf_t id;
    tg_buf_init(&id);
    size_t i;
    json_t *b;
    json_array_foreach(r->content, i, b) {
        if (i)
            tg_buf_appends(out, ",");
        tg_buf_reset(&id);
        const char *type = tg__str(b, "type");
        tg_buf_printf(&id, "%s_%zu_", !strcmp(type, "text") ? "msg" : "fc", i);
        tg_buf_appends(&id, rid);
        if (!strcmp(type, "text")) {
            put_text_item(out, id.data, id.len, "completed", tg__str(b, "text"),
                          json_string_length(json_object_get(b, "text")));
        } else {
            const char *call = tg__str(b, "id"), *name = tg__str(b, "name"), *args = tg__str(b, "arguments");
            put_call_item(out, id.data, id.len, "completed", call, strlen(call), name, strlen(name), args,
                          json_string_length(json_object_get(b, "arguments")));
        }
    }
    tg_buf_free(&id);
    tg_buf_appends(out, "],\"usage\":");
    if (r->usage.known)
        tg__usage_responses(&r->usage, out);
    else
        tg_buf_appends(out, "null");
    tg_buf_appends(out, "}");
}

/* ---- stream: Responses events -> neutral -------------------------------------------- */

void tg__responses_dec(tg_xlate_t *x, const json_t *doc, tg_buf_t *out) {
    const char *type = tg__str(doc, "type");
    if (!type)
        return;
    json_t *joi = json_object_get(doc, "output_index");
    int64_t oi = json_is_integer(joi) ? json_integer_value(joi) : -1;
    json_t *v;
    if (!strcmp(type, "response.output_text.delta") || !strcmp(type, "response.refusal.delta")) {
        if (json_is_string(v = json_object_get(doc, "delta")) && json_string_length(v)) {
            if (!strcmp(type, "response.refusal.delta"))
                x->d_refusal = 1;
            tg__x_text(x, json_string_value(v), json_string_length(v), out);
        }
    } else if (!strcmp(type, "response.function_call_arguments.delta")) {
        if (x->d_kind == TG__BLK_TOOL && oi == x->d_index && json_is_string(v = json_object_get(doc, "delta")))
            tg__x_tool_args(x, json_string_value(v), json_string_length(v), out);
    } else if (!strcmp(type, "response.output_item.added")) {
        json_t *item = json_object_get(doc, "item");
        const char *it = tg__str(item, "type");
        x->d_index = oi;
        x->d_kind = TG__BLK_SKIP;
        if (it && !strcmp(it, "message")) {
            x->d_kind = TG__BLK_TEXT;
            tg__x_start(x, out);
        } else if (it && !strcmp(it, "function_call")) {
            x->d_kind = TG__BLK_TOOL;
            json_t *id = json_object_get(item, "call_id"), *name = json_object_get(item, "name");
            tg__x_tool_start(x, json_string_value(id), json_string_length(id), json_string_value(name),
                             json_string_length(name), out);
            if (json_is_string(v = json_object_get(item, "arguments")))
                tg__x_tool_args(x, json_string_value(v), json_string_length(v), out);
        }
    } else if (!strcmp(type, "response.output_item.done")) {
        if (oi == x->d_index && (x->d_kind == TG__BLK_TEXT || x->d_kind == TG__BLK_TOOL))
            tg__x_block_end(x, out);
        x->d_kind = TG__BLK_NONE;
    } else if (!strcmp(type, "response.created") || !strcmp(type, "response.in_progress")) {
        json_t *r = json_object_get(doc, "response");
        tg__x_meta(x, tg__str(r, "id"), tg__str(r, "model"), tg__int(r, "created_at"));
        tg__x_start(x, out);
    } else if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete")) {
        int fin = fin_from_status(json_object_get(doc, "response"));
        tg__x_stop(x, x->d_refusal && fin == TG__FIN_STOP ? TG__FIN_FILTER : fin, out);
        tg__x_end(x, out);
    } else if (!strcmp(type, "response.failed")) {
        json_t *e = json_object_get(json_object_get(doc, "response"), "error");
        const char *msg = tg__str(e, "message");
        tg__x_error(x, "api_error", msg ? msg : "the upstream response failed", out);
    } else if (!strcmp(type, "error")) {
        const char *msg = tg__str(doc, "message"), *code = tg__str(doc, "code");
        const char *et = code && strstr(code, "rate_limit") ? "rate_limit_error" : "api_error";
        tg__x_error(x, et, msg, out);
    }
}

/* ---- stream: neutral -> Responses events -------------------------------------------- */

static void ev_begin(tg_xlate_t *x, tg_buf_t *out, const char *type) {
    tg__sse_begin(out, type);
    tg_buf_appends(out, "{\"type\":\"");
    tg_buf_appends(out, type);
    tg_buf_printf(out, "\",\"sequence_number\":%lld", (long long)x->seq++);
}

/* The response object; `final` adds the output and the usage. */
static void put_response(tg_xlate_t *x, tg_buf_t *out, int final) {
    tg_buf_appends(out, ",\"response\":{\"id\":");
    tg__put_str(out, x->id.data, x->id.len);
    tg_buf_printf(out, ",\"object\":\"response\",\"created_at\":%lld,", (long long)x->created);
    if (final)
        put_status(out, x->fin);
    else
        tg_buf_appends(out, "\"status\":\"in_progress\",\"error\":null,\"incomplete_details\":null");
    tg_buf_appends(out, ",\"model\":");
    tg__put_str(out, x->model.data, x->model.len);
    tg_buf_appends(out, ",\"output\":[");
    if (final)
        tg_buf_append(out, x->e_items.data, x->e_items.len);
    tg_buf_appends(out, "],\"usage\":");
    if (final)
        tg__usage_responses(tg__x_u(x), out);
    else
        tg_buf_appends(out, "null");
    tg_buf_appends(out, "}}\n\n");
}

/* The id of the open item: msg_<request id>_<output index> or fc_... */
static void item_id(tg_xlate_t *x, tg_buf_t *out) {
    tg_buf_printf(out, "\"%s_%s_%d\"", x->e_kind == TG__BLK_TEXT ? "msg" : "fc", x->req_id, x->e_index);
}

static void item_ref(tg_xlate_t *x, tg_buf_t *out) {
    tg_buf_appends(out, ",\"item_id\":");
    item_id(x, out);
    tg_buf_printf(out, ",\"output_index\":%d", x->e_index);
}

static void rs_start(tg_xlate_t *x, tg_buf_t *out) {
    ev_begin(x, out, "response.created");
    put_response(x, out, 0);
    ev_begin(x, out, "response.in_progress");
    put_response(x, out, 0);
}

static void rs_open(tg_xlate_t *x, int kind) {
    x->e_kind = kind;
    x->e_index = x->e_count++;
    tg_buf_reset(&x->e_text);
}

static void rs_text(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out) {
    if (x->e_kind != TG__BLK_TEXT) {
        rs_open(x, TG__BLK_TEXT);
        ev_begin(x, out, "response.output_item.added");
        tg_buf_printf(out, ",\"output_index\":%d,\"item\":{\"id\":", x->e_index);
        item_id(x, out);
        tg_buf_appends(out,
                       ",\"type\":\"message\",\"status\":\"in_progress\",\"content\":[],\"role\":\"assistant\"}}\n\n");
        ev_begin(x, out, "response.content_part.added");
        item_ref(x, out);
        tg_buf_appends(out, ",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],"
                            "\"text\":\"\"}}\n\n");
    }
    ev_begin(x, out, "response.output_text.delta");
    item_ref(x, out);
    tg_buf_appends(out, ",\"content_index\":0,\"delta\":");
    tg__put_str(out, s, n);
    tg_buf_appends(out, ",\"logprobs\":[]}\n\n");
    tg_buf_append(&x->e_text, s, n);
}

static void rs_tool_start(tg_xlate_t *x, const char *id, size_t idn, const char *name, size_t nn, tg_buf_t *out) {
    rs_open(x, TG__BLK_TOOL);
    tg_buf_reset(&x->e_call);
    tg_buf_append(&x->e_call, id, idn);
    tg_buf_reset(&x->e_name);
    tg_buf_append(&x->e_name, name, nn);
    tg_buf_t iid;
    tg_buf_init(&iid);
    tg_buf_printf(&iid, "fc_%s_%d", x->req_id, x->e_index);
    ev_begin(x, out, "response.output_item.added");
    tg_buf_printf(out, ",\"output_index\":%d,\"item\":", x->e_index);
    put_call_item(out, iid.data, iid.len, "in_progress", id, idn, name, nn, "", 0);
    tg_buf_appends(out, "}\n\n");
    tg_buf_free(&iid);
}

static void rs_tool_args(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out) {
    ev_begin(x, out, "response.function_call_arguments.delta");
    item_ref(x, out);
    tg_buf_appends(out, ",\"delta\":");
    tg__put_str(out, s, n);
    tg_buf_appends(out, "}\n\n");
    tg_buf_append(&x->e_text, s, n);
}

static void rs_block_end(tg_xlate_t *x, tg_buf_t *out) {
    const char *text = x->e_text.data ? x->e_text.data : "";
    tg_buf_t item;
    tg_buf_init(&item);
    tg_buf_t iid;
    tg_buf_init(&iid);
    tg_buf_printf(&iid, "%s_%s_%d", x->e_kind == TG__BLK_TEXT ? "msg" : "fc", x->req_id, x->e_index);
    if (x->e_kind == TG__BLK_TEXT) {
        ev_begin(x, out, "response.output_text.done");
        item_ref(x, out);
        tg_buf_appends(out, ",\"content_index\":0,\"text\":");
        tg__put_str(out, text, x->e_text.len);
        tg_buf_appends(out, ",\"logprobs\":[]}\n\n");
        ev_begin(x, out, "response.content_part.done");
        item_ref(x, out);
        tg_buf_appends(out, ",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],"
                            "\"text\":");
        tg__put_str(out, text, x->e_text.len);
        tg_buf_appends(out, "}}\n\n");
        put_text_item(&item, iid.data, iid.len, "completed", text, x->e_text.len);
    } else {
        ev_begin(x, out, "response.function_call_arguments.done");
        item_ref(x, out);
        tg_buf_appends(out, ",\"arguments\":");
        tg__put_str(out, text, x->e_text.len);
        tg_buf_appends(out, "}\n\n");
        put_call_item(&item, iid.data, iid.len, "completed", x->e_call.data ? x->e_call.data : "", x->e_call.len,
                      x->e_name.data ? x->e_name.data : "", x->e_name.len, text, x->e_text.len);
    }
    ev_begin(x, out, "response.output_item.done");
    tg_buf_printf(out, ",\"output_index\":%d,\"item\":", x->e_index);
    tg_buf_append(out, item.data, item.len);
    tg_buf_appends(out, "}\n\n");
    if (x->e_items.len)
        tg_buf_append(&x->e_items, ",", 1);
    tg_buf_append(&x->e_items, item.data, item.len);
    tg_buf_free(&item);
    tg_buf_free(&iid);
    tg_buf_reset(&x->e_text);
}

static void rs_stop(tg_xlate_t *x, tg_buf_t *out) {
    TG_UNUSED(x);
    TG_UNUSED(out);
}

static void rs_end(tg_xlate_t *x, tg_buf_t *out) {
    int incomplete = x->fin == TG__FIN_LENGTH || x->fin == TG__FIN_FILTER;
    ev_begin(x, out, incomplete ? "response.incomplete" : "response.completed");
    put_response(x, out, 1);
}

static void rs_error(tg_xlate_t *x, const char *type, const char *msg, size_t n, tg_buf_t *out) {
    const char *code = !strcmp(type, "rate_limit_error")   ? "rate_limit_exceeded"
                       : !strcmp(type, "overloaded_error") ? "overloaded"
                                                           : "upstream_error";
    ev_begin(x, out, "error");
    tg_buf_printf(out, ",\"code\":\"%s\",\"message\":", code);
    tg__put_str(out, msg, n);
    tg_buf_appends(out, ",\"param\":null}\n\n");
}

const tg__enc_t tg__responses_enc = {rs_start, rs_text, rs_tool_start, rs_tool_args,
                                     rs_block_end, rs_stop, rs_end, rs_error};
