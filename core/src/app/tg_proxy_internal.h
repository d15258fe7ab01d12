/*
 * The request state the data-plane pipeline's files share (not a public API; the
 * pipeline's entry points are in tollgate/tg_proxy.h). tg_proxy.c lists the files and
 * what lives in each.
 */
#ifndef TOLLGATE_TG_PROXY_INTERNAL_H
#define TOLLGATE_TG_PROXY_INTERNAL_H

#include <jansson.h>
#include <openssl/evp.h>

#include "tollgate/tg_proxy.h"

#include "tollgate/tg_accounts.h"
#include "tollgate/tg_aws.h"
#include "tollgate/tg_billing.h"
#include "tollgate/tg_crypto.h"
#include "tollgate/tg_health.h"
#include "tollgate/tg_identity.h"
#include "tollgate/tg_json.h"
#include "tollgate/tg_limits.h"
#include "tollgate/tg_pg.h"
#include "tollgate/tg_plugin.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_select.h"
#include "tollgate/tg_server.h"
#include "tollgate/tg_sse.h"
#include "tollgate/tg_state.h"
#include "tollgate/tg_trace.h"
#include "tollgate/tg_translate.h"
#include "tollgate/tg_upstream.h"
#include "tollgate/tg_usage.h"
#include "tollgate/tg_valid.h"
#include "tollgate/tg_worker.h"


#define TG_KEY_DIGESTS 64     /* keys whose digest a worker keeps */
#define TG_KEY_DIGEST_MAX 95  /* longer keys are hashed every time */

/* The pipeline's own per-worker part (tg_proxy_worker_create); the subsystems it uses
 * are the worker's (tg_worker_ctx_t). */
typedef struct tg_proxy_worker_s {
    tg_worker_ctx_t *ctx;      /* the worker's subsystems */
    int slot_script;           /* account slot lease (Redis); given back with a plain ZREM */
    EVP_MD_CTX *sha;           /* reused for every key hash: no allocation per request */
    struct proxy_req_s *spare; /* finished requests kept for reuse (see preq_alloc in tg_proxy.c) */
    struct tg_models_cache_s *models; /* GET /v1/models lists (tg_proxy_models.c) */
    int nspare;
    /* The SHA-256 of keys presented lately (direct-mapped by a hash of the key's bytes):
     * a client sends the same key on every request, and hashing it cost ~2,300
     * instructions a request. A digest is a function of the bytes alone, so nothing here
     * goes stale: revoking or changing a key is the lookup's business (tg_state_auth). */
    struct key_digest_s {
        unsigned char len; /* 0: empty */
        char key[TG_KEY_DIGEST_MAX];
        unsigned char digest[32];
    } digests[TG_KEY_DIGESTS];
} proxy_worker_t;

typedef struct proxy_req_s proxy_req_t;
/* Which top-level members of the client's body a phase changed: only these are
 * rewritten in the bytes sent upstream (tg_json_set_members). */
enum { DIRTY_MODEL = 1, DIRTY_LIMIT = 2, DIRTY_STREAM_OPTIONS = 4, DIRTY_WHOLE = 8 /* re-serialise it all */ };
/* The pipeline's phases, in order; phases[] in tg_proxy.c maps each to its
 * function. A phase that waits resumes the pipeline where it left off (tg__proxy_run); a
 * balance load admits again from PH_ADMIT, a retry starts over from PH_SELECT (admit then
 * passes: the first attempt's admission holds for the request). The account is chosen
 * before the admission so that the admission script takes the chosen account's slot too
 * (tg__slot_with_admission): one script and one round trip before the upstream call. */
typedef enum {
    PH_AUTH,
    PH_PARSE,
    PH_PLUGINS,
    PH_STICKY,
    PH_SELECT,
    PH_ADMIT,
    PH_SLOT,
    PH_RESERVE,
    PH_UPSTREAM,
    PH__COUNT
} phase_t;
typedef int (*phase_fn)(proxy_req_t *p);

/* Each kind of resource a request may hold has one cleanup (see tg__cleanup_add). */
#define CLEANUPS_MAX 16

/*
 * One upstream attempt: the account it goes to and everything its answer set. A retry
 * frees what the attempt owns and zeroes it (tg__attempt_reset), so nothing of a failed
 * attempt reaches the next one by accident.
 */
