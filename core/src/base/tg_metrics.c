/*
 * Counters and histograms in Prometheus text exposition format (see tg_metrics.h).
 */
#include <stdlib.h>

#include "tollgate/tg_metrics.h"

static const int status_codes[TG_METRICS_NSTATUS - 1] = {200, 400, 401, 402, 403, 404, 405, 408, 413,
                                                         429, 431, 499, 500, 502, 503, 504, 529};
static const double bucket_le[TG_METRICS_NBUCKETS - 1] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
static const char *route_names[TG_ROUTE__COUNT] = {
    "chat_completions", "messages", "responses", "embeddings", "models",
    "healthz",          "readyz",   "metrics",   "admin",     "other"};

#define RELAXED memory_order_relaxed

const char *tg_route_name(tg_route_t r) { return r < TG_ROUTE__COUNT ? route_names[r] : "other"; }

void tg_metrics_count_request(tg_metrics_t *m, tg_route_t route, int status) {
    int slot = TG_METRICS_NSTATUS - 1;
    for (int i = 0; i < TG_METRICS_NSTATUS - 1; i++)
        if (status_codes[i] == status) {
            slot = i;
            break;
        }
    atomic_fetch_add_explicit(&m->requests[route][slot], 1, RELAXED);
}

/* The codes counted apart (tg_proxy.c, tg_billing_holds.c); the last slot is "other". */
static const char *const refusal_codes[TG_METRICS_NREFUSALS] = {
    "invalid_api_key",     "key_expired",           "model_not_allowed",       "ip_not_allowed",
    "insufficient_balance", "insufficient_quota",   "budget_exceeded",         "rate_limit_exceeded",
    "tokens_limit_exceeded", "concurrency_limit_exceeded", "accounts_busy",    "no_account_available",
    "accounts_unavailable", "limiter_unavailable",  "billing_unavailable",     "auth_unavailable",
    "upstream_error",      "upstream_unreachable",  "upstream_timeout",        "upstream_request_refused",
    "rejected_by_plugin",  "invalid_request",       "invalid_json",            "missing_model",
    "internal_error",      "other",
};

void tg_metrics_count_refusal(tg_metrics_t *m, const char *code) {
    int slot = TG_METRICS_NREFUSALS - 1;
    for (int i = 0; code && i < TG_METRICS_NREFUSALS - 1; i++)
        if (!strcmp(refusal_codes[i], code)) {
            slot = i;
            break;
        }
    atomic_fetch_add_explicit(&m->refusals[slot], 1, RELAXED);
}

void tg_histogram_observe(tg_histogram_t *h, uint64_t us) {
    int i = 0;
    while (i < TG_METRICS_NBUCKETS - 1 && (double)us > bucket_le[i] * 1e6)
        i++;
    atomic_fetch_add_explicit(&h->buckets[i], 1, RELAXED);
    atomic_fetch_add_explicit(&h->count, 1, RELAXED);
    atomic_fetch_add_explicit(&h->sum_us, us, RELAXED);
}

static void render_collectors(tg_metrics_t *const *w, int n, tg_buf_t *out);

static void render_hist(tg_metrics_t *const *w, int n, size_t off, const char *name,
                        const char *help, tg_buf_t *out) {
    tg_buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0, count = 0, sum = 0;
    for (int b = 0; b < TG_METRICS_NBUCKETS; b++) {
        for (int i = 0; i < n; i++) {
            const tg_histogram_t *h = (const tg_histogram_t *)((const char *)w[i] + off);
            cum += atomic_load_explicit(&h->buckets[b], RELAXED);
        }
        if (b < TG_METRICS_NBUCKETS - 1)
            tg_buf_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, bucket_le[b], (unsigned long long)cum);
        else
            tg_buf_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    for (int i = 0; i < n; i++) {
        const tg_histogram_t *h = (const tg_histogram_t *)((const char *)w[i] + off);
        count += atomic_load_explicit(&h->count, RELAXED);
        sum += atomic_load_explicit(&h->sum_us, RELAXED);
    }
    tg_buf_printf(out, "%s_sum %.6f\n%s_count %llu\n", name, (double)sum / 1e6, name,
                  (unsigned long long)count);
}

