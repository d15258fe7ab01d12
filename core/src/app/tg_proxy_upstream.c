/*
 * The last phase (tg_proxy.c runs it): the request the upstream receives and the call.
 * The body goes as the client sent it, but for the members a phase changed (rewritten in
 * place), or translated when the account speaks another protocol; the output cap is
 * spelled as the upstream wants it; the head carries the account's credential, the
 * request id and the trace context (tg_proxy_trace.c). The answer comes back through the callbacks of
 * tg_proxy_relay.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tg_proxy_internal.h"

/* The upstream attempt: its request bytes, deferred answer, stream parser, translator. */
static void cleanup_attempt(proxy_req_t *p) {
    tg_buf_free(&p->upstream_req);
    tg_buf_free(&p->deferred_body);
    tg__attempt_free(&p->at);
}

/* The client's body with the members the phases changed rewritten in place (their
 * values serialised from p->json); the whole document re-serialised only when the
 * bytes cannot be edited safely. Returns a malloc'd body and its length. */
static char *patched_body(proxy_req_t *p, size_t *len) {
    const char *keys[3], *vals[3];
    char *owned[3];
    int n = 0;
    if (p->json_dirty & DIRTY_MODEL)
        keys[n++] = "model";
    if ((p->json_dirty & DIRTY_LIMIT) && p->limit_key)
        keys[n++] = p->limit_key;
    if (p->json_dirty & DIRTY_STREAM_OPTIONS)
        keys[n++] = "stream_options";
    for (int i = 0; i < n; i++) {
        if (!p->json && keys[i] == p->limit_key) {
            /* Billing's cap, written before there was a tree (money_bound): the one
             * edit that can be made without it. */
            char d[24];
            size_t k = tg_fmt_u64(d, (uint64_t)p->bound_output);
            owned[i] = malloc(k + 1);
            if (owned[i]) {
                memcpy(owned[i], d, k);
                owned[i][k] = '\0';
            }
        } else {
            owned[i] = tg_json_dumps(json_object_get(tg__proxy_json(p), keys[i]), JSON_COMPACT | JSON_ENCODE_ANY);
        }
        vals[i] = owned[i];
    }
    tg_buf_t out;
    tg_buf_init(&out);
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok = ok && vals[i];
    if (!ok || (p->json_dirty & DIRTY_WHOLE) || tg_json_set_members(p->req->body.data, p->req->body.len, keys, vals, n, &out) != TG_OK) {
        tg_buf_free(&out);
        out.data = tg_json_dumps(tg__proxy_json(p), JSON_COMPACT);
        out.len = out.data ? strlen(out.data) : 0;
    }
    for (int i = 0; i < n; i++)
        free(owned[i]);
    *len = out.len;
    return out.data;
}

/* Whether the upstream model is listed in max_tokens_models (a name, or a prefix that
 * ends in '*'). */
static int model_takes_max_tokens(const tg_config_t *cfg, const char *model) {
    for (size_t i = 0; model && i < cfg->nmax_tokens_models; i++) {
        const char *m = cfg->max_tokens_models[i];
        size_t n = strlen(m);
        if (n && m[n - 1] == '*' ? !strncmp(model, m, n - 1) : !strcmp(model, m))
            return 1;
    }
    return 0;
}

/* The one place that decides how the output cap reaches the upstream. An OpenAI chat
 * upstream gets it as max_completion_tokens (every current OpenAI chat model takes it;
 * the o-series and the gpt-5 family refuse max_tokens), or as max_tokens for a model in
 * max_tokens_models (older OpenAI-compatible servers); the other protocols have one
 * spelling. A cap the gateway wrote (billing's default, tg__phase_reserve) or translated is
 * spelled so, its value (the bound reserved) unchanged; a cap the client spelled itself
 * in a pass-through is the client's choice and goes as sent. `doc` is the translated
 * body, or p->json for a pass-through. */
