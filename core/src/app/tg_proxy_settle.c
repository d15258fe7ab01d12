/*
 * The end of a request (tg__on_finish, the server's finish callback, after the last
 * byte or when the client left): the admission's lease released with the tokens used,
 * metrics, the price and on_log hooks, the decision of what is billed (the upstream's
 * usage; an estimate when the client left or the usage is unreadable; the reserved
 * bound when it is not believable; unknown when the upstream may have run it), the
 * settlement handed to billing, and the access-log line.
 */
#include "tollgate/tg_access_log.h"

#include "tg_proxy_internal.h"

/* The data plane's members of the access-log line (tg_access_log writes the rest). */
static void access_log_more(void *ud, tg_buf_t *b, uint64_t now) {
    proxy_req_t *p = ud;
    tg_request_t *req = p->req;
    if (p->upstream_start_ns && p->at.up)
        tg_buf_printf(b, ",\"upstream\":\"%s\",\"upstream_status\":%d", tg_upstream_name(p->at.up),
                      p->at.upstream_status);
    else
        tg_buf_appends(b, ",\"upstream\":null,\"upstream_status\":null");
    if (p->at.account)
        tg_buf_printf(b, ",\"account_id\":%lld", (long long)p->at.account->id);
    if (p->principal && p->principal->key_id)
        tg_buf_printf(b, ",\"key_id\":%lld,\"tenant_id\":%lld", (long long)p->principal->key_id,
                      (long long)p->principal->tenant_id);
    if (p->model[0]) {
        tg_buf_appends(b, ",\"model\":\"");
        tg_buf_append_json_escaped(b, p->model, strlen(p->model));
        tg_buf_printf(b, "\",\"stream\":%s", p->stream ? "true" : "false");
    }
    if (TTFT_NS(p))
        tg_buf_printf(b, ",\"ttft_ms\":%.3f", (double)(TTFT_NS(p) - req->start_ns) / 1e6);
    else
        tg_buf_appends(b, ",\"ttft_ms\":null");
    double total_ms = (double)(now - req->start_ns) / 1e6;
    uint64_t up_ns = p->upstream_start_ns ? (p->upstream_end_ns ? p->upstream_end_ns : now) - p->upstream_start_ns : 0;
    tg_buf_printf(b, ",\"upstream_ms\":%.3f,\"overhead_ms\":%.3f,\"usage\":", (double)up_ns / 1e6,
                  total_ms - (double)up_ns / 1e6);
    tg_usage_append_json(&p->at.usage, b);
    if (p->traceparent[0])
        tg_buf_printf(b, ",\"traceparent\":\"%s\"", p->traceparent);
    if (p->ctx_on)
        tg_plugins_log_json(&p->ctx, b);
}

