/*
 * Google Gemini's generateContent (Generative Language API, and Vertex AI's Gemini
 * models): an upstream protocol only. Requests are encoded from the neutral form; the
 * answer, whole or streamed (streamGenerateContent?alt=sse: each event one
 * GenerateContentResponse), is decoded into it. The model is not in the body but in the
 * path (tg_translate_gemini_path).
 *
 *   request   contents[{role user|model, parts[text | inlineData{mimeType,data} |
 *             functionCall{name,args} | functionResponse{name,response}]}],
 *             systemInstruction{parts[text]}, tools[{functionDeclarations[{name,
 *             description,parametersJsonSchema}]}], toolConfig.functionCallingConfig
 *             {mode AUTO|NONE|ANY, allowedFunctionNames}, generationConfig{
 *             maxOutputTokens, temperature, topP, stopSequences, responseMimeType,
 *             responseJsonSchema}
 *   answer    candidates[0]{content.parts, finishReason}, usageMetadata (tg_usage),
 *             responseId, modelVersion; promptFeedback.blockReason without candidates
 *
 * Gemini names a function's result by the function's name, not the call's id: a
 * tool_result is sent with the name of the tool_use it answers (found earlier in the
 * conversation; one that answers no call is refused). Its text goes as
 * response.result (response.error when is_error), its images as inlineData parts after
 * it. Images and documents go as base64 inlineData; a URL is refused (Gemini reads only
 * its own file URIs). Calls the model makes get ids made from the request id (Gemini
 * sends none). Thought parts (thought: true) are not carried to the client; their
 * tokens are billed (thoughtsTokenCount is output).
 */
#include "tg_translate_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- request: neutral -> Gemini ------------------------------------------------------- */

static json_t *inline_part(const json_t *b, const char *what, char *err, size_t errlen) {
    const char *media = tg__str(b, "media_type"), *data = tg__str(b, "data");
    if (!media || !data) {
        tg__fail(err, errlen, "%s given by URL cannot be sent to a Gemini upstream; send it as base64 data", what);
        return NULL;
    }
    return json_pack("{s:{s:s,s:s}}", "inlineData", "mimeType", media, "data", data);
}

/* The name of the call `id` in the turns before the current one (ir order), or NULL. */
static const char *call_name(const tg__ir_t *ir, const char *id) {
    size_t i, j;
    json_t *turn, *b;
    const char *name = NULL;
    json_array_foreach(ir->messages, i, turn) {
        json_array_foreach(json_object_get(turn, "content"), j, b) {
            const char *t = tg__str(b, "type");
            if (t && !strcmp(t, "tool_use") && id && tg__str(b, "id") && !strcmp(tg__str(b, "id"), id))
                name = tg__str(b, "name");
        }
    }
    return name;
}

/* Appends the parts of one neutral block to `parts`. Returns TG_OK or TG_ERROR. */
static int gemini_parts(const tg__ir_t *ir, const json_t *b, json_t *parts, char *err, size_t errlen) {
    const char *type = tg__str(b, "type");
    if (!type)
        return tg__fail(err, errlen, "content block without a type");
    if (!strcmp(type, "text")) {
        json_array_append_new(parts, json_pack("{s:O}", "text", json_object_get(b, "text")));
    } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
        json_t *p = inline_part(b, !strcmp(type, "image") ? "an image" : "a document", err, errlen);
        if (!p)
            return TG_ERROR;
        json_array_append_new(parts, p);
    } else if (!strcmp(type, "tool_use")) {
        const char *args = tg__str(b, "arguments");
        json_error_t jerr;
        json_t *a = args && *args ? tg_json_loadb(args, strlen(args), 0, &jerr) : json_object();
        if (!json_is_object(a)) {
            json_decref(a);
            return tg__fail(err, errlen, "tool call \"%s\": its arguments must be a JSON object for a Gemini upstream",
                            tg__str(b, "name") ? tg__str(b, "name") : "");
        }
        json_array_append_new(parts, json_pack("{s:{s:O,s:o}}", "functionCall", "name", json_object_get(b, "name"),
                                               "args", a));
    } else if (!strcmp(type, "tool_result")) {
        const char *id = tg__str(b, "tool_use_id");
        const char *name = call_name(ir, id);
        if (!name)
            return tg__fail(err, errlen,
                            "tool result \"%s\" answers no tool call of this conversation: a Gemini upstream names "
                            "results by their function",
                            id ? id : "");
        tg_buf_t text;
        tg_buf_init(&text);
        json_t *extra = json_array();
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(b, "content"), i, c) {
            const char *ct = tg__str(c, "type");
            if (ct && !strcmp(ct, "text")) {
                if (text.len)
                    tg_buf_appends(&text, "\n");
                json_t *t = json_object_get(c, "text");
                tg_buf_append(&text, json_string_value(t), json_string_length(t));
            } else {
                json_t *p = inline_part(c, "an image or document in a tool result", err, errlen);
                if (!p) {
                    tg_buf_free(&text);
                    json_decref(extra);
                    return TG_ERROR;
                }
                json_array_append_new(extra, p);
            }
        }
        json_t *resp = json_object();
        json_object_set_new(resp, json_is_true(json_object_get(b, "is_error")) ? "error" : "result",
                            json_stringn(text.data ? text.data : "", text.len));
        tg_buf_free(&text);
        json_array_append_new(parts, json_pack("{s:{s:s,s:o}}", "functionResponse", "name", name, "response", resp));
        json_array_extend(parts, extra);
        json_decref(extra);
    } else {
        return tg__fail(err, errlen, "content block type \"%s\" cannot be sent to a Gemini upstream", type);
    }
    return TG_OK;
}