static void output_cap(proxy_req_t *p, json_t *doc, int translated) {
    if (p->at.up_proto != TG_PROTO_OPENAI_CHAT)
        return;
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    /* No tree (a pass-through whose body was only scanned): the model is the client's,
     * and the cap is billing's, not yet written (patched_body writes it). */
    const char *want = model_takes_max_tokens(cfg, doc ? json_string_value(json_object_get(doc, "model")) : p->model)
                           ? "max_tokens"
                           : "max_completion_tokens";
    const char *have = translated ? "max_completion_tokens" /* the encoder's spelling */
                                  : p->cap_added ? p->limit_key : NULL;
    json_t *v = have && doc ? json_object_get(doc, have) : NULL;
    if (!have || (doc && !v) || !strcmp(have, want))
        return;
    if (v) {
        json_incref(v);
        json_object_del(doc, have);
        json_object_set_new(doc, want, v);
    }
    if (!translated) {
        /* The client's bytes may hold the old member (a null the default replaced):
         * then the body is written whole, without it. */
        char quoted[32];
        int qn = snprintf(quoted, sizeof(quoted), "\"%s\"", have);
        if (memmem(p->req->body.data ? p->req->body.data : "", p->req->body.len, quoted, (size_t)qn))
            p->json_dirty |= DIRTY_WHOLE;
        p->limit_key = want;
    }
}

/* ---- identities: the account's access token (tg_identity.h) ----------------------------- */

static void cleanup_id_wait(proxy_req_t *p) {
    tg_identity_cancel(p->id_wait);
    p->id_wait = NULL;
}

/* The account's token could not be renewed: the refresh marked and cooled it for the
 * fleet; here it cools at once, and the request moves to another account if any. */
static int identity_failed(proxy_req_t *p, const char *why) {
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    tg_health_cool(tg_health_get(p->pw->ctx->health, p->at.account->id), (int64_t)tg_wall_ms(),
                   cfg->routing.cooldown_auth_ms);
    tg_log_warn("request %s: account %s: no access token (%s)", p->req->id, p->at.account->name, why);
    if (tg__maybe_retry(p, 0, TG_UPFAIL_CONNECT, -1))
        return TG_AGAIN;
    char msg[256];
    snprintf(msg, sizeof(msg), "the upstream account's credentials could not be renewed (%s)", why);
    return tg__proxy_fail(p, 502, "upstream_error", "upstream_auth_failed", msg);
}

static void identity_cb(void *ud, const char *token, const char *err) {
    TG_UNUSED(token);
    proxy_req_t *p = ud;
    p->id_wait = NULL;
    if (err) {
        identity_failed(p, err);
        return;
    }
    p->phase = PH_UPSTREAM;
    tg__proxy_run(p);
}

int tg__auth_retry(proxy_req_t *p) {
    if (!tg__auth_retry_possible(p, 401))
        return 0;
    p->auth_retried = 1;
    tg_identity_rejected(p->pw->ctx->identity, p->at.account->id, p->at.token_gen);
    if (p->at.health) {
        tg_health_end(p->at.health, 1, -1); /* a stale token is not the account's failure */
        p->at.health = NULL;
    }
    const tg_account_t *acc = p->at.account;
    tg_upstream_t *up = p->at.up;
    tg_proto_t proto = p->at.up_proto;
    tg__attempt_reset(p);
    p->at.account = acc;
    p->at.up = up;
    p->at.up_proto = proto;
    p->error = NULL;
    tg_log_info("request %s: account %s: the upstream refused its access token (401): renewed, calling again",
                p->req->id, acc->name);
    tg__run_phase_later(p, PH_UPSTREAM, 0);
    return 1;
}

/* Appends s to a URL path as one segment ('@' kept: Vertex's model versions). */
static int path_segment(char *out, size_t cap, int n, const char *s) {
    for (const char *c = s ? s : ""; *c && n < (int)cap - 4; c++) {
        unsigned char ch = (unsigned char)*c;
        int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                    ch == '_' || ch == '.' || ch == '@';
        n += snprintf(out + n, cap - (size_t)n, plain ? "%c" : "%%%02X", ch);
    }
    return n;
}