void tg__on_finish(tg_request_t *req, int aborted) {
    proxy_req_t *p = req->handler_data;
    tg__health_detach(p);
    if (p->at.call) {
        tg_upcall_abort(p->at.call);
        p->at.call = NULL;
    }
    uint64_t now = tg_now_ns();
    tg_metrics_t *m = &req->worker->metrics;
    if (TTFT_NS(p))
        tg_histogram_observe(&m->ttft, (TTFT_NS(p) - req->start_ns) / 1000);
    if (p->upstream_start_ns) {
        uint64_t up = (p->upstream_end_ns ? p->upstream_end_ns : now) - p->upstream_start_ns;
        uint64_t total = now - req->start_ns;
        tg_histogram_observe(&m->overhead, total > up ? (total - up) / 1000 : 0);
    }
    if (p->admit) {
        /* Counts past 2^40 are not believed (nor summed: they could wrap): unknown. */
        int64_t actual = (p->at.usage.known & TG_USAGE_INPUT) && (p->at.usage.known & TG_USAGE_OUTPUT) &&
                                 p->at.usage.input <= TG_USAGE_TOKENS_MAX && p->at.usage.output <= TG_USAGE_TOKENS_MAX &&
                                 p->at.usage.cache_read <= TG_USAGE_TOKENS_MAX &&
                                 p->at.usage.cache_write <= TG_USAGE_TOKENS_MAX
                             ? p->at.usage.input + p->at.usage.output + p->at.usage.cache_read + p->at.usage.cache_write
                             : -1;
        tg_admit_release(p->admit, actual);
        p->admit = NULL;
    }
    if (p->at.usage.known & TG_USAGE_INPUT)
        atomic_fetch_add_explicit(&m->tokens_input, (uint64_t)p->at.usage.input, memory_order_relaxed);
    if (p->at.usage.known & TG_USAGE_OUTPUT)
        atomic_fetch_add_explicit(&m->tokens_output, (uint64_t)p->at.usage.output, memory_order_relaxed);
    int64_t cost = -1;
    int estimated = 0;
    tg_usage_t billed = p->at.usage;
    if (p->reserved) {
        /* What the client got is what is billed: the upstream's numbers, or an estimate
         * from what was streamed when the client left before the upstream reported. */
        int known = (p->at.usage.known & TG_USAGE_INPUT) && (p->at.usage.known & TG_USAGE_OUTPUT);
        if (!known && aborted) {
            if (!(billed.known & TG_USAGE_INPUT))
                billed.input = p->est_input;
            if (!(billed.known & TG_USAGE_OUTPUT))
                billed.output = p->at.stream_chunks;
            billed.known |= TG_USAGE_INPUT | TG_USAGE_OUTPUT;
            estimated = 1;
        }
    }
    if (p->ctx_on) {
        tg_hookctx_t *c = &p->ctx;
        c->usage_input = p->at.usage.input;
        c->usage_output = p->at.usage.output;
        c->usage_cache_read = p->at.usage.cache_read;
        c->usage_cache_write = p->at.usage.cache_write;
        c->usage_reasoning = p->at.usage.reasoning;
        c->usage_known = p->at.usage.known;
        c->status = aborted && req->status < 400 ? 499 : req->status;
        c->ttft_ms = TTFT_NS(p) ? (double)(TTFT_NS(p) - req->start_ns) / 1e6 : -1;
        c->total_ms = (double)(now - req->start_ns) / 1e6;
        if (p->at.usage.known && tg_plugins_has_hook(p->pw->ctx->plugins, c, TG_HOOK_PRICE)) {
            c->usage_input = billed.input;
            c->usage_output = billed.output;
            c->usage_known = billed.known;
            tg__hook(p, TG_HOOK_PRICE);
            if (c->cost_nanousd >= 0)
                cost = c->cost_nanousd;
        }
        if (p->cap)
            tg__capture_price(p, &billed, cost);
        if (tg_plugins_has_hook(p->pw->ctx->plugins, c, TG_HOOK_ON_LOG))
            tg__hook(p, TG_HOOK_ON_LOG);
    }
    if (p->reserved && p->pw->ctx->billing) {
        uint64_t settle_start = p->trace ? tg_now_ns() : 0;
        int unknown = !((billed.known & TG_USAGE_INPUT) && (billed.known & TG_USAGE_OUTPUT));
        int sent = p->at.up_err == TG_UPERR_TIMEOUT_FIRST_BYTE || p->at.up_err == TG_UPERR_TIMEOUT_IDLE ||
                   p->at.up_err == TG_UPERR_RESET || p->at.up_err == TG_UPERR_PROTOCOL;
        if (unknown && sent) {
            /* The upstream may have run it: never assume it did not. */
            tg_billing_unknown(p->pw->ctx->billing, req->id, p->principal->tenant_id, p->principal->key_id, p->reserved,
                               p->model, p->reserved_amount);
            if (p->trace)
                tg__trace_settled(p, settle_start, "unknown_usage", -1, 0);
        } else {
            int clamped = 0, unreadable = 0;
            if (unknown && !aborted && p->at.upstream_status >= 200 && p->at.upstream_status < 300 && !p->at.up_err) {
                /* A successful answer whose usage could not be read (absent, malformed):
                 * the provider billed it, so it is never free. Estimated as when the
                 * client leaves: the input estimate, and as output the content events
                 * streamed, or for a whole answer the output limit it was sent. */
                if (!(billed.known & TG_USAGE_INPUT))
                    billed.input = p->est_input;
                if (!(billed.known & TG_USAGE_OUTPUT))
                    billed.output = p->stream ? p->at.stream_chunks : p->bound_output;
                billed.known |= TG_USAGE_INPUT | TG_USAGE_OUTPUT;
                estimated = unreadable = 1;
                unknown = 0;
                cost = -1; /* priced below, not by a hook that saw no usage */
            }
            tg_price_t price;
            int priced = p->snap && tg_snapshot_price(p->snap, p->model, &price);
            if (cost < 0) {
                cost = 0;
                if (!unknown && priced)
                    cost = tg_price_usage(&price, &billed, p->principal->rate_multiplier_micro);
            }
            if (!unknown && (billed.input > TG_USAGE_TOKENS_MAX || billed.output > TG_USAGE_TOKENS_MAX ||
                             billed.cache_read > TG_USAGE_TOKENS_MAX || billed.cache_write > TG_USAGE_TOKENS_MAX ||
                             billed.reasoning > TG_USAGE_TOKENS_MAX || cost > TG_MONEY_REQUEST_MAX)) {
                /* Not believable (a count past 2^40 tokens, a cost past what one request
                 * may hold): billed at the bound it reserved, marked estimated. */
                tg_log_warn("request %s: the upstream's usage is not believable (input %lld, output %lld, cost "
                            "%lld nano-USD): billed at the reserved bound, marked estimated",
                            req->id, (long long)billed.input, (long long)billed.output, (long long)cost);
                billed = (tg_usage_t){.input = p->est_input, .output = p->bound_output,
                                      .known = TG_USAGE_INPUT | TG_USAGE_OUTPUT};
                cost = priced ? tg_price_usage(&price, &billed, p->principal->rate_multiplier_micro) : 0;
                cost = TG_MIN(cost, TG_MONEY_REQUEST_MAX);
                estimated = clamped = 1;
            }
            tg_settlement_t s = {
                .request_id = req->id,
                .tenant_id = p->principal->tenant_id,
                .key_id = p->principal->key_id,
                .group_id = p->principal->group_id,
                .account_id = p->at.account ? p->at.account->id : 0,
                .model = p->model,
                .usage = billed,
                .cost = cost,
                .estimated = estimated,
                .clamped = clamped,
                .unreadable = unreadable,
                .attempts = p->reserved,
                .unheld = p->unheld,
                .status = aborted && req->status < 400 ? 499 : req->status,
                .ttft_ms = TTFT_NS(p) ? (double)(TTFT_NS(p) - req->start_ns) / 1e6 : -1,
                .total_ms = (double)(now - req->start_ns) / 1e6,
                .budgets = p->budgets,
                .nbudgets = p->nbudgets,
            };
            tg_billing_settle(p->pw->ctx->billing, &s);
            if (p->trace)
                tg__trace_settled(p, settle_start, "settled", cost, estimated);
        }
    }
    if (p->cap)
        tg__capture_finish(p, aborted && req->status < 400 ? 499 : req->status,
                           TTFT_NS(p) ? (double)(TTFT_NS(p) - req->start_ns) / 1e6 : -1,
                           (double)(now - req->start_ns) / 1e6, cost);
    if (req->route != TG_ROUTE_HEALTHZ && req->route != TG_ROUTE_READYZ && req->route != TG_ROUTE_METRICS) {
        tg_access_line_t line = {.path = p->path ? p->path : "",
                                 .path_len = p->path ? strlen(p->path) : 0,
                                 .now_ns = now,
                                 .error = p->error,
                                 .more = access_log_more,
                                 .ud = p};
        tg_access_log(req, aborted, &line);
    }
    if (p->trace)
        tg__trace_finish(p, aborted && req->status < 400 ? 499 : req->status, now);
    req->handler_data = NULL;
    tg__preq_free(p);
}
