/*
 * A request's trace (tollgate/tg_trace.h), beside the phases: the W3C trace context
 * read at the start and written into each upstream attempt's head, and, for a sampled
 * request, its spans filled into its record as the phases pass:
 *
 *   server span   the request, from its first byte to its end (tg__trace_finish)
 *   admission     the limits and the first attempt's money hold: the Redis script
 *                 (tg_proxy_admit.c), a balance load and the admission again included
 *   select        per attempt: sticky, select and slot (tg_proxy_route.c), up to the
 *                 reserve phase
 *   attempt       per attempt: the upstream call, a CLIENT span whose id is the parent
 *                 the upstream sees in its traceparent; status, account, retry number
 *   settlement    the settlement handed to billing (tg_proxy_settle.c); the Postgres
 *                 write follows in billing's batch, found by the request id
 *
 * Off (tg_trace_enabled() false) nothing here runs but tg__trace_pass, which passes a
 * valid client traceparent (and its tracestate) on to the upstream unchanged. On and
 * not sampled, the upstream gets the client's traceparent, or a new trace's with the
 * sampled flag clear, and no record is taken.
 */
#include <llhttp.h>
#include <stdio.h>

#include "tg_proxy_internal.h"

static void cleanup_trace(proxy_req_t *p) {
    if (p->trace) {
        tg_trace_cancel(p->trace);
        p->trace = NULL;
    }
}

/* The client's traceparent, when valid, and its tracestate when that may be passed. */
static int incoming(proxy_req_t *p, tg_traceparent_t *tp) {
    const tg_str_t *h = tg_request_header(p->req, "traceparent");
    if (!h || !tg_traceparent_parse(h->p, h->len, tp))
        return 0;
    const tg_str_t *ts = tg_request_header(p->req, "tracestate");
    if (ts && tg_tracestate_ok(ts->p, ts->len))
        p->tracestate = ts;
    return 1;
}

void tg__trace_pass(proxy_req_t *p) {
    tg_traceparent_t tp;
    if (incoming(p, &tp))
        tg_traceparent_format(tp.trace_id, tp.span_id, tp.flags & 1, p->traceparent);
}

void tg__trace_begin(proxy_req_t *p) {
    tg_traceparent_t in, ctx;
    int has_parent = incoming(p, &in);
    int sampled = tg_trace_decide(has_parent ? &in : NULL, &ctx);
    tg_trace_rec_t *r = sampled ? tg_trace_take() : NULL;
    if (!r) {
        /* Not recorded: the caller's context goes on as it came, or a new trace's
         * (our span id, not sampled) so that the upstream's spans still join up. */
        if (has_parent)
            tg_traceparent_format(in.trace_id, in.span_id, in.flags & 1, p->traceparent);
        else
            tg_traceparent_format(ctx.trace_id, ctx.span_id, sampled, p->traceparent);
        return;
    }
    r->wall_minus_mono = tg_trace_clock_offset();
    memcpy(r->trace_id, ctx.trace_id, 16);
    memcpy(r->span_id, ctx.span_id, 8);
    if (has_parent) {
        memcpy(r->parent_id, in.span_id, 8);
        r->has_parent = 1;
    }
    if (p->tracestate)
        snprintf(r->tracestate, sizeof(r->tracestate), "%.*s", (int)p->tracestate->len, p->tracestate->p);
    r->start = p->req->start_ns;
    p->trace = r;
    tg__cleanup_add(p, cleanup_trace);
}

/* ---- the phases' marks ----------------------------------------------------------------- */

void tg__trace_admit_start(proxy_req_t *p) {
    if (!p->trace->admit_start) {
        p->trace->admit_start = tg_now_ns();
        tg_trace_span_id(p->trace->admit_span_id);
    }
}

void tg__trace_admit_end(proxy_req_t *p, int result) {
    static const char *const names[] = {
        [TG_ADMIT_OK] = "admitted",
        [TG_ADMIT_RATE] = "rate_limit_exceeded",
        [TG_ADMIT_TOKENS] = "tokens_limit_exceeded",
        [TG_ADMIT_CONCURRENCY] = "concurrency_limit_exceeded",
        [TG_ADMIT_QUEUE_FULL] = "concurrency_queue_full",
        [TG_ADMIT_UNAVAILABLE] = "limiter_unavailable",
        [TG_ADMIT_BALANCE] = "insufficient_balance",
        [TG_ADMIT_BUDGET] = "key_budget_exceeded",
        [TG_ADMIT_MONEY_INIT] = "balance_load",
        [TG_ADMIT_PERIOD_BUDGET] = "budget_exceeded",
    };
    tg_trace_rec_t *r = p->trace;
    r->admit_end = tg_now_ns();
    const char *n = result >= 0 && (size_t)result < sizeof(names) / sizeof(names[0]) ? names[result] : NULL;
    snprintf(r->admit_result, sizeof(r->admit_result), "%s", n ? n : "refused");
}

