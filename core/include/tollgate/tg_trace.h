/*
 * OpenTelemetry traces (config `tracing`, README "Traces"): the W3C trace context read
 * from a request and written to the upstream, a sampled request's spans kept in a
 * fixed record while it runs, and one exporter thread that sends finished records to a
 * collector as OTLP/HTTP JSON (POST <endpoint>, batched).
 *
 * Costs: off (no `tracing.endpoint`), a request pays one branch (tg_trace_enabled). On,
 * each request draws a trace id from a per-thread generator (or continues the client's
 * traceparent) and decides by the ratio, parent-based: a client's sampled flag is
 * followed, else the ratio applies. A sampled request takes a record from a pool
 * allocated at start (`queue_size` records): no allocation per request, and when the
 * pool is empty (the collector is slow or down) the request is served untraced and
 * counted (tollgate_trace_dropped_total{reason="queue_full"}). The exporter alone does
 * the network I/O (blocking sockets, bounded by `timeout_ms`): no event loop waits on it.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef TOLLGATE_TG_TRACE_H
#define TOLLGATE_TG_TRACE_H

#include "tollgate/tg_config.h"
#include "tollgate/tg_metrics.h"

/** A W3C traceparent, parsed. */
typedef struct {
    uint8_t trace_id[16];
    uint8_t span_id[8]; /* the caller's span: the parent of ours */
    uint8_t flags;      /* bit 0: sampled */
} tg_traceparent_t;

/** A traceparent's text: "00-" 32 hex "-" 16 hex "-" 2 hex, and NUL. */
#define TG_TRACEPARENT_LEN 55
/** The longest tracestate passed on (the W3C's limit for what a vendor must pass). */
#define TG_TRACESTATE_MAX 512

/**
 * Parses a traceparent header value (W3C Trace Context level 1): version 00 of exactly
 * 55 characters, or a later version (not ff) whose first 55 characters have that form
 * and are followed by '-' or the end; lower-case hex; trace id and parent id not all
 * zero. Returns 1 and fills *out, or 0 (the value is ignored: a new trace starts).
 */
int tg_traceparent_parse(const char *s, size_t n, tg_traceparent_t *out);
/** Writes "00-<trace>-<span>-<flags>" and a NUL into out[56]. */
void tg_traceparent_format(const uint8_t trace_id[16], const uint8_t span_id[8], int sampled, char out[56]);
/** Whether a tracestate value may be passed on: at most TG_TRACESTATE_MAX bytes of
 *  printable ASCII (no control bytes), not empty. Its list members are not judged. */
int tg_tracestate_ok(const char *s, size_t n);

/* ---- a sampled request's spans ------------------------------------------------------ */

#define TG_TRACE_ATTEMPTS 8

/** One upstream attempt (a CLIENT span) and the account selection before it. Times
 *  are tg_now_ns(); 0 not reached. */
typedef struct {
    uint64_t select_start, select_end;
    uint64_t start, end;
    uint8_t span_id[8], select_span_id[8];
    int64_t account_id;   /* 0: the config file's static upstream */
    int candidates;       /* accounts in the selection's order */
    int status;           /* the upstream's HTTP status, 0 none */
    const char *error;    /* static text: "timeout", "connect", "reset", ... or NULL */
    char provider[16];    /* gen_ai.provider.name */
} tg_trace_attempt_t;

/** A sampled request's record: the server span and its children. Filled by the
 *  request's worker, then handed to the exporter (tg_trace_submit). */
typedef struct tg_trace_rec_s {
    struct tg_trace_rec_s *next;
    int64_t wall_minus_mono;      /* ns: the clock offset when the record was taken */
    uint8_t trace_id[16], span_id[8], parent_id[8];
    int has_parent;               /* continued from the client's traceparent */
    char tracestate[TG_TRACESTATE_MAX + 1];
    uint64_t start, end;
    /* the server span's attributes */
    const char *method;           /* static */
    char path[96];
    char request_id[40];
    char model[128];
    char error[48];               /* the gateway's own error code, "" none */
    const char *operation;        /* gen_ai.operation.name (static), NULL for non-model routes */
    int status;
    int stream;
    int64_t key_id, tenant_id;
    int64_t input_tokens, output_tokens, cache_read_tokens; /* -1 unknown */
    /* admission: limits and the first attempt's money hold, in Redis */
    uint64_t admit_start, admit_end;
    uint8_t admit_span_id[8];
    char admit_result[40];        /* "admitted" or the refusal's code */
    /* attempts */
    tg_trace_attempt_t at[TG_TRACE_ATTEMPTS];
    int nat;
    /* settlement: handed to billing's queue (the Postgres write follows in a batch) */
    uint64_t settle_start, settle_end;
    uint8_t settle_span_id[8];
    const char *settle_kind;      /* "settled", "unknown_usage" (static), NULL none */
    int64_t cost_nanousd;
    int estimated;
} tg_trace_rec_t;

/** Non-zero while tracing runs (read by tg_trace_enabled; do not write). */
extern int tg__trace_active;
/** The one branch a request pays when tracing is off. */
static inline int tg_trace_enabled(void) { return tg__trace_active; }

/**
 * Starts tracing when cfg->endpoint is set: allocates the record pool and starts the
 * exporter thread. TG_OK (also when off), or TG_ERROR with a line in err.
 */
int tg_trace_start(const tg_tracing_config_t *cfg, char *err, size_t errlen);
/** Sends what is queued (one attempt, bounded by timeout_ms), stops the exporter. */
void tg_trace_stop(void);

/**
 * The trace decision for a request: `incoming` the client's traceparent parsed (NULL
 * none or invalid). Fills *ctx with the trace id and a fresh span id for the server
 * span (and the flags). Returns 1 when the request is sampled (then take a record with
 * tg_trace_take), 0 when it is not.
 */
int tg_trace_decide(const tg_traceparent_t *incoming, tg_traceparent_t *ctx);
/** A fresh span id (never all zero), from the calling thread's generator. */
void tg_trace_span_id(uint8_t out[8]);
/** A free record (zeroed but for its ids), or NULL when the pool is empty (counted as
 *  dropped). */
tg_trace_rec_t *tg_trace_take(void);
/** Hands a finished record to the exporter. */
void tg_trace_submit(tg_trace_rec_t *r);
/** Gives back a record that will not be sent (a request freed without finishing). */
void tg_trace_cancel(tg_trace_rec_t *r);
/** The monotonic-to-wall offset now (ns), for a record's wall_minus_mono. */
int64_t tg_trace_clock_offset(void);

/** Registers the exporter's counters on a worker's /metrics (a no-op when off). */
void tg_trace_metrics(tg_metrics_t *m);

/** Writes records [0, n) as one OTLP/HTTP JSON ExportTraceServiceRequest into out
 *  (exposed for the unit tests and the fuzz target). */
void tg_trace_encode(tg_trace_rec_t *const *recs, int n, const char *service_name, tg_buf_t *out);

#endif
