/*
 * The phases that decide, before the call, whether the request may go and what it
 * holds (tg_proxy.c runs them):
 *
 *   admit    the key's and tenant's limits (rpm, tpm, concurrency) and the first
 *            attempt's money in one Redis script (tg_limits_admit), after the account
 *            is chosen: on a single Redis the same script takes that account's slot
 *            (tg__slot_with_admission in tg_proxy_route.c); a balance not yet in Redis
 *            is loaded and admitted again; Redis down: the on_limiter_down hook or the
 *            configured policy decides
 *   reserve  the money of a later attempt (tg_billing_reserve), or the record of the
 *            first attempt's reservation that the admission took
 *
 * Both reserve the same bound, computed once (money_bound): the priced estimate of the
 * input plus the output limit the upstream receives.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tg_proxy_internal.h"

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

/* ---- phase: admit ------------------------------------------------------------------- */

static void balance_loaded(void *ud, int status, const char *code, const char *msg, const char *tenant,
                           const char *key, const char *budget_spend) {
    proxy_req_t *p = ud;
    p->reserve = NULL;
    if (status) {
        tg__proxy_fail(p, status, "server_error", code, msg);
        return;
    }
    snprintf(p->tenant_init, sizeof(p->tenant_init), "%s", tenant);
    snprintf(p->key_init, sizeof(p->key_init), "%s", key);
    tg_billing_budget_inits(p->budgets, p->nbudgets, budget_spend);
    p->phase = PH_ADMIT; /* the script wrote nothing (its marker is gone): admit again */
    tg__proxy_run(p);
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
        .budgets = p->budgets,
        .nbudgets = p->nbudgets,
    };
}

/* ---- periodic budgets (tg_budgets.h) -------------------------------------------------- */

/* The principal's periodic budgets in the periods they are in now (the budgets' clock):
 * what this attempt's reservation is checked against. A spend loaded from Postgres is
 * kept while its period is the same. TG_OK, or TG_DONE when a budget's period cannot be
 * computed (its time zone is no longer on this system): refused, 503, money fails closed. */
static int budgets_now(proxy_req_t *p) {
    tg_principal_t *pr = (tg_principal_t *)p->principal; /* per worker: its period cache */
    int64_t now = tg_budget_now_s();
    for (int i = 0; i < pr->nbudgets; i++) {
        tg_budget_t *b = &pr->budgets[i];
        int64_t start, end;
        if (tg_budget_period(b, now, &start, &end) != 0) {
            char msg[256];
            snprintf(msg, sizeof(msg), "the budget \"%s\" cannot be checked: its time zone %s is not available",
                     b->name, b->tz);
            return tg__proxy_fail(p, 503, "server_error", "budget_unavailable", msg);
        }
        tg_budget_use_t *u = &p->budgets[i];
        if (u->id != b->id || u->start != start)
            u->init[0] = '\0';
        u->id = b->id;
        u->limit = b->amount;
        u->start = start;
        u->end = end;
    }
    p->nbudgets = pr->nbudgets;
    return TG_OK;
}

/* 402 budget_exceeded naming budget i, its period and when it resets (Retry-After, and
 * the reset time in x-tollgate-budget-reset), in the client's protocol's error shape. */
static void budget_refused(proxy_req_t *p, int i) {
    if (i < 0 || i >= p->nbudgets || i >= p->principal->nbudgets) {
        tg__proxy_fail(p, 402, "insufficient_quota", "budget_exceeded", "a budget cannot cover the request's maximum cost");
        return;
    }
    const tg_budget_t *b = &p->principal->budgets[i];
    const tg_budget_use_t *u = &p->budgets[i];
    char kind[32], limit[32], cost[32], reset[32], msg[512], extra[160];
    const char *k = tg_budget_kind_text(b, kind, sizeof(kind));
    tg_money_format(b->amount, limit);
    tg_money_format(p->reserved_amount, cost);
    time_t e = (time_t)u->end;
    struct tm tm;
    gmtime_r(&e, &tm);
    strftime(reset, sizeof(reset), "%Y-%m-%dT%H:%M:%SZ", &tm);
    int64_t wait = TG_MAX(u->end - tg_budget_now_s(), 1);
    const char *whose = b->scope == 'k' ? "this API key" : b->scope == 'u' ? "this key's user" : "this tenant";
    snprintf(msg, sizeof(msg),
             "the %s budget \"%s\" of %s (%s USD%s%s) cannot cover this request's maximum cost of %s USD; it resets "
             "at %s (in %lld s)",
             k, b->name, whose, limit, b->kind == TG_BUDGET_HOURS ? "" : ", periods in ",
             b->kind == TG_BUDGET_HOURS ? "" : b->tz, cost, reset, (long long)wait);
    snprintf(extra, sizeof(extra), "Retry-After: %lld\r\nx-tollgate-budget: %lld\r\nx-tollgate-budget-reset: %s\r\n",
             (long long)wait, (long long)b->id, reset);
    tg__proxy_fail_ex(p, 402, "insufficient_quota", "budget_exceeded", msg, extra);
}