typedef struct {
    const tg_account_t *account;  /* NULL: the static upstream */
    tg_upstream_t *up;
    const char *credential;
    uint64_t token_gen;           /* an identity's token: which one was sent (tg_identity_rejected) */
    tg_proto_t up_proto;          /* what the upstream speaks (p->proto: what the client speaks) */
    tg_upcall_t *call;            /* the call in flight */
    tg_health_entry_t *health;    /* of the account, while the call runs */
    int upstream_status;
    int up_err;                   /* tg_uperr_t of a failed upstream call, 0 none */
    uint64_t first_byte_ns;
    uint64_t first_token_ns;      /* the first content event of a stream */
    int64_t stream_chunks;        /* content events streamed to the client */
    tg_usage_t usage;
    int strip_usage_chunk;        /* the client did not ask for the usage chunk we requested */
    tg_sse_parser_t sse;          /* owned while sse_on */
    int sse_on;
    tg_bedrock_stream_t aws;      /* a Bedrock event stream's decoder, owned while aws_on */
    int aws_on;
    tg_xlate_t *xlate;            /* stream translator when the protocols differ (owned) */
    int buffer_whole;             /* a translated non-stream or error answer: sent at the end */
    int body_copy_over;           /* the answer outgrew body_copy */
    int paused;                   /* the upstream read is paused for a slow client */
    int deferred;                 /* the error answer is deferred: a retry may replace it */
    int deferred_status;
    int auth_retry;               /* a 401 with an identity's token: refresh, then this account again */
    char deferred_ctype[128];
    char deferred_extra[1024];
} attempt_t;