#define SUM_FIELD(w, n, field, type)                                                        \
    ({                                                                                      \
        type s__ = 0;                                                                       \
        for (int i__ = 0; i__ < (n); i__++)                                                 \
            s__ += atomic_load_explicit(&(w)[i__]->field, RELAXED);                         \
        s__;                                                                                \
    })

void tg_metrics_render(tg_metrics_t *const *w, int n, tg_buf_t *out) {
    tg_buf_appends(out, "# HELP tollgate_requests_total Requests answered, by route and status.\n"
                        "# TYPE tollgate_requests_total counter\n");
    for (int r = 0; r < TG_ROUTE__COUNT; r++) {
        for (int s = 0; s < TG_METRICS_NSTATUS; s++) {
            uint64_t v = 0;
            for (int i = 0; i < n; i++)
                v += atomic_load_explicit(&w[i]->requests[r][s], RELAXED);
            if (!v)
                continue;
            if (s < TG_METRICS_NSTATUS - 1)
                tg_buf_printf(out, "tollgate_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
                              route_names[r], status_codes[s], (unsigned long long)v);
            else
                tg_buf_printf(out, "tollgate_requests_total{route=\"%s\",status=\"other\"} %llu\n",
                              route_names[r], (unsigned long long)v);
        }
    }
    render_hist(w, n, offsetof(tg_metrics_t, duration), "tollgate_request_duration_seconds",
                "Time from the request's first byte to the response's last byte.", out);
    render_hist(w, n, offsetof(tg_metrics_t, ttft), "tollgate_ttft_seconds",
                "Time from the request to the first upstream response byte.", out);
    render_hist(w, n, offsetof(tg_metrics_t, overhead), "tollgate_overhead_seconds",
                "Time the gateway itself added: total time minus time waiting on the upstream.", out);
    tg_buf_printf(out,
                  "# HELP tollgate_upstream_errors_total Upstream connect failures, timeouts and resets.\n"
                  "# TYPE tollgate_upstream_errors_total counter\ntollgate_upstream_errors_total %llu\n",
                  (unsigned long long)SUM_FIELD(w, n, upstream_errors, uint64_t));
    tg_buf_printf(out,
                  "# HELP tollgate_upstream_refused_total Upstream requests not sent because a value that would "
                  "go into their request line or headers holds a control character.\n"
                  "# TYPE tollgate_upstream_refused_total counter\ntollgate_upstream_refused_total %llu\n",
                  (unsigned long long)SUM_FIELD(w, n, upstream_refused, uint64_t));
    tg_buf_printf(out,
                  "# HELP tollgate_client_aborts_total Clients that went away before their response ended.\n"
                  "# TYPE tollgate_client_aborts_total counter\ntollgate_client_aborts_total %llu\n",
                  (unsigned long long)SUM_FIELD(w, n, client_aborts, uint64_t));
    tg_buf_printf(out,
                  "# HELP tollgate_connections Open client connections.\n"
                  "# TYPE tollgate_connections gauge\ntollgate_connections %lld\n",
                  (long long)SUM_FIELD(w, n, connections, int64_t));
    tg_buf_printf(out,
                  "# HELP tollgate_inflight_requests Requests in progress.\n"
                  "# TYPE tollgate_inflight_requests gauge\ntollgate_inflight_requests %lld\n",
                  (long long)SUM_FIELD(w, n, inflight, int64_t));
    tg_buf_printf(out,
                  "# HELP tollgate_tokens_total Tokens reported by upstreams.\n"
                  "# TYPE tollgate_tokens_total counter\n"
                  "tollgate_tokens_total{kind=\"input\"} %llu\ntollgate_tokens_total{kind=\"output\"} %llu\n",
                  (unsigned long long)SUM_FIELD(w, n, tokens_input, uint64_t),
                  (unsigned long long)SUM_FIELD(w, n, tokens_output, uint64_t));
    tg_buf_printf(out,
                  "# HELP tollgate_quota_values_total Quota values read from upstream headers and error bodies.\n"
                  "# TYPE tollgate_quota_values_total counter\ntollgate_quota_values_total %llu\n"
                  "# HELP tollgate_quota_malformed_total Quota header values that could not be read (ignored).\n"
                  "# TYPE tollgate_quota_malformed_total counter\ntollgate_quota_malformed_total %llu\n"
                  "# HELP tollgate_quota_skips_total Accounts passed over because their provider said their quota "
                  "could not cover the request.\n"
                  "# TYPE tollgate_quota_skips_total counter\ntollgate_quota_skips_total %llu\n"
                  "# HELP tollgate_quota_shared_total Learned quota states written to the fleet's copy in Redis.\n"
                  "# TYPE tollgate_quota_shared_total counter\ntollgate_quota_shared_total %llu\n",
                  (unsigned long long)SUM_FIELD(w, n, quota_values, uint64_t),
                  (unsigned long long)SUM_FIELD(w, n, quota_malformed, uint64_t),
                  (unsigned long long)SUM_FIELD(w, n, quota_skips, uint64_t),
                  (unsigned long long)SUM_FIELD(w, n, quota_shared, uint64_t));
    {
        uint64_t bound = SUM_FIELD(w, n, sticky_bound, uint64_t), kept = SUM_FIELD(w, n, sticky_kept, uint64_t);
        tg_buf_printf(out,
                      "# HELP tollgate_sticky_bound_total Requests whose conversation was bound to an account.\n"
                      "# TYPE tollgate_sticky_bound_total counter\ntollgate_sticky_bound_total %llu\n"
                      "# HELP tollgate_sticky_hits_total Of those, requests sent to the bound account.\n"
                      "# TYPE tollgate_sticky_hits_total counter\ntollgate_sticky_hits_total %llu\n"
                      "# HELP tollgate_sticky_hit_ratio Sticky hits / bound requests since start.\n"
                      "# TYPE tollgate_sticky_hit_ratio gauge\ntollgate_sticky_hit_ratio %.4f\n",
                      (unsigned long long)bound, (unsigned long long)kept, bound ? (double)kept / (double)bound : 0.0);
    }
    tg_buf_appends(out, "# HELP tollgate_refusals_total Error answers the gateway made itself (not relayed from an "
                        "upstream), by error code.\n# TYPE tollgate_refusals_total counter\n");
    for (int i = 0; i < TG_METRICS_NREFUSALS; i++) {
        uint64_t v = 0;
        for (int k = 0; k < n; k++)
            v += atomic_load_explicit(&w[k]->refusals[i], RELAXED);
        if (v)
            tg_buf_printf(out, "tollgate_refusals_total{code=\"%s\"} %llu\n", refusal_codes[i], (unsigned long long)v);
    }
    render_collectors(w, n, out);
}

