/*
 * The admin API's account extras (see tg_admin_accounts.h).
 *
 * An account test runs on the worker that got the admin request, through the account
 * of that worker's snapshot: its upstream client (pool, TLS, timeouts), its opened
 * credential and its model map, exactly as a client request would be sent, but
 * outside selection, limits, health and billing (it takes none of the account's
 * concurrency and cools nothing down). An account written a moment ago may not be in
 * the snapshot yet: the test asks for a reload and waits for the next snapshot
 * (bounded), then answers 404 if the account still is not there.
 */
#include "tollgate/tg_admin_accounts.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tollgate/tg_accounts.h"
#include "tollgate/tg_aws.h"
#include "tollgate/tg_identity.h"
#include "tollgate/tg_translate.h"
#include "tollgate/tg_upstream.h"
#include "tollgate/tg_valid.h"
#include "tollgate/tg_worker.h"

enum {
    TEST_BODY_MAX = 4096,      /* the admin request's body */
    TEST_KEEP = 8192,          /* the upstream answer kept for the report */
    TEST_WAIT_STEP_MS = 100,   /* polling for an account not loaded yet */
    TEST_WAIT_STEPS = 30,
};

struct tg_acctest_s {
    tg_request_t *req;
    tg_acctest_t **slot;
    int64_t id;
    uint64_t generation; /* of the snapshot that lacked the account */
    int waits;
    uv_timer_t *timer;   /* freed in its close callback */
    tg_snapshot_t *snap; /* retained while the call runs */
    tg_identity_wait_t *idw; /* waiting for the account's access token */
    uint64_t token_gen;      /* the token sent (tg_identity_rejected) */
    int auth_retried;        /* a 401 to it was answered with a renewed token once */
    tg_upcall_t *call;
    char model[300];
    char upstream_model[300];
    char path[768];
    uint64_t t0, t_head;
    int status;
    tg_buf_t answer;
};

static void timer_close_cb(uv_handle_t *h) { free(h); }

static void test_free(tg_acctest_t *t) {
    if (t->timer) {
        uv_timer_stop(t->timer);
        uv_close((uv_handle_t *)t->timer, timer_close_cb);
    }
    if (t->call)
        tg_upcall_abort(t->call);
    tg_identity_cancel(t->idw);
    tg_snapshot_release(t->snap);
    tg_buf_free(&t->answer);
    free(t);
}

/* Detaches the test from its request and answers with an admin error. */
static void test_fail(tg_acctest_t *t, int status, const char *code, const char *msg) {
    tg_request_t *req = t->req;
    *t->slot = NULL;
    test_free(t);
    tg_response_error(req, status, status >= 500 ? "server_error" : "invalid_request_error", code, msg);
}

void tg_acctest_abort(tg_acctest_t *t) {
    if (t) {
        *t->slot = NULL;
        test_free(t);
    }
}

static double ms_since(uint64_t t0, uint64_t t1) { return t1 > t0 ? (double)(t1 - t0) / 1e6 : 0; }

/* The upstream's error message out of its answer (OpenAI and Anthropic both put it at
 * error.message; some servers send error as a string, or message alone), else NULL. */
static json_t *upstream_message(json_t *j) {
    json_t *e = json_object_get(j, "error");
    if (json_is_string(e))
        return json_incref(e);
    json_t *m = json_object_get(e, "message");
    if (json_is_string(m))
        return json_incref(m);
    m = json_object_get(j, "message");
    return json_is_string(m) ? json_incref(m) : NULL;
}

/* The answer's text for a 2xx (chat choices[0].message.content, Messages content[0].text). */
static json_t *upstream_reply(json_t *j) {
    json_t *c = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content");
    if (!json_is_string(c))
        c = json_object_get(json_array_get(json_object_get(j, "content"), 0), "text");
    return json_is_string(c) ? json_incref(c) : NULL;
}

/* Answers the admin request with the report; errkind/errmsg for a call that got no
 * answer (connect, timeout, reset). */