struct proxy_req_s {
    struct proxy_req_s *next_spare; /* in the worker's spare list */
    tg_request_t *req;
    proxy_worker_t *pw;
    phase_t phase;                /* the next phase to run */
    const char *path;      /* path without query */
    json_t *json;          /* the request body's tree, built when a phase asks (tg__proxy_json) */
    int parsed;            /* the body is valid (phase_parse): tg__proxy_json can build it */
    int64_t scan_max_tokens; /* the plugins' max_tokens, when the body was only scanned */
    /* What the scan read for the phases that can do without the tree (parse_scanned):
     * scan_limits says every output-limit field is absent or an integer, their values
     * in scan_limit[] (limit_fields' order: 0 absent, -1 an integer below 1);
     * scan_sticky, that sticky routing may find a conversation key in the body. */
    int scan_limits, scan_sticky;
    int64_t scan_limit[3];
    tg_buf_t upstream_req; /* bytes sent upstream */
    char model[128];
    int stream;
    int strip_usage_orig;  /* the client did not ask for the usage chunk (each attempt's start) */
    tg_proto_t proto;
    tg_buf_t body_copy;           /* the attempt's answer, when read whole (kept across attempts) */
    tg_buf_t deferred_body;       /* the attempt's deferred error body (kept across attempts) */
    uint64_t upstream_start_ns, upstream_end_ns; /* the last attempt's call */
    const char *error;     /* short reason for the access log */
    tg_principal_t *principal;
    tg_auth_wait_t *auth_wait;
    tg_snapshot_t *snap;          /* kept while the account is in use */
    unsigned json_dirty;          /* top-level members changed since the parse (DIRTY_*) */
    const char *limit_key;        /* the output-cap member money_bound or output_cap set */
    int cap_added;                /* limit_key holds billing's default (the client set none) */
    tg_admit_t *admit;            /* held while admitted; released at the end */
    int64_t est_tokens;
    int est_done;                 /* est_tokens is the admission's (tg__estimate_tokens) */
    int ctx_on;                   /* ctx holds a plugin generation */
    char key_id_s[24], tenant_id_s[24];
    tg_reserve_t *reserve;        /* in flight (a reservation, or a balance load) */
    int reserved;                 /* attempts that reserved */
    unsigned unheld;              /* bit a-1: attempt a reserved without a Redis hold */
    int64_t reserved_amount;      /* nano-USD, all attempts */
    int bound_done;               /* reserved_amount and est_input are computed (-1 refused) */
    int64_t bound_output;         /* the output limit the upstream receives (money_bound) */
    int money_held;               /* the admission reserved attempt 1; not yet recorded */
    int balance_loads;            /* the admission asked for the live balance */
    char tenant_init[32], key_init[32]; /* the loaded balances, for the admission's retry */
    tg_budget_use_t budgets[TG_BUDGETS_MAX]; /* the periodic budgets, in the periods of the
                                                latest attempt that reserved (budgets_now) */
    int nbudgets;
    int64_t est_input;
    /* Routing and retries. */
    int attempt;                  /* 1-based */
    attempt_t at;                 /* the current attempt's state */
    int64_t tried[8];             /* accounts already tried */
    int ntried;
    int retry_other;              /* the next attempt must use another account if any */
    int norder, next_order;
    tg_redis_req_t *slot_rq;
    int64_t slot_asking;          /* the account slot_rq asks for */
    int slot_early;               /* 1: the admission asks for the slot (tg__slot_with_admission);
                                     2: its answer waits for phase slot in slot_answer */
    int slot_answer;              /* that answer: 1 taken, 0 full, -1 no answer */
    tg_redis_req_t *quota_rq;     /* the fleet's copy of the account's quota, read with its slot */
    uv_timer_t *slot_timer;       /* renews the slot lease while the call runs */
    int64_t slot_account;         /* holds a slot lease on this account */
    uint64_t slot_wait_since;     /* every account was full since (ms), 0 not waiting */
    uv_timer_t *retry_timer;
    char sticky_key[96];          /* Redis key of the sticky binding, "" none */
    int64_t sticky_account;       /* bound account (0 none) */
    tg_redis_req_t *sticky_rq;
    char traceparent[56];         /* sent upstream ("" none): the client's, or this attempt's */
    const tg_str_t *tracestate;   /* the client's, passed on with it (NULL none) */
    tg_trace_rec_t *trace;        /* a sampled request's spans (tg_proxy_trace.c), else NULL */
    tg_identity_wait_t *id_wait;  /* waiting for the account's access token (tg_identity.h) */
    int auth_retried;             /* the one refresh-and-retry after a 401 was used */
    struct models_fetch_s *models_fetch; /* GET /v1/models: the accounts asked (tg_proxy_models.c) */
    struct tg_capture_line_s *cap; /* a sampled request's capture line (tg_proxy_capture.c), else NULL */
    uint32_t cap_seed;
    void (*cleanups[CLEANUPS_MAX])(proxy_req_t *p); /* run newest first by tg__preq_free */
    int ncleanups;
    /* Large arrays, written before they are read: not zeroed at allocation (this is
     * most of the struct). Keep them last: preq_alloc zeroes everything before `ctx`. */
    tg_hookctx_t ctx;             /* what the plugin hooks see (tg_plugins_begin zeroes it) */
    tg_ffi_header_t hdrs[TG_MAX_HEADERS];
    tg_ffi_account_t accts[64];
    const tg_account_t *order[64]; /* candidates in order of preference */
};

/* Time to first token: the first content event of a stream, else the first body byte. */
#define TTFT_NS(p) ((p)->at.first_token_ns ? (p)->at.first_token_ns : (p)->at.first_byte_ns)

/* The model-calling routes: everything that is proxied, limited and billed. */
static inline int tg__is_model_route(tg_route_t r) {
    return r == TG_ROUTE_CHAT || r == TG_ROUTE_MESSAGES || r == TG_ROUTE_RESPONSES || r == TG_ROUTE_EMBEDDINGS;
}

/* ---- shared between the pipeline's files (each defined where its file says) ---------- */

/* tg_proxy.c: the driver, the request's state and cleanups, the gateway's own answers. */
void tg__proxy_run(proxy_req_t *p);
void tg__cleanup_add(proxy_req_t *p, void (*fn)(proxy_req_t *p));
void tg__preq_free(proxy_req_t *p);
void tg__attempt_free(attempt_t *at);
void tg__attempt_reset(proxy_req_t *p);
int tg__run_phase_later(proxy_req_t *p, phase_t phase, uint64_t delay_ms);
int tg__proxy_answer_error(proxy_req_t *p, int status, const char *type, const char *code, const char *msg,
                           const char *extra_headers);
int tg__proxy_fail_ex(proxy_req_t *p, int status, const char *type, const char *code, const char *msg,
                      const char *extra_headers);
