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
 * tg_plugins_hook_seed), so the replay draws the same random numbers. The line is
 * written straight into buffers (the inputs, the attempts, the live decisions), joined
 * at the end: a JSON tree would cost several times more per sampled request.
 */
#include "tg_proxy_internal.h"

#include <math.h>

#include "tollgate/tg_capture.h"

/* A sampled request's line under construction (p->cap). */
struct tg_capture_line_s {
    tg_buf_t in;       /* the top-level members, from the first comma */
    tg_buf_t attempts; /* the attempts' objects, comma-separated; the last one open */
    tg_buf_t live;     /* the live decisions' members, from the first comma */
    tg_buf_t select;   /* live.select's objects, comma-separated */
    int nattempts, attempt_open, has_reject, has_limiter;
};

static void line_free(tg_capture_line_t *c) {
    tg_buf_free(&c->in);
    tg_buf_free(&c->attempts);
    tg_buf_free(&c->live);
    tg_buf_free(&c->select);
    free(c);
}

static void cleanup_capture(proxy_req_t *p) {
    if (p->cap) {
        line_free(p->cap);
        p->cap = NULL;
        tg_capture_cancel();
    }
}

/*
 * The members are written without printf: a sampled line has about a hundred of them,
 * and vsnprintf costs ~1,000 instructions a call (callgrind: 60% of a captured
 * request's instructions were tg_buf_printf's). Keys are literals.
 */

/* ,"key": */
static void put_key(tg_buf_t *b, const char *key) {
    size_t k = strlen(key);
    tg_buf_reserve(b, k + 4);
    char *d = b->data + b->len;
    d[0] = ',';
    d[1] = '"';
    memcpy(d + 2, key, k);
    d[k + 2] = '"';
    d[k + 3] = ':';
    b->len += k + 4;
    b->data[b->len] = '\0';
}

/* ,"key":"escaped" */
static void put_str(tg_buf_t *b, const char *key, const char *s, size_t n) {
    put_key(b, key);
    tg_buf_append(b, "\"", 1);
    tg_buf_append_json_escaped(b, s ? s : "", s ? n : 0);
    tg_buf_append(b, "\"", 1);
}

static void put_cstr(tg_buf_t *b, const char *key, const char *s) { put_str(b, key, s, s ? strlen(s) : 0); }

static void put_int(tg_buf_t *b, const char *key, long long v) {
    put_key(b, key);
    tg_buf_append_i64(b, v);
}

/* Doubles in full precision (%.17g reads back to the same double: the replay's scores
 * are the live ones to the last bit); anything not finite as -1 (unknown); a whole
 * number as an integer, without printf. */
static void put_num(tg_buf_t *b, const char *key, double v) {
    if (!isfinite(v))
        v = -1;
    put_key(b, key);
    if (fabs(v) < 1e15 && v == (double)(long long)v) {
        tg_buf_append_i64(b, (int64_t)v);
        return;
    }
    char tmp[32];
    int n = snprintf(tmp, sizeof(tmp), "%.17g", v);
    tg_buf_append(b, tmp, (size_t)n);
}

static void put_bool(tg_buf_t *b, const char *key, int v) {
    put_key(b, key);
    if (v)
        tg_buf_append(b, "true", 4);
    else
        tg_buf_append(b, "false", 5);
}