static void admit_done(void *ud, const tg_admit_outcome_t *out) {
    proxy_req_t *p = ud;
    if (p->trace)
        tg__trace_admit_end(p, out->result);
    if (out->result == TG_ADMIT_OK) {
        p->money_held = out->reserved;
        tg__cleanup_add(p, cleanup_money_held);
        tg__slot_admitted(p, out->slot);
        tg__proxy_run(p);
        return;
    }
    p->slot_early = 0; /* a refusal took no slot */
    tg_admit_t *a = p->admit;
    p->admit = NULL;
    tg_admit_cancel(a); /* refused: nothing is held; frees the handle */
    if (out->result == TG_ADMIT_PERIOD_BUDGET) {
        tg_billing_refused_budget(p->pw->ctx->billing);
        budget_refused(p, out->budget);
        return;
    }
    if (out->result == TG_ADMIT_BALANCE || out->result == TG_ADMIT_BUDGET) {
        const char *code, *msg;
        tg_billing_refused(p->pw->ctx->billing, out->result == TG_ADMIT_BUDGET, &code, &msg);
        tg__proxy_fail(p, 402, "insufficient_quota", code, msg);
        return;
    }
    if (out->result == TG_ADMIT_MONEY_INIT) {
        /* As tg_billing_reserve: a few loads at most (another instance may race us). */
        if (p->balance_loads++ > 2) {
            tg__proxy_fail(p, 503, "server_error", "billing_unavailable", "the balance could not be initialised");
            return;
        }
        tg_reserve_req_t r = reserve_req(p);
        p->reserve = tg_billing_load(p->pw->ctx->billing, &r, balance_loaded, p);
        tg__cleanup_add(p, cleanup_reserve);
        return;
    }
    if (out->result == TG_ADMIT_UNAVAILABLE) {
        tg__proxy_fail_ex(p, 503, "server_error", "limiter_unavailable",
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
    tg__proxy_fail_ex(p, 429, "rate_limit_error", code, msg, extra);
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
    tg__hook(p, TG_HOOK_ON_LIMITER_DOWN);
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
        int64_t n;
        if (!p->json) {
            /* only scanned (tree_for_limits): every field absent or an integer */
            if (!p->scan_limit[i])
                continue;
            n = p->scan_limit[i];
        } else {
            json_t *v = json_object_get(p->json, limit_fields[i]);
            if (!v || json_is_null(v))
                continue;
            n = limit_value(v);
        }
        if (n < 0)
            *bad = limit_fields[i];
        else if (n > best) {
            best = n;
            *field = limit_fields[i];
        }
    }
    return best;
}

/* The tree, unless the body's scan read every output limit (an integer or absent):
 * client_out_bound reads them from either. */
static void tree_for_limits(proxy_req_t *p) {
    if (!p->scan_limits)
        tg__proxy_json(p);
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
    tree_for_limits(p);
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    const char *limit_field = p->proto == TG_PROTO_RESPONSES ? "max_output_tokens" : "max_tokens";
    const char *field, *bad;
    int64_t max_out = client_out_bound(p, &field, &bad);
    char msg[320];
    if (bad) {
        snprintf(msg, sizeof(msg), "%s must be a positive integer (the most output tokens the model may produce)",
                 bad);
        return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_max_tokens", msg);
    }
    for (size_t i = 0; p->json && i < sizeof(limit_fields) / sizeof(limit_fields[0]); i++) {
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
        if (p->json) /* else written when the tree is built (tg__proxy_json), or as bytes */
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
        return tg__proxy_fail(p, 400, "invalid_request_error", "max_tokens_too_large", msg);
    }
    p->reserved_amount = amount;
    p->bound_done = 1;
    return TG_OK;
}

/* Whether the admission can take the first attempt's reservation too: billing applies,
 * and the prices are known (a key with a group prices from the account snapshot, taken
 * here instead of in tg__phase_select; before the first snapshot has loaded, tg__phase_reserve
 * reserves after tg__phase_select waited for it). */
static int money_in_admission(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    proxy_worker_t *pw = p->pw;
    if (!pw->ctx->billing || !pr->key_id || p->attempt != 1 || p->reserved || p->money_held)
        return 0;
    if (pr->group_id && pw->ctx->accounts && !p->snap) {
        if (!(p->snap = tg_accounts_snapshot(pw->ctx->accounts)))
            return 0;
        tg__cleanup_add(p, tg__cleanup_snapshot);
    }
    return 1;
}

static int limited(const tg_principal_t *pr) {
    return !(pr->rpm < 0 && pr->tpm < 0 && pr->concurrency < 0 && pr->tenant_rpm < 0 && pr->tenant_tpm < 0 &&
             pr->tenant_concurrency < 0);
}

/* The token estimate the admission charges, made once (phase select reads it for the
 * learned quotas, before the admission): prompt bytes / 4 plus the output bound, read
 * from the fields billing reads (max_completion_tokens, then max_output_tokens for the
 * Responses API, max_tokens otherwise). A client's bound is any integer: the sum
 * saturates instead of wrapping, so a huge max_tokens charges the whole TPM bucket, never
 * nothing. The client's bound, before billing's default is put in: kept when admitting
 * again after a balance load. Nothing when the admission will not ask Redis. */
void tg__estimate_tokens(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    if (p->est_done || !pr || !p->pw->ctx->limits || !tg__is_model_route(p->req->route) || p->admit ||
        (!limited(pr) && !money_in_admission(p)))
        return;
    tree_for_limits(p);
    const char *field, *bad;
    int64_t out_bound = client_out_bound(p, &field, &bad);
    if (out_bound < 0)
        out_bound = 1024;
    int64_t in_bound = (int64_t)TG_MIN(p->req->body.len / 4, (size_t)INT64_MAX);
    p->est_tokens = in_bound + TG_MIN(TG_MAX(out_bound, 0), INT64_MAX - in_bound);
    p->est_done = 1;
}

int tg__phase_admit(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    if (!pr || !p->pw->ctx->limits || !tg__is_model_route(p->req->route) || p->admit)
        return TG_OK;
    int money = money_in_admission(p);
    if (!limited(pr) && !money)
        return TG_OK; /* no Redis call */
    tg__estimate_tokens(p);
    tg_limit_money_t m;
    if (money) {
        if (money_bound(p) != TG_OK || budgets_now(p) != TG_OK)
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
    char slot_key[64];
    if (tg__slot_with_admission(p, slot_key, &lim.slot_limit)) {
        lim.slot_key = slot_key;
        lim.slot_ttl_ms = p->req->worker->gw->cfg->limiter.lease_ttl_ms;
    }
    if (p->trace)
        tg__trace_admit_start(p);
    p->admit = tg_limits_admit(p->pw->ctx->limits, p->req->id, &lim, admit_done, p);
    tg__cleanup_add(p, cleanup_admit);
    return TG_AGAIN;
}

/* ---- phase: reserve ----------------------------------------------------------------- */

static void reserve_done(void *ud, int status, const char *code, const char *msg) {
    proxy_req_t *p = ud;
    p->reserve = NULL;
    if (status == 0) {
        p->reserved = p->attempt;
        if (code && p->attempt >= 1 && p->attempt <= 32) /* "unheld": money open, Redis down */
            p->unheld |= 1u << (p->attempt - 1);
        tg__proxy_run(p);
        return;
    }
    if (status == 402 && code && !strcmp(code, "budget_exceeded") && msg && !strncmp(msg, "budget ", 7)) {
        budget_refused(p, atoi(msg + 7));
        return;
    }
    tg__proxy_fail(p, status, status == 402 ? "insufficient_quota" : "server_error", code, msg);
}

int tg__phase_reserve(proxy_req_t *p) {
    if (p->trace)
        tg__trace_select_end(p);
    const tg_principal_t *pr = p->principal;
    proxy_worker_t *pw = p->pw;
    if (!pw->ctx->billing || !pr || !pr->key_id || !tg__is_model_route(p->req->route))
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
    if (budgets_now(p) != TG_OK)
        return TG_DONE;
    r = reserve_req(p);
    p->reserve = tg_billing_reserve(pw->ctx->billing, &r, reserve_done, p);
    tg__cleanup_add(p, cleanup_reserve);
    return TG_AGAIN;
}
