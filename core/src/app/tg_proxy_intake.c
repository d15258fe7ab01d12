/*
 * The pipeline's first phases (tg_proxy.c runs them): who calls and what they ask.
 *
 *   auth     the key from Authorization or x-api-key, hashed and looked up (tg_state;
 *            asynchronous on a cache miss), checked: active, not expired, the address
 *   parse    the body read as JSON (a model route's), the members the gateway reads
 *            checked: model, messages or input, stream, stream_options (the usage
 *            chunk is asked for); count_tokens answered here
 *   plugins  the plugin context filled, on_request and map_model run, the key's model
 *            restrictions applied to the model that will be served
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "tg_proxy_internal.h"

#include "tollgate/tg_capture.h"

static void cleanup_auth_wait(proxy_req_t *p) { tg_state_auth_cancel(p->auth_wait); }

static void cleanup_principal(proxy_req_t *p) { tg_principal_release(p->principal); }

static void cleanup_json(proxy_req_t *p) {
    if (p->json)
        json_decref(p->json);
}

static void cleanup_plugins(proxy_req_t *p) {
    if (p->ctx_on)
        tg_plugins_end(p->pw->ctx->plugins, &p->ctx);
}

/* ---- phase: auth -------------------------------------------------------------------- */

static int auth_check(proxy_req_t *p, tg_principal_t *pr) {
    tg_request_t *req = p->req;
    p->principal = pr;
    tg__cleanup_add(p, cleanup_principal);
    if (!pr)
        return tg__proxy_fail(p, 401, "invalid_request_error", "invalid_api_key", "invalid API key");
    if (!pr->active)
        return tg__proxy_fail(p, 401, "invalid_request_error", "invalid_api_key", "this API key has been revoked or its tenant suspended");
    if (pr->expires_at_ms && (int64_t)tg_wall_ms() >= pr->expires_at_ms)
        return tg__proxy_fail(p, 401, "invalid_request_error", "invalid_api_key", "this API key has expired");
    if (!tg_principal_allows_ip(pr, req->client_ip))
        return tg__proxy_fail(p, 403, "permission_error", "ip_not_allowed", "this API key may not be used from this address");
    return TG_OK;
}

static void auth_done(void *ud, tg_principal_t *pr, const char *err) {
    proxy_req_t *p = ud;
    p->auth_wait = NULL;
    if (err) {
        tg_principal_release(pr);
        tg_log_warn("request %s: key lookup failed: %s", p->req->id, err);
        tg__proxy_fail(p, 503, "server_error", "auth_unavailable", "the key could not be checked; try again");
        return;
    }
    if (auth_check(p, pr) == TG_OK)
        tg__proxy_run(p);
}

static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_free(void) { EVP_MD_free(sha256_md); }

static void sha256_fetch(void) {
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    atexit(sha256_free);
}

/* The slot of a key in the worker's digests: its length and last 8 bytes mixed (keys
 * differ in their random tail; a client choosing keys that share a slot only makes them
 * hash every time). */
static size_t digest_slot(tg_str_t key) {
    uint64_t t = 0;
    memcpy(&t, key.p + key.len - TG_MIN(key.len, 8), TG_MIN(key.len, 8));
    t = (t ^ key.len) * 0x9e3779b97f4a7c15ull;
    return (size_t)(t >> 58) % TG_KEY_DIGESTS;
}

/* SHA-256 of the presented key, from the worker's digests when the same bytes came
 * lately (compared in constant time), else computed and kept. */
static void key_digest(proxy_worker_t *pw, tg_str_t key, unsigned char digest[32]) {
    struct key_digest_s *e = NULL;
    if (key.len <= TG_KEY_DIGEST_MAX) {
        e = &pw->digests[digest_slot(key)];
        if (e->len == key.len && CRYPTO_memcmp(e->key, key.p, key.len) == 0) {
            memcpy(digest, e->digest, 32);
            return;
        }
    }
    /* OpenSSL 3's one-shot SHA256() fetches the algorithm on every call: fetch it once. */
    pthread_once(&sha256_once, sha256_fetch);
    EVP_MD_CTX *sha = pw->sha;
    if (!sha256_md || !sha || !EVP_DigestInit_ex(sha, sha256_md, NULL) || !EVP_DigestUpdate(sha, key.p, key.len) ||
        !EVP_DigestFinal_ex(sha, digest, NULL))
        SHA256((const unsigned char *)key.p, key.len, digest);
    if (e) {
        e->len = (unsigned char)key.len;
        memcpy(e->key, key.p, key.len);
        memcpy(e->digest, digest, 32);
    }
}