void tg__capture_begin(proxy_req_t *p) {
    tg_hookctx_t *c = &p->ctx;
    uint32_t seed;
    if (!tg_capture_sample(c->group, &seed))
        return;
    tg_capture_line_t *l = calloc(1, sizeof(*l));
    if (!l)
        abort();
    p->cap = l;
    p->cap_seed = seed;
    tg__cleanup_add(p, cleanup_capture);
    tg_buf_t *b = &l->in;
    tg_buf_reserve(b, 1024);
    put_str(b, "id", c->request_id, c->request_id_len);
    put_int(b, "capture", 1);
    put_int(b, "seed", seed);
    put_int(b, "generation", (long long)c->generation);
    put_num(b, "now_ms", c->now_ms);
    put_str(b, "model", c->original_model, c->original_model_len);
    put_str(b, "route", c->route, c->route_len);
    put_str(b, "protocol", c->protocol, c->protocol_len);
    put_str(b, "tenant_id", c->tenant_id, c->tenant_id_len);
    put_str(b, "key_id", c->key_id, c->key_id_len);
    put_str(b, "group", c->group, c->group_len);
    put_bool(b, "stream", c->stream);
    put_int(b, "max_tokens", c->max_tokens);
    tg_buf_appends(b, ",\"headers\":{");
    int nh = 0;
    for (int i = 0; i < c->nheaders; i++) {
        const tg_ffi_header_t *x = &c->headers[i];
        char name[65];
        if (x->name_len >= sizeof(name) || !tg_capture_header_allowed(x->name, x->name_len))
            continue;
        for (size_t k = 0; k < x->name_len; k++)
            name[k] = (char)(x->name[k] >= 'A' && x->name[k] <= 'Z' ? x->name[k] + 32 : x->name[k]);
        name[x->name_len] = '\0';
        tg_buf_appends(b, nh++ ? ",\"" : "\"");
        tg_buf_append_json_escaped(b, name, x->name_len);
        tg_buf_appends(b, "\":\"");
        tg_buf_append_json_escaped(b, x->value, x->value_len);
        tg_buf_appends(b, "\"");
    }
    tg_buf_appends(b, "}");
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
    tg_capture_line_t *l = p->cap;
    int attempt = hook == TG_HOOK_SELECT_ACCOUNT || hook == TG_HOOK_ON_UPSTREAM_ERROR ? p->attempt : 0;
    tg_plugins_seed(pl, tg_plugins_hook_seed(p->cap_seed, hook, attempt));
    int rc = tg_plugins_run(pl, hook, c);
    if (rc == TG_DONE && c->reject_status && !l->has_reject) {
        l->has_reject = 1;
        tg_buf_appends(&l->live, ",\"reject\":{\"hook\":\"");
        tg_buf_appends(&l->live, tg_ffi_hook_name(hook));
        tg_buf_appends(&l->live, "\"");
        put_int(&l->live, "status", c->reject_status);
        put_cstr(&l->live, "code", c->reject_code);
        put_cstr(&l->live, "message", c->reject_message);
        tg_buf_appends(&l->live, "}");
    }
    if (hook == TG_HOOK_ON_LIMITER_DOWN && !l->has_limiter) {
        l->has_limiter = 1;
        tg_buf_appends(&l->in, ",\"limiter_down\":[");
        tg_buf_appends(&l->live, ",\"limiter\":{");
        for (int k = 0, n = 0; k < 4; k++) {
            if (!(c->limits & (1 << k)))
                continue;
            int v = c->limiter_decision[k];
            tg_buf_appends(&l->in, n ? ",\"" : "\"");
            tg_buf_appends(&l->in, limit_names[k]);
            tg_buf_appends(&l->in, "\"");
            tg_buf_appends(&l->live, n ? ",\"" : "\"");
            tg_buf_appends(&l->live, limit_names[k]);
            tg_buf_appends(&l->live, "\":\"");
            tg_buf_appends(&l->live, v >= 0 && v <= 2 ? decisions[v] : "default");
            tg_buf_appends(&l->live, "\"");
            n++;
        }
        tg_buf_appends(&l->in, "]");
        tg_buf_appends(&l->live, "}");
    }
    return rc;
}

void tg__capture_model(proxy_req_t *p) {
    tg_capture_line_t *l = p->cap;
    put_cstr(&l->live, "model", p->model);
    put_str(&l->live, "group", p->ctx.group, p->ctx.group_len);
}

/* Closes the attempt left open (its upstream error may have been added to it). */
static void close_attempt(tg_capture_line_t *l) {
    if (l->attempt_open) {
        tg_buf_appends(&l->attempts, "}");
        l->attempt_open = 0;
    }
}

void tg__capture_accounts(proxy_req_t *p, int n, int sticky) {
    tg_capture_line_t *l = p->cap;
    close_attempt(l);
    tg_buf_t *b = &l->attempts;
    tg_buf_reserve(b, (size_t)n * 320 + 64);
    tg_buf_appends(b, l->nattempts++ ? ",{\"accounts\":[" : "{\"accounts\":[");
    for (int i = 0; i < n; i++) {
        const tg_ffi_account_t *a = &p->accts[i];
        tg_buf_appends(b, i ? ",{\"id\":\"" : "{\"id\":\"");
        tg_buf_append_json_escaped(b, a->id, a->id_len);
        tg_buf_appends(b, "\"");
        put_str(b, "region", a->region, a->region_len);
        put_int(b, "priority", a->priority);
        put_int(b, "inflight", a->inflight);
        put_int(b, "max_concurrency", a->max_concurrency);
        put_int(b, "queued", a->queued);
        put_bool(b, "sticky", a->sticky);
        put_int(b, "tried", a->tried);
        put_num(b, "error_ewma", a->error_ewma);
        put_num(b, "ttft_ewma_ms", a->ttft_ewma_ms);
        put_num(b, "reset_in_ms", a->reset_in_ms);
        put_num(b, "cost", a->cost);
        put_bool(b, "trial", a->trial);
        put_num(b, "headroom", a->headroom);
        put_num(b, "window_left", a->window_left);
        put_num(b, "window_reset_in_ms", a->window_reset_in_ms);
        tg_buf_appends(b, "}");
    }
    tg_buf_appends(b, "]");
    put_bool(b, "sticky", sticky);
    l->attempt_open = 1;
}

