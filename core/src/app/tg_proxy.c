/*
 * The data-plane pipeline (tg_proxy.h): a request to a /v1/ route, routed here by
 * app/tg_router.c, walks the phases of phases[] below (nginx-style), then is settled and
 * logged when its response ends.
 *
 *   auth -> parse -> plugins (on_request, map_model) -> sticky -> select (account) ->
 *   admit (limits and the first attempt's money, one Redis script, with the chosen
 *   account's slot script behind it in the same write) -> slot (the account's
 *   concurrency lease: that answer, or another account's) -> reserve (money of a later
 *   attempt) -> upstream (the call; the answer streamed back as it arrives, translated
 *   when the protocols differ) -> on_finish (release, price and on_log hooks,
 *   settlement, access log, metrics)
 *
 * Each phase returns TG_OK to go on, TG_DONE when it answered the request, or TG_AGAIN
 * when it started asynchronous work (a key lookup, admission in Redis, a slot lease, a
 * balance load) whose callback calls tg__proxy_run() again. A retry (another account, or
 * the same after a delay) runs the phases again from select. The subsystems it calls
 * are its worker's (tg_worker.h), built and torn down by app/tg_worker.c.
 *
 * The pipeline's files, in the order a request meets them (tg_proxy_internal.h holds
 * the request state they share):
 *
 *   tg_proxy.c           this file: the per-worker part, a request's state from
 *                        allocation to free (the cleanups), the phase table and its
 *                        driver, the entry points, the gateway's own error answers in
 *                        the client's protocol's shape
 *   tg_proxy_intake.c    phases auth, parse, plugins: who calls and what they ask
 *   tg_proxy_route.c     phases sticky, select, slot: the account; and the retry
 *                        loop (tg__maybe_retry) that sends a failed attempt back to select
 *   tg_proxy_admit.c     phases admit and reserve: limits and money before the call
 *   tg_proxy_upstream.c  phase upstream: the request the upstream receives, the call
 *   tg_proxy_models.c    GET /v1/models: the group's accounts' lists, merged and
 *                        cached, in the client's shape
 *   tg_proxy_relay.c     the answer on its way back (streamed, translated, deferred
 *                        for a retry) and a client that leaves or reads slowly
 *   tg_proxy_settle.c    the end (tg__on_finish): releases, hooks, what is billed,
 *                        the access log
 *   tg_proxy_capture.c   beside them all: tg__hook runs a plugin hook, and records it
 *                        with the request's context when the capture sampled it
 *   tg_proxy_trace.c     beside them all too: the W3C trace context, and a sampled
 *                        request's OpenTelemetry spans marked as the phases pass
 */
#include <stdio.h>
#include <stdlib.h>

#include "tg_proxy_internal.h"

/* The account's own concurrency slot: KEYS[1] {a:<id>}:conc; ARGV id, limit, ttl_ms.
 * Expired slots (a gateway that died holding them) are swept only when the set looks
 * full, as admit.lua does for leases: a set below its limit admits without the sweep
 * (was a ZREMRANGEBYSCORE and a ZSCORE on every request). Like the lease sets, the set
 * has no TTL: its last ZREM deletes it (was a PEXPIRE on every request). */