int tg__gemini_req_encode(const tg__ir_t *ir, json_t *out, char *err, size_t errlen) {
    /* The model goes in the path. */
    json_object_del(out, "model");
    json_t *contents = json_array();
    json_object_set_new(out, "contents", contents);
    json_t *last = NULL;
    size_t i, j;
    json_t *turn, *b;
    json_array_foreach(ir->messages, i, turn) {
        const char *role = !strcmp(tg__str(turn, "role"), "assistant") ? "model" : "user";
        json_t *parts = json_array();
        json_array_foreach(json_object_get(turn, "content"), j, b) {
            if (gemini_parts(ir, b, parts, err, errlen) != TG_OK) {
                json_decref(parts);
                return TG_ERROR;
            }
        }
        if (!json_array_size(parts)) {
            json_decref(parts);
            continue;
        }
        if (last && !strcmp(tg__str(last, "role"), role)) {
            json_array_extend(json_object_get(last, "parts"), parts);
            json_decref(parts);
        } else {
            last = json_pack("{s:s,s:o}", "role", role, "parts", parts);
            json_array_append_new(contents, last);
        }
    }
    if (json_array_size(ir->system))
        json_object_set_new(out, "systemInstruction",
                            json_pack("{s:[{s:o}]}", "parts", "text", tg__join_text(ir->system, "\n\n")));
    if (ir->tools && json_array_size(ir->tools)) {
        json_t *decls = json_array(), *t;
        json_array_foreach(ir->tools, i, t) {
            json_t *d = json_pack("{s:O}", "name", json_object_get(t, "name"));
            if (json_object_get(t, "description"))
                json_object_set(d, "description", json_object_get(t, "description"));
            json_object_set_new(d, "parametersJsonSchema", tg__schema(json_object_get(t, "parameters")));
            json_array_append_new(decls, d);
        }
        json_object_set_new(out, "tools", json_pack("[{s:o}]", "functionDeclarations", decls));
    }
    json_t *fcc = NULL;
    switch (ir->tool_choice) {
    case TG__TC_AUTO: fcc = json_pack("{s:s}", "mode", "AUTO"); break;
    case TG__TC_NONE: fcc = json_pack("{s:s}", "mode", "NONE"); break;
    case TG__TC_REQUIRED: fcc = json_pack("{s:s}", "mode", "ANY"); break;
    case TG__TC_NAMED: fcc = json_pack("{s:s,s:[s]}", "mode", "ANY", "allowedFunctionNames", ir->tool_name); break;
    }
    if (fcc)
        json_object_set_new(out, "toolConfig", json_pack("{s:o}", "functionCallingConfig", fcc));
    json_t *gc = json_object();
    if (ir->max_tokens >= 0)
        json_object_set_new(gc, "maxOutputTokens", json_integer(ir->max_tokens));
    if (ir->temperature)
        json_object_set(gc, "temperature", ir->temperature);
    if (ir->top_p)
        json_object_set(gc, "topP", ir->top_p);
    if (ir->stop)
        json_object_set(gc, "stopSequences", ir->stop);
    if (ir->format) {
        json_object_set_new(gc, "responseMimeType", json_string("application/json"));
        json_t *schema = json_object_get(ir->format, "schema");
        if (schema)
            json_object_set(gc, "responseJsonSchema", schema);
    }
    if (json_object_size(gc))
        json_object_set_new(out, "generationConfig", gc);
    else
        json_decref(gc);
    return TG_OK;
}

void tg_translate_gemini_path(const char *model, int stream, tg_buf_t *out) {
    static const char hex[] = "0123456789ABCDEF";
    tg_buf_appends(out, "/models/");
    for (const char *s = model ? model : ""; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
            c == '.' || c == '@') {
            tg_buf_append(out, (const char *)&c, 1);
        } else {
            char e[3] = {'%', hex[c >> 4], hex[c & 15]};
            tg_buf_append(out, e, 3);
        }
    }
    tg_buf_appends(out, stream ? ":streamGenerateContent?alt=sse" : ":generateContent");
}

/* ---- answers: Gemini -> neutral --------------------------------------------------------- */