static void test_report(tg_acctest_t *t, const char *errkind, const char *errmsg) {
    uint64_t now = tg_now_ns();
    const tg_account_t *acc = tg_snapshot_account(t->snap, t->id);
    json_t *r = json_object();
    json_object_set_new(r, "account_id", json_integer(t->id));
    json_object_set_new(r, "account", json_string(acc && acc->name ? acc->name : ""));
    json_object_set_new(r, "model", json_string(t->model));
    json_object_set_new(r, "upstream_model", json_string(t->upstream_model));
    json_object_set_new(r, "path", json_string(t->path));
    int ok = !errkind && t->status >= 200 && t->status < 300;
    json_object_set_new(r, "ok", json_boolean(ok));
    json_object_set_new(r, "status", t->status ? json_integer(t->status) : json_null());
    json_object_set_new(r, "first_byte_ms", t->t_head ? json_real(ms_since(t->t0, t->t_head)) : json_null());
    json_object_set_new(r, "total_ms", json_real(ms_since(t->t0, now)));
    json_t *parsed = t->answer.len ? json_loadb(t->answer.data, t->answer.len, 0, NULL) : NULL;
    if (errkind) {
        json_t *e = json_object();
        json_object_set_new(e, "kind", json_string(errkind));
        json_object_set_new(e, "message", json_string(errmsg ? errmsg : errkind));
        json_object_set_new(r, "error", e);
    } else if (!ok) {
        json_t *e = json_object();
        json_t *m = upstream_message(parsed);
        json_object_set_new(e, "kind", json_string("upstream"));
        if (!m) {
            char text[160];
            snprintf(text, sizeof(text), "the upstream answered HTTP %d", t->status);
            m = json_string(text);
        }
        json_object_set_new(e, "message", m ? m : json_string("the upstream's answer has no readable message"));
        json_object_set_new(r, "error", e);
    } else {
        json_object_set_new(r, "error", json_null());
        json_t *reply = upstream_reply(parsed);
        json_object_set_new(r, "reply", reply ? reply : json_null());
    }
    if (!ok && t->answer.len) {
        /* The raw answer, cut to 1 KiB and to valid UTF-8 (json_stringn refuses the rest). */
        size_t n = t->answer.len < 1024 ? t->answer.len : 1024;
        json_t *body = NULL;
        while (n > 0 && !(body = json_stringn(t->answer.data, n)))
            n--;
        json_object_set_new(r, "body", body ? body : json_null());
    }
    json_decref(parsed);
    char *s = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    tg_request_t *req = t->req;
    *t->slot = NULL;
    t->call = NULL; /* ended: the callbacks say so */
    test_free(t);
    tg_response_send(req, 200, "application/json", "Cache-Control: no-store\r\n", s, strlen(s));
    free(s);
}

static void up_head(void *ud, const tg_uphead_t *h) {
    tg_acctest_t *t = ud;
    t->status = h->status;
    t->t_head = tg_now_ns();
}

static void up_body(void *ud, const char *p, size_t n) {
    tg_acctest_t *t = ud;
    if (t->answer.len < TEST_KEEP)
        tg_buf_append(&t->answer, p, n < TEST_KEEP - t->answer.len ? n : TEST_KEEP - t->answer.len);
}

static void test_start(tg_acctest_t *t, const tg_account_t *acc);

static void up_done(void *ud) {
    tg_acctest_t *t = ud;
    const tg_account_t *acc = tg_snapshot_account(t->snap, t->id);
    if (t->status == 401 && acc && acc->auth && !t->auth_retried && t->req->worker->ctx->identity) {
        /* The token was refused (revoked, or the issuer forgot it): renewed once, as a
         * client request would be. */
        t->auth_retried = 1;
        t->call = NULL;
        t->status = 0;
        t->t_head = 0;
        tg_buf_reset(&t->answer);
        tg_identity_rejected(t->req->worker->ctx->identity, t->id, t->token_gen);
        test_start(t, acc);
        return;
    }
    test_report(t, NULL, NULL);
}