int tg__phase_auth(proxy_req_t *p) {
    tg_request_t *req = p->req;
    tg_str_t key = {NULL, 0};
    const tg_str_t *h = tg_request_header(req, "authorization");
    if (h && h->len > 7 && strncasecmp(h->p, "Bearer ", 7) == 0) {
        key.p = h->p + 7;
        key.len = h->len - 7;
        while (key.len && key.p[0] == ' ') {
            key.p++;
            key.len--;
        }
    } else if ((h = tg_request_header(req, "x-api-key")) != NULL) {
        key = *h;
    }
    if (!key.len)
        return tg__proxy_fail(p, 401, "invalid_request_error", "invalid_api_key",
                              "missing API key: send Authorization: Bearer <key>");
    unsigned char digest[32];
    key_digest(p->pw, key, digest);
    tg_principal_t *pr = NULL;
    int rc = tg_state_auth(p->pw->ctx->state, digest, auth_done, p, &pr, &p->auth_wait);
    if (rc == TG_AGAIN) {
        tg__cleanup_add(p, cleanup_auth_wait);
        return TG_AGAIN;
    }
    return auth_check(p, pr);
}

/* ---- phase: parse ------------------------------------------------------------------- */

/* The body's tree, built the first time a phase asks (phase_parse only validated the
 * body, in one pass, when it could check what it checks without it). NULL for a request
 * without a body to parse, or when memory ran out. */
json_t *tg__proxy_json(proxy_req_t *p) {
    if (!p->json && p->parsed) {
        json_error_t jerr;
        p->json = tg_json_loadb(p->req->body.data ? p->req->body.data : "", p->req->body.len, JSON_REJECT_DUPLICATES,
                                &jerr);
        tg__cleanup_add(p, cleanup_json);
        if (!p->json)
            tg_log_error("request %s: the validated body did not parse: %s", p->req->id, jerr.text);
        else if (p->cap_added && p->limit_key)
            /* billing's default cap, written before there was a tree (money_bound) */
            json_object_set_new(p->json, p->limit_key, json_integer(p->bound_output));
    }
    return p->json;
}

/*
 * The checks of phase_parse below, read from tg_json_scan's pass instead of a tree, in
 * the same order with the same answers. Returns 0, nothing done, when the request needs
 * the tree here (count_tokens, a chat stream's stream_options, a model spelled with an
 * escape): phase_parse parses then. Else 1 with *rc the phase's result.
 */