void tg_metrics_collector_add(tg_metrics_t *m, tg_metrics_collect_fn fn, const void *inst) {
    if (!inst)
        return;
    if (m->ncollectors >= TG_METRICS_COLLECTORS_MAX)
        abort();
    m->collectors[m->ncollectors].fn = fn;
    m->collectors[m->ncollectors].inst = inst;
    m->ncollectors++;
}

void tg_metrics_collectors_clear(tg_metrics_t *m) { m->ncollectors = 0; }

void tg_metrics_sum_u64(const void *const *stats, int n, size_t nfields, uint64_t *sum) {
    memset(sum, 0, nfields * sizeof(*sum));
    for (int i = 0; i < n; i++) {
        const uint64_t *f = stats[i];
        if (!f)
            continue;
        for (size_t k = 0; k < nfields; k++)
            sum[k] += __atomic_load_n(&f[k], __ATOMIC_RELAXED);
    }
}

/* The instance worker `w` registered with `fn`, or NULL. */
static const void *collector_inst(const tg_metrics_t *w, tg_metrics_collect_fn fn) {
    for (int j = 0; j < w->ncollectors; j++)
        if (w->collectors[j].fn == fn)
            return w->collectors[j].inst;
    return NULL;
}

/* Each collector once, in the order the workers registered them, with every worker's
 * instance (a worker may lack a subsystem: NULL there). */
static void render_collectors(tg_metrics_t *const *w, int n, tg_buf_t *out) {
    const void **inst = calloc((size_t)(n > 0 ? n : 1), sizeof(*inst));
    if (!inst)
        abort();
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < w[i]->ncollectors; j++) {
            tg_metrics_collect_fn fn = w[i]->collectors[j].fn;
            int seen = 0;
            for (int k = 0; k < i && !seen; k++)
                seen = collector_inst(w[k], fn) != NULL;
            if (seen)
                continue;
            for (int k = 0; k < n; k++)
                inst[k] = collector_inst(w[k], fn);
            fn(inst, n, out);
        }
    }
    free(inst);
}