static void up_error(void *ud, tg_uperr_t err, const char *msg) {
    const char *kind = err == TG_UPERR_CONNECT                ? "connect"
                       : err == TG_UPERR_TIMEOUT_CONNECT      ? "connect_timeout"
                       : err == TG_UPERR_TIMEOUT_FIRST_BYTE   ? "first_byte_timeout"
                       : err == TG_UPERR_TIMEOUT_IDLE         ? "idle_timeout"
                       : err == TG_UPERR_RESET                ? "reset"
                                                              : "protocol";
    tg_acctest_t *t = ud;
    if (!t->t_head)
        t->status = 0;
    test_report(t, kind, msg);
}

static const tg_upcall_cbs_t up_cbs = {up_head, up_body, up_done, up_error};

/* Sends the request through the account (found in t->snap) with its credential: the
 * stored key, or an identity's access token. */
static void test_send(tg_acctest_t *t, const tg_account_t *acc, const char *credential) {
    if (!acc->upstream) {
        test_fail(t, 409, "account_unusable", "the gateway has no upstream client for this account's base_url");
        return;
    }
    if (!t->model[0]) {
        const char *m = acc->nmodels > 0 ? acc->models[0] : NULL;
        if (!m && json_object_size(acc->model_map) > 0)
            m = json_object_iter_key(json_object_iter(acc->model_map));
        if (!m) {
            test_fail(t, 400, "invalid_request",
                      "field \"model\" is required: this account lists no models, so name one to test with");
            return;
        }
        snprintf(t->model, sizeof(t->model), "%s", m);
    }
    snprintf(t->upstream_model, sizeof(t->upstream_model), "%s", tg_account_map_model(acc, t->model));
    int vertex = acc->provider && !strcmp(acc->provider, "vertex");
    int anthropic = acc->provider && (!strcmp(acc->provider, "anthropic") || (vertex && !strncmp(t->upstream_model, "claude", 6)));
    int gemini = acc->provider && (!strcmp(acc->provider, "gemini") || (vertex && !anthropic));
    int azure = acc->provider && !strcmp(acc->provider, "azure");
    int bedrock = acc->provider && !strcmp(acc->provider, "bedrock");
    anthropic |= bedrock; /* Bedrock's InvokeModel takes the Messages body */
    json_t *body = json_object();
    if (vertex && anthropic) {
        json_object_set_new(body, "anthropic_version", json_string(TG_VERTEX_ANTHROPIC_VERSION));
        json_object_set_new(body, "messages",
                            json_pack("[{s:s,s:s}]", "role", "user", "content", "Reply with the word OK."));
        json_object_set_new(body, "max_tokens", json_integer(8));
    } else if (gemini) {
        json_object_set_new(body, "contents",
                            json_pack("[{s:s,s:[{s:s}]}]", "role", "user", "parts", "text", "Reply with the word OK."));
        json_object_set_new(body, "generationConfig", json_pack("{s:i}", "maxOutputTokens", 8));
    } else {
        json_object_set_new(body, "model", json_string(t->upstream_model));
        json_t *msgs = json_array();
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", "Reply with the word OK."));
        json_object_set_new(body, "messages", msgs);
        json_object_set_new(body, anthropic ? "max_tokens" : "max_completion_tokens", json_integer(8));
    }
    char *text = bedrock ? tg_bedrock_body(body) : json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (vertex) {
        snprintf(t->path, sizeof(t->path), "/v1/projects/%s/locations/%s/publishers/%s/models/%s:%s",
                 tg_account_setting(acc, "project", ""), tg_account_setting(acc, "region", "global"),
                 anthropic ? "anthropic" : "google", t->upstream_model, anthropic ? "rawPredict" : "generateContent");
    } else if (gemini) {
        tg_buf_t gp;
        tg_buf_init(&gp);
        tg_translate_gemini_path(t->upstream_model, 0, &gp);
        snprintf(t->path, sizeof(t->path), "%.*s", (int)gp.len, gp.data ? gp.data : "");
        tg_buf_free(&gp);
    } else if (bedrock) {
        tg_buf_t bp;
        tg_buf_init(&bp);
        tg_bedrock_path(&bp, t->upstream_model, 0);
        snprintf(t->path, sizeof(t->path), "%.*s", (int)bp.len, bp.data ? bp.data : "");
        tg_buf_free(&bp);
    } else if (azure) {
        snprintf(t->path, sizeof(t->path), "/deployments/%s/chat/completions?api-version=%s", t->upstream_model,
                 tg_account_setting(acc, "api_version", TG_AZURE_API_VERSION));
    } else {
        snprintf(t->path, sizeof(t->path), "%s", anthropic ? "/messages" : "/chat/completions");
    }
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_printf(&b, "POST %s%s HTTP/1.1\r\nHost: %s", tg_upstream_path_prefix(acc->upstream), t->path,
                  tg_upstream_host_header(acc->upstream));
    if (bedrock) {
        tg_aws_creds_t cr;
        tg_aws_creds_split(acc->credential, &cr);
        cr.region = tg_account_setting(acc, "region", "");
        cr.access_key = tg_account_setting(acc, "access_key_id", "");
        char path[1024];
        snprintf(path, sizeof(path), "%s%s", tg_upstream_path_prefix(acc->upstream), t->path);
        tg_bedrock_sign(&b, &cr, tg_upstream_host_header(acc->upstream), path, text, strlen(text), time(NULL));
    } else if (credential && acc->auth)
        tg_buf_printf(&b, "\r\nAuthorization: Bearer %s%s", credential,
                      anthropic && !vertex ? "\r\nanthropic-version: 2023-06-01" : "");
    else if (credential && anthropic)
        tg_buf_printf(&b, "\r\nx-api-key: %s\r\nanthropic-version: 2023-06-01", credential);
    else if (credential && gemini)
        tg_buf_printf(&b, "\r\nx-goog-api-key: %s", credential);
    else if (credential && azure)
        tg_buf_printf(&b, "\r\napi-key: %s", credential);
    else if (credential)
        tg_buf_printf(&b, "\r\nAuthorization: Bearer %s", credential);
    tg_buf_printf(&b, "\r\nx-request-id: %s\r\nContent-Type: application/json\r\nAccept: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n%s",
                  t->req->id, strlen(text), text);
    free(text);
    t->t0 = tg_now_ns();
    t->call = tg_upcall_start(acc->upstream, &b, &up_cbs, t);
    tg_buf_free(&b);
}