static int fin_from_gemini(const char *s) {
    if (!s || !*s || !strcmp(s, "FINISH_REASON_UNSPECIFIED"))
        return TG__FIN_NONE;
    if (!strcmp(s, "MAX_TOKENS"))
        return TG__FIN_LENGTH;
    if (!strcmp(s, "SAFETY") || !strcmp(s, "RECITATION") || !strcmp(s, "BLOCKLIST") ||
        !strcmp(s, "PROHIBITED_CONTENT") || !strcmp(s, "SPII") || !strcmp(s, "IMAGE_SAFETY"))
        return TG__FIN_FILTER;
    return TG__FIN_STOP; /* STOP, LANGUAGE, OTHER, MALFORMED_FUNCTION_CALL, anything newer */
}

/* The finish reason of an answer: its first candidate's, or a filter when the prompt was
 * blocked (no candidates), else none yet. */
static int answer_fin(const json_t *doc) {
    json_t *cand = json_array_get(json_object_get(doc, "candidates"), 0);
    if (cand)
        return fin_from_gemini(tg__str(cand, "finishReason"));
    return tg__str(json_object_get(doc, "promptFeedback"), "blockReason") ? TG__FIN_FILTER : TG__FIN_NONE;
}

static void call_id(const char *seed, int n, char *out, size_t outlen) {
    snprintf(out, outlen, "call_%.48s_%d", seed && *seed ? seed : "gemini", n);
}

int tg__gemini_resp_decode(const json_t *doc, tg__resp_t *r) {
    json_t *cands = json_object_get(doc, "candidates");
    if (!json_is_array(cands) && !json_is_object(json_object_get(doc, "promptFeedback")))
        return TG_ERROR;
    r->id = tg__str(doc, "responseId");
    r->model = tg__str(doc, "modelVersion");
    json_t *parts = json_object_get(json_object_get(json_array_get(cands, 0), "content"), "parts");
    size_t i;
    json_t *p;
    int calls = 0;
    json_array_foreach(parts, i, p) {
        if (json_is_true(json_object_get(p, "thought")))
            continue;
        json_t *t = json_object_get(p, "text"), *fc = json_object_get(p, "functionCall");
        if (json_is_string(t) && json_string_length(t)) {
            json_array_append_new(r->content, json_pack("{s:s,s:O}", "type", "text", "text", t));
        } else if (json_is_object(fc)) {
            json_t *args = json_object_get(fc, "args");
            char *a = args ? tg_json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            char id[80];
            const char *given = tg__str(fc, "id");
            call_id(r->id, calls++, id, sizeof(id));
            json_array_append_new(r->content, json_pack("{s:s,s:s,s:s,s:s}", "type", "tool_use", "id",
                                                         given && *given ? given : id, "name",
                                                         tg__str(fc, "name") ? tg__str(fc, "name") : "",
                                                         "arguments", a ? a : "{}"));
            free(a);
        }
    }
    r->fin = answer_fin(doc);
    if (r->fin == TG__FIN_NONE)
        r->fin = TG__FIN_STOP;
    return TG_OK;
}

/* ---- stream: Gemini chunks -> neutral --------------------------------------------------- */

void tg__gemini_dec(tg_xlate_t *x, const json_t *doc, tg_buf_t *out) {
    json_t *e = json_object_get(doc, "error");
    if (json_is_object(e)) {
        /* An error in the stream (Google's {"error":{"code","message","status"}}). */
        int64_t code = tg__int(e, "code");
        tg__x_error(x, code == 429 ? "rate_limit_error" : code == 503 ? "overloaded_error" : "api_error",
                    tg__str(e, "message"), out);
        return;
    }
    tg__x_meta(x, tg__str(doc, "responseId"), tg__str(doc, "modelVersion"), 0);
    tg__x_start(x, out);
    json_t *parts = json_object_get(json_object_get(json_array_get(json_object_get(doc, "candidates"), 0), "content"),
                                    "parts");
    size_t i;
    json_t *p;
    json_array_foreach(parts, i, p) {
        if (json_is_true(json_object_get(p, "thought")))
            continue;
        json_t *t = json_object_get(p, "text"), *fc = json_object_get(p, "functionCall");
        if (json_is_string(t)) {
            tg__x_text(x, json_string_value(t), json_string_length(t), out);
        } else if (json_is_object(fc)) {
            /* A call arrives whole in one chunk. */
            json_t *name = json_object_get(fc, "name"), *id = json_object_get(fc, "id");
            char gen[80];
            const char *cid = json_string_value(id);
            size_t cidn = json_string_length(id);
            if (!cid || !cidn) {
                call_id(x->req_id, x->tools, gen, sizeof(gen));
                cid = gen;
                cidn = strlen(gen);
            }
            tg__x_tool_start(x, cid, cidn, json_string_value(name), json_string_length(name), out);
            json_t *args = json_object_get(fc, "args");
            char *a = args ? tg_json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            if (a)
                tg__x_tool_args(x, a, strlen(a), out);
            free(a);
            tg__x_block_end(x, out);
        }
    }
    int fin = answer_fin(doc);
    if (fin != TG__FIN_NONE)
        tg__x_stop(x, fin, out);
}