static const char SLOT_LUA[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local limit = tonumber(ARGV[2])\n"
    "if redis.call('ZCARD', KEYS[1]) >= limit then\n"
    "  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "  if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= limit then return 0 end\n"
    "end\n"
    "redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])\n"
    "return 1\n";

/* ---- per-worker state --------------------------------------------------------------- */

tg_proxy_worker_t *tg_proxy_worker_create(tg_worker_ctx_t *wc) {
    proxy_worker_t *pw = calloc(1, sizeof(*pw));
    pw->ctx = wc;
    pw->sha = EVP_MD_CTX_new();
    tg_redis_t *redis = tg_state_redis(wc->state);
    if (redis) {
        pw->slot_script = tg_redis_script_register(redis, SLOT_LUA);
    }
    return pw;
}

void tg_proxy_worker_destroy(tg_proxy_worker_t *pw) {
    if (!pw)
        return;
    EVP_MD_CTX_free(pw->sha);
    OPENSSL_cleanse(pw->digests, sizeof(pw->digests));
    tg__models_cache_free(pw);
    while (pw->spare) {
        proxy_req_t *p = pw->spare;
        TG_UNPOISON(p, sizeof(*p));
        TG_UNPOISON(p->body_copy.data, p->body_copy.cap);
        pw->spare = p->next_spare;
        tg_buf_free(&p->body_copy);
        free(p);
    }
    free(pw);
}

/* ---- request lifecycle -------------------------------------------------------------- */

/*
 * proxy_req_t is large (the plugin context's arrays): a short per-worker list keeps
 * finished ones, with their answer-copy buffer when it is small, for the next request.
 * Under ASan the kept ones are poisoned (TG_POISON), so a use after free is still caught.
 */
#define PREQ_SPARE_MAX 64

static proxy_req_t *preq_alloc(proxy_worker_t *pw) {
    proxy_req_t *p = pw->spare;
    tg_buf_t copy;
    tg_buf_init(&copy);
    if (p) {
        TG_UNPOISON(p, sizeof(*p));
        pw->spare = p->next_spare;
        pw->nspare--;
        copy = p->body_copy;
        TG_UNPOISON(copy.data, copy.cap);
    } else if (!(p = malloc(sizeof(*p)))) {
        abort();
    }
    memset(p, 0, offsetof(proxy_req_t, ctx));
    p->body_copy = copy;
    return p;
}

static void preq_recycle(proxy_req_t *p) {
    proxy_worker_t *pw = p->pw;
    if (pw->nspare >= PREQ_SPARE_MAX || p->body_copy.cap > 16384) {
        tg_buf_free(&p->body_copy);
        if (pw->nspare >= PREQ_SPARE_MAX) {
            free(p);
            return;
        }
    }
    tg_buf_reset(&p->body_copy);
    p->next_spare = pw->spare;
    pw->spare = p;
    pw->nspare++;
    TG_POISON(p->body_copy.data, p->body_copy.cap);
    TG_POISON(p, sizeof(*p));
}

/* Frees what an attempt owns (its stream parser and translator). */
void tg__attempt_free(attempt_t *at) {
    if (at->sse_on)
        tg_sse_free(&at->sse);
    if (at->aws_on)
        tg_bedrock_stream_free(&at->aws);
    tg_xlate_destroy(at->xlate);
}

/* A retry: the failed attempt's state goes, the next starts from zero (its answer
 * buffers keep their memory). The call has ended and the account's health is settled. */
void tg__attempt_reset(proxy_req_t *p) {
    tg__attempt_free(&p->at);
    memset(&p->at, 0, sizeof(p->at));
    p->at.strip_usage_chunk = p->strip_usage_orig;
    tg_buf_reset(&p->body_copy);
    tg_buf_reset(&p->deferred_body);
}

/*
 * What a request holds is given back by the cleanup registered where it was taken (as
 * nginx's pool cleanups): tg__preq_free runs them newest first, so what was taken later goes
 * first (a hold before the principal it names). A cleanup reads the request's fields when
 * it runs: a resource already given back on the way (an answered lookup, a released lease)
 * is skipped. Each kind is registered once per request, however often it is taken.
 */
void tg__cleanup_add(proxy_req_t *p, void (*fn)(proxy_req_t *p)) {
    for (int i = 0; i < p->ncleanups; i++)
        if (p->cleanups[i] == fn)
            return;
    if (p->ncleanups >= CLEANUPS_MAX)
        abort();
    p->cleanups[p->ncleanups++] = fn;
}

void tg__preq_free(proxy_req_t *p) {
    while (p->ncleanups > 0)
        p->cleanups[--p->ncleanups](p);
    preq_recycle(p);
}

static void cleanup_retry_timer(proxy_req_t *p) {
    uv_timer_stop(p->retry_timer);
    uv_close((uv_handle_t *)p->retry_timer, (uv_close_cb)free);
}

static void retry_timer_cb(uv_timer_t *t) {
    proxy_req_t *p = t->data;
    tg__proxy_run(p);
}

/* Resumes the pipeline at `phase` after delay_ms (a retry's backoff, a wait for the
 * account snapshot or for a free slot). One timer per request, made on first use. */
int tg__run_phase_later(proxy_req_t *p, phase_t phase, uint64_t delay_ms) {
    if (!p->retry_timer) {
        p->retry_timer = malloc(sizeof(uv_timer_t));
        if (!p->retry_timer)
            abort();
        uv_timer_init(&p->req->worker->loop, p->retry_timer);
        p->retry_timer->data = p;
        tg__cleanup_add(p, cleanup_retry_timer);
    }
    p->phase = phase;
    uv_timer_start(p->retry_timer, retry_timer_cb, delay_ms, 0);
    return TG_AGAIN;
}

/* ---- the gateway's own answers ------------------------------------------------------ */

/* Every error the gateway itself answers goes through here, so that a client gets it in
 * its own protocol's shape (Anthropic's for /v1/messages, OpenAI's otherwise). */
int tg__proxy_answer_error(proxy_req_t *p, int status, const char *type, const char *code, const char *msg,
                                  const char *extra_headers) {
    /* Counted by code for /metrics: the console's refusals by reason. */
    tg_metrics_count_refusal(&p->req->worker->metrics,
                             p->error && !strcmp(p->error, "rejected_by_plugin") ? p->error : code);
    if (p->proto == TG_PROTO_ANTHROPIC && (p->req->route == TG_ROUTE_MESSAGES || p->req->route == TG_ROUTE_MODELS)) {
        tg_buf_t o, a;
        tg_buf_init(&o);
        tg_buf_init(&a);
        tg_buf_appends(&o, "{\"error\":{\"message\":\"");
        tg_buf_append_json_escaped(&o, msg, strlen(msg));
        tg_buf_printf(&o, "\",\"type\":\"%s\",\"code\":\"%s\"}}", type, code);
        tg_translate_error(TG_PROTO_ANTHROPIC, status, o.data, o.len, &a);
        tg_response_send(p->req, status, "application/json", extra_headers, a.data, a.len);
        tg_buf_free(&o);
        tg_buf_free(&a);
        return TG_DONE;
    }
    tg_response_error_ex(p->req, status, type, code, msg, extra_headers);
    return TG_DONE;
}

int tg__proxy_fail_ex(proxy_req_t *p, int status, const char *type, const char *code, const char *msg,
                             const char *extra_headers) {
    p->error = code;
    return tg__proxy_answer_error(p, status, type, code, msg, extra_headers);
}

int tg__proxy_fail(proxy_req_t *p, int status, const char *type, const char *code, const char *msg) {
    return tg__proxy_fail_ex(p, status, type, code, msg, NULL);
}

/* ---- the pipeline ------------------------------------------------------------------- */

static const phase_fn phases[PH__COUNT] = {
    [PH_AUTH] = tg__phase_auth,     [PH_PARSE] = tg__phase_parse,
    [PH_PLUGINS] = tg__phase_plugins, [PH_ADMIT] = tg__phase_admit,   [PH_STICKY] = tg__phase_sticky,
    [PH_SELECT] = tg__phase_select, [PH_SLOT] = tg__phase_slot,     [PH_RESERVE] = tg__phase_reserve,
    [PH_UPSTREAM] = tg__phase_upstream,
};

void tg__proxy_run(proxy_req_t *p) {
    while (p->phase < PH__COUNT) {
        int rc = phases[p->phase++](p);
        if (rc == TG_OK)
            continue;
        if (rc == TG_ERROR)
            tg__proxy_fail(p, 500, "server_error", "internal_error", "internal error");
        return; /* TG_DONE or TG_AGAIN */
    }
}

static proxy_req_t *proxy_begin(tg_request_t *req, tg_proto_t proto) {
    proxy_worker_t *pw = req->worker->ctx->proxy;
    proxy_req_t *p = preq_alloc(pw);
    p->req = req;
    p->pw = pw;
    p->attempt = 1;
    p->proto = proto;
    p->path = req->url.data ? req->url.data : "/";
    req->handler_data = p;
    req->abort_cb = tg__on_abort;
    req->drain_cb = tg__on_drain;
    req->finish_cb = tg__on_finish;
    if (tg_trace_enabled())
        tg__trace_begin(p);
    return p;
}

void tg_proxy_handle(tg_request_t *req, tg_proto_t proto) {
    tg__proxy_run(proxy_begin(req, proto));
}

void tg_proxy_refuse(tg_request_t *req, tg_proto_t proto, int status, const char *code, const char *msg,
                     const char *extra_headers) {
    tg__proxy_fail_ex(proxy_begin(req, proto), status, "invalid_request_error", code, msg, extra_headers);
}