static int parse_scanned(proxy_req_t *p, const tg_json_scan_top_t *top, int *rc) {
    const tg_json_scan_val_t *model = &top->m[TG_JTOP_MODEL], *stream = &top->m[TG_JTOP_STREAM];
    if ((model->kind == TG_JV_STRING && model->escaped) ||
        (p->req->route == TG_ROUTE_MESSAGES && strcmp(p->path, "/v1/messages/count_tokens") == 0) ||
        (stream->kind == TG_JV_TRUE && p->proto == TG_PROTO_OPENAI_CHAT))
        return 0;
    p->parsed = 1;
    *rc = TG_DONE;
    if (!top->object) {
        tg__proxy_fail(p, 400, "invalid_request_error", "invalid_request", "request body must be a JSON object");
        return 1;
    }
    if (!model->kind) {
        tg__proxy_fail(p, 400, "invalid_request_error", "missing_model", "you must provide a model parameter");
        return 1;
    }
    if (model->kind != TG_JV_STRING || model->len == 0 || model->len >= sizeof(p->model)) {
        tg__proxy_fail(p, 400, "invalid_request_error", "invalid_model", "model must be a non-empty string");
        return 1;
    }
    memcpy(p->model, p->req->body.data + model->start, model->len);
    p->model[model->len] = '\0';
    if (p->proto == TG_PROTO_OPENAI_CHAT || p->proto == TG_PROTO_ANTHROPIC) {
        if (top->m[TG_JTOP_MESSAGES].kind != TG_JV_ARRAY) {
            tg__proxy_fail(p, 400, "invalid_request_error", "missing_messages", "messages must be an array");
            return 1;
        }
    } else if (top->m[TG_JTOP_INPUT].kind != TG_JV_STRING && top->m[TG_JTOP_INPUT].kind != TG_JV_ARRAY) {
        tg__proxy_fail(p, 400, "invalid_request_error", "missing_input", "input must be a string or an array");
        return 1;
    }
    if (stream->kind && stream->kind != TG_JV_TRUE && stream->kind != TG_JV_FALSE && stream->kind != TG_JV_NULL) {
        tg__proxy_fail(p, 400, "invalid_request_error", "invalid_stream", "stream must be a boolean");
        return 1;
    }
    p->stream = stream->kind == TG_JV_TRUE && p->proto != TG_PROTO_EMBEDDINGS;
    /* What the plugins see as max_tokens (phase_plugins): max_completion_tokens when it
     * is an integer, else max_tokens when it is one (the scan's integers are within
     * int64), else -1. */
    const tg_json_scan_val_t *mt = &top->m[TG_JTOP_MAX_COMPLETION_TOKENS];
    if (mt->kind != TG_JV_INT)
        mt = &top->m[TG_JTOP_MAX_TOKENS];
    p->scan_max_tokens = mt->kind == TG_JV_INT ? strtoll(p->req->body.data + mt->start, NULL, 10) : -1;
    /* The output limits, for admission and billing (tg_proxy_admit.c's limit_fields). */
    static const int limit_members[3] = {TG_JTOP_MAX_TOKENS, TG_JTOP_MAX_COMPLETION_TOKENS, TG_JTOP_MAX_OUTPUT_TOKENS};
    p->scan_limits = 1;
    for (int i = 0; i < 3; i++) {
        const tg_json_scan_val_t *v = &top->m[limit_members[i]];
        int64_t n = v->kind == TG_JV_INT ? strtoll(p->req->body.data + v->start, NULL, 10) : 0;
        p->scan_limit[i] = v->kind == TG_JV_INT ? (n >= 1 ? n : -1) : 0;
        if (v->kind && v->kind != TG_JV_INT)
            p->scan_limits = 0; /* a null, a real, a string: read from the tree */
    }
    /* What phase_sticky reads before the conversation's opening (route.c): any of these,
     * a cache_control mark, or three messages and more. */
    p->scan_sticky = top->m[TG_JTOP_PROMPT_CACHE_KEY].kind || top->m[TG_JTOP_PREVIOUS_RESPONSE_ID].kind ||
                     top->m[TG_JTOP_METADATA].kind ||
                     (top->m[TG_JTOP_MESSAGES].kind == TG_JV_ARRAY && top->m[TG_JTOP_MESSAGES].count >= 3) ||
                     (p->req->body.len && memmem(p->req->body.data, p->req->body.len, "cache_control", 13));
    *rc = TG_OK;
    return 1;
}

