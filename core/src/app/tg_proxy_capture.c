/*
 * A sampled request's capture line (policy/tg_capture.c records it): what each hook
 * saw and what was decided, in the format `tollgate policy test --requests` reads, so
 * a candidate policy can be replayed on the traffic the gateway really has and its
 * decisions compared with the live ones (`--compare`).
 *
 *   {"id", "capture": 1, "seed", "generation", "now_ms", "model" (as sent), "route",
 *    "protocol", "tenant_id", "key_id", "group", "stream", "max_tokens",
 *    "headers" {the allow list's},
 *    "attempts": [{"accounts": [candidates as select_account saw them], "sticky",
 *                  "upstream_error" {...}, "retry" {"action", "delay_ms", "by"}}],
 *    "limiter_down": [...], "usage" {as price saw it}, "status",
 *    "live": {"model", "group", "reject" {hook, status, code, message},
 *             "select": [{"account", "by": plugin|builtin|sticky, "builtin"}],
 *             "limiter" {limit: decision}, "cost_nanousd"},
 *    "outcome": {"status", "account", "attempts", "ttft_ms", "total_ms", "usage",
 *                "cost_nanousd"}}
 *
 * Only a sampled request pays for any of this (p->cap is NULL otherwise); each hook
 * call of a sampled request runs with a seed derived from the line's (see
 * tg_plugins_hook_seed), so the replay draws the same random numbers.
 */
#include "tg_proxy_internal.h"

#include "tollgate/tg_capture.h"

static void cleanup_capture(proxy_req_t *p) {
    if (p->cap) {
        json_decref(p->cap);
        p->cap = NULL;
        tg_capture_cancel();
    }
}

static json_t *strn(const char *s, size_t n) { return json_stringn_nocheck(s ? s : "", s ? n : 0); }

void tg__capture_begin(proxy_req_t *p) {
    tg_hookctx_t *c = &p->ctx;
    uint32_t seed;
    if (!tg_capture_sample(c->group, &seed))
        return;
    json_t *o = json_object();
    p->cap = o;
    p->cap_seed = seed;
    tg__cleanup_add(p, cleanup_capture);
    json_object_set_new(o, "id", strn(c->request_id, c->request_id_len));
    json_object_set_new(o, "capture", json_integer(1));
    json_object_set_new(o, "seed", json_integer(seed));
    json_object_set_new(o, "generation", json_integer((json_int_t)c->generation));
    json_object_set_new(o, "now_ms", json_real(c->now_ms));
    json_object_set_new(o, "model", strn(c->original_model, c->original_model_len));
    json_object_set_new(o, "route", strn(c->route, c->route_len));
    json_object_set_new(o, "protocol", strn(c->protocol, c->protocol_len));
    json_object_set_new(o, "tenant_id", strn(c->tenant_id, c->tenant_id_len));
    json_object_set_new(o, "key_id", strn(c->key_id, c->key_id_len));
    json_object_set_new(o, "group", strn(c->group, c->group_len));
    json_object_set_new(o, "stream", json_boolean(c->stream));
    json_object_set_new(o, "max_tokens", json_integer(c->max_tokens));
    json_t *h = json_object();
    for (int i = 0; i < c->nheaders; i++) {
        const tg_ffi_header_t *x = &c->headers[i];
        char name[65];
        if (x->name_len >= sizeof(name) || !tg_capture_header_allowed(x->name, x->name_len))
            continue;
        for (size_t k = 0; k < x->name_len; k++)
            name[k] = (char)(x->name[k] >= 'A' && x->name[k] <= 'Z' ? x->name[k] + 32 : x->name[k]);
        name[x->name_len] = '\0';
        json_object_set_new(h, name, strn(x->value, x->value_len));
    }
    json_object_set_new(o, "headers", h);
    json_object_set_new(o, "attempts", json_array());
    json_object_set_new(o, "live", json_object());
}

static json_t *live(proxy_req_t *p) { return json_object_get(p->cap, "live"); }

