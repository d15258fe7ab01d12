/*
 * The data-plane pipeline (tg_proxy.h): a request to a /v1/ route, routed here by
 * app/tg_router.c, walks the phases of phases[] below (nginx-style), then is settled and
 * logged when its response ends.
 *
 *   auth -> parse -> plugins (on_request, map_model) -> admit (limits and the first
 *   attempt's money, one Redis script) -> sticky -> select (account) -> slot (the
 *   account's concurrency lease) -> reserve (money of a later attempt) -> upstream
 *   (the call; the answer streamed back as it arrives, translated when the protocols
 *   differ) -> on_finish (release, price and on_log hooks, settlement, access log,
 *   metrics)
 *
 * Each phase returns TG_OK to go on, TG_DONE when it answered the request, or TG_AGAIN
 * when it started asynchronous work (a key lookup, admission in Redis, a slot lease, a
 * balance load) whose callback calls proxy_run() again. A retry (another account, or
 * the same after a delay) runs the phases again from select. The subsystems it calls
 * are its worker's (tg_worker.h), built and torn down by app/tg_worker.c.
 */
#include <jansson.h>
#include <libpq-fe.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_proxy.h"

#include "tollgate/tg_access_log.h"
#include "tollgate/tg_accounts.h"
#include "tollgate/tg_billing.h"
#include "tollgate/tg_crypto.h"
#include "tollgate/tg_health.h"
#include "tollgate/tg_pg.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_limits.h"
#include "tollgate/tg_json.h"
#include "tollgate/tg_plugin.h"
#include "tollgate/tg_select.h"
#include "tollgate/tg_server.h"
#include "tollgate/tg_state.h"
#include "tollgate/tg_sse.h"
#include "tollgate/tg_translate.h"
#include "tollgate/tg_upstream.h"
#include "tollgate/tg_valid.h"
#include "tollgate/tg_usage.h"
#include "tollgate/tg_worker.h"

#define BODY_COPY_MAX (16u * 1024 * 1024)
#define SSE_EVENT_MAX (4u * 1024 * 1024)

/* The pipeline's own per-worker part (tg_proxy_worker_create); the subsystems it uses
 * are the worker's (tg_worker_ctx_t). */
typedef struct tg_proxy_worker_s {
    tg_worker_ctx_t *ctx;      /* the worker's subsystems */
    int slot_script;           /* account slot lease (Redis) */
    int slot_release_script;
    EVP_MD_CTX *sha;           /* reused for every key hash: no allocation per request */
    struct proxy_req_s *spare; /* finished requests kept for reuse (see preq_alloc) */
    int nspare;
} proxy_worker_t;

/* The account's own concurrency slot: KEYS[1] {a:<id>}:conc; ARGV id, limit, ttl_ms. */
static const char SLOT_LUA[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end\n"
    "redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])\n"
    "redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)\n"
    "return 1\n";
static const char SLOT_RELEASE_LUA[] = "return redis.call('ZREM', KEYS[1], ARGV[1])\n";

typedef struct proxy_req_s proxy_req_t;
/* Which top-level members of the client's body a phase changed: only these are
 * rewritten in the bytes sent upstream (tg_json_set_members). */
enum { DIRTY_MODEL = 1, DIRTY_LIMIT = 2, DIRTY_STREAM_OPTIONS = 4, DIRTY_WHOLE = 8 /* re-serialise it all */ };
/* The pipeline's phases, in order; phases[] at the end of the file maps each to its
 * function. A phase that waits resumes the pipeline where it left off (proxy_run); a
 * balance load admits again from PH_ADMIT, a retry starts over from PH_SELECT. */
typedef enum {
    PH_AUTH,
    PH_PARSE,
    PH_PLUGINS,
    PH_ADMIT,
    PH_STICKY,
    PH_SELECT,
    PH_SLOT,
    PH_RESERVE,
    PH_UPSTREAM,
    PH__COUNT
} phase_t;
typedef int (*phase_fn)(proxy_req_t *p);

/* Each kind of resource a request may hold has one cleanup (see cleanup_add). */
#define CLEANUPS_MAX 16

/*
 * One upstream attempt: the account it goes to and everything its answer set. A retry
 * frees what the attempt owns and zeroes it (attempt_reset), so nothing of a failed
 * attempt reaches the next one by accident.
 */
typedef struct {
    const tg_account_t *account;  /* NULL: the static upstream */
    tg_upstream_t *up;
    const char *credential;
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
    tg_xlate_t *xlate;            /* stream translator when the protocols differ (owned) */
    int buffer_whole;             /* a translated non-stream or error answer: sent at the end */
    int body_copy_over;           /* the answer outgrew body_copy */
    int paused;                   /* the upstream read is paused for a slow client */
    int deferred;                 /* the error answer is deferred: a retry may replace it */
    int deferred_status;
    char deferred_ctype[128];
    char deferred_extra[1024];
} attempt_t;

struct proxy_req_s {
    struct proxy_req_s *next_spare; /* in the worker's spare list */
    tg_request_t *req;
    proxy_worker_t *pw;
    phase_t phase;                /* the next phase to run */
    const char *path;      /* path without query */
    json_t *json;          /* parsed request body */
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
    const char *limit_key;        /* the output-cap member phase_reserve set */
    int cap_added;                /* limit_key holds billing's default (the client set none) */
    tg_admit_t *admit;            /* held while admitted; released at the end */
    int64_t est_tokens;
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
    int64_t est_input;
    /* Routing and retries. */
    int attempt;                  /* 1-based */
    attempt_t at;                 /* the current attempt's state */
    int64_t tried[8];             /* accounts already tried */
    int ntried;
    int retry_other;              /* the next attempt must use another account if any */
    int norder, next_order;
    tg_redis_req_t *slot_rq;
    uv_timer_t *slot_timer;       /* renews the slot lease while the call runs */
    int64_t slot_account;         /* holds a slot lease on this account */
    uint64_t slot_wait_since;     /* every account was full since (ms), 0 not waiting */
    uv_timer_t *retry_timer;
    char sticky_key[96];          /* Redis key of the sticky binding, "" none */
    int64_t sticky_account;       /* bound account (0 none) */
    tg_redis_req_t *sticky_rq;
    char traceparent[56];
    void (*cleanups[CLEANUPS_MAX])(proxy_req_t *p); /* run newest first by preq_free */
    int ncleanups;
    /* Large arrays, written before they are read: not zeroed at allocation (this is
     * most of the struct). Keep them last: preq_new zeroes everything before `ctx`. */
    tg_hookctx_t ctx;             /* what the plugin hooks see (tg_plugins_begin zeroes it) */
    tg_ffi_header_t hdrs[TG_MAX_HEADERS];
    tg_ffi_account_t accts[64];
    const tg_account_t *order[64]; /* candidates in order of preference */
};

static void proxy_run(proxy_req_t *p);

/* Time to first token: the first content event of a stream, else the first body byte. */
#define TTFT_NS(p) ((p)->at.first_token_ns ? (p)->at.first_token_ns : (p)->at.first_byte_ns)

/* ---- per-worker state --------------------------------------------------------------- */

tg_proxy_worker_t *tg_proxy_worker_create(tg_worker_ctx_t *wc) {
    proxy_worker_t *pw = calloc(1, sizeof(*pw));
    pw->ctx = wc;
    pw->sha = EVP_MD_CTX_new();
    tg_redis_t *redis = tg_state_redis(wc->state);
    if (redis) {
        pw->slot_script = tg_redis_script_register(redis, SLOT_LUA);
        pw->slot_release_script = tg_redis_script_register(redis, SLOT_RELEASE_LUA);
    }
    return pw;
}

void tg_proxy_worker_destroy(tg_proxy_worker_t *pw) {
    if (!pw)
        return;
    EVP_MD_CTX_free(pw->sha);
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

static void slot_release(proxy_req_t *p);

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
static void attempt_free(attempt_t *at) {
    if (at->sse_on)
        tg_sse_free(&at->sse);
    tg_xlate_destroy(at->xlate);
}

/* A retry: the failed attempt's state goes, the next starts from zero (its answer
 * buffers keep their memory). The call has ended and the account's health is settled. */
static void attempt_reset(proxy_req_t *p) {
    attempt_free(&p->at);
    memset(&p->at, 0, sizeof(p->at));
    p->at.strip_usage_chunk = p->strip_usage_orig;
    tg_buf_reset(&p->body_copy);
    tg_buf_reset(&p->deferred_body);
}

/*
 * What a request holds is given back by the cleanup registered where it was taken (as
 * nginx's pool cleanups): preq_free runs them newest first, so what was taken later goes
 * first (a hold before the principal it names). A cleanup reads the request's fields when
 * it runs: a resource already given back on the way (an answered lookup, a released lease)
 * is skipped. Each kind is registered once per request, however often it is taken.
 */
static void cleanup_add(proxy_req_t *p, void (*fn)(proxy_req_t *p)) {
    for (int i = 0; i < p->ncleanups; i++)
        if (p->cleanups[i] == fn)
            return;
    if (p->ncleanups >= CLEANUPS_MAX)
        abort();
    p->cleanups[p->ncleanups++] = fn;
}

static void preq_free(proxy_req_t *p) {
    while (p->ncleanups > 0)
        p->cleanups[--p->ncleanups](p);
    preq_recycle(p);
}

static void cleanup_auth_wait(proxy_req_t *p) { tg_state_auth_cancel(p->auth_wait); }

static void cleanup_principal(proxy_req_t *p) { tg_principal_release(p->principal); }

static void cleanup_json(proxy_req_t *p) {
    if (p->json)
        json_decref(p->json);
}

static void cleanup_plugins(proxy_req_t *p) {
    if (p->ctx_on)
        tg_plugins_end(p->pw->ctx->plugins, &p->ctx);
}

static void cleanup_admit(proxy_req_t *p) {
    if (p->admit)
        tg_admit_cancel(p->admit);
}

/* Admitted and reserved, but the upstream was never called (no account, the client
 * left): the hold goes straight back and nothing is recorded. */
static void cleanup_money_held(proxy_req_t *p) {
    if (p->money_held && p->pw->ctx->billing)
        tg_billing_release_attempt(p->pw->ctx->billing, p->req->id, p->principal->tenant_id, p->principal->key_id, 1);
}

/* A reservation or a balance load in flight. */
static void cleanup_reserve(proxy_req_t *p) { tg_reserve_detach(p->reserve); }

static void cleanup_sticky(proxy_req_t *p) {
    if (p->sticky_rq)
        tg_redis_cancel(p->sticky_rq);
}

static void cleanup_snapshot(proxy_req_t *p) { tg_snapshot_release(p->snap); }

static void cleanup_retry_timer(proxy_req_t *p) {
    uv_timer_stop(p->retry_timer);
    uv_close((uv_handle_t *)p->retry_timer, (uv_close_cb)free);
}

/* The account slot: the lookup in flight, the lease, its renewal timer. */
static void cleanup_slot(proxy_req_t *p) {
    if (p->slot_rq)
        tg_redis_cancel(p->slot_rq);
    slot_release(p);
    if (p->slot_timer)
        uv_close((uv_handle_t *)p->slot_timer, (uv_close_cb)free);
}

/* The upstream attempt: its request bytes, deferred answer, stream parser, translator. */
static void cleanup_attempt(proxy_req_t *p) {
    tg_buf_free(&p->upstream_req);
    tg_buf_free(&p->deferred_body);
    attempt_free(&p->at);
}

static void health_detach(proxy_req_t *p) {
    /* The client left: not the account's fault, so no EWMA change. */
    if (p->at.health) {
        if (p->at.health->inflight > 0)
            p->at.health->inflight--;
        p->at.health->probing = 0;
        p->at.health = NULL;
    }
}

static void on_abort(tg_request_t *req) {
    proxy_req_t *p = req->handler_data;
    health_detach(p);
    if (p->at.call) {
        tg_upcall_abort(p->at.call);
        p->at.call = NULL;
        p->upstream_end_ns = tg_now_ns();
    }
    p->error = "client_disconnected";
}

static void on_drain(tg_request_t *req) {
    proxy_req_t *p = req->handler_data;
    if (p->at.paused && p->at.call) {
        p->at.paused = 0;
        tg_upcall_resume(p->at.call);
    }
}

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

static void on_finish(tg_request_t *req, int aborted) {
    proxy_req_t *p = req->handler_data;
    health_detach(p);
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
            tg_plugins_run(p->pw->ctx->plugins, TG_HOOK_PRICE, c);
            if (c->cost_nanousd >= 0)
                cost = c->cost_nanousd;
        }
        if (tg_plugins_has_hook(p->pw->ctx->plugins, c, TG_HOOK_ON_LOG))
            tg_plugins_run(p->pw->ctx->plugins, TG_HOOK_ON_LOG, c);
    }
    if (p->reserved && p->pw->ctx->billing) {
        int unknown = !((billed.known & TG_USAGE_INPUT) && (billed.known & TG_USAGE_OUTPUT));
        int sent = p->at.up_err == TG_UPERR_TIMEOUT_FIRST_BYTE || p->at.up_err == TG_UPERR_TIMEOUT_IDLE ||
                   p->at.up_err == TG_UPERR_RESET || p->at.up_err == TG_UPERR_PROTOCOL;
        if (unknown && sent) {
            /* The upstream may have run it: never assume it did not. */
            tg_billing_unknown(p->pw->ctx->billing, req->id, p->principal->tenant_id, p->principal->key_id, p->reserved,
                               p->model, p->reserved_amount);
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
            };
            tg_billing_settle(p->pw->ctx->billing, &s);
        }
    }
    if (req->route != TG_ROUTE_HEALTHZ && req->route != TG_ROUTE_METRICS) {
        tg_access_line_t line = {.path = p->path ? p->path : "",
                                 .path_len = p->path ? strlen(p->path) : 0,
                                 .now_ns = now,
                                 .error = p->error,
                                 .more = access_log_more,
                                 .ud = p};
        tg_access_log(req, aborted, &line);
    }
    req->handler_data = NULL;
    preq_free(p);
}