static void test_try(tg_acctest_t *t);

static void wait_cb(uv_timer_t *h) { test_try(h->data); }

/* The account's access token came (or could not be obtained): asked for again, so that
 * t->token_gen names the token sent (a 401 to it must reject that one, else the retry
 * sends it again). */
static void token_cb(void *ud, const char *token, const char *err) {
    tg_acctest_t *t = ud;
    t->idw = NULL;
    const tg_account_t *acc = tg_snapshot_account(t->snap, t->id);
    if (err || !token || !acc) {
        char msg[256];
        snprintf(msg, sizeof(msg), "the account's access token could not be obtained: %s", err ? err : "no token");
        test_fail(t, 409, "account_auth_failed", msg);
        return;
    }
    test_start(t, acc);
}

/* Sends with the stored key, or first obtains the identity's token (tg_identity.h). */
static void test_start(tg_acctest_t *t, const tg_account_t *acc) {
    if (!acc->auth) {
        test_send(t, acc, acc->credential);
        return;
    }
    const char *tok = NULL;
    tg_identity_t *id = t->req->worker->ctx->identity;
    int rc = id ? tg_identity_token(id, acc, token_cb, t, &tok, &t->token_gen, &t->idw) : TG_ERROR;
    if (rc == TG_OK)
        test_send(t, acc, tok);
    else if (rc != TG_AGAIN)
        token_cb(t, NULL, tok ? tok : "no identity module");
}

/* Looks for the account in the worker's current snapshot; waits for a newer one when it
 * is missing (created a moment ago), at most TEST_WAIT_STEPS times. */