static json_t *last_attempt(proxy_req_t *p) {
    json_t *a = json_object_get(p->cap, "attempts");
    size_t n = json_array_size(a);
    return n ? json_array_get(a, n - 1) : NULL;
}

static const char *const limit_names[] = {"rate", "tokens", "concurrency", "money"};
static const char *const decisions[] = {"closed", "open", "local"};
static const char *const actions[] = {"give_up", "same", "other"};
static const char *const failures[] = {"status", "connect", "timeout_connect", "timeout_first_byte",
                                       "timeout_idle", "reset"};

int tg__hook(proxy_req_t *p, int hook) {
    tg_plugins_t *pl = p->pw->ctx->plugins;
    tg_hookctx_t *c = &p->ctx;
    if (!p->cap)
        return tg_plugins_run(pl, hook, c);
    int attempt = hook == TG_HOOK_SELECT_ACCOUNT || hook == TG_HOOK_ON_UPSTREAM_ERROR ? p->attempt : 0;
    tg_plugins_seed(pl, tg_plugins_hook_seed(p->cap_seed, hook, attempt));
    int rc = tg_plugins_run(pl, hook, c);
    json_t *lv = live(p);
    if (rc == TG_DONE && c->reject_status && !json_object_get(lv, "reject")) {
        json_t *r = json_object();
        json_object_set_new(r, "hook", json_string(tg_ffi_hook_name(hook)));
        json_object_set_new(r, "status", json_integer(c->reject_status));
        json_object_set_new(r, "code", json_string(c->reject_code));
        json_object_set_new(r, "message", json_string(c->reject_message));
        json_object_set_new(lv, "reject", r);
    }
    if (hook == TG_HOOK_ON_LIMITER_DOWN && !json_object_get(lv, "limiter")) {
        json_t *in = json_array(), *d = json_object();
        for (int k = 0; k < 4; k++) {
            if (!(c->limits & (1 << k)))
                continue;
            json_array_append_new(in, json_string(limit_names[k]));
            int v = c->limiter_decision[k];
            json_object_set_new(d, limit_names[k], json_string(v >= 0 && v <= 2 ? decisions[v] : "default"));
        }
        json_object_set_new(p->cap, "limiter_down", in);
        json_object_set_new(lv, "limiter", d);
    }
    return rc;
}

void tg__capture_model(proxy_req_t *p) {
    json_t *lv = live(p);
    json_object_set_new(lv, "model", json_string(p->model));
    json_object_set_new(lv, "group", strn(p->ctx.group, p->ctx.group_len));
}

void tg__capture_accounts(proxy_req_t *p, int n, int sticky) {
    json_t *at = json_object(), *list = json_array();
    for (int i = 0; i < n; i++) {
        const tg_ffi_account_t *a = &p->accts[i];
        json_t *x = json_object();
        json_object_set_new(x, "id", strn(a->id, a->id_len));
        json_object_set_new(x, "region", strn(a->region, a->region_len));
        json_object_set_new(x, "priority", json_integer(a->priority));
        json_object_set_new(x, "inflight", json_integer(a->inflight));
        json_object_set_new(x, "max_concurrency", json_integer(a->max_concurrency));
        json_object_set_new(x, "queued", json_integer(a->queued));
        json_object_set_new(x, "sticky", json_boolean(a->sticky));
        json_object_set_new(x, "tried", json_integer(a->tried));
        json_object_set_new(x, "error_ewma", json_real(a->error_ewma));
        json_object_set_new(x, "ttft_ewma_ms", json_real(a->ttft_ewma_ms));
        json_object_set_new(x, "reset_in_ms", json_real(a->reset_in_ms));
        json_object_set_new(x, "cost", json_real(a->cost));
        json_object_set_new(x, "trial", json_boolean(a->trial));
        json_object_set_new(x, "headroom", json_real(a->headroom));
        json_object_set_new(x, "window_left", json_real(a->window_left));
        json_object_set_new(x, "window_reset_in_ms", json_real(a->window_reset_in_ms));
        json_array_append_new(list, x);
    }
    json_object_set_new(at, "accounts", list);
    json_object_set_new(at, "sticky", json_boolean(sticky));
    json_array_append_new(json_object_get(p->cap, "attempts"), at);
}