/* The model-calling routes: everything that is proxied, limited and billed. */
static int is_model_route(tg_route_t r) {
    return r == TG_ROUTE_CHAT || r == TG_ROUTE_MESSAGES || r == TG_ROUTE_RESPONSES || r == TG_ROUTE_EMBEDDINGS;
}

/* Every error the gateway itself answers goes through here, so that a client gets it in
 * its own protocol's shape (Anthropic's for /v1/messages, OpenAI's otherwise). */
static int answer_error(proxy_req_t *p, int status, const char *type, const char *code, const char *msg,
                        const char *extra_headers) {
    if (p->proto == TG_PROTO_ANTHROPIC && p->req->route == TG_ROUTE_MESSAGES) {
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

static int fail_ex(proxy_req_t *p, int status, const char *type, const char *code, const char *msg,
                   const char *extra_headers) {
    p->error = code;
    return answer_error(p, status, type, code, msg, extra_headers);
}

static int fail(proxy_req_t *p, int status, const char *type, const char *code, const char *msg) {
    return fail_ex(p, status, type, code, msg, NULL);
}

/* ---- phase: auth -------------------------------------------------------------------- */

static int auth_check(proxy_req_t *p, tg_principal_t *pr) {
    tg_request_t *req = p->req;
    p->principal = pr;
    cleanup_add(p, cleanup_principal);
    if (!pr)
        return fail(p, 401, "invalid_request_error", "invalid_api_key", "invalid API key");
    if (!pr->active)
        return fail(p, 401, "invalid_request_error", "invalid_api_key", "this API key has been revoked or its tenant suspended");
    if (pr->expires_at_ms && (int64_t)tg_wall_ms() >= pr->expires_at_ms)
        return fail(p, 401, "invalid_request_error", "invalid_api_key", "this API key has expired");
    if (!tg_principal_allows_ip(pr, req->client_ip))
        return fail(p, 403, "permission_error", "ip_not_allowed", "this API key may not be used from this address");
    return TG_OK;
}

static void auth_done(void *ud, tg_principal_t *pr, const char *err) {
    proxy_req_t *p = ud;
    p->auth_wait = NULL;
    if (err) {
        tg_principal_release(pr);
        tg_log_warn("request %s: key lookup failed: %s", p->req->id, err);
        fail(p, 503, "server_error", "auth_unavailable", "the key could not be checked; try again");
        return;
    }
    if (auth_check(p, pr) == TG_OK)
        proxy_run(p);
}

static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_free(void) { EVP_MD_free(sha256_md); }

static void sha256_fetch(void) {
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    atexit(sha256_free);
}

static int phase_auth(proxy_req_t *p) {
    tg_request_t *req = p->req;
    tg_str_t key = {NULL, 0};
    const tg_str_t *h = tg_request_header(req, "authorization");
    if (h && h->len > 7 && strncasecmp(h->p, "Bearer ", 7) == 0) {
        key.p = h->p + 7;
        key.len = h->len - 7;
        while (key.len && key.p[0] == ' ') {
            key.p++;
            key.len--;
        }
    } else if ((h = tg_request_header(req, "x-api-key")) != NULL) {
        key = *h;
    }
    if (!key.len)
        return fail(p, 401, "invalid_request_error", "invalid_api_key",
                    "missing API key: send Authorization: Bearer <key>");
    unsigned char digest[32];
    /* OpenSSL 3's one-shot SHA256() fetches the algorithm on every call: fetch it once. */
    pthread_once(&sha256_once, sha256_fetch);
    EVP_MD_CTX *sha = p->pw->sha;
    if (!sha256_md || !sha || !EVP_DigestInit_ex(sha, sha256_md, NULL) || !EVP_DigestUpdate(sha, key.p, key.len) ||
        !EVP_DigestFinal_ex(sha, digest, NULL))
        SHA256((const unsigned char *)key.p, key.len, digest);
    tg_principal_t *pr = NULL;
    int rc = tg_state_auth(p->pw->ctx->state, digest, auth_done, p, &pr, &p->auth_wait);
    if (rc == TG_AGAIN) {
        cleanup_add(p, cleanup_auth_wait);
        return TG_AGAIN;
    }
    return auth_check(p, pr);
}

/* ---- phase: parse ------------------------------------------------------------------- */

static int phase_parse(proxy_req_t *p) {
    tg_request_t *req = p->req;
    if (!is_model_route(req->route))
        return TG_OK;
    json_error_t jerr;
    p->json = tg_json_loadb(req->body.data ? req->body.data : "", req->body.len, JSON_REJECT_DUPLICATES, &jerr);
    cleanup_add(p, cleanup_json);
    if (!p->json) {
        char msg[256];
        snprintf(msg, sizeof(msg), "request body is not valid JSON: %s (at byte %d)", jerr.text, jerr.position);
        return fail(p, 400, "invalid_request_error", "invalid_json", msg);
    }
    if (!json_is_object(p->json))
        return fail(p, 400, "invalid_request_error", "invalid_request", "request body must be a JSON object");
    /* Integers beyond int64 are kept where they are data (tool schemas, arguments); a
     * top-level parameter that big is never meaningful, and the gateway reads some. */
    const char *key;
    json_t *val;
    json_object_foreach(p->json, key, val) {
        if (tg_json_is_big(val, NULL, NULL)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "%.64s: integer out of range", key);
            return fail(p, 400, "invalid_request_error", "invalid_number", msg);
        }
    }
    json_t *model = json_object_get(p->json, "model");
    if (!model)
        return fail(p, 400, "invalid_request_error", "missing_model", "you must provide a model parameter");
    if (!json_is_string(model) || json_string_length(model) == 0 ||
        json_string_length(model) >= sizeof(p->model))
        return fail(p, 400, "invalid_request_error", "invalid_model", "model must be a non-empty string");
    snprintf(p->model, sizeof(p->model), "%s", json_string_value(model));
    if (p->proto == TG_PROTO_OPENAI_CHAT || p->proto == TG_PROTO_ANTHROPIC) {
        json_t *messages = json_object_get(p->json, "messages");
        if (!json_is_array(messages))
            return fail(p, 400, "invalid_request_error", "missing_messages", "messages must be an array");
    } else if (p->proto == TG_PROTO_RESPONSES) {
        json_t *input = json_object_get(p->json, "input");
        if (!json_is_string(input) && !json_is_array(input))
            return fail(p, 400, "invalid_request_error", "missing_input", "input must be a string or an array");
    } else {
        json_t *input = json_object_get(p->json, "input");
        if (!json_is_string(input) && !json_is_array(input))
            return fail(p, 400, "invalid_request_error", "missing_input", "input must be a string or an array");
    }
    json_t *stream = json_object_get(p->json, "stream");
    if (stream && !json_is_boolean(stream) && !json_is_null(stream))
        return fail(p, 400, "invalid_request_error", "invalid_stream", "stream must be a boolean");
    p->stream = json_is_true(stream) && p->proto != TG_PROTO_EMBEDDINGS;
    if (p->req->route == TG_ROUTE_MESSAGES && strcmp(p->path, "/v1/messages/count_tokens") == 0) {
        /* Anthropic's count_tokens: a local estimate, no upstream call. */
        int64_t n = tg_estimate_tokens(TG_PROTO_ANTHROPIC, p->json);
        char body[64];
        int len = snprintf(body, sizeof(body), "{\"input_tokens\":%lld}", (long long)TG_MAX(n, 1));
        tg_response_send(p->req, 200, "application/json", NULL, body, (size_t)len);
        return TG_DONE;
    }
    if (p->stream && p->proto == TG_PROTO_OPENAI_CHAT) {
        /* Ask for the usage chunk; remember whether the client wanted it. */
        json_t *so = json_object_get(p->json, "stream_options");
        if (so && !json_is_object(so) && !json_is_null(so))
            return fail(p, 400, "invalid_request_error", "invalid_stream_options",
                        "stream_options must be an object");
        if (!json_is_object(so)) {
            so = json_object();
            json_object_set_new(p->json, "stream_options", so);
        }
        if (!json_is_true(json_object_get(so, "include_usage"))) {
            p->at.strip_usage_chunk = p->strip_usage_orig = 1;
            json_object_set_new(so, "include_usage", json_true());
            p->json_dirty |= DIRTY_STREAM_OPTIONS;
        }
    }
    return TG_OK;
}

/* ---- phase: plugins (on_request, map_model) ----------------------------------------- */

/* A plugin's refusal, in the client's protocol's error shape (fail_ex). The code is the
 * plugin's own text: letters, digits, '_', '-' and '.' pass, anything else becomes '_',
 * so it can stand in the JSON body unescaped. */
static int plugin_reject(proxy_req_t *p) {
    tg_hookctx_t *c = &p->ctx;
    int status = c->reject_status >= 400 && c->reject_status < 600 ? c->reject_status : 403;
    char code[sizeof(c->reject_code)];
    size_t n = 0;
    for (; c->reject_code[n] && n + 1 < sizeof(code); n++) {
        char ch = c->reject_code[n];
        code[n] = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                          ch == '-' || ch == '.'
                      ? ch
                      : '_';
    }
    code[n] = '\0';
    p->error = "rejected_by_plugin"; /* the access log's; code lives on this stack */
    return answer_error(p, status,
                        status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error",
                        n ? code : "rejected", c->reject_message[0] ? c->reject_message : "rejected by policy", NULL);
}

static int phase_plugins(proxy_req_t *p) {
    tg_request_t *req = p->req;
    tg_plugins_t *pl = p->pw->ctx->plugins;
    if (!pl || !is_model_route(req->route))
        return TG_OK;
    tg_hookctx_t *c = &p->ctx;
    tg_plugins_begin(pl, c);
    p->ctx_on = 1;
    cleanup_add(p, cleanup_plugins);
    for (int i = 0; i < req->nheaders; i++)
        p->hdrs[i] = (tg_ffi_header_t){req->headers[i].name.p, req->headers[i].name.len, req->headers[i].value.p,
                                       req->headers[i].value.len};
    c->headers = p->hdrs;
    c->nheaders = req->nheaders;
    c->request_id = req->id;
    c->request_id_len = strlen(req->id);
    static const char *const routes[] = {"chat", "messages", "responses", "embeddings"};
    c->route = routes[p->proto];
    c->route_len = strlen(c->route);
    c->protocol = tg_translate_proto_name(p->proto);
    c->protocol_len = strlen(c->protocol);
    if (p->principal && p->principal->key_id) {
        snprintf(p->key_id_s, sizeof(p->key_id_s), "%lld", (long long)p->principal->key_id);
        snprintf(p->tenant_id_s, sizeof(p->tenant_id_s), "%lld", (long long)p->principal->tenant_id);
        snprintf(c->group, sizeof(c->group), "%.63s", p->principal->group_name);
        c->group_len = strlen(c->group);
        tg_plugins_use_group(pl, c, p->principal->group_id, p->principal->group_plugins);
    }
    c->key_id = p->key_id_s;
    c->key_id_len = strlen(p->key_id_s);
    c->tenant_id = p->tenant_id_s;
    c->tenant_id_len = strlen(p->tenant_id_s);
    c->stream = p->stream;
    json_t *mt = json_object_get(p->json, "max_completion_tokens");
    if (!json_is_integer(mt))
        mt = json_object_get(p->json, "max_tokens");
    c->max_tokens = json_is_integer(mt) ? json_integer_value(mt) : -1;
    tg_plugins_ctx_set_model(c, p->model, strlen(p->model));
    if (tg_plugins_has_hook(pl, c, TG_HOOK_ON_REQUEST) && tg_plugins_run(pl, TG_HOOK_ON_REQUEST, c) == TG_DONE)
        return plugin_reject(p);
    if (tg_plugins_has_hook(pl, c, TG_HOOK_MAP_MODEL) && tg_plugins_run(pl, TG_HOOK_MAP_MODEL, c) == TG_DONE)
        return plugin_reject(p);
    if (c->model_len && (c->model_len != strlen(p->model) || memcmp(c->model, p->model, c->model_len) != 0)) {
        snprintf(p->model, sizeof(p->model), "%.*s", (int)c->model_len, c->model);
        json_object_set_new(p->json, "model", json_string(p->model));
        p->json_dirty |= DIRTY_MODEL;
    }
    /* The key's model restrictions apply to the model that will be served. */
    if (p->principal && !tg_principal_allows_model(p->principal, p->model))
        return fail(p, 403, "permission_error", "model_not_allowed", "this API key may not use this model");
    return TG_OK;
}

/* ---- phase: admit ------------------------------------------------------------------- */

static int phase_admit(proxy_req_t *p);

static void balance_loaded(void *ud, int status, const char *code, const char *msg, const char *tenant,
                           const char *key) {
    proxy_req_t *p = ud;
    p->reserve = NULL;
    if (status) {
        fail(p, status, "server_error", code, msg);
        return;
    }
    snprintf(p->tenant_init, sizeof(p->tenant_init), "%s", tenant);
    snprintf(p->key_init, sizeof(p->key_init), "%s", key);
    p->phase = PH_ADMIT; /* the script wrote nothing (its marker is gone): admit again */
    proxy_run(p);
}

static int money_open(void *ud);

static tg_reserve_req_t reserve_req(const proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    return (tg_reserve_req_t){
        .request_id = p->req->id,
        .attempt = p->attempt,
        .tenant_id = pr->tenant_id,
        .key_id = pr->key_id,
        .model = p->model,
        .amount = p->reserved_amount,
        .key_budget = pr->budget[0] != '\0',
        .money_open = money_open,
    };
}

static void admit_done(void *ud, const tg_admit_outcome_t *out) {
    proxy_req_t *p = ud;
    if (out->result == TG_ADMIT_OK) {
        p->money_held = out->reserved;
        cleanup_add(p, cleanup_money_held);
        proxy_run(p);
        return;
    }
    tg_admit_t *a = p->admit;
    p->admit = NULL;
    tg_admit_cancel(a); /* refused: nothing is held; frees the handle */
    if (out->result == TG_ADMIT_BALANCE || out->result == TG_ADMIT_BUDGET) {
        const char *code, *msg;
        tg_billing_refused(p->pw->ctx->billing, out->result == TG_ADMIT_BUDGET, &code, &msg);
        fail(p, 402, "insufficient_quota", code, msg);
        return;
    }
    if (out->result == TG_ADMIT_MONEY_INIT) {
        /* As tg_billing_reserve: a few loads at most (another instance may race us). */
        if (p->balance_loads++ > 2) {
            fail(p, 503, "server_error", "billing_unavailable", "the balance could not be initialised");
            return;
        }
        tg_reserve_req_t r = reserve_req(p);
        p->reserve = tg_billing_load(p->pw->ctx->billing, &r, balance_loaded, p);
        cleanup_add(p, cleanup_reserve);
        return;
    }
    if (out->result == TG_ADMIT_UNAVAILABLE) {
        fail_ex(p, 503, "server_error", "limiter_unavailable",
                "the rate limiter is unavailable and this limit fails closed; try again shortly", "Retry-After: 1\r\n");
        return;
    }
    const char *code = out->result == TG_ADMIT_TOKENS        ? "tokens_limit_exceeded"
                       : out->result == TG_ADMIT_CONCURRENCY ? "concurrency_limit_exceeded"
                       : out->result == TG_ADMIT_QUEUE_FULL  ? "concurrency_limit_exceeded"
                                                             : "rate_limit_exceeded";
    char extra[64], msg[200];
    long secs = (long)((out->retry_after_ms + 999) / 1000);
    if (secs < 1)
        secs = 1;
    snprintf(extra, sizeof(extra), "Retry-After: %ld\r\n", secs);
    snprintf(msg, sizeof(msg), "%s limit reached%s; retry after %ld s", out->which ? out->which : "a",
             out->result == TG_ADMIT_QUEUE_FULL ? " and the wait queue is full" : "", secs);
    fail_ex(p, 429, "rate_limit_error", code, msg, extra);
}

/* Redis is down: the on_limiter_down hook decides, per limit, when a plugin implements
 * it; what it leaves undecided keeps the configured policy in `pol`. `bits` are
 * 1 << TG_DOWN_* = TG_LIMIT_*. */
_Static_assert(TG_LIMIT_RATE == 1 << TG_DOWN_RATE && TG_LIMIT_TOKENS == 1 << TG_DOWN_TOKENS &&
                   TG_LIMIT_CONCURRENCY == 1 << TG_DOWN_CONCURRENCY && TG_LIMIT_MONEY == 1 << TG_DOWN_MONEY,
               "limit bits");
_Static_assert((int)TG_LIMITER_CLOSED == (int)TG_FAIL_CLOSED && (int)TG_LIMITER_OPEN == (int)TG_FAIL_OPEN &&
                   (int)TG_LIMITER_LOCAL == (int)TG_FAIL_LOCAL,
               "decisions");
static void limiter_down(void *ud, int bits, tg_fail_policy_t pol[TG_DOWN__COUNT]) {
    proxy_req_t *p = ud;
    tg_plugins_t *pl = p->pw->ctx->plugins;
    if (!p->ctx_on || !tg_plugins_has_hook(pl, &p->ctx, TG_HOOK_ON_LIMITER_DOWN))
        return;
    p->ctx.limits = bits;
    tg_plugins_run(pl, TG_HOOK_ON_LIMITER_DOWN, &p->ctx);
    for (int k = 0; k < TG_DOWN__COUNT; k++) {
        int d = p->ctx.limiter_decision[k];
        if (!(bits & (1 << k)) || d == TG_LIMITER_DEFAULT)
            continue;
        /* Money has no local bucket (tg_ffi_limiter refuses it; a failed plugin cannot set it). */
        pol[k] = k == TG_DOWN_MONEY && d == TG_LIMITER_LOCAL ? TG_FAIL_CLOSED : (tg_fail_policy_t)d;
    }
}

/* Billing could not reach Redis: money is closed unless the on_limiter_down hook opens
 * it (money has no local policy). Counted with the other limits. */
static int money_open(void *ud) {
    proxy_req_t *p = ud;
    tg_fail_policy_t pol[TG_DOWN__COUNT] = {TG_FAIL_CLOSED, TG_FAIL_CLOSED, TG_FAIL_CLOSED, TG_FAIL_CLOSED};
    limiter_down(p, TG_LIMIT_MONEY, pol);
    tg_fail_policy_t m = pol[TG_DOWN_MONEY] == TG_FAIL_OPEN ? TG_FAIL_OPEN : TG_FAIL_CLOSED;
    if (p->pw->ctx->limits)
        tg_limits_count_down(p->pw->ctx->limits, TG_DOWN_MONEY, m);
    return m == TG_FAIL_OPEN;
}

/* The output limit's spellings. A passthrough sends the body as it came (every one of
 * them), and a translation reads the one its source protocol knows (chat reads
 * max_completion_tokens, then max_tokens): so the bound the upstream can act on is the
 * largest of those present, whatever the protocol. */
static const char *const limit_fields[] = {"max_tokens", "max_completion_tokens", "max_output_tokens"};

/* A limit field's value as a token count: a positive integer, or a number with no
 * fraction that is one (1e2); -1 for anything else. */
static int64_t limit_value(const json_t *v) {
    if (json_is_integer(v))
        return json_integer_value(v) >= 1 ? json_integer_value(v) : -1;
    double d = json_is_real(v) ? json_real_value(v) : 0;
    return d >= 1 && d < 9.2e18 && d == (double)(int64_t)d ? (int64_t)d : -1;
}

/* The client's output bound: the largest of the limit fields (and its field in *field),
 * or -1 when there is none. A limit field that is present but not a positive integer
 * (nor null) is named in *bad: zero, negative, fractional and string limits are refused,
 * as the providers refuse them, instead of being read as "no limit". */
static int64_t client_out_bound(const proxy_req_t *p, const char **field, const char **bad) {
    int64_t best = -1;
    *field = NULL;
    *bad = NULL;
    for (size_t i = 0; i < sizeof(limit_fields) / sizeof(limit_fields[0]); i++) {
        json_t *v = json_object_get(p->json, limit_fields[i]);
        if (!v || json_is_null(v))
            continue;
        int64_t n = limit_value(v);
        if (n < 0)
            *bad = limit_fields[i];
        else if (n > best) {
            best = n;
            *field = limit_fields[i];
        }
    }
    return best;
}

/* The reservation's bound, computed once per request (every attempt reserves the same):
 * the priced estimate of the input plus the output limit the upstream receives. The
 * reservation must be a real bound: a request without an output limit gets the
 * configured cap, and the upstream is told so (in the protocol's field, the others
 * removed so that no translation finds a different one). A bound that cannot be priced
 * within TG_MONEY_REQUEST_MAX, or a limit that is not an integer, is refused (400).
 * TG_OK, or TG_DONE when refused (the answer is sent). */
static int money_bound(proxy_req_t *p) {
    if (p->bound_done)
        return p->bound_done > 0 ? TG_OK : TG_DONE;
    p->bound_done = -1;
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    const char *limit_field = p->proto == TG_PROTO_RESPONSES ? "max_output_tokens" : "max_tokens";
    const char *field, *bad;
    int64_t max_out = client_out_bound(p, &field, &bad);
    char msg[320];
    if (bad) {
        snprintf(msg, sizeof(msg), "%s must be a positive integer (the most output tokens the model may produce)",
                 bad);
        return fail(p, 400, "invalid_request_error", "invalid_max_tokens", msg);
    }
    for (size_t i = 0; i < sizeof(limit_fields) / sizeof(limit_fields[0]); i++) {
        /* A limit written as a number with no fraction (1e2) goes on as the integer, so
         * that a translation reads it too (it reads integers only). Rare. */
        json_t *v = json_object_get(p->json, limit_fields[i]);
        if (json_is_real(v)) {
            json_object_set_new(p->json, limit_fields[i], json_integer(limit_value(v)));
            p->json_dirty |= p->limit_key ? DIRTY_WHOLE : DIRTY_LIMIT;
            p->limit_key = limit_fields[i];
        }
    }
    if (p->proto == TG_PROTO_EMBEDDINGS) {
        max_out = 0;
    } else if (max_out <= 0) {
        /* No limit in any spelling (or only nulls, which no translation reads). */
        max_out = cfg->billing.default_max_tokens;
        json_object_set_new(p->json, limit_field, json_integer(max_out));
        p->json_dirty |= DIRTY_LIMIT;
        p->limit_key = limit_field;
        p->cap_added = 1;
        field = limit_field;
    }
    p->bound_output = max_out;
    /* Input bound: JSON bytes / 3 (over-counts English text, which is ~4 bytes a token). */
    p->est_input = (int64_t)(p->req->body.len / 3) + 1;
    tg_price_t price;
    int64_t amount = 0;
    if (tg_snapshot_price(p->snap, p->model, &price)) {
        tg_usage_t bound = {.input = p->est_input, .output = max_out, .known = TG_USAGE_INPUT | TG_USAGE_OUTPUT};
        amount = tg_price_usage(&price, &bound, p->principal->rate_multiplier_micro);
    } else {
        /* A client can repeat this at will: one line per model per minute on each worker,
         * counting the ones not written. */
        uint64_t skipped;
        if (tg_log_level >= TG_LOG_WARN && tg_log_allow(p->model, strlen(p->model), tg_now_ms(), &skipped)) {
            char more[64] = "";
            if (skipped)
                snprintf(more, sizeof(more), "; %llu more since the last such line", (unsigned long long)skipped);
            tg_log_warn("request %s: model \"%s\" has no price: metered at 0 (add it under prices)%s",
                        p->req->id, p->model, more);
        }
    }
    if (amount > TG_MONEY_REQUEST_MAX) {
        /* Saturated or past what one request may hold: refused before anything is held. */
        char most[32];
        tg_money_format(TG_MONEY_REQUEST_MAX, most);
        if (field)
            snprintf(msg, sizeof(msg),
                     "%s (%lld) is too large: the request's maximum cost at this model's price exceeds %s USD, the "
                     "most one request may reserve; lower %s",
                     field, (long long)max_out, most, field);
        else
            snprintf(msg, sizeof(msg),
                     "the request is too large: its maximum cost at this model's price exceeds %s USD, the most one "
                     "request may reserve",
                     most);
        return fail(p, 400, "invalid_request_error", "max_tokens_too_large", msg);
    }
    p->reserved_amount = amount;
    p->bound_done = 1;
    return TG_OK;
}

/* Whether the admission can take the first attempt's reservation too: billing applies,
 * and the prices are known (a key with a group prices from the account snapshot, taken
 * here instead of in phase_select; before the first snapshot has loaded, phase_reserve
 * reserves after phase_select waited for it). */
static int money_in_admission(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    proxy_worker_t *pw = p->pw;
    if (!pw->ctx->billing || !pr->key_id || p->attempt != 1 || p->reserved || p->money_held)
        return 0;
    if (pr->group_id && pw->ctx->accounts && !p->snap) {
        if (!(p->snap = tg_accounts_snapshot(pw->ctx->accounts)))
            return 0;
        cleanup_add(p, cleanup_snapshot);
    }
    return 1;
}

static int phase_admit(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    if (!pr || !p->pw->ctx->limits || !is_model_route(p->req->route) || p->admit)
        return TG_OK;
    int limited = !(pr->rpm < 0 && pr->tpm < 0 && pr->concurrency < 0 && pr->tenant_rpm < 0 && pr->tenant_tpm < 0 &&
                    pr->tenant_concurrency < 0);
    int money = money_in_admission(p);
    if (!limited && !money)
        return TG_OK; /* no Redis call */
    /* The token estimate: prompt bytes / 4 plus the output bound, read from the fields
     * billing reads (max_completion_tokens, then max_output_tokens for the Responses API,
     * max_tokens otherwise). A client's bound is any integer: the sum saturates instead
     * of wrapping, so a huge max_tokens charges the whole TPM bucket, never nothing. The
     * client's bound, before billing's default is put in: kept when admitting again
     * after a balance load. */
    if (!p->balance_loads) {
        const char *field, *bad;
        int64_t out_bound = client_out_bound(p, &field, &bad);
        if (out_bound < 0)
            out_bound = 1024;
        int64_t in_bound = (int64_t)TG_MIN(p->req->body.len / 4, (size_t)INT64_MAX);
        p->est_tokens = in_bound + TG_MIN(TG_MAX(out_bound, 0), INT64_MAX - in_bound);
    }
    tg_limit_money_t m;
    if (money) {
        if (money_bound(p) != TG_OK)
            return TG_DONE;
        tg_reserve_req_t r = reserve_req(p);
        tg_billing_admission_money(p->pw->ctx->billing, &r, p->tenant_init, p->key_init, &m);
    }
    tg_limit_req_t lim = {
        .tenant_id = pr->tenant_id,
        .key_id = pr->key_id,
        .key_rpm = pr->rpm,
        .key_burst = pr->rpm_burst,
        .tenant_rpm = pr->tenant_rpm,
        .tenant_burst = pr->tenant_rpm_burst,
        .key_tpm = pr->tpm,
        .tenant_tpm = pr->tenant_tpm,
        .key_conc = pr->concurrency,
        .tenant_conc = pr->tenant_concurrency,
        .est_tokens = p->est_tokens,
        .on_down = limiter_down,
        .money = money ? &m : NULL,
    };
    p->admit = tg_limits_admit(p->pw->ctx->limits, p->req->id, &lim, admit_done, p);
    cleanup_add(p, cleanup_admit);
    return TG_AGAIN;
}

/* ---- phase: select ------------------------------------------------------------------ */

static void models_from_group(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    json_t *list = json_array();
    for (int i = 0; i < pr->ngroup_models; i++) {
        if (!tg_principal_allows_model(pr, pr->group_models[i]))
            continue;
        json_array_append_new(list, json_pack("{s:s,s:s,s:i,s:s}", "id", pr->group_models[i], "object", "model",
                                              "created", 0, "owned_by", "tollgate"));
    }
    json_t *doc = json_pack("{s:s,s:o}", "object", "list", "data", list);
    char *s = json_dumps(doc, JSON_COMPACT);
    tg_response_send(p->req, 200, "application/json", NULL, s, strlen(s));
    free(s);
    json_decref(doc);
}

/* What the upstream speaks: an Anthropic account speaks Messages; an OpenAI one speaks
 * the client's OpenAI protocol, or chat completions for an Anthropic client. */
static tg_proto_t upstream_proto(const proxy_req_t *p, const char *provider) {
    if (!strcmp(provider, "anthropic"))
        return TG_PROTO_ANTHROPIC;
    return p->proto == TG_PROTO_ANTHROPIC ? TG_PROTO_OPENAI_CHAT : p->proto;
}

/* ---- phase: sticky ------------------------------------------------------------------ */

/*
 * A conversation stays on the account that holds its prompt cache. The binding's source,
 * first found: the x-session-id header, the body's prompt_cache_key, previous_response_id,
 * or — for a conversation of two messages or more — the hash of its first two messages
 * (the same opening means the same conversation). The binding lives in Redis for an hour
 * and is left at once when the bound account is cooling, saturated, failing (error EWMA
 * ≥ 0.5) or slow (TTFT EWMA over 30 s).
 */
static void sticky_got(void *ud, redisReply *r, const char *err) {
    proxy_req_t *p = ud;
    p->sticky_rq = NULL;
    if (!err && r && r->type == REDIS_REPLY_STRING)
        p->sticky_account = atoll(r->str);
    proxy_run(p);
}

static int phase_sticky(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (!pr || !pr->group_id || !redis || !p->json || p->attempt > 1)
        return TG_OK;
    tg_buf_t src;
    tg_buf_init(&src);
    const tg_str_t *h = tg_request_header(p->req, "x-session-id");
    json_t *pck = json_object_get(p->json, "prompt_cache_key");
    json_t *prev = json_object_get(p->json, "previous_response_id");
    json_t *msgs = json_object_get(p->json, "messages");
    if (h && h->len) {
        tg_buf_appends(&src, "s:");
        tg_buf_append(&src, h->p, TG_MIN(h->len, (size_t)256));
    } else if (json_is_string(pck)) {
        tg_buf_appends(&src, "c:");
        tg_buf_appends(&src, json_string_value(pck));
    } else if (json_is_string(prev)) {
        tg_buf_appends(&src, "r:");
        tg_buf_appends(&src, json_string_value(prev));
    } else if (json_is_array(msgs) && json_array_size(msgs) >= 3) {
        /* A continued conversation (its opening plus an answer and a new turn). */
        for (size_t i = 0; i < 2; i++) {
            char *m = tg_json_dumps(json_array_get(msgs, i), JSON_COMPACT | JSON_SORT_KEYS);
            if (m)
                tg_buf_appends(&src, m);
            free(m);
        }
    }
    if (!src.len) {
        tg_buf_free(&src);
        return TG_OK;
    }
    char hex[65];
    tg_sha256_hex(src.data, src.len, hex);
    tg_buf_free(&src);
    snprintf(p->sticky_key, sizeof(p->sticky_key), "sticky:{g:%lld}:%.32s", (long long)pr->group_id, hex);
    const char *argv[2] = {"GET", p->sticky_key};
    p->sticky_rq = tg_redis_command(redis, sticky_got, p, 2, argv, NULL);
    cleanup_add(p, cleanup_sticky);
    return p->sticky_rq ? TG_AGAIN : TG_OK;
}

static void sticky_bind(proxy_req_t *p) {
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (!p->sticky_key[0] || !p->at.account || !redis)
        return;
    char id[24];
    snprintf(id, sizeof(id), "%lld", (long long)p->at.account->id);
    const char *argv[5] = {"SET", p->sticky_key, id, "EX", "3600"};
    tg_redis_command(redis, NULL, NULL, 5, argv, NULL);
}

/* ---- phase: select ------------------------------------------------------------------ */

static int was_tried(const proxy_req_t *p, int64_t id) {
    for (int i = 0; i < p->ntried; i++)
        if (p->tried[i] == id)
            return 1;
    return 0;
}

static void retry_timer_cb(uv_timer_t *t) {
    proxy_req_t *p = t->data;
    proxy_run(p);
}

/* Resumes the pipeline at `phase` after delay_ms (a retry's backoff, a wait for the
 * account snapshot or for a free slot). One timer per request, made on first use. */
static int run_phase_later(proxy_req_t *p, phase_t phase, uint64_t delay_ms) {
    if (!p->retry_timer) {
        p->retry_timer = malloc(sizeof(uv_timer_t));
        if (!p->retry_timer)
            abort();
        uv_timer_init(&p->req->worker->loop, p->retry_timer);
        p->retry_timer->data = p;
        cleanup_add(p, cleanup_retry_timer);
    }
    p->phase = phase;
    uv_timer_start(p->retry_timer, retry_timer_cb, delay_ms, 0);
    return TG_AGAIN;
}

/* Fills p->order through tg_select (the default order, no plugin) and returns how many. */
static int select_order(proxy_req_t *p, tg_select_t *q, int *sticky) {
    *q = (tg_select_t){
        .group_id = p->principal->group_id,
        .model = p->req->route == TG_ROUTE_MODELS ? "" : p->model,
        .now_ms = (int64_t)tg_wall_ms(),
        .openai_only = p->proto == TG_PROTO_EMBEDDINGS, /* embeddings are not translated */
        .avoid = p->retry_other ? p->tried : NULL,
        .navoid = p->retry_other ? p->ntried : 0,
        .sticky = p->attempt == 1 ? p->sticky_account : 0,
    };
    return tg_select(p->snap, p->pw->ctx->health, q, p->order, (int)(sizeof(p->order) / sizeof(p->order[0])), sticky);
}

static int phase_select(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    proxy_worker_t *pw = p->pw;
    if (!pr || !pr->group_id || !pw->ctx->accounts) {
        p->at.up = pw->ctx->upstream;
        p->at.credential = p->req->worker->gw->cfg->upstream.api_key;
        p->at.up_proto = upstream_proto(p, p->req->worker->gw->cfg->upstream.provider);
        if (p->proto == TG_PROTO_EMBEDDINGS && p->at.up_proto != TG_PROTO_EMBEDDINGS)
            return fail(p, 400, "invalid_request_error", "unsupported", "embeddings need an OpenAI upstream");
        if (!p->at.up)
            return fail(p, 502, "upstream_error", "upstream_unreachable", "no upstream is configured");
        return TG_OK;
    }
    if (p->req->route == TG_ROUTE_MODELS && pr->ngroup_models > 0) {
        models_from_group(p);
        return TG_DONE;
    }
    if (!p->snap && (p->snap = tg_accounts_snapshot(pw->ctx->accounts)) != NULL)
        cleanup_add(p, cleanup_snapshot);
    if (!p->snap) {
        /* Just started: the first snapshot is on its way; wait for it (up to 3 s). */
        if (tg_now_ns() - p->req->start_ns < 3000000000ull) {
            return run_phase_later(p, PH_SELECT, 20);
        }
        return fail(p, 503, "server_error", "accounts_unavailable", "the account pool is not loaded yet; try again");
    }
    /* The accounts to try, best first: a bounded sample of the group (tg_select.h). */
    int sticky = 0;
    tg_select_t q;
    int n = select_order(p, &q, &sticky);
    if (n == 0) {
        char msg[256];
        snprintf(msg, sizeof(msg), "no upstream account of this key's group can serve model \"%s\" right now", q.model);
        return fail(p, 503, "server_error", "no_account_available", msg);
    }
    tg_plugins_t *pl = pw->ctx->plugins;
    if (!sticky && p->ctx_on && tg_plugins_has_hook(pl, &p->ctx, TG_HOOK_SELECT_ACCOUNT)) {
        /* The routing plugin scores the sampled candidates (at most TG_SELECT_MAX); its
         * choice goes first, the rest keep their order for when its slot is full. */
        for (int i = 0; i < n; i++) {
            const tg_account_t *acc = p->order[i];
            tg_health_entry_t *e = tg_health_get(pw->ctx->health, acc->id);
            tg_ffi_account_t *fa = &p->accts[i];
            memset(fa, 0, sizeof(*fa));
            fa->id = acc->name;
            fa->id_len = strlen(acc->name);
            fa->region = "";
            fa->priority = acc->priority;
            fa->max_concurrency = acc->concurrency;
            fa->inflight = e->inflight;
            fa->sticky = acc->id == p->sticky_account;
            fa->tried = was_tried(p, acc->id);
            fa->error_ewma = e->err_ewma;
            fa->ttft_ewma_ms = e->ttft_ewma_ms;
            fa->reset_in_ms = acc->reset_at_ms ? (double)(acc->reset_at_ms - q.now_ms) : -1;
            fa->cost = atof(acc->cost_multiplier);
        }
        p->ctx.accounts = p->accts;
        p->ctx.naccounts = n;
        p->ctx.selected = -1;
        if (tg_plugins_run(pl, TG_HOOK_SELECT_ACCOUNT, &p->ctx) == TG_DONE)
            return plugin_reject(p);
        if (p->ctx.selected > 0 && p->ctx.selected < n) {
            const tg_account_t *chosen = p->order[p->ctx.selected];
            memmove(&p->order[1], &p->order[0], (size_t)p->ctx.selected * sizeof(p->order[0]));
            p->order[0] = chosen;
        }
    }
    p->norder = n;
    p->next_order = 0;
    return TG_OK;
}

/* ---- phase: slot -------------------------------------------------------------------- */

static void use_account(proxy_req_t *p, const tg_account_t *acc) {
    p->at.account = acc;
    tg_health_get(p->pw->ctx->health, acc->id)->picks += 1;
    p->at.up_proto = upstream_proto(p, acc->provider);
    p->at.up = acc->upstream;
    p->at.credential = acc->credential;
    if (p->json) {
        const char *mapped = tg_account_map_model(acc, p->model);
        json_object_set_new(p->json, "model", json_string(mapped));
        if (strcmp(mapped, p->model) != 0)
            p->json_dirty |= DIRTY_MODEL;
    }
}

static void slot_release(proxy_req_t *p) {
    if (p->slot_timer)
        uv_timer_stop(p->slot_timer);
    if (!p->slot_account)
        return;
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (redis) {
        char key[64];
        snprintf(key, sizeof(key), "{a:%lld}:conc", (long long)p->slot_account);
        const char *argv[2] = {key, p->req->id};
        tg_redis_eval(redis, p->pw->slot_release_script, 1, 2, argv, NULL, NULL, NULL);
    }
    p->slot_account = 0;
}

static int slot_try(proxy_req_t *p);

static void slot_renew_cb(uv_timer_t *t) {
    proxy_req_t *p = t->data;
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (!p->slot_account || !redis)
        return;
    char key[64], ttl[16];
    snprintf(key, sizeof(key), "{a:%lld}:conc", (long long)p->slot_account);
    snprintf(ttl, sizeof(ttl), "%d", p->req->worker->gw->cfg->limiter.lease_ttl_ms);
    const char *argv[4] = {key, p->req->id, "1000000000", ttl};
    tg_redis_eval(redis, p->pw->slot_script, 1, 4, argv, NULL, NULL, NULL);
}

static void slot_renew_start(proxy_req_t *p) {
    if (!p->slot_timer) {
        p->slot_timer = malloc(sizeof(uv_timer_t));
        uv_timer_init(&p->req->worker->loop, p->slot_timer);
        p->slot_timer->data = p;
    }
    uint64_t every = (uint64_t)TG_MAX(p->req->worker->gw->cfg->limiter.lease_ttl_ms / 3, 100);
    uv_timer_start(p->slot_timer, slot_renew_cb, every, every);
}

static void slot_got(void *ud, redisReply *r, const char *err) {
    proxy_req_t *p = ud;
    p->slot_rq = NULL;
    const tg_account_t *acc = p->order[p->next_order];
    if (err || !r || r->type != REDIS_REPLY_INTEGER) {
        /* The slot store is down: the account's own limit is enforced per worker only. */
        use_account(p, acc);
        proxy_run(p);
        return;
    }
    if (r->integer == 1) {
        p->slot_account = acc->id;
        slot_renew_start(p);
        use_account(p, acc);
        proxy_run(p);
        return;
    }
    p->next_order++;
    if (slot_try(p) == TG_OK)
        proxy_run(p);
}

/* Takes the first account in order whose slot is free. TG_AGAIN while asking Redis. */
static int slot_try(proxy_req_t *p) {
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    while (p->next_order < p->norder) {
        const tg_account_t *acc = p->order[p->next_order];
        tg_health_entry_t *e = tg_health_get(p->pw->ctx->health, acc->id);
        if (acc->concurrency > 0 && e->inflight >= acc->concurrency) {
            p->next_order++;
            continue;
        }
        if (acc->concurrency <= 0 || !redis) {
            use_account(p, acc);
            return TG_OK;
        }
        char key[64], limit[16], ttl[16];
        snprintf(key, sizeof(key), "{a:%lld}:conc", (long long)acc->id);
        snprintf(limit, sizeof(limit), "%d", acc->concurrency);
        snprintf(ttl, sizeof(ttl), "%d", p->req->worker->gw->cfg->limiter.lease_ttl_ms);
        const char *argv[4] = {key, p->req->id, limit, ttl};
        p->slot_rq = tg_redis_eval(redis, p->pw->slot_script, 1, 4, argv, NULL, slot_got, p);
        if (p->slot_rq)
            return TG_AGAIN;
        use_account(p, acc);
        return TG_OK;
    }
    /* Every account is full: wait for a slot (bounded like the key's wait queue), polling
     * with jitter since slots free on any instance. */
    uint64_t now = tg_now_ms();
    if (!p->slot_wait_since)
        p->slot_wait_since = now;
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    if (now - p->slot_wait_since < (uint64_t)cfg->limiter.queue_timeout_ms && p->norder > 0) {
        uint32_t r = 0;
        tg_random_bytes(&r, sizeof(r));
        /* A fresh sample for the next poll: in a group larger than the sample, accounts
         * that were not drawn this time may have free slots. */
        tg_select_t q;
        int sticky, n = select_order(p, &q, &sticky);
        if (n > 0)
            p->norder = n;
        p->next_order = 0;
        return run_phase_later(p, PH_SLOT, 20 + r % 30);
    }
    return fail_ex(p, 429, "rate_limit_error", "accounts_busy",
                   "every upstream account of this group is at its concurrency limit; retry shortly",
                   "Retry-After: 1\r\n");
}

static int phase_slot(proxy_req_t *p) {
    if (!p->norder)
        return TG_OK; /* the static upstream */
    cleanup_add(p, cleanup_slot);
    return slot_try(p);
}

/* ---- phase: reserve ----------------------------------------------------------------- */

static void reserve_done(void *ud, int status, const char *code, const char *msg) {
    proxy_req_t *p = ud;
    p->reserve = NULL;
    if (status == 0) {
        p->reserved = p->attempt;
        if (code && p->attempt >= 1 && p->attempt <= 32) /* "unheld": money open, Redis down */
            p->unheld |= 1u << (p->attempt - 1);
        proxy_run(p);
        return;
    }
    fail(p, status, status == 402 ? "insufficient_quota" : "server_error", code, msg);
}

static int phase_reserve(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    proxy_worker_t *pw = p->pw;
    if (!pw->ctx->billing || !pr || !pr->key_id || !is_model_route(p->req->route))
        return TG_OK;
    if (money_bound(p) != TG_OK)
        return TG_DONE;
    tg_reserve_req_t r = reserve_req(p);
    if (p->money_held) {
        /* The admission script reserved this (first) attempt: the upstream call is next,
         * so record it now. */
        p->money_held = 0;
        p->reserved = p->attempt;
        tg_billing_admitted(pw->ctx->billing, &r);
        return TG_OK;
    }
    p->reserve = tg_billing_reserve(pw->ctx->billing, &r, reserve_done, p);
    cleanup_add(p, cleanup_reserve);
    return TG_AGAIN;
}

/* ---- phase: upstream ---------------------------------------------------------------- */

static void sse_event(void *ud, const char *event, size_t event_len, const char *data, size_t data_len) {
    proxy_req_t *p = ud;
    int usage_found = 0;
    if (data_len && (memmem(data, data_len, "\"content\"", 9) || memmem(data, data_len, "text_delta", 10) ||
                     memmem(data, data_len, "output_text.delta", 17))) {
        /* Time to first token: the first event that carries content. */
        if (!p->at.stream_chunks++)
            p->at.first_token_ns = tg_now_ns();
    }
    if (data_len && memmem(data, data_len, "usage", 5))
        usage_found = tg_usage_merge_json(&p->at.usage, p->at.up_proto, data, data_len) == 1;
    if (p->at.xlate) {
        tg_buf_t out;
        tg_buf_init(&out);
        tg_xlate_event(p->at.xlate, event, event_len, data, data_len, &out);
        if (out.len)
            tg_response_body(p->req, out.data, out.len);
        tg_buf_free(&out);
        return;
    }
    if (!p->at.strip_usage_chunk)
        return;
    /* Re-emit the event unless it is the usage-only chunk the client did not ask for. */
    if (usage_found && data_len && memmem(data, data_len, "\"choices\":[]", 12))
        return;
    tg_buf_t b;
    tg_buf_init(&b);
    if (event_len) {
        tg_buf_appends(&b, "event: ");
        tg_buf_append(&b, event, event_len);
        tg_buf_appends(&b, "\n");
    }
    /* Multi-line data goes back out as several data: lines. */
    const char *s = data, *end = data + data_len;
    while (s <= end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        tg_buf_appends(&b, "data: ");
        tg_buf_append(&b, s, (size_t)(e - s));
        tg_buf_appends(&b, "\n");
        if (!nl)
            break;
        s = nl + 1;
    }
    tg_buf_appends(&b, "\n");
    tg_response_body(p->req, b.data, b.len);
    tg_buf_free(&b);
}

/* ---- retries and failover ----------------------------------------------------------- */

static void proxy_run(proxy_req_t *p);
static int retryable_status(int st) { return st == 429 || st == 529 || st == 401 || st == 403 || st == 408 || st >= 500; }

static int can_retry(const proxy_req_t *p) {
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    uint64_t elapsed = (tg_now_ns() - p->req->start_ns) / 1000000;
    return p->at.account && !p->req->resp_started && is_model_route(p->req->route) &&
           p->attempt < cfg->routing.max_attempts &&
           elapsed < (uint64_t)cfg->routing.deadline_ms;
}

static int64_t parse_retry_after_ms(const char *v) {
    if (!v || !*v)
        return -1;
    char *end;
    double secs = strtod(v, &end);
    if (end == v || secs < 0)
        return -1; /* an HTTP date: treated as unknown */
    return (int64_t)(secs * 1000);
}

static void cooldown_persisted(void *ud, const PGresult *res, const char *err) {
    TG_UNUSED(res);
    tg_state_t *st = ud;
    if (!err)
        tg_state_publish_accounts(st);
}

/* Cools the account here and, through Postgres, everywhere (extends, never shortens). */
static void cool_account(proxy_req_t *p, int64_t ms) {
    if (!p->at.account || ms <= 0)
        return;
    int64_t now = (int64_t)tg_wall_ms();
    int64_t until = tg_health_cool(tg_health_get(p->pw->ctx->health, p->at.account->id), now, ms);
    tg_log_info("request %s: account %s cools down for %lld ms (upstream %d)", p->req->id, p->at.account->name,
                (long long)(until - now), p->at.upstream_status);
    tg_pg_t *pg = tg_state_pg(p->pw->ctx->state);
    if (!pg)
        return;
    char id[24], ts[32];
    snprintf(id, sizeof(id), "%lld", (long long)p->at.account->id);
    snprintf(ts, sizeof(ts), "%lld", (long long)until);
    const char *params[2] = {id, ts};
    tg_pg_query(pg,
                "UPDATE accounts SET cooldown_until = greatest(coalesce(cooldown_until, to_timestamp(0)), "
                "to_timestamp($2::bigint / 1000.0)) WHERE id = $1::bigint",
                2, params, cooldown_persisted, p->pw->ctx->state);
}

/*
 * One place decides retries: the on_upstream_error hook when a plugin implements it,
 * else the default: 429/529/401/403 move to another account (the failing one cools
 * down), 5xx, timeouts and resets move too after a short backoff with jitter; nothing
 * retries once a byte reached the client, past the attempt limit, or past the deadline.
 * Returns 1 when a retry was scheduled (the request continues), 0 to give up.
 */
static int maybe_retry(proxy_req_t *p, int status, int failure, int64_t retry_after_ms) {
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    /* Health and cooldown first: they apply whether or not we retry. */
    if (p->at.health) {
        tg_health_end(p->at.health, 0, -1);
        p->at.health = NULL;
    }
    if (status == 429)
        cool_account(p, retry_after_ms > 0 ? retry_after_ms : cfg->routing.cooldown_429_ms);
    else if (status == 529)
        cool_account(p, retry_after_ms > 0 ? retry_after_ms : cfg->routing.cooldown_529_ms);
    else if (status == 401 || status == 403)
        cool_account(p, cfg->routing.cooldown_auth_ms);
    else if (p->at.account && tg_health_get(p->pw->ctx->health, p->at.account->id)->err_ewma >= 0.5)
        cool_account(p, cfg->routing.cooldown_5xx_ms);
    /* The static upstream of the config file is a single target: no retries there. */
    if (!p->at.account || !can_retry(p))
        return 0;
    {
        /* Nothing left to retry on: the client gets this answer (with its Retry-After). */
        const tg_account_t *any[1];
        int sticky = 0;
        tg_select_t q = {.group_id = p->principal->group_id, .model = p->model, .now_ms = (int64_t)tg_wall_ms()};
        if (tg_select(p->snap, p->pw->ctx->health, &q, any, 1, &sticky) == 0)
            return 0;
    }
    int action = TG_RETRY_OTHER;
    uint32_t r = 0;
    tg_random_bytes(&r, sizeof(r));
    int64_t backoff = TG_MIN((int64_t)2000, (int64_t)100 << TG_MIN(p->attempt - 1, 5));
    int64_t delay = status == 429 || status == 529 || status == 401 || status == 403
                        ? 0
                        : backoff / 2 + (int64_t)(r % (uint32_t)(backoff + 1));
    tg_plugins_t *pl = p->pw->ctx->plugins;
    if (p->ctx_on && tg_plugins_has_hook(pl, &p->ctx, TG_HOOK_ON_UPSTREAM_ERROR)) {
        tg_hookctx_t *c = &p->ctx;
        c->attempt = p->attempt;
        c->upstream_status = status;
        c->failure = failure;
        c->bytes_sent = 0;
        c->retry_after_ms = retry_after_ms;
        c->elapsed_ms = (int64_t)((tg_now_ns() - p->req->start_ns) / 1000000);
        c->deadline_ms = cfg->routing.deadline_ms;
        c->retry_action = action;
        c->retry_delay_ms = delay;
        tg_plugins_run(pl, TG_HOOK_ON_UPSTREAM_ERROR, c);
        action = c->retry_action;
        delay = c->retry_delay_ms;
    }
    if (action == TG_RETRY_GIVE_UP)
        return 0;
    if (action == TG_RETRY_SAME && retry_after_ms > delay)
        delay = retry_after_ms; /* Retry-After is honoured on the same account */
    int64_t elapsed = (int64_t)((tg_now_ns() - p->req->start_ns) / 1000000);
    if (delay < 0 || elapsed + delay >= cfg->routing.deadline_ms)
        return 0;
    /* A known failure cost nothing: its hold goes back before the next attempt reserves. */
    if (p->reserved == p->attempt && p->pw->ctx->billing && (failure == TG_UPFAIL_STATUS || failure == TG_UPFAIL_CONNECT ||
                                                          failure == TG_UPFAIL_TIMEOUT_CONNECT))
        tg_billing_release_attempt(p->pw->ctx->billing, p->req->id, p->principal->tenant_id, p->principal->key_id,
                                   p->attempt);
    /* Reset this attempt's upstream state and go back to account selection. */
    if (p->at.account && p->ntried < 8)
        p->tried[p->ntried++] = p->at.account->id;
    slot_release(p);
    p->retry_other = action == TG_RETRY_OTHER;
    p->attempt++;
    attempt_reset(p);
    tg_log_info("request %s: attempt %d after upstream %d/%d in %lld ms (%s)", p->req->id, p->attempt, status, failure,
                (long long)delay, action == TG_RETRY_SAME ? "same account" : "another account");
    run_phase_later(p, PH_SELECT, (uint64_t)delay);
    return 1;
}

static void up_head(void *ud, const tg_uphead_t *head) {
    proxy_req_t *p = ud;
    p->at.upstream_status = head->status;
    if (retryable_status(head->status) && can_retry(p)) {
        /* Deferred: if a retry follows, the client never sees this attempt. */
        p->at.deferred = 1;
        p->at.deferred_status = head->status;
        snprintf(p->at.deferred_ctype, sizeof(p->at.deferred_ctype), "%s", head->content_type ? head->content_type : "application/json");
        int n = snprintf(p->at.deferred_extra, sizeof(p->at.deferred_extra), "%s", head->extra_headers ? head->extra_headers : "");
        if (head->retry_after && n >= 0 && (size_t)n < sizeof(p->at.deferred_extra))
            snprintf(p->at.deferred_extra + n, sizeof(p->at.deferred_extra) - (size_t)n, "Retry-After: %s\r\n", head->retry_after);
        return;
    }
    int is_sse = head->content_type && strncasecmp(head->content_type, "text/event-stream", 17) == 0;
    int translating = p->at.up_proto != p->proto;
    if (is_sse && head->status == 200) {
        tg_sse_init(&p->at.sse, SSE_EVENT_MAX, sse_event, p);
        p->at.sse_on = 1;
        if (translating) {
            p->at.xlate = tg_xlate_create(p->at.up_proto, p->proto, p->model, p->req->id);
            if (p->at.xlate && p->proto == TG_PROTO_OPENAI_CHAT)
                tg_xlate_set_usage_chunk(p->at.xlate, !p->strip_usage_orig);
        }
    } else {
        p->at.strip_usage_chunk = 0;
        if (translating || (head->status >= 400 && p->proto == TG_PROTO_ANTHROPIC)) {
            /* A translated answer or error is sent whole at the end, in the client's shape. */
            p->at.buffer_whole = 1;
            return;
        }
    }
    /* The common case — a plain answer with nothing to add — passes the upstream's
     * header lines through without copying them. */
    const char *extra = head->extra_headers ? head->extra_headers : "";
    char more[2048];
    if (head->retry_after || is_sse || p->ctx_on) {
        int n = snprintf(more, sizeof(more), "%s", extra);
        if (head->retry_after && n >= 0 && (size_t)n < sizeof(more))
            snprintf(more + n, sizeof(more) - (size_t)n, "Retry-After: %s\r\n", head->retry_after);
        if (is_sse)
            strncat(more, "Cache-Control: no-cache\r\n", sizeof(more) - strlen(more) - 1);
        if (p->ctx_on) {
            size_t el = strlen(more);
            snprintf(more + el, sizeof(more) - el, "x-tollgate-generation: %llu\r\n%.*s",
                     (unsigned long long)p->ctx.generation, (int)p->ctx.resp_headers_len, p->ctx.resp_headers);
        }
        extra = more;
    }
    /* A non-stream answer passed through byte for byte keeps its Content-Length (no
     * chunk framing); streams and translated answers are chunked. */
    int64_t length = !is_sse && !translating ? head->content_length : -1;
    tg_response_start(p->req, head->status,
                      p->at.xlate ? "text/event-stream" : head->content_type ? head->content_type : "application/json",
                      extra, length);
}

static void up_body(void *ud, const char *data, size_t n) {
    proxy_req_t *p = ud;
    if (p->at.deferred) {
        if (p->deferred_body.len + n <= 65536)
            tg_buf_append(&p->deferred_body, data, n);
        return;
    }
    if (!p->at.first_byte_ns)
        p->at.first_byte_ns = tg_now_ns();
    if (p->at.buffer_whole) {
        if (p->body_copy.len + n <= BODY_COPY_MAX)
            tg_buf_append(&p->body_copy, data, n);
        else
            p->at.body_copy_over = 1;
        return;
    }
    if (p->at.sse_on) {
        tg_sse_feed(&p->at.sse, data, n);
        if (!p->at.strip_usage_chunk && !p->at.xlate)
            tg_response_body(p->req, data, n);
    } else {
        tg_response_body(p->req, data, n);
        if (!p->at.body_copy_over) {
            if (p->body_copy.len + n > BODY_COPY_MAX) {
                p->at.body_copy_over = 1;
                tg_buf_free(&p->body_copy);
            } else {
                tg_buf_append(&p->body_copy, data, n);
            }
        }
    }
    /* Back-pressure: a slow client pauses the upstream instead of growing our buffers. */
    if (p->at.call && !p->at.paused &&
        tg_request_write_queue(p->req) > p->req->worker->gw->cfg->http_limits.max_write_buffer) {
        p->at.paused = 1;
        tg_upcall_pause(p->at.call);
    }
}

static void up_done(void *ud) {
    proxy_req_t *p = ud;
    p->at.call = NULL;
    p->upstream_end_ns = tg_now_ns();
    if (p->at.deferred) {
        const char *ra = strstr(p->at.deferred_extra, "Retry-After: ");
        int64_t retry_after = ra ? parse_retry_after_ms(ra + 13) : -1;
        p->error = "upstream_error";
        int status = p->at.deferred_status;
        if (maybe_retry(p, status, TG_UPFAIL_STATUS, retry_after))
            return;
        /* Giving up: the client gets this attempt's answer (in its own protocol's shape). */
        p->at.deferred = 0;
        if (p->at.up_proto != p->proto || p->proto == TG_PROTO_ANTHROPIC) {
            tg_buf_t out;
            tg_buf_init(&out);
            tg_translate_error(p->proto, status, p->deferred_body.data ? p->deferred_body.data : "", p->deferred_body.len, &out);
            tg_response_start(p->req, status, "application/json", p->at.deferred_extra, (int64_t)out.len);
            tg_response_body(p->req, out.data, out.len);
            tg_buf_free(&out);
        } else {
            tg_response_start(p->req, status, p->at.deferred_ctype, p->at.deferred_extra, (int64_t)p->deferred_body.len);
            tg_response_body(p->req, p->deferred_body.data, p->deferred_body.len);
        }
        tg_response_end(p->req);
        return;
    }
    if (p->at.health) {
        int ok = p->at.upstream_status < 500 && p->at.upstream_status != 429;
        double ttft = TTFT_NS(p) ? (double)(TTFT_NS(p) - p->upstream_start_ns) / 1e6 : -1;
        tg_health_end(p->at.health, ok, ttft);
        p->at.health = NULL;
    }
    if (p->at.upstream_status == 200)
        sticky_bind(p);
    if (!p->at.first_byte_ns)
        p->at.first_byte_ns = p->upstream_end_ns;
    if (!p->at.sse_on && p->body_copy.len && p->at.upstream_status < 300)
        tg_usage_merge_json(&p->at.usage, p->at.up_proto, p->body_copy.data, p->body_copy.len);
    if (p->at.buffer_whole) {
        tg_buf_t out;
        tg_buf_init(&out);
        int status = p->at.upstream_status;
        if (p->at.body_copy_over) {
            fail(p, 502, "upstream_error", "upstream_error", "the upstream's answer is too large to translate");
        } else if (status < 300) {
            if (tg_translate_response(p->at.up_proto, p->proto, p->body_copy.data ? p->body_copy.data : "", p->body_copy.len,
                                      p->model, &out) == TG_OK)
                tg_response_send(p->req, status, "application/json", NULL, out.data, out.len);
            else
                fail(p, 502, "upstream_error", "upstream_error", "the upstream's answer could not be read");
        } else {
            tg_translate_error(p->proto, status, p->body_copy.data ? p->body_copy.data : "", p->body_copy.len, &out);
            tg_response_send(p->req, status, "application/json", NULL, out.data, out.len);
        }
        tg_buf_free(&out);
        return;
    }
    if (p->at.xlate) {
        tg_buf_t out;
        tg_buf_init(&out);
        tg_xlate_finish(p->at.xlate, &out);
        if (out.len)
            tg_response_body(p->req, out.data, out.len);
        tg_buf_free(&out);
    }
    tg_response_end(p->req);
}

static void up_error(void *ud, tg_uperr_t err, const char *msg) {
    proxy_req_t *p = ud;
    tg_request_t *req = p->req;
    p->at.call = NULL;
    p->at.up_err = (int)err;
    p->upstream_end_ns = tg_now_ns();
    atomic_fetch_add_explicit(&req->worker->metrics.upstream_errors, 1, memory_order_relaxed);
    tg_log_warn("request %s: upstream %s: %s", req->id, tg_upstream_name(p->at.up), msg);
    if (!req->resp_started) {
        int failure = err == TG_UPERR_CONNECT              ? TG_UPFAIL_CONNECT
                      : err == TG_UPERR_TIMEOUT_CONNECT    ? TG_UPFAIL_TIMEOUT_CONNECT
                      : err == TG_UPERR_TIMEOUT_FIRST_BYTE ? TG_UPFAIL_TIMEOUT_FIRST_BYTE
                      : err == TG_UPERR_TIMEOUT_IDLE       ? TG_UPFAIL_TIMEOUT_IDLE
                                                           : TG_UPFAIL_RESET;
        p->at.deferred = 0;
        if (maybe_retry(p, 0, failure, -1))
            return;
    } else if (p->at.health) {
        tg_health_end(p->at.health, 0, -1);
        p->at.health = NULL;
    }
    if (req->resp_started) {
        p->error = "upstream_reset";
        tg_response_abort(req);
        return;
    }
    switch (err) {
    case TG_UPERR_TIMEOUT_CONNECT:
    case TG_UPERR_TIMEOUT_FIRST_BYTE:
    case TG_UPERR_TIMEOUT_IDLE:
        fail(p, 504, "upstream_error", "upstream_timeout", "the upstream did not answer in time");
        break;
    case TG_UPERR_CONNECT:
        fail(p, 502, "upstream_error", "upstream_unreachable", "the upstream could not be reached");
        break;
    default:
        fail(p, 502, "upstream_error", "upstream_error", "the upstream closed the connection or sent an invalid response");
        break;
    }
}

static const tg_upcall_cbs_t up_cbs = {up_head, up_body, up_done, up_error};

static int valid_traceparent(const tg_str_t *v) {
    if (!v || v->len != 55)
        return 0;
    for (size_t i = 0; i < 55; i++) {
        char c = v->p[i];
        int dash = i == 2 || i == 35 || i == 52;
        if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
    }
    return 1;
}

/* The client's body with the members the phases changed rewritten in place (their
 * values serialised from p->json); the whole document re-serialised only when the
 * bytes cannot be edited safely. Returns a malloc'd body and its length. */
static char *patched_body(proxy_req_t *p, size_t *len) {
    const char *keys[3], *vals[3];
    char *owned[3];
    int n = 0;
    if (p->json_dirty & DIRTY_MODEL)
        keys[n++] = "model";
    if ((p->json_dirty & DIRTY_LIMIT) && p->limit_key)
        keys[n++] = p->limit_key;
    if (p->json_dirty & DIRTY_STREAM_OPTIONS)
        keys[n++] = "stream_options";
    for (int i = 0; i < n; i++)
        vals[i] = owned[i] = tg_json_dumps(json_object_get(p->json, keys[i]), JSON_COMPACT | JSON_ENCODE_ANY);
    tg_buf_t out;
    tg_buf_init(&out);
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok = ok && vals[i];
    if (!ok || (p->json_dirty & DIRTY_WHOLE) || tg_json_set_members(p->req->body.data, p->req->body.len, keys, vals, n, &out) != TG_OK) {
        tg_buf_free(&out);
        out.data = tg_json_dumps(p->json, JSON_COMPACT);
        out.len = out.data ? strlen(out.data) : 0;
    }
    for (int i = 0; i < n; i++)
        free(owned[i]);
    *len = out.len;
    return out.data;
}

/* Whether the upstream model is listed in max_tokens_models (a name, or a prefix that
 * ends in '*'). */
static int model_takes_max_tokens(const tg_config_t *cfg, const char *model) {
    for (size_t i = 0; model && i < cfg->nmax_tokens_models; i++) {
        const char *m = cfg->max_tokens_models[i];
        size_t n = strlen(m);
        if (n && m[n - 1] == '*' ? !strncmp(model, m, n - 1) : !strcmp(model, m))
            return 1;
    }
    return 0;
}

/* The one place that decides how the output cap reaches the upstream. An OpenAI chat
 * upstream gets it as max_completion_tokens (every current OpenAI chat model takes it;
 * the o-series and the gpt-5 family refuse max_tokens), or as max_tokens for a model in
 * max_tokens_models (older OpenAI-compatible servers); the other protocols have one
 * spelling. A cap the gateway wrote (billing's default, phase_reserve) or translated is
 * spelled so, its value (the bound reserved) unchanged; a cap the client spelled itself
 * in a pass-through is the client's choice and goes as sent. `doc` is the translated
 * body, or p->json for a pass-through. */
static void output_cap(proxy_req_t *p, json_t *doc, int translated) {
    if (p->at.up_proto != TG_PROTO_OPENAI_CHAT)
        return;
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    const char *want = model_takes_max_tokens(cfg, json_string_value(json_object_get(doc, "model")))
                           ? "max_tokens"
                           : "max_completion_tokens";
    const char *have = translated ? "max_completion_tokens" /* the encoder's spelling */
                                  : p->cap_added ? p->limit_key : NULL;
    json_t *v = have ? json_object_get(doc, have) : NULL;
    if (!v || !strcmp(have, want))
        return;
    json_incref(v);
    json_object_del(doc, have);
    json_object_set_new(doc, want, v);
    if (!translated) {
        /* The client's bytes may hold the old member (a null the default replaced):
         * then the body is written whole, without it. */
        char quoted[32];
        int qn = snprintf(quoted, sizeof(quoted), "\"%s\"", have);
        if (memmem(p->req->body.data ? p->req->body.data : "", p->req->body.len, quoted, (size_t)qn))
            p->json_dirty |= DIRTY_WHOLE;
        p->limit_key = want;
    }
}

static int phase_upstream(proxy_req_t *p) {
    tg_request_t *req = p->req;
    tg_upstream_t *u = p->at.up;
    /* The credential becomes a header line: one with CR, LF or another control byte is
     * never sent (the admin API, apply, the config and the account loader refuse it
     * first; this is the last line). The URL's parts were checked by tg_upstream_create. */
    if (p->at.credential && tg_valid_no_ctl(p->at.credential, strlen(p->at.credential))) {
        atomic_fetch_add_explicit(&req->worker->metrics.upstream_refused, 1, memory_order_relaxed);
        tg_log_error("request %s: account %lld: the credential holds a control character; the request is not sent",
                     req->id, p->at.account ? (long long)p->at.account->id : 0LL);
        return fail(p, 502, "server_error", "upstream_request_refused",
                    "the gateway refused to send this request upstream: its account's credential holds characters "
                    "not allowed in an HTTP header");
    }
    const tg_str_t *tp = tg_request_header(req, "traceparent");
    if (valid_traceparent(tp)) {
        memcpy(p->traceparent, tp->p, 55);
        p->traceparent[55] = '\0';
    }
    char *body = NULL;
    size_t body_len = 0;
    const char *method = "GET";
    const char *suffix = "/models";
    if (is_model_route(req->route)) {
        method = "POST";
        suffix = tg_translate_path(p->at.up_proto);
        if (p->at.up_proto != p->proto) {
            /* Another protocol upstream: the request is translated (the model already
             * mapped for the account is in p->json). */
            json_t *out = NULL;
            char err[256];
            json_t *m = json_object_get(p->json, "model");
            if (tg_translate_request(p->proto, p->at.up_proto, p->json, json_string_value(m), &out, err, sizeof(err)) !=
                TG_OK)
                return fail(p, 400, "invalid_request_error", "untranslatable_request", err);
            output_cap(p, out, 1);
            body = tg_json_dumps(out, JSON_COMPACT);
            json_decref(out);
        } else {
            if (p->cap_added)
                output_cap(p, p->json, 0);
            if (p->json_dirty)
                body = patched_body(p, &body_len);
        }
        if (body && !body_len)
            body_len = strlen(body);
    }
    tg_buf_t *b = &p->upstream_req;
    cleanup_add(p, cleanup_attempt);
    tg_buf_reset(b);
    /* Appends, not printf: this head is built for every upstream call. */
    tg_buf_appends(b, method);
    tg_buf_appends(b, " ");
    tg_buf_appends(b, tg_upstream_path_prefix(u));
    tg_buf_appends(b, suffix);
    tg_buf_appends(b, " HTTP/1.1\r\nHost: ");
    tg_buf_appends(b, tg_upstream_host_header(u));
    if (p->at.credential && p->at.up_proto == TG_PROTO_ANTHROPIC) {
        tg_buf_appends(b, "\r\nx-api-key: ");
        tg_buf_appends(b, p->at.credential);
        tg_buf_appends(b, "\r\nanthropic-version: 2023-06-01");
    } else if (p->at.credential) {
        tg_buf_appends(b, "\r\nAuthorization: Bearer ");
        tg_buf_appends(b, p->at.credential);
    }
    tg_buf_appends(b, "\r\nx-request-id: ");
    tg_buf_appends(b, req->id);
    if (p->traceparent[0]) {
        tg_buf_appends(b, "\r\ntraceparent: ");
        tg_buf_appends(b, p->traceparent);
    }
    if (method[0] == 'P') {
        const char *src = body ? body : req->body.data;
        size_t len = body ? body_len : req->body.len;
        tg_buf_appends(b, p->stream ? "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: "
                                    : "\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: ");
        tg_buf_append_u64(b, len);
        tg_buf_appends(b, "\r\n\r\n");
        tg_buf_append(b, src, len);
    } else {
        tg_buf_appends(b, "\r\nAccept: application/json\r\n\r\n");
    }
    free(body);
    p->upstream_start_ns = tg_now_ns();
    if (p->at.account) {
        p->at.health = tg_health_get(p->pw->ctx->health, p->at.account->id);
        tg_health_begin(p->at.health);
    }
    p->at.call = tg_upcall_start(u, b, &up_cbs, p);
    return TG_AGAIN;
}

/* ---- the pipeline ------------------------------------------------------------------- */

static const phase_fn phases[PH__COUNT] = {
    [PH_AUTH] = phase_auth,     [PH_PARSE] = phase_parse,
    [PH_PLUGINS] = phase_plugins, [PH_ADMIT] = phase_admit,   [PH_STICKY] = phase_sticky,
    [PH_SELECT] = phase_select, [PH_SLOT] = phase_slot,     [PH_RESERVE] = phase_reserve,
    [PH_UPSTREAM] = phase_upstream,
};

static void proxy_run(proxy_req_t *p) {
    while (p->phase < PH__COUNT) {
        int rc = phases[p->phase++](p);
        if (rc == TG_OK)
            continue;
        if (rc == TG_ERROR)
            fail(p, 500, "server_error", "internal_error", "internal error");
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
    req->abort_cb = on_abort;
    req->drain_cb = on_drain;
    req->finish_cb = on_finish;
    return p;
}

void tg_proxy_handle(tg_request_t *req, tg_proto_t proto) {
    proxy_run(proxy_begin(req, proto));
}

void tg_proxy_refuse(tg_request_t *req, tg_proto_t proto, int status, const char *code, const char *msg,
                     const char *extra_headers) {
    fail_ex(proxy_begin(req, proto), status, "invalid_request_error", code, msg, extra_headers);
}
