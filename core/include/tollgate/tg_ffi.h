/*
 * The plugin-facing C API: everything a plugin can read or change, as one C struct
 * per hook call (tg_hookctx_t) and a few tg_ffi_* functions. The Lua half of the
 * binding (core/lua/tg_cdef.lua) declares the block between the CDEF markers with
 * ffi.cdef, so plugin calls are JIT-compiled FFI calls rather than Lua C API calls;
 * spec/lua/test_cdef.lua fails when the two drift apart.
 *
 * Conventions (lua-resty-core style):
 *   - strings are pointer + length, never NUL-terminated views;
 *   - functions return TG_FFI_OK (0) or a negative TG_FFI_E* code, which the Lua side
 *     turns into `nil, "message"`; TG_FFI_EPHASE means the API is disabled in the
 *     context of the hook running now ("API disabled in the context of price");
 *   - Lua only ever sees `const tg_hookctx_t *`: fields are read directly (cheap and
 *     JIT-friendly), every change goes through a function that checks the hook.
 *
 * Ownership: the core owns the context and everything it points to (accounts, headers,
 * the strings); a context lives as long as its request. Plugins never keep pointers
 * across hook calls.
 */
#ifndef TOLLGATE_TG_FFI_H
#define TOLLGATE_TG_FFI_H

#include <stddef.h>
#include <stdint.h>

/* BEGIN FFI CDEF */
enum {
    TG_HOOK_ON_REQUEST = 0,
    TG_HOOK_MAP_MODEL = 1,
    TG_HOOK_SELECT_ACCOUNT = 2,
    TG_HOOK_ON_UPSTREAM_ERROR = 3,
    TG_HOOK_ON_LIMITER_DOWN = 4,
    TG_HOOK_PRICE = 5,
    TG_HOOK_ON_LOG = 6,
    TG_HOOK__COUNT = 7
};

enum {
    TG_FFI_OK = 0,
    TG_FFI_EPHASE = -1,
    TG_FFI_EARG = -2,
    TG_FFI_ENOTFOUND = -3,
    TG_FFI_ETOOLONG = -4,
    TG_FFI_EDECIDED = -5
};

/* on_upstream_error decisions. */
enum { TG_RETRY_GIVE_UP = 0, TG_RETRY_SAME = 1, TG_RETRY_OTHER = 2 };
/* on_upstream_error: what failed. */
enum {
    TG_UPFAIL_STATUS = 0,
    TG_UPFAIL_CONNECT = 1,
    TG_UPFAIL_TIMEOUT_CONNECT = 2,
    TG_UPFAIL_TIMEOUT_FIRST_BYTE = 3,
    TG_UPFAIL_TIMEOUT_IDLE = 4,
    TG_UPFAIL_RESET = 5
};
/* on_limiter_down: the limits that could not be checked, and the decision. */
enum { TG_LIMIT_RATE = 1, TG_LIMIT_TOKENS = 2, TG_LIMIT_CONCURRENCY = 4, TG_LIMIT_MONEY = 8 };
enum { TG_LIMITER_DEFAULT = -1, TG_LIMITER_CLOSED = 0, TG_LIMITER_OPEN = 1, TG_LIMITER_LOCAL = 2 };

typedef struct {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} tg_ffi_header_t;

/** One candidate upstream account, as select_account sees it. */
typedef struct {
    const char *id;
    size_t id_len;
    const char *region;
    size_t region_len;
    int priority;          /* higher is preferred */
    int inflight;          /* requests in flight on it */
    int max_concurrency;   /* 0 = unlimited */
    int queued;            /* requests waiting for one of its slots */
    int sticky;            /* the request's sticky binding points here */
    int tried;             /* attempts already made on it by this request */
    int excluded;          /* set by tg_ffi_exclude: never chosen */
    double error_ewma;     /* recent error rate, 0..1 */
    double ttft_ewma_ms;   /* recent time to first token; < 0 unknown */
    double reset_in_ms;    /* until its rate window resets (learned from the provider's
                              headers, else the operator's reset_at); < 0 unknown */
    double cost;           /* relative price (USD per million tokens, blended) */
    double score;          /* the last score a plugin gave it (logs, workbench) */
    int trial;             /* cooled, cooldown over: due its one trial request, which goes
                              first whatever a plugin selects (unless it excludes it) */
    double headroom;       /* the smallest share left of its learned limits (requests,
                              tokens, plan windows), 0..1; < 0 unknown */
    double window_left;    /* plan window resetting soonest: its unused share, 0..1; < 0 none */
    double window_reset_in_ms; /* until that window resets; < 0 none */
} tg_ffi_account_t;

/**
 * The context of one hook call. The core fills the inputs; plugins read them and
 * change the outputs through the tg_ffi_* functions below. Fields marked "out" are
 * written only by those functions.
 */
