/*
 * Prometheus metrics. Each worker owns one tg_metrics_t and is its only writer (relaxed
 * atomics, no locks, no shared cache lines); GET /metrics sums every worker's copy.
 *
 * A subsystem with counters of its own (the key cache, admission, Redis, billing) is a
 * collector (as h2o's status handlers): the worker that builds it registers it on its
 * tg_metrics_t with the subsystem's render function, and /metrics calls each function
 * once with every worker's instance. Counters are written by their worker's thread only
 * and read from any thread with relaxed atomic loads.
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
    TG_ROUTE_READYZ,
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

/**
 * Renders one subsystem's families: `inst[i]` is worker i's instance as registered (NULL
 * for a worker without it), `n` the number of workers.
 */
typedef void (*tg_metrics_collect_fn)(const void *const *inst, int n, tg_buf_t *out);

#define TG_METRICS_COLLECTORS_MAX 16

/** Error codes of the gateway's own refusals, counted one by one; any other is "other". */
#define TG_METRICS_NREFUSALS 26

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
    _Atomic uint64_t refusals[TG_METRICS_NREFUSALS]; /* the gateway's own error answers, by code */
    _Atomic uint64_t quota_values;     /* quota values read from upstream headers and bodies */
    _Atomic uint64_t quota_malformed;  /* quota header values that could not be read (ignored) */
    _Atomic uint64_t quota_skips;      /* accounts passed over because their quota was spent */
    _Atomic uint64_t quota_shared;     /* learned quota written to the fleet's copy (Redis) */
    _Atomic uint64_t sticky_bound;     /* requests whose conversation was bound to an account */
    _Atomic uint64_t sticky_kept;      /* of those, sent to the bound account */
    /* Registered while the worker is built, before any request (tg_metrics_collector_add). */
    struct {
        tg_metrics_collect_fn fn;
        const void *inst;
    } collectors[TG_METRICS_COLLECTORS_MAX];
    int ncollectors;
} tg_metrics_t;

const char *tg_route_name(tg_route_t r);
void tg_metrics_count_request(tg_metrics_t *m, tg_route_t route, int status);
void tg_histogram_observe(tg_histogram_t *h, uint64_t us);
/** Counts one error answer the gateway made itself (not relayed from an upstream), by its
 *  `code` (invalid_api_key, rate_limit_exceeded, no_account_available, ...): rendered as
 *  tollgate_refusals_total{code}. Only the error path calls it (a short table lookup). */
void tg_metrics_count_refusal(tg_metrics_t *m, const char *code);
/**
 * Renders the sum of `n` workers' metrics in Prometheus text format into `out`: the
 * worker's own families, then each registered collector's, in registration order.
 */
void tg_metrics_render(tg_metrics_t *const *workers, int n, tg_buf_t *out);
/**
 * Registers `inst` (not owned; it must outlive the worker's requests) with its render
 * function on the worker's metrics. Call while the worker is built, before it serves.
 * A NULL `inst` registers nothing. Aborts past TG_METRICS_COLLECTORS_MAX.
 */
void tg_metrics_collector_add(tg_metrics_t *m, tg_metrics_collect_fn fn, const void *inst);
/** Forgets every collector of the worker (before its subsystems are destroyed). */
void tg_metrics_collectors_clear(tg_metrics_t *m);
/**
 * Sums counters across workers with relaxed atomic loads: each non-NULL `stats[i]` points
 * at `nfields` uint64_t counters laid out as an array (a stats struct of uint64_t fields
 * only); `sum` gets `nfields` totals.
 */
void tg_metrics_sum_u64(const void *const *stats, int n, size_t nfields, uint64_t *sum);
/** The number of uint64_t counters in a stats struct made of uint64_t fields only. */
#define TG_METRICS_NFIELDS(type) (sizeof(type) / sizeof(uint64_t))

#endif
