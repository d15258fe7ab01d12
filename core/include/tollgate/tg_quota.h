/*
 * What a provider says about an account's quota, read from its response headers and
 * error bodies (core/src/proto/tg_quota.c): remaining requests and tokens with their
 * resets (OpenAI x-ratelimit-*, Anthropic anthropic-ratelimit-{requests,tokens,
 * input-tokens,output-tokens}-{limit,remaining,reset}), plan windows with their
 * utilisation, reset and status (Anthropic anthropic-ratelimit-unified-{5h,7d}-*, Codex
 * x-codex-{primary,secondary}-*), and a block until a stated reset (a 429 body such as
 * usage_limit_reached with resets_at or resets_in_seconds).
 *
 * Tolerant: a header it does not know is passed over, a value it cannot read is
 * ignored and counted (tg_quota_t.malformed), never an error. Pure functions over bytes:
 * no allocation, no I/O. Fuzzed by spec/fuzz/fuzz_quota.c.
 */
#ifndef TOLLGATE_TG_QUOTA_H
#define TOLLGATE_TG_QUOTA_H

#include "tollgate/tg_common.h"

/** Counted limits (per minute on metered plans). */
enum { TG_QL_REQUESTS = 0, TG_QL_TOKENS, TG_QL_INPUT_TOKENS, TG_QL_OUTPUT_TOKENS, TG_QL__COUNT };
/** Plan windows: the short one (Anthropic unified 5h, Codex primary) and the long one
 *  (unified 7d, Codex secondary). */
enum { TG_QW_SHORT = 0, TG_QW_LONG, TG_QW__COUNT };
/** A window's status as the provider states it. */
enum { TG_QS_UNKNOWN = 0, TG_QS_ALLOWED, TG_QS_WARNING, TG_QS_REJECTED };

typedef struct {
    int64_t limit;       /* -1 unknown */
    int64_t remaining;   /* -1 unknown */
    int64_t reset_at_ms; /* wall clock; 0 unknown */
} tg_quota_limit_t;

typedef struct {
    double used;         /* utilisation 0..1; < 0 unknown */
    int64_t reset_at_ms; /* 0 unknown */
    int64_t window_ms;   /* its length; 0 unknown */
    int status;          /* TG_QS_* */
} tg_quota_window_t;

typedef struct {
    tg_quota_limit_t lim[TG_QL__COUNT];
    tg_quota_window_t win[TG_QW__COUNT];
    int64_t blocked_until_ms; /* a stated "spent until" (an error body's resets_at); 0 none */
    int plan_status;          /* the plan as a whole (anthropic-ratelimit-unified-status) */
    int64_t plan_reset_ms;    /* and its reset (-unified-reset); 0 unknown */
    int64_t at_ms;            /* when it was learned (wall clock) */
    int known;                /* how many values were read */
    int malformed;            /* values of known headers that could not be read */
} tg_quota_t;

/** An empty state: everything unknown. */
void tg_quota_init(tg_quota_t *q, int64_t now_ms);

/**
 * Reads the quota headers among `lines` ("Name: value\r\n" lines, the upstream
 * response's forwarded headers) into q, relative to now_ms. Returns how many values
 * were read; q->malformed counts those that could not be.
 */
int tg_quota_parse_headers(tg_quota_t *q, const char *lines, size_t len, int64_t now_ms);

/** One header (name, value), as tg_quota_parse_headers reads each. 1 read, 0 not a quota
 *  header, -1 a quota header whose value could not be read (counted). */
int tg_quota_header(tg_quota_t *q, const char *name, size_t nlen, const char *v, size_t vlen, int64_t now_ms);

/**
 * Reads an error body for a stated reset (usage_limit_reached and the like: "resets_at"
 * in seconds since the epoch, or "resets_in_seconds") into q->blocked_until_ms. Returns
 * 1 when it found one.
 */
int tg_quota_parse_error(tg_quota_t *q, const char *body, size_t len, int64_t now_ms);

/** Folds what one response said (`in`) into the account's state (`st`): values it
 *  stated replace the old ones, the rest are kept. */
void tg_quota_merge(tg_quota_t *st, const tg_quota_t *in);

/**
 * Until when the account cannot take a request needing `est_tokens` tokens (0 or
 * less: unknown), by what it learned: a stated block, a rejected or fully used window,
 * no requests left, or fewer tokens left than the estimate — each until its reset.
 * 0 when it can (or nothing is known, or every reset has passed).
 */
int64_t tg_quota_blocked_until(const tg_quota_t *q, int64_t now_ms, int64_t est_tokens);

/** The smallest share left of the limits and windows it knows, 0..1; < 0 when none is
 *  known (or all have reset). *reset_in_ms: until the reset of that tightest one. */
double tg_quota_headroom(const tg_quota_t *q, int64_t now_ms, double *reset_in_ms);

/** The plan window resetting soonest (not yet reset): its unused share and the time
 *  until its reset; returns 0 when there is none. */
int tg_quota_window_soonest(const tg_quota_t *q, int64_t now_ms, double *left, double *reset_in_ms);

/** A compact text form for the fleet's copy in Redis (tg_quota_decode reads it back):
 *  at most TG_QUOTA_TEXT_MAX bytes with the NUL. Returns its length. */
#define TG_QUOTA_TEXT_MAX 256
size_t tg_quota_encode(const tg_quota_t *q, char *out, size_t cap);
/** 1 when `s` was a valid encoding (q filled), else 0 (q untouched). */
int tg_quota_decode(tg_quota_t *q, const char *s, size_t len);

#endif