/* Claude on Vertex AI: the Messages body without "model" (it is in the URL) and with
 * anthropic_version in the body. `doc` is changed (a translation) or copied (the
 * client's tree, which a retry on another account still needs). */
static char *vertex_anthropic_body(json_t *doc, int owned) {
    json_t *d = owned ? json_incref(doc) : json_copy(doc);
    json_object_del(d, "model");
    json_object_set_new(d, "anthropic_version", json_string(TG_VERTEX_ANTHROPIC_VERSION));
    char *s = tg_json_dumps(d, JSON_COMPACT);
    json_decref(d);
    return s;
}

int tg__phase_upstream(proxy_req_t *p) {
    tg_request_t *req = p->req;
    tg_upstream_t *u = p->at.up;
    const tg_account_t *acc = p->at.account;
    if (acc && acc->auth) {
        /* The account's access token: this worker's while it is valid, else the wait for
         * its refresh (which resumes this phase). */
        const char *tok = NULL;
        tg_identity_wait_t *w = NULL;
        int rc = p->pw->ctx->identity ? tg_identity_token(p->pw->ctx->identity, acc, identity_cb, p, &tok,
                                                           &p->at.token_gen, &w)
                                      : TG_ERROR;
        if (rc == TG_AGAIN) {
            p->id_wait = w;
            tg__cleanup_add(p, cleanup_id_wait);
            return TG_AGAIN;
        }
        if (rc != TG_OK)
            return identity_failed(p, tok ? tok : "no identity module");
        p->at.credential = tok;
    }
    int vertex = acc && !strcmp(acc->provider, "vertex");
    int bedrock = acc && !strcmp(acc->provider, "bedrock");
    /* The credential becomes a header line: one with CR, LF or another control byte is
     * never sent (the admin API, apply, the config and the account loader refuse it
     * first; this is the last line). The URL's parts were checked by tg_upstream_create. */
    if (p->at.credential && tg_valid_no_ctl(p->at.credential, strlen(p->at.credential))) {
        atomic_fetch_add_explicit(&req->worker->metrics.upstream_refused, 1, memory_order_relaxed);
        tg_log_error("request %s: account %lld: the credential holds a control character; the request is not sent",
                     req->id, p->at.account ? (long long)p->at.account->id : 0LL);
        return tg__proxy_fail(p, 502, "server_error", "upstream_request_refused",
                              "the gateway refused to send this request upstream: its account's credential holds characters "
                              "not allowed in an HTTP header");
    }
    if (p->trace)
        tg__trace_attempt_start(p); /* this attempt's span is the upstream's parent */
    else if (!tg_trace_enabled() && p->attempt == 1)
        tg__trace_pass(p);
    char *body = NULL;
    size_t body_len = 0;
    const char *method = "GET";
    const char *suffix = "/models";
    char gpath[512];
    if (tg__is_model_route(req->route)) {
        method = "POST";
        suffix = tg_translate_path(p->at.up_proto);
        if (bedrock) {
            /* Bedrock: the modelId (the model as mapped) and the operation in the path. */
            tg_buf_t bp;
            tg_buf_init(&bp);
            tg_bedrock_path(&bp, json_string_value(json_object_get(tg__proxy_json(p), "model")), p->stream);
            snprintf(gpath, sizeof(gpath), "%.*s", (int)bp.len, bp.data ? bp.data : "");
            tg_buf_free(&bp);
            suffix = gpath;
        } else if (p->at.account && !strcmp(p->at.account->provider, "azure")) {
            /* Azure OpenAI: the deployment (the model as mapped) and the api-version in
             * the URL; the path prefix is the resource's (".../openai"). */
            const char *dep = json_string_value(json_object_get(tg__proxy_json(p), "model"));
            int n = snprintf(gpath, sizeof(gpath), "/deployments/");
            for (const char *c = dep ? dep : ""; *c && n < (int)sizeof(gpath) - 4; c++) {
                unsigned char ch = (unsigned char)*c;
                int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                            ch == '-' || ch == '_' || ch == '.';
                n += snprintf(gpath + n, sizeof(gpath) - (size_t)n, plain ? "%c" : "%%%02X", ch);
            }
            snprintf(gpath + n, sizeof(gpath) - (size_t)n, "%s?api-version=%s", suffix,
                     tg_account_setting(p->at.account, "api_version", TG_AZURE_API_VERSION));
            suffix = gpath;
        } else if (vertex) {
            /* Vertex AI: the project, the region and the model in the path; Claude through
             * rawPredict / streamRawPredict, Gemini through generateContent. */
            int claude = p->at.up_proto == TG_PROTO_ANTHROPIC;
            int n = snprintf(gpath, sizeof(gpath), "/v1/projects/");
            n = path_segment(gpath, sizeof(gpath), n, tg_account_setting(acc, "project", ""));
            n += snprintf(gpath + n, sizeof(gpath) - (size_t)n, "/locations/");
            n = path_segment(gpath, sizeof(gpath), n, tg_account_setting(acc, "region", "global"));
            n += snprintf(gpath + n, sizeof(gpath) - (size_t)n, "/publishers/%s/models/", claude ? "anthropic" : "google");
            n = path_segment(gpath, sizeof(gpath), n, json_string_value(json_object_get(tg__proxy_json(p), "model")));
            snprintf(gpath + n, sizeof(gpath) - (size_t)n, "%s",
                     claude ? (p->stream ? ":streamRawPredict" : ":rawPredict")
                            : (p->stream ? ":streamGenerateContent?alt=sse" : ":generateContent"));
            suffix = gpath;
        } else if (p->at.up_proto == TG_PROTO_GEMINI) {
            /* Gemini's model and method are in the path (the model mapped already). */
            tg_buf_t gp;
            tg_buf_init(&gp);
            tg_translate_gemini_path(json_string_value(json_object_get(tg__proxy_json(p), "model")), p->stream, &gp);
            snprintf(gpath, sizeof(gpath), "%.*s", (int)gp.len, gp.data ? gp.data : "");
            tg_buf_free(&gp);
            suffix = gpath;
        }
        if (p->at.up_proto != p->proto) {
            /* Another protocol upstream: the request is translated (the model already
             * mapped for the account is in p->json). */
            json_t *out = NULL;
            char err[256];
            json_t *m = json_object_get(tg__proxy_json(p), "model");
            if (tg_translate_request(p->proto, p->at.up_proto, p->json, json_string_value(m), &out, err, sizeof(err)) !=
                TG_OK)
                return tg__proxy_fail(p, 400, "invalid_request_error", "untranslatable_request", err);
            output_cap(p, out, 1);
            body = bedrock                                      ? tg_bedrock_body(out)
                   : vertex && p->at.up_proto == TG_PROTO_ANTHROPIC ? vertex_anthropic_body(out, 1)
                                                                  : tg_json_dumps(out, JSON_COMPACT);
            json_decref(out);
        } else if (bedrock) {
            /* InvokeModel's body: the Messages body without model and stream. */
            body = tg__proxy_json(p) ? tg_bedrock_body(p->json) : NULL;
            if (!body)
                return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_request", "the request body could not be read");
        } else if (vertex && p->at.up_proto == TG_PROTO_ANTHROPIC) {
            body = tg__proxy_json(p) ? vertex_anthropic_body(p->json, 0) : NULL;
            if (!body)
                return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_request", "the request body could not be read");
        } else {
            if (p->cap_added)
                output_cap(p, p->json, 0);
            if (p->json_dirty)
                body = patched_body(p, &body_len);
        }
        if (body && !body_len)
            body_len = strlen(body);
    }
    tg_buf_t *b = &p->upstream_req;
    tg__cleanup_add(p, cleanup_attempt);
    tg_buf_reset(b);
    /* Appends, not printf: this head is built for every upstream call. */
    tg_buf_appends(b, method);
    tg_buf_appends(b, " ");
    tg_buf_appends(b, tg_upstream_path_prefix(u));
    tg_buf_appends(b, suffix);
    tg_buf_appends(b, " HTTP/1.1\r\nHost: ");
    tg_buf_appends(b, tg_upstream_host_header(u));
    if (bedrock) {
        /* Signature Version 4 over the path, host, content type, date and body. */
        tg_aws_creds_t cr;
        tg_aws_creds_split(p->at.credential, &cr);
        cr.region = tg_account_setting(acc, "region", "");
        cr.access_key = tg_account_setting(acc, "access_key_id", "");
        char path[1024];
        snprintf(path, sizeof(path), "%s%s", tg_upstream_path_prefix(u), suffix);
        tg_bedrock_sign(b, &cr, tg_upstream_host_header(u), path, body ? body : req->body.data,
                        body ? body_len : req->body.len, time(NULL));
    } else if (p->at.credential && acc && acc->auth) {
        /* An identity's access token; Claude on Vertex has its version in the body. */
        tg_buf_appends(b, "\r\nAuthorization: Bearer ");
        tg_buf_appends(b, p->at.credential);
        if (p->at.up_proto == TG_PROTO_ANTHROPIC && !vertex)
            tg_buf_appends(b, "\r\nanthropic-version: 2023-06-01");
    } else if (p->at.credential && p->at.up_proto == TG_PROTO_ANTHROPIC) {
        tg_buf_appends(b, "\r\nx-api-key: ");
        tg_buf_appends(b, p->at.credential);
        tg_buf_appends(b, "\r\nanthropic-version: 2023-06-01");
    } else if (p->at.credential && p->at.account && !strcmp(p->at.account->provider, "azure")) {
        tg_buf_appends(b, "\r\napi-key: ");
        tg_buf_appends(b, p->at.credential);
    } else if (p->at.credential && p->at.up_proto == TG_PROTO_GEMINI) {
        tg_buf_appends(b, "\r\nx-goog-api-key: ");
        tg_buf_appends(b, p->at.credential);
    } else if (p->at.credential) {
        tg_buf_appends(b, "\r\nAuthorization: Bearer ");
        tg_buf_appends(b, p->at.credential);
    }
    tg_buf_appends(b, "\r\nx-request-id: ");
    tg_buf_appends(b, req->id);
    if (p->traceparent[0]) {
        tg_buf_appends(b, "\r\ntraceparent: ");
        tg_buf_appends(b, p->traceparent);
        if (p->tracestate) {
            tg_buf_appends(b, "\r\ntracestate: ");
            tg_buf_append(b, p->tracestate->p, p->tracestate->len);
        }
    }
    if (method[0] == 'P') {
        const char *src = body ? body : req->body.data;
        size_t len = body ? body_len : req->body.len;
        tg_buf_appends(b, !p->stream ? "\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: "
                          : bedrock  ? "\r\nContent-Type: application/json\r\nAccept: application/vnd.amazon.eventstream"
                                       "\r\nContent-Length: "
                                     : "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: ");
        tg_buf_append_u64(b, len);
        tg_buf_appends(b, "\r\n\r\n");
        tg_buf_append(b, src, len);
    } else {
        tg_buf_appends(b, "\r\nAccept: application/json\r\n\r\n");
    }
    free(body);
    p->upstream_start_ns = tg_now_ns();
    if (p->trace && p->attempt <= TG_TRACE_ATTEMPTS)
        p->trace->at[p->attempt - 1].start = p->upstream_start_ns;
    if (p->at.account) {
        p->at.health = tg_health_get(p->pw->ctx->health, p->at.account->id);
        tg_health_begin(p->at.health);
    }
    p->at.call = tg_upcall_start(u, b, &tg__up_cbs, p);
    return TG_AGAIN;
}