static void test_try(tg_acctest_t *t) {
    tg_accounts_t *accounts = t->req->worker->ctx->accounts;
    tg_snapshot_t *s = tg_accounts_snapshot(accounts);
    const char *broken = tg_snapshot_broken(s, t->id);
    const tg_account_t *acc = tg_snapshot_account(s, t->id);
    if (broken && !acc) {
        char msg[640];
        snprintf(msg, sizeof(msg), "the gateway cannot use this account: %s", broken);
        tg_snapshot_release(s);
        test_fail(t, 409, "account_unusable", msg);
        return;
    }
    if (acc) {
        t->snap = s;
        test_start(t, acc);
        return;
    }
    uint64_t gen = tg_snapshot_generation(s);
    tg_snapshot_release(s);
    if (t->waits == 0) {
        t->generation = gen;
        tg_accounts_refresh(accounts);
    } else if (gen != t->generation || t->waits >= TEST_WAIT_STEPS) {
        test_fail(t, 404, "not_found", "no such account");
        return;
    }
    t->waits++;
    if (!t->timer) {
        t->timer = malloc(sizeof(*t->timer));
        uv_timer_init(&t->req->worker->loop, t->timer);
        t->timer->data = t;
    }
    uv_timer_start(t->timer, wait_cb, TEST_WAIT_STEP_MS, 0);
}

void tg_acctest_start(tg_request_t *req, int64_t id, tg_acctest_t **slot) {
    *slot = NULL;
    if (!req->worker->ctx->accounts) {
        tg_response_error(req, 503, "server_error", "database_unavailable",
                          "no database is configured (postgres / TOLLGATE_PG): there are no accounts to test");
        return;
    }
    char model[300] = "";
    if (req->body.len > TEST_BODY_MAX) {
        tg_response_error(req, 400, "invalid_request_error", "invalid_request",
                          "the body is larger than 4096 bytes: send {} or {\"model\": \"<name>\"}");
        return;
    }
    if (req->body.len > 0) {
        json_error_t jerr;
        json_t *body = json_loadb(req->body.data, req->body.len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
        char msg[400];
        const char *bad = NULL;
        if (!body) {
            snprintf(msg, sizeof(msg), "the body is not valid JSON: %s", jerr.text);
            tg_response_error(req, 400, "invalid_request_error", "invalid_json", msg);
            return;
        }
        const char *k;
        json_t *v;
        if (!json_is_object(body))
            bad = "the body must be a JSON object: {} or {\"model\": \"<name>\"}";
        else
            json_object_foreach(body, k, v) {
                if (strcmp(k, "model") != 0) {
                    bad = "unknown field: the body takes only \"model\"";
                    break;
                }
                const char *why = json_is_string(v) ? tg_valid_model(json_string_value(v), json_string_length(v))
                                                    : "must be a string";
                if (why) {
                    snprintf(msg, sizeof(msg), "field \"model\" %s (a model name of 1 to 256 bytes)", why);
                    bad = msg;
                    break;
                }
                snprintf(model, sizeof(model), "%s", json_string_value(v));
            }
        json_decref(body);
        if (bad) {
            tg_response_error(req, 400, "invalid_request_error", "invalid_request", bad);
            return;
        }
    }
    tg_acctest_t *t = calloc(1, sizeof(*t));
    t->req = req;
    t->slot = slot;
    t->id = id;
    snprintf(t->model, sizeof(t->model), "%s", model);
    tg_buf_init(&t->answer);
    *slot = t;
    test_try(t);
}

/* ---- problems ------------------------------------------------------------------------- */

static void annotate_one(const tg_snapshot_t *s, json_t *acc) {
    json_t *id = json_object_get(acc, "id");
    if (!json_is_integer(id))
        return;
    const char *why = tg_snapshot_broken(s, json_integer_value(id));
    json_object_set_new(acc, "problem", why ? json_string(why) : json_null());
}

char *tg_admin_accounts_annotate(tg_request_t *req, const char *json, size_t n) {
    tg_snapshot_t *s = tg_accounts_snapshot(req->worker->ctx->accounts);
    if (!s)
        return NULL;
    json_t *j = json_loadb(json, n, 0, NULL);
    json_t *data = json_object_get(j, "data");
    if (json_is_array(data)) {
        size_t i;
        json_t *acc;
        json_array_foreach(data, i, acc) annotate_one(s, acc);
    } else if (json_is_object(j)) {
        annotate_one(s, j);
    }
    tg_snapshot_release(s);
    char *out = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return out;
}