typedef struct {
    int hook;                   /* TG_HOOK_* running now, -1 between hooks */
    int worker;                 /* worker index, 0-based */
    int nworkers;
    int decided;                /* out: a plugin decided; later plugins are skipped */
    uint64_t generation;        /* plugin generation deciding this request */
    double now_ms;              /* wall clock at request start, ms since the epoch */

    const char *request_id;
    size_t request_id_len;
    const char *route;          /* "chat", "messages", "responses", "embeddings" */
    size_t route_len;
    const char *protocol;       /* "openai_chat", "anthropic", "responses", "embeddings" */
    size_t protocol_len;
    const char *key_id;         /* "" until keys live in the state store */
    size_t key_id_len;
    const char *tenant_id;
    size_t tenant_id_len;
    const tg_ffi_header_t *headers;
    int nheaders;
    int stream;
    int64_t max_tokens;         /* requested output limit, -1 unknown */

    char model[128];            /* out via tg_ffi_set_model (on_request, map_model) */
    size_t model_len;
    char original_model[128];   /* as the client sent it */
    size_t original_model_len;
    char group[64];             /* out via tg_ffi_set_group (on_request, map_model) */
    size_t group_len;

    /* select_account */
    tg_ffi_account_t *accounts;
    int naccounts;
    int selected;               /* out: index into accounts, -1 none */

    /* on_upstream_error */
    int attempt;                /* attempts made, counting the failed one (1-based) */
    int upstream_status;        /* HTTP status; 0 when failure is below HTTP */
    int failure;                /* TG_UPFAIL_* */
    int bytes_sent;             /* the client already got bytes: no retry possible */
    int64_t retry_after_ms;     /* parsed Retry-After, -1 absent */
    int64_t elapsed_ms;         /* since the request arrived */
    int64_t deadline_ms;        /* total budget from arrival, 0 none */
    int retry_action;           /* out: TG_RETRY_* */
    int64_t retry_delay_ms;     /* out */

    /* on_limiter_down */
    int limits;                 /* TG_LIMIT_* bits that could not be checked */
    int limiter_decision[4];    /* out: TG_LIMITER_* per limit, indexed by the bit
                                   position of its TG_LIMIT_* (rate, tokens, concurrency,
                                   money); DEFAULT = the configured policy */

    /* price, on_log */
    int64_t usage_input;
    int64_t usage_output;
    int64_t usage_cache_read;
    int64_t usage_cache_write;
    int64_t usage_reasoning;
    unsigned usage_known;       /* TG_USAGE_* bits (tg_usage.h) */
    int64_t cost_nanousd;       /* out via tg_ffi_set_cost (price); -1 unpriced */
    int status;                 /* on_log: the response status */
    double ttft_ms;             /* on_log; -1 unknown */
    double total_ms;            /* on_log */

    /* rejection (on_request, map_model, select_account) */
    int reject_status;          /* out: 0 = not rejected */
    char reject_code[64];
    char reject_message[256];

    /* response headers and access-log fields added by plugins */
    char resp_headers[512];     /* "name: value\r\n" lines */
    size_t resp_headers_len;
    char log_fields[512];       /* ,"key":"value" JSON members */
    size_t log_fields_len;

    int plugin_errors;          /* plugin errors during this request */
    void *gen_;                 /* the core's: the generation this request holds */
} tg_hookctx_t;

int tg_ffi_header(const tg_hookctx_t *ctx, const char *name, size_t name_len,
                  const char **value, size_t *value_len);
int tg_ffi_set_model(tg_hookctx_t *ctx, const char *model, size_t len);
int tg_ffi_set_group(tg_hookctx_t *ctx, const char *group, size_t len);
int tg_ffi_reject(tg_hookctx_t *ctx, int status, const char *code, size_t code_len,
                  const char *message, size_t message_len);
int tg_ffi_exclude(tg_hookctx_t *ctx, int index);
int tg_ffi_set_score(tg_hookctx_t *ctx, int index, double score);
int tg_ffi_select(tg_hookctx_t *ctx, int index);
int tg_ffi_retry(tg_hookctx_t *ctx, int action, int64_t delay_ms);
int tg_ffi_limiter(tg_hookctx_t *ctx, int limits, int decision);
int tg_ffi_set_cost(tg_hookctx_t *ctx, double nanousd);
int tg_ffi_add_header(tg_hookctx_t *ctx, const char *name, size_t name_len,
                      const char *value, size_t value_len);
int tg_ffi_log_field(tg_hookctx_t *ctx, const char *key, size_t key_len,
                     const char *value, size_t value_len);
int tg_ffi_log(const tg_hookctx_t *ctx, int level, const char *msg, size_t len);
double tg_ffi_monotonic_ms(void);
/* END FFI CDEF */

/** The name of a hook ("on_request", ...), or "?" for an unknown id. */
const char *tg_ffi_hook_name(int hook);

/** A constant message for a TG_FFI_E* code (the text Lua returns as `err`). */
const char *tg_ffi_strerror(int rc);

#endif