/* The attempt's slot in the record: attempts past TG_TRACE_ATTEMPTS are not recorded. */
static tg_trace_attempt_t *attempt_of(proxy_req_t *p) {
    if (p->attempt < 1 || p->attempt > TG_TRACE_ATTEMPTS)
        return NULL;
    if (p->trace->nat < p->attempt)
        p->trace->nat = p->attempt;
    return &p->trace->at[p->attempt - 1];
}

void tg__trace_select_start(proxy_req_t *p) {
    tg_trace_attempt_t *t = attempt_of(p);
    if (t && !t->select_start) {
        t->select_start = tg_now_ns();
        tg_trace_span_id(t->select_span_id);
    }
}

void tg__trace_select_end(proxy_req_t *p) {
    tg_trace_attempt_t *t = attempt_of(p);
    if (t && t->select_start && !t->select_end) {
        t->select_end = tg_now_ns();
        t->account_id = p->at.account ? p->at.account->id : 0;
        t->candidates = p->norder;
    }
}

static const char *provider_name(const char *provider) {
    if (!strcmp(provider, "gemini"))
        return "gcp.gemini";
    if (!strcmp(provider, "azure"))
        return "azure.ai.openai";
    if (!strcmp(provider, "vertex"))
        return "gcp.vertex_ai";
    if (!strcmp(provider, "bedrock"))
        return "aws.bedrock";
    return provider; /* "openai", "anthropic": the conventions' names */
}

/* The attempt's span id, and the traceparent the upstream receives (its parent: this
 * attempt's span). Called before the head is written; the start is the call's. */
void tg__trace_attempt_start(proxy_req_t *p) {
    tg_trace_attempt_t *t = attempt_of(p);
    if (!t) {
        tg_traceparent_format(p->trace->trace_id, p->trace->span_id, 1, p->traceparent);
        return;
    }
    tg_trace_span_id(t->span_id);
    t->account_id = p->at.account ? p->at.account->id : 0;
    snprintf(t->provider, sizeof(t->provider), "%s",
             provider_name(p->at.account ? p->at.account->provider : p->req->worker->gw->cfg->upstream.provider));
    tg_traceparent_format(p->trace->trace_id, t->span_id, 1, p->traceparent);
}

void tg__trace_attempt_end(proxy_req_t *p, uint64_t now) {
    tg_trace_attempt_t *t = attempt_of(p);
    if (!t || !t->start || t->end)
        return;
    t->end = p->upstream_end_ns ? p->upstream_end_ns : now;
    t->status = p->at.upstream_status;
    switch (p->at.up_err) {
    case TG_UPERR_CONNECT:
        t->error = "connect";
        break;
    case TG_UPERR_TIMEOUT_CONNECT:
    case TG_UPERR_TIMEOUT_FIRST_BYTE:
    case TG_UPERR_TIMEOUT_IDLE:
        t->error = "timeout";
        break;
    case TG_UPERR_RESET:
        t->error = "reset";
        break;
    case TG_UPERR_PROTOCOL:
        t->error = "protocol";
        break;
    default:
        break;
    }
}

void tg__trace_settled(proxy_req_t *p, uint64_t start, const char *kind, int64_t cost, int estimated) {
    tg_trace_rec_t *r = p->trace;
    r->settle_start = start;
    r->settle_end = tg_now_ns();
    tg_trace_span_id(r->settle_span_id);
    r->settle_kind = kind;
    r->cost_nanousd = cost;
    r->estimated = estimated;
}

/* The server span's attributes, and the record handed to the exporter. */
void tg__trace_finish(proxy_req_t *p, int status, uint64_t now) {
    tg_trace_rec_t *r = p->trace;
    tg_request_t *req = p->req;
    tg__trace_attempt_end(p, now);
    r->end = r->settle_end > now ? r->settle_end : now; /* the settlement is the request's last work */
    r->status = status;
    r->method = llhttp_method_name((llhttp_method_t)req->method);
    snprintf(r->path, sizeof(r->path), "%s", p->path ? p->path : "");
    snprintf(r->request_id, sizeof(r->request_id), "%s", req->id);
    snprintf(r->error, sizeof(r->error), "%s", p->error ? p->error : "");
    if (tg__is_model_route(req->route)) {
        r->operation = req->route == TG_ROUTE_EMBEDDINGS ? "embeddings" : "chat";
        snprintf(r->model, sizeof(r->model), "%s", p->model);
        r->stream = p->stream;
    }
    if (p->principal) {
        r->key_id = p->principal->key_id;
        r->tenant_id = p->principal->tenant_id;
    }
    const tg_usage_t *u = &p->at.usage;
    if (u->known & TG_USAGE_INPUT)
        r->input_tokens = u->input;
    if (u->known & TG_USAGE_OUTPUT)
        r->output_tokens = u->output;
    if (u->known & TG_USAGE_CACHE_READ)
        r->cache_read_tokens = u->cache_read;
    p->trace = NULL;
    tg_trace_submit(r);
}