int tg__phase_parse(proxy_req_t *p) {
    tg_request_t *req = p->req;
    if (!tg__is_model_route(req->route))
        return TG_OK;
    /* One pass validates the body (tg_json_scan, held to jansson's verdict by its fuzz
     * target); the tree is built only when a phase asks for it (tg__proxy_json). A body
     * the scan refuses or leaves to jansson is parsed here, for jansson's error message
     * or verdict. */
    tg_json_scan_top_t top;
    int rc, verdict = tg_json_scan(req->body.data ? req->body.data : "", req->body.len, &top);
    if (verdict == TG_JSON_VALID && parse_scanned(p, &top, &rc))
        return rc;
    json_error_t jerr;
    p->json = tg_json_loadb(req->body.data ? req->body.data : "", req->body.len, JSON_REJECT_DUPLICATES, &jerr);
    tg__cleanup_add(p, cleanup_json);
    if (!p->json) {
        char msg[256];
        snprintf(msg, sizeof(msg), "request body is not valid JSON: %s (at byte %d)", jerr.text, jerr.position);
        return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_json", msg);
    }
    p->parsed = 1;
    if (!json_is_object(p->json))
        return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_request", "request body must be a JSON object");
    /* Integers beyond int64 are kept where they are data (tool schemas, arguments); a
     * top-level parameter that big is never meaningful, and the gateway reads some. */
    const char *key;
    json_t *val;
    json_object_foreach(p->json, key, val) {
        if (tg_json_is_big(val, NULL, NULL)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "%.64s: integer out of range", key);
            return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_number", msg);
        }
    }
    json_t *model = json_object_get(p->json, "model");
    if (!model)
        return tg__proxy_fail(p, 400, "invalid_request_error", "missing_model", "you must provide a model parameter");
    if (!json_is_string(model) || json_string_length(model) == 0 ||
        json_string_length(model) >= sizeof(p->model))
        return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_model", "model must be a non-empty string");
    snprintf(p->model, sizeof(p->model), "%s", json_string_value(model));
    if (p->proto == TG_PROTO_OPENAI_CHAT || p->proto == TG_PROTO_ANTHROPIC) {
        json_t *messages = json_object_get(p->json, "messages");
        if (!json_is_array(messages))
            return tg__proxy_fail(p, 400, "invalid_request_error", "missing_messages", "messages must be an array");
    } else if (p->proto == TG_PROTO_RESPONSES) {
        json_t *input = json_object_get(p->json, "input");
        if (!json_is_string(input) && !json_is_array(input))
            return tg__proxy_fail(p, 400, "invalid_request_error", "missing_input", "input must be a string or an array");
    } else {
        json_t *input = json_object_get(p->json, "input");
        if (!json_is_string(input) && !json_is_array(input))
            return tg__proxy_fail(p, 400, "invalid_request_error", "missing_input", "input must be a string or an array");
    }
    json_t *stream = json_object_get(p->json, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream))
        return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_stream", "stream must be a boolean");
    p->stream = json_is_true(stream) && p->proto != TG_PROTO_EMBEDDINGS;
    if (p->req->route == TG_ROUTE_MESSAGES && strcmp(p->path, "/v1/messages/count_tokens") == 0) {
        /* Anthropic's count_tokens: a local estimate, no upstream call. */
        int64_t n = tg_estimate_tokens(TG_PROTO_ANTHROPIC, p->json);
        char body[64];
        int len = snprintf(body, sizeof(body), "{\"input_tokens\":%lld}", (long long)TG_MAX(n, 1));
        tg_response_send(p->req, 200, "application/json", NULL, body, (size_t)len);
        return TG_DONE;
    }
    if (p->stream && p->proto == TG_PROTO_OPENAI_CHAT) {
        /* Ask for the usage chunk; remember whether the client wanted it. */
        json_t *so = json_object_get(p->json, "stream_options");
        if (so && !json_is_object(so) && !json_is_null(so))
            return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_stream_options",
                                  "stream_options must be an object");
        if (!json_is_object(so)) {
            so = json_object();
            json_object_set_new(p->json, "stream_options", so);
        }
        if (!json_is_true(json_object_get(so, "include_usage"))) {
            p->at.strip_usage_chunk = p->strip_usage_orig = 1;
            json_object_set_new(so, "include_usage", json_true());
            p->json_dirty |= DIRTY_STREAM_OPTIONS;
        }
    }
    return TG_OK;
}

/* ---- phase: plugins (on_request, map_model) ----------------------------------------- */

/* A plugin's refusal, in the client's protocol's error shape (tg__proxy_fail_ex). The code is the
 * plugin's own text: letters, digits, '_', '-' and '.' pass, anything else becomes '_',
 * so it can stand in the JSON body unescaped. */