int tg__proxy_fail(proxy_req_t *p, int status, const char *type, const char *code, const char *msg);

/* tg_proxy_intake.c */
int tg__phase_auth(proxy_req_t *p);
int tg__phase_parse(proxy_req_t *p);
int tg__phase_plugins(proxy_req_t *p);
int tg__plugin_reject(proxy_req_t *p);
json_t *tg__proxy_json(proxy_req_t *p);

/* tg_proxy_admit.c */
int tg__phase_admit(proxy_req_t *p);
int tg__phase_reserve(proxy_req_t *p);
void tg__estimate_tokens(proxy_req_t *p);

/* tg_proxy_route.c */
int tg__phase_sticky(proxy_req_t *p);
int tg__phase_select(proxy_req_t *p);
int tg__phase_slot(proxy_req_t *p);
int tg__slot_with_admission(proxy_req_t *p, char key[64], int64_t *limit);
void tg__slot_admitted(proxy_req_t *p, int slot);
void tg__cleanup_snapshot(proxy_req_t *p);
void tg__sticky_bind(proxy_req_t *p);
/* What the attempt's upstream said about its account's quota: its forwarded header lines
 * and, for an error, its body (tg_quota.h), folded into the account's health and shared
 * with the fleet (tg_proxy_route.c). */
void tg__quota_learn(proxy_req_t *p, int status, const char *lines, const char *body, size_t body_len);
int tg__retryable_status(int st);
int tg__can_retry(const proxy_req_t *p);
int tg__maybe_retry(proxy_req_t *p, int status, int failure, int64_t retry_after_ms);

/* tg_proxy_upstream.c */
int tg__phase_upstream(proxy_req_t *p);
/* A 401 from an account with an identity (tg_identity.h): the token is dropped and the
 * same account is called again once with a fresh one. Returns 1 when that retry was
 * scheduled. */
int tg__auth_retry(proxy_req_t *p);
static inline int tg__auth_retry_possible(const proxy_req_t *p, int status) {
    return status == 401 && p->at.account && p->at.account->auth && !p->auth_retried && !p->req->resp_started;
}

/* tg_proxy_models.c */
int tg__models_list(proxy_req_t *p);
void tg__models_cache_free(proxy_worker_t *pw);

/* tg_proxy_relay.c */
extern const tg_upcall_cbs_t tg__up_cbs;
void tg__health_detach(proxy_req_t *p);
void tg__on_abort(tg_request_t *req);
void tg__on_drain(tg_request_t *req);

/* tg_proxy_capture.c: a sampled request's capture line; tg__hook runs a hook (and
 * records it when the request is sampled). */
typedef struct tg_capture_line_s tg_capture_line_t;
int tg__hook(proxy_req_t *p, int hook);
void tg__capture_begin(proxy_req_t *p);
void tg__capture_model(proxy_req_t *p);
void tg__capture_accounts(proxy_req_t *p, int n, int sticky);
void tg__capture_select(proxy_req_t *p, const char *by, const tg_account_t *builtin);
void tg__capture_retry(proxy_req_t *p, int status, int failure, int64_t retry_after_ms, int64_t elapsed_ms,
                       int64_t deadline_ms, int action, int64_t delay_ms, int by_plugin);
void tg__capture_price(proxy_req_t *p, const tg_usage_t *billed, int64_t cost);
void tg__capture_finish(proxy_req_t *p, int status, double ttft_ms, double total_ms, int64_t cost);

/* tg_proxy_trace.c: the trace context, and a sampled request's spans (p->trace set). */
void tg__trace_pass(proxy_req_t *p);
void tg__trace_begin(proxy_req_t *p);
void tg__trace_admit_start(proxy_req_t *p);
void tg__trace_admit_end(proxy_req_t *p, int result);
void tg__trace_select_start(proxy_req_t *p);
void tg__trace_select_end(proxy_req_t *p);
void tg__trace_attempt_start(proxy_req_t *p);
void tg__trace_attempt_end(proxy_req_t *p, uint64_t now);
void tg__trace_settled(proxy_req_t *p, uint64_t start, const char *kind, int64_t cost, int estimated);
void tg__trace_finish(proxy_req_t *p, int status, uint64_t now);

/* tg_proxy_settle.c */
void tg__on_finish(tg_request_t *req, int aborted);

#endif
