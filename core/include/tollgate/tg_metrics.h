/*
 * Prometheus metrics. Each worker owns one tg_metrics_t and is its only writer (relaxed
 * atomics, no locks, no shared cache lines); GET /metrics sums every worker's copy.
 */
#ifndef TOLLGATE_TG_METRICS_H
#define TOLLGATE_TG_METRICS_H

#include <stdatomic.h>

#include "tollgate/tg_common.h"

typedef enum {
    TG_ROUTE_CHAT = 0,
    TG_ROUTE_MESSAGES,
    TG_ROUTE_RESPONSES,
    TG_ROUTE_EMBEDDINGS,
    TG_ROUTE_MODELS,
    TG_ROUTE_HEALTHZ,
    TG_ROUTE_METRICS,
    TG_ROUTE_ADMIN,
    TG_ROUTE_OTHER,
    TG_ROUTE__COUNT
} tg_route_t;

#define TG_METRICS_NSTATUS 18
#define TG_METRICS_NBUCKETS 19

typedef struct {
    _Atomic uint64_t buckets[TG_METRICS_NBUCKETS]; /* cumulative at render time */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_us;
} tg_histogram_t;

typedef struct {
    _Atomic uint64_t requests[TG_ROUTE__COUNT][TG_METRICS_NSTATUS];
    tg_histogram_t duration;  /* whole request, first byte in to last byte out */
    tg_histogram_t ttft;      /* request received to first upstream body byte */
    tg_histogram_t overhead;  /* duration minus time spent waiting on the upstream */
    _Atomic uint64_t upstream_errors;  /* connect failures, timeouts, resets */
    _Atomic uint64_t upstream_refused; /* requests not sent: a credential unfit for a header */
    _Atomic uint64_t client_aborts;    /* clients gone before the response ended */
    _Atomic int64_t connections;       /* open client connections */
    _Atomic int64_t inflight;          /* requests in progress */
    _Atomic uint64_t tokens_input;
    _Atomic uint64_t tokens_output;
} tg_metrics_t;

const char *tg_route_name(tg_route_t r);
void tg_metrics_count_request(tg_metrics_t *m, tg_route_t route, int status);
void tg_histogram_observe(tg_histogram_t *h, uint64_t us);
/** Renders the sum of `n` workers' metrics in Prometheus text format into `out`. */
void tg_metrics_render(tg_metrics_t *const *workers, int n, tg_buf_t *out);

#endif