void tg__capture_select(proxy_req_t *p, const char *by, const tg_account_t *builtin) {
    json_t *sel = json_object_get(live(p), "select");
    if (!sel) {
        sel = json_array();
        json_object_set_new(live(p), "select", sel);
    }
    json_t *d = json_object();
    json_object_set_new(d, "account", json_string(p->order[0]->name));
    json_object_set_new(d, "by", json_string(by));
    json_object_set_new(d, "builtin", json_string(builtin->name));
    json_array_append_new(sel, d);
}

void tg__capture_retry(proxy_req_t *p, int status, int failure, int64_t retry_after_ms, int64_t elapsed_ms,
                       int64_t deadline_ms, int action, int64_t delay_ms, int by_plugin) {
    json_t *at = last_attempt(p);
    if (!at)
        return;
    json_t *ue = json_object();
    json_object_set_new(ue, "status", json_integer(status));
    json_object_set_new(ue, "failure", json_string(failure >= 0 && failure <= 5 ? failures[failure] : "status"));
    json_object_set_new(ue, "attempt", json_integer(p->attempt));
    json_object_set_new(ue, "retry_after_ms", json_integer(retry_after_ms));
    json_object_set_new(ue, "elapsed_ms", json_integer(elapsed_ms));
    json_object_set_new(ue, "deadline_ms", json_integer(deadline_ms));
    json_object_set_new(at, "upstream_error", ue);
    json_t *r = json_object();
    json_object_set_new(r, "action", json_string(action >= 0 && action <= 2 ? actions[action] : "give_up"));
    json_object_set_new(r, "delay_ms", json_integer(delay_ms));
    json_object_set_new(r, "by", json_string(by_plugin ? "plugin" : "core"));
    json_object_set_new(at, "retry", r);
}

static json_t *usage_json(const tg_usage_t *u) {
    json_t *o = json_object();
    if (u->known & TG_USAGE_INPUT)
        json_object_set_new(o, "input", json_integer(u->input));
    if (u->known & TG_USAGE_OUTPUT)
        json_object_set_new(o, "output", json_integer(u->output));
    if (u->known & TG_USAGE_CACHE_READ)
        json_object_set_new(o, "cache_read", json_integer(u->cache_read));
    if (u->known & TG_USAGE_CACHE_WRITE)
        json_object_set_new(o, "cache_write", json_integer(u->cache_write));
    if (u->known & TG_USAGE_REASONING)
        json_object_set_new(o, "reasoning", json_integer(u->reasoning));
    return o;
}

void tg__capture_price(proxy_req_t *p, const tg_usage_t *billed, int64_t cost) {
    json_object_set_new(p->cap, "usage", usage_json(billed));
    json_object_set_new(live(p), "cost_nanousd", cost >= 0 ? json_integer(cost) : json_null());
}

void tg__capture_finish(proxy_req_t *p, int status, double ttft_ms, double total_ms, int64_t cost) {
    json_t *o = p->cap;
    json_object_set_new(o, "status", json_integer(status));
    json_t *out = json_object();
    json_object_set_new(out, "status", json_integer(status));
    json_object_set_new(out, "account", p->at.account ? json_string(p->at.account->name) : json_null());
    json_object_set_new(out, "attempts", json_integer(p->attempt));
    json_object_set_new(out, "ttft_ms", ttft_ms >= 0 ? json_real(ttft_ms) : json_null());
    json_object_set_new(out, "total_ms", json_real(total_ms));
    json_object_set_new(out, "usage", usage_json(&p->at.usage));
    json_object_set_new(out, "cost_nanousd", cost >= 0 ? json_integer(cost) : json_null());
    json_object_set_new(o, "outcome", out);
    char *line = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    p->cap = NULL;
    if (line)
        tg_capture_submit(line, strlen(line));
    else
        tg_capture_cancel();
}