void tg__capture_select(proxy_req_t *p, const char *by, const tg_account_t *builtin) {
    tg_capture_line_t *l = p->cap;
    tg_buf_t *b = &l->select;
    tg_buf_appends(b, b->len ? ",{\"account\":\"" : "{\"account\":\"");
    tg_buf_append_json_escaped(b, p->order[0]->name, strlen(p->order[0]->name));
    tg_buf_appends(b, "\"");
    put_cstr(b, "by", by);
    put_cstr(b, "builtin", builtin->name);
    tg_buf_appends(b, "}");
}

void tg__capture_retry(proxy_req_t *p, int status, int failure, int64_t retry_after_ms, int64_t elapsed_ms,
                       int64_t deadline_ms, int action, int64_t delay_ms, int by_plugin) {
    tg_capture_line_t *l = p->cap;
    if (!l->attempt_open)
        return;
    tg_buf_t *b = &l->attempts;
    tg_buf_appends(b, ",\"upstream_error\":{\"status\":");
    tg_buf_append_i64(b, status);
    put_cstr(b, "failure", failure >= 0 && failure <= 5 ? failures[failure] : "status");
    put_int(b, "attempt", p->attempt);
    put_int(b, "retry_after_ms", retry_after_ms);
    put_int(b, "elapsed_ms", elapsed_ms);
    put_int(b, "deadline_ms", deadline_ms);
    tg_buf_appends(b, "},\"retry\":{\"action\":\"");
    tg_buf_appends(b, action >= 0 && action <= 2 ? actions[action] : "give_up");
    tg_buf_appends(b, "\"");
    put_int(b, "delay_ms", delay_ms);
    put_cstr(b, "by", by_plugin ? "plugin" : "core");
    tg_buf_appends(b, "}");
}

static void put_usage(tg_buf_t *b, const char *key, const tg_usage_t *u) {
    put_key(b, key);
    tg_buf_append(b, "{", 1);
    static const char *const names[] = {"input", "output", "cache_read", "cache_write", "reasoning"};
    const int64_t v[] = {u->input, u->output, u->cache_read, u->cache_write, u->reasoning};
    for (int k = 0, n = 0; k < 5; k++) {
        if (!(u->known & (1u << k)))
            continue;
        tg_buf_appends(b, n++ ? ",\"" : "\"");
        tg_buf_appends(b, names[k]);
        tg_buf_append(b, "\":", 2);
        tg_buf_append_i64(b, v[k]);
    }
    tg_buf_appends(b, "}");
}

void tg__capture_price(proxy_req_t *p, const tg_usage_t *billed, int64_t cost) {
    tg_capture_line_t *l = p->cap;
    put_usage(&l->in, "usage", billed);
    if (cost >= 0)
        put_int(&l->live, "cost_nanousd", cost);
    else
        tg_buf_appends(&l->live, ",\"cost_nanousd\":null");
}

void tg__capture_finish(proxy_req_t *p, int status, double ttft_ms, double total_ms, int64_t cost) {
    tg_capture_line_t *l = p->cap;
    close_attempt(l);
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_reserve(&b, l->in.len + l->attempts.len + l->live.len + l->select.len + 512);
    tg_buf_appends(&b, "{");
    tg_buf_append(&b, l->in.data + 1, l->in.len - 1); /* the first member's comma */
    put_int(&b, "status", status);
    tg_buf_appends(&b, ",\"attempts\":[");
    tg_buf_append(&b, l->attempts.data, l->attempts.len);
    tg_buf_appends(&b, "],\"live\":{\"select\":[");
    tg_buf_append(&b, l->select.data, l->select.len);
    tg_buf_appends(&b, "]");
    tg_buf_append(&b, l->live.data, l->live.len);
    tg_buf_appends(&b, "},\"outcome\":{\"status\":");
    tg_buf_append_i64(&b, status);
    tg_buf_appends(&b, ",\"account\":");
    if (p->at.account) {
        tg_buf_appends(&b, "\"");
        tg_buf_append_json_escaped(&b, p->at.account->name, strlen(p->at.account->name));
        tg_buf_appends(&b, "\"");
    } else {
        tg_buf_appends(&b, "null");
    }
    put_int(&b, "attempts", p->attempt);
    if (ttft_ms >= 0)
        put_num(&b, "ttft_ms", ttft_ms);
    else
        tg_buf_appends(&b, ",\"ttft_ms\":null");
    put_num(&b, "total_ms", total_ms);
    put_usage(&b, "usage", &p->at.usage);
    if (cost >= 0)
        put_int(&b, "cost_nanousd", cost);
    else
        tg_buf_appends(&b, ",\"cost_nanousd\":null");
    tg_buf_appends(&b, "}}");
    line_free(l);
    p->cap = NULL;
    /* The recorder owns the text now (one byte past it is ours: its NUL). */
    tg_capture_submit(b.data, b.len);
}