int tg__plugin_reject(proxy_req_t *p) {
    tg_hookctx_t *c = &p->ctx;
    int status = c->reject_status >= 400 && c->reject_status < 600 ? c->reject_status : 403;
    char code[sizeof(c->reject_code)];
    size_t n = 0;
    for (; c->reject_code[n] && n + 1 < sizeof(code); n++) {
        char ch = c->reject_code[n];
        code[n] = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                          ch == '-' || ch == '.'
                      ? ch
                      : '_';
    }
    code[n] = '\0';
    p->error = "rejected_by_plugin"; /* the access log's; code lives on this stack */
    return tg__proxy_answer_error(p, status,
                                  status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error",
                                  n ? code : "rejected", c->reject_message[0] ? c->reject_message : "rejected by policy", NULL);
}

int tg__phase_plugins(proxy_req_t *p) {
    tg_request_t *req = p->req;
    tg_plugins_t *pl = p->pw->ctx->plugins;
    if (!pl || !tg__is_model_route(req->route))
        return TG_OK;
    tg_hookctx_t *c = &p->ctx;
    tg_plugins_begin(pl, c);
    p->ctx_on = 1;
    tg__cleanup_add(p, cleanup_plugins);
    for (int i = 0; i < req->nheaders; i++)
        p->hdrs[i] = (tg_ffi_header_t){req->headers[i].name.p, req->headers[i].name.len, req->headers[i].value.p,
                                       req->headers[i].value.len};
    c->headers = p->hdrs;
    c->nheaders = req->nheaders;
    c->request_id = req->id;
    c->request_id_len = strlen(req->id);
    static const char *const routes[] = {"chat", "messages", "responses", "embeddings"};
    c->route = routes[p->proto];
    c->route_len = strlen(c->route);
    c->protocol = tg_translate_proto_name(p->proto);
    c->protocol_len = strlen(c->protocol);
    if (p->principal && p->principal->key_id) {
        tg_fmt_i64z(p->key_id_s, p->principal->key_id);
        tg_fmt_i64z(p->tenant_id_s, p->principal->tenant_id);
        c->group_len = tg_copy(c->group, sizeof(c->group), p->principal->group_name);
        tg_plugins_use_group(pl, c, p->principal->group_id, p->principal->group_plugins);
    }
    c->key_id = p->key_id_s;
    c->key_id_len = strlen(p->key_id_s);
    c->tenant_id = p->tenant_id_s;
    c->tenant_id_len = strlen(p->tenant_id_s);
    c->stream = p->stream;
    if (p->json) {
        json_t *mt = json_object_get(p->json, "max_completion_tokens");
        if (!json_is_integer(mt))
            mt = json_object_get(p->json, "max_tokens");
        c->max_tokens = json_is_integer(mt) ? json_integer_value(mt) : -1;
    } else {
        c->max_tokens = p->scan_max_tokens; /* the body was only scanned (phase_parse) */
    }
    tg_plugins_ctx_set_model(c, p->model, strlen(p->model));
    if (tg_capture_enabled())
        tg__capture_begin(p);
    if (tg_plugins_has_hook(pl, c, TG_HOOK_ON_REQUEST) && tg__hook(p, TG_HOOK_ON_REQUEST) == TG_DONE)
        return tg__plugin_reject(p);
    if (tg_plugins_has_hook(pl, c, TG_HOOK_MAP_MODEL) && tg__hook(p, TG_HOOK_MAP_MODEL) == TG_DONE)
        return tg__plugin_reject(p);
    if (c->model_len && (c->model_len != strlen(p->model) || memcmp(c->model, p->model, c->model_len) != 0)) {
        snprintf(p->model, sizeof(p->model), "%.*s", (int)c->model_len, c->model);
        json_object_set_new(tg__proxy_json(p), "model", json_string(p->model));
        p->json_dirty |= DIRTY_MODEL;
    }
    if (p->cap)
        tg__capture_model(p);
    /* The key's model restrictions apply to the model that will be served. */
    if (p->principal && !tg_principal_allows_model(p->principal, p->model))
        return tg__proxy_fail(p, 403, "permission_error", "model_not_allowed", "this API key may not use this model");
    return TG_OK;
}
