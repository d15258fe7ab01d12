/*
 * The policy workbench: `tollgate policy test POLICY --requests FILE.jsonl`. Replays
 * recorded request contexts (one JSON object per line) through a policy, offline, with
 * the same runtime the gateway uses (sandbox, schema, fallbacks, budget), and prints
 * what each hook decided, so a team sees what a policy would do before it goes live.
 *
 * A line may hold: id, model, protocol, route, tenant_id, key_id, group, stream,
 * max_tokens, headers {name: value}, now_ms (or now: "2024-01-15T10:00:00Z"),
 * accounts [{id, region, priority, inflight, max_concurrency, queued, sticky, tried,
 * error_ewma, ttft_ewma_ms, reset_in_ms, cost, trial, headroom, window_left,
 * window_reset_in_ms}], upstream_error {status, failure,
 * attempt, retry_after_ms, elapsed_ms, deadline_ms, bytes_sent}, limiter_down
 * ["rate", "tokens", "concurrency", "money"], usage {input, output, cache_read,
 * cache_write, reasoning}, status. Hooks run in request order; those whose inputs are
 * absent are skipped. Exit 0 when no plugin failed, 1 when one did, 2 on bad usage.
 *
 * A capture line (the gateway's recorder, tg_capture.c) also holds `seed` (each hook
 * call reseeds math.random as the gateway did: tg_plugins_hook_seed), `attempts` (the
 * candidates of each account selection and the upstream error after it) and `live`,
 * what was decided live. With --compare the candidate's decisions are set against
 * `live`, per request and in total: which account, why (the candidate's scores), and
 * the cost and TTFT of either choice by the EWMAs recorded with the candidates.
 */
#include <errno.h>
#include <jansson.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <limits.h>
#include <unistd.h>

#include "tg_plugin_internal.h"

#define MAX_ACCOUNTS 64
#define TG_MAX_HEADERS_WB 64

static void usage(FILE *f) {
    fprintf(f, "usage: tollgate policy test POLICY --requests FILE.jsonl [options]\n\n"
               "POLICY is a file (policies/x.lua), a plugin folder (plugins/router), or a name\n"
               "looked up in --dirs. Options:\n"
               "  --config LUA      the policy's config, a Lua table constructor: '{top_k = 2}'\n"
               "  --with NAME[=LUA] also run plugin NAME (from --dirs) with that config, e.g.\n"
               "                    --with router to see the policy together with the router\n"
               "  --dirs A,B        where names are looked up (default: the folders of -c FILE's\n"
               "                    plugins.dirs, else plugins,policies beside the install)\n"
               "  -c FILE           the gateway's config: its plugins.dirs, relative to FILE\n"
               "  --seed N          seed math.random, for repeatable draws (default 1; a captured\n"
               "                    request carries its own seed)\n"
               "  --compare         set the decisions against the live ones of a capture\n"
               "                    (GET /admin/api/v1/plugins/capture/download): per request and\n"
               "                    in total\n"
               "  --fail-on-diff    with --compare: exit 3 when a decision differs\n"
               "  --json            one JSON object per request (with --compare: one report)\n");
}

static const char *jstr(json_t *o, const char *k, const char *def) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : def;
}

static double jnum(json_t *o, const char *k, double def) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : def;
}

/* Parses "YYYY-MM-DDTHH:MM:SS[.fff](Z|+HH:MM|-HH:MM)" into ms since the epoch. */
static int parse_time(const char *s, double *out) {
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    const char *rest = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!rest)
        return -1;
    double frac = 0;
    if (*rest == '.') {
        char *end;
        frac = strtod(rest, &end);
        rest = end;
    }
    long off = 0;
    if (*rest == '+' || *rest == '-') {
        int h = 0, m = 0;
        if (sscanf(rest + 1, "%d:%d", &h, &m) < 1)
            return -1;
        off = (h * 3600L + m * 60L) * (*rest == '-' ? -1 : 1);
    } else if (*rest != 'Z' && *rest != '\0') {
        return -1;
    }
    *out = ((double)timegm(&tm) - (double)off + frac) * 1000.0;
    return 0;
}

static const char *const failures[] = {"status", "connect", "timeout_connect", "timeout_first_byte", "timeout_idle",
                                       "reset"};

/* Everything one line needs to stay alive while its hooks run. */
typedef struct {
    json_t *doc;
    tg_ffi_header_t headers[TG_MAX_HEADERS_WB];
    tg_ffi_account_t accounts[MAX_ACCOUNTS];
    char lower[TG_MAX_HEADERS_WB][128];
} line_t;

/* A line's (or an attempt's) candidate accounts into l->accounts: c->naccounts. */
static int fill_accounts(tg_hookctx_t *c, line_t *l, json_t *accts) {
    size_t i;
    json_t *v;
    c->naccounts = 0;
    json_array_foreach(accts, i, v) {
        if (i >= MAX_ACCOUNTS)
            break;
        const char *id = jstr(v, "id", "?"), *region = jstr(v, "region", "");
        l->accounts[i] = (tg_ffi_account_t){
            .id = id, .id_len = strlen(id), .region = region, .region_len = strlen(region),
            .priority = (int)jnum(v, "priority", 0), .inflight = (int)jnum(v, "inflight", 0),
            .max_concurrency = (int)jnum(v, "max_concurrency", 0), .queued = (int)jnum(v, "queued", 0),
            .sticky = json_is_true(json_object_get(v, "sticky")), .tried = (int)jnum(v, "tried", 0),
            .error_ewma = jnum(v, "error_ewma", 0), .ttft_ewma_ms = jnum(v, "ttft_ewma_ms", -1),
            .reset_in_ms = jnum(v, "reset_in_ms", -1), .cost = jnum(v, "cost", 0),
            .trial = json_is_true(json_object_get(v, "trial")), .headroom = jnum(v, "headroom", -1),
            .window_left = jnum(v, "window_left", -1), .window_reset_in_ms = jnum(v, "window_reset_in_ms", -1),
        };
        c->naccounts = (int)i + 1;
    }
    c->accounts = l->accounts;
    return 0;
}

static int fill_upstream_error(tg_hookctx_t *c, json_t *ue, char *err, size_t errlen) {
    if (!ue)
        return 0;
    c->upstream_status = (int)jnum(ue, "status", 0);
    c->attempt = (int)jnum(ue, "attempt", 1);
    c->retry_after_ms = (int64_t)jnum(ue, "retry_after_ms", -1);
    c->elapsed_ms = (int64_t)jnum(ue, "elapsed_ms", 0);
    c->deadline_ms = (int64_t)jnum(ue, "deadline_ms", 0);
    c->bytes_sent = json_is_true(json_object_get(ue, "bytes_sent"));
    const char *f = jstr(ue, "failure", "status");
    c->failure = -1;
    for (int k2 = 0; k2 < 6; k2++)
        if (!strcmp(f, failures[k2]))
            c->failure = k2;
    if (c->failure < 0) {
        snprintf(err, errlen, "upstream_error.failure: unknown \"%s\"", f);
        return -1;
    }
    return 0;
}

static int fill(tg_hookctx_t *c, line_t *l, int lineno, char *err, size_t errlen) {
    json_t *o = l->doc;
    c->request_id = jstr(o, "id", NULL);
    if (!c->request_id) {
        static __thread char idbuf[32];
        snprintf(idbuf, sizeof(idbuf), "line-%d", lineno);
        c->request_id = idbuf;
    }
    c->request_id_len = strlen(c->request_id);
    c->route = jstr(o, "route", "chat");
    c->route_len = strlen(c->route);
    c->protocol = jstr(o, "protocol", "openai_chat");
    c->protocol_len = strlen(c->protocol);
    c->tenant_id = jstr(o, "tenant_id", "");
    c->tenant_id_len = strlen(c->tenant_id);
    c->key_id = jstr(o, "key_id", "");
    c->key_id_len = strlen(c->key_id);
    const char *group = jstr(o, "group", "default");
    snprintf(c->group, sizeof(c->group), "%s", group);
    c->group_len = strlen(c->group);
    const char *model = jstr(o, "model", NULL);
    if (!model) {
        snprintf(err, errlen, "\"model\" (a string) is required");
        return -1;
    }
    tg_plugins_ctx_set_model(c, model, strlen(model));
    c->stream = json_is_true(json_object_get(o, "stream"));
    c->max_tokens = (int64_t)jnum(o, "max_tokens", -1);
    const char *now = jstr(o, "now", NULL);
    if (now && parse_time(now, &c->now_ms) != 0) {
        snprintf(err, errlen, "\"now\": expected 2024-01-15T10:00:00Z, got \"%s\"", now);
        return -1;
    }
    c->now_ms = jnum(o, "now_ms", c->now_ms);
    json_t *h = json_object_get(o, "headers");
    const char *k;
    json_t *v;
    int nh = 0;
    json_object_foreach(h, k, v) {
        if (nh >= TG_MAX_HEADERS_WB || !json_is_string(v))
            continue;
        snprintf(l->lower[nh], sizeof(l->lower[nh]), "%s", k);
        l->headers[nh] = (tg_ffi_header_t){l->lower[nh], strlen(l->lower[nh]), json_string_value(v),
                                           json_string_length(v)};
        nh++;
    }
    c->headers = l->headers;
    c->nheaders = nh;
    c->accounts = l->accounts;
    if (fill_accounts(c, l, json_object_get(o, "accounts")) != 0 ||
        fill_upstream_error(c, json_object_get(o, "upstream_error"), err, errlen) != 0)
        return -1;
    json_t *ld = json_object_get(o, "limiter_down");
    size_t i;
    json_array_foreach(ld, i, v) {
        const char *n = json_is_string(v) ? json_string_value(v) : "";
        c->limits |= !strcmp(n, "rate") ? TG_LIMIT_RATE : !strcmp(n, "tokens") ? TG_LIMIT_TOKENS
                     : !strcmp(n, "concurrency") ? TG_LIMIT_CONCURRENCY : !strcmp(n, "money") ? TG_LIMIT_MONEY : 0;
    }
    json_t *u = json_object_get(o, "usage");
    static const char *const unames[] = {"input", "output", "cache_read", "cache_write", "reasoning"};
    int64_t *uf[] = {&c->usage_input, &c->usage_output, &c->usage_cache_read, &c->usage_cache_write,
                     &c->usage_reasoning};
    for (int k2 = 0; u && k2 < 5; k2++) {
        json_t *x = json_object_get(u, unames[k2]);
        if (json_is_number(x)) {
            *uf[k2] = (int64_t)json_number_value(x);
            c->usage_known |= 1u << k2;
        }
    }
    c->status = (int)jnum(o, "status", 200);
    return 0;
}

/* ---- running a line ------------------------------------------------------------------ */

/* What the candidate decided on one line, for --compare. */
typedef struct {
    int rejected;
    char reject_hook[24];
    int reject_status;
    char reject_code[64], reject_message[256];
    char model[128], group[64];
    int nsel;
    struct {
        int ran;          /* the candidate's select_account ran (else: the live built-in order) */
        int index;        /* into the attempt's accounts, -1 none */
        char why[512];    /* its scores / exclusions */
    } sel[8];
    int nretry;
    int retry_action[8]; /* -1: no upstream error in that attempt */
    int64_t retry_delay[8];
    int has_limiter;
    int limiter[4];
    int has_price;
    int64_t cost;
} decided_t;

typedef struct {
    int json, compare, fail_on_diff;
    tg_buf_t out; /* the current line's text, or its JSON members */
    int errors;
    /* --compare totals */
    int compared, differ, by_hook[TG_HOOK__COUNT];
    double live_cost, cand_cost, live_ttft, cand_ttft;
    int ncost, nttft;
    json_t *diffs, *errlist;
} report_t;

static void add(report_t *r, const char *hook, const char *text) {
    if (r->json) {
        tg_buf_printf(&r->out, ",\"%s\":\"", hook);
        tg_buf_append_json_escaped(&r->out, text, strlen(text));
        tg_buf_appends(&r->out, "\"");
    } else {
        tg_buf_printf(&r->out, "\n  %-18s %s", hook, text);
    }
}

/* The seed of a captured line (0: none; then --seed applies once for the whole file). */
static uint32_t line_seed;

/* Runs one hook if the policy has it and reports the decision in words. */
static void step(tg_plugins_t *pl, tg_hookctx_t *c, int hook, report_t *r, int *stop, int attempt,
                 decided_t *d) {
    if (*stop || !tg_plugins_has_hook(pl, c, hook))
        return;
    int before_errors = c->plugin_errors;
    char before_model[128];
    snprintf(before_model, sizeof(before_model), "%s", c->model);
    if (line_seed)
        tg_plugins_seed(pl, tg_plugins_hook_seed(line_seed, hook, attempt));
    int rc = tg_plugins_run(pl, hook, c);
    char text[1024];
    tg_buf_t b;
    tg_buf_init(&b);
    if (c->plugin_errors > before_errors) {
        r->errors++;
        tg_buf_printf(&b, "ERROR %s; fallback: ", pl->last_hook_error);
        if (r->errlist) {
            json_t *e = json_object();
            json_object_set_new(e, "id", json_stringn(c->request_id, c->request_id_len));
            json_object_set_new(e, "hook", json_string(tg_ffi_hook_name(hook)));
            json_object_set_new(e, "error", json_string(pl->last_hook_error));
            json_array_append_new(r->errlist, e);
        }
    }
    if (rc == TG_DONE) {
        tg_buf_printf(&b, "reject %d %s: %s", c->reject_status, c->reject_code, c->reject_message);
        *stop = 1;
        d->rejected = 1;
        snprintf(d->reject_hook, sizeof(d->reject_hook), "%s", tg_ffi_hook_name(hook));
        d->reject_status = c->reject_status;
        snprintf(d->reject_code, sizeof(d->reject_code), "%s", c->reject_code);
        snprintf(d->reject_message, sizeof(d->reject_message), "%s", c->reject_message);
    } else {
        switch (hook) {
        case TG_HOOK_ON_REQUEST:
        case TG_HOOK_MAP_MODEL:
            if (strcmp(before_model, c->model) != 0)
                tg_buf_printf(&b, "model %s -> %s", before_model, c->model);
            else
                tg_buf_appends(&b, "pass");
            if (c->group_len)
                tg_buf_printf(&b, " (group %s)", c->group);
            break;
        case TG_HOOK_SELECT_ACCOUNT: {
            const tg_ffi_account_t *a = c->selected >= 0 ? &c->accounts[c->selected] : NULL;
            tg_buf_printf(&b, "%.*s%s", a ? (int)a->id_len : 4, a ? a->id : "none",
                          a && a->trial ? " (due a trial)" : c->decided ? "" : " (built-in pick)");
            int scored = 0;
            for (int i = 0; i < c->naccounts; i++)
                scored |= c->accounts[i].score != 0;
            size_t at = b.len;
            tg_buf_appends(&b, "  [");
            for (int i = 0; i < c->naccounts; i++) {
                const tg_ffi_account_t *x = &c->accounts[i];
                tg_buf_printf(&b, "%s%.*s", i ? ", " : "", (int)x->id_len, x->id);
                if (x->trial)
                    tg_buf_appends(&b, " trial");
                if (x->excluded)
                    tg_buf_appends(&b, " excluded");
                else if (scored)
                    tg_buf_printf(&b, " %.3f", x->score);
            }
            tg_buf_appends(&b, "]");
            if (d->nsel > 0 && d->nsel <= 8) {
                d->sel[d->nsel - 1].ran = 1;
                d->sel[d->nsel - 1].index = c->selected;
                snprintf(d->sel[d->nsel - 1].why, sizeof(d->sel[0].why), "%s%s",
                         c->decided ? "scores" : "no choice, built-in pick; scores", b.data + at + 1);
            }
            break;
        }
        case TG_HOOK_ON_UPSTREAM_ERROR:
            if (c->retry_action == TG_RETRY_GIVE_UP)
                tg_buf_appends(&b, "give up");
            else
                tg_buf_printf(&b, "retry on %s account after %lld ms",
                              c->retry_action == TG_RETRY_SAME ? "the same" : "another",
                              (long long)c->retry_delay_ms);
            if (d->nretry > 0 && d->nretry <= 8) {
                d->retry_action[d->nretry - 1] = c->retry_action;
                d->retry_delay[d->nretry - 1] = c->retry_delay_ms;
            }
            break;
        case TG_HOOK_ON_LIMITER_DOWN:
            d->has_limiter = 1;
            for (int k = 0, n = 0; k < 4; k++) {
                static const char *const lim[] = {"rate", "tokens", "concurrency", "money"};
                int dd = c->limiter_decision[k];
                d->limiter[k] = dd;
                if (!(c->limits & (1 << k)))
                    continue;
                tg_buf_printf(&b, "%s%s %s", n++ ? ", " : "", lim[k],
                              dd == TG_LIMITER_OPEN    ? "open (not checked)"
                              : dd == TG_LIMITER_LOCAL ? "local (this instance's bucket)"
                              : dd == TG_LIMITER_CLOSED ? "closed (refuse)"
                                                        : "the configured policy");
            }
            break;
        case TG_HOOK_PRICE:
            d->has_price = 1;
            d->cost = c->cost_nanousd;
            if (c->cost_nanousd < 0)
                tg_buf_appends(&b, "unpriced");
            else
                tg_buf_printf(&b, "%lld nano-USD ($%.9f)", (long long)c->cost_nanousd, (double)c->cost_nanousd / 1e9);
            break;
        default:
            tg_buf_appends(&b, "done");
            break;
        }
    }
    snprintf(text, sizeof(text), "%s", b.data ? b.data : "");
    tg_buf_free(&b);
    add(r, tg_ffi_hook_name(hook), text);
}

/* Runs a line's hooks in request order. A captured line's attempts each run
 * select_account on their own candidates and on_upstream_error on their failure. */
static void run_line(tg_plugins_t *pl, tg_hookctx_t *c, line_t *l, report_t *r, decided_t *d, char *err,
                     size_t errlen, int *bad) {
    int stop = 0;
    memset(d, 0, sizeof(*d));
    d->cost = -1;
    for (int k = 0; k < 4; k++)
        d->limiter[k] = TG_LIMITER_DEFAULT;
    for (int k = 0; k < 8; k++)
        d->retry_action[k] = -1;
    step(pl, c, TG_HOOK_ON_REQUEST, r, &stop, 0, d);
    step(pl, c, TG_HOOK_MAP_MODEL, r, &stop, 0, d);
    snprintf(d->model, sizeof(d->model), "%s", c->model);
    snprintf(d->group, sizeof(d->group), "%s", c->group);
    json_t *attempts = json_object_get(l->doc, "attempts");
    if (json_is_array(attempts)) {
        size_t i;
        json_t *at;
        json_array_foreach(attempts, i, at) {
            if (i >= 8)
                break;
            c->naccounts = 0;
            c->selected = -1;
            if (fill_accounts(c, l, json_object_get(at, "accounts")) != 0)
                break;
            d->nsel = (int)i + 1;
            d->sel[i].index = -1;
            if (c->naccounts && !json_is_true(json_object_get(at, "sticky")))
                step(pl, c, TG_HOOK_SELECT_ACCOUNT, r, &stop, (int)i + 1, d);
            json_t *ue = json_object_get(at, "upstream_error");
            if (ue) {
                if (fill_upstream_error(c, ue, err, errlen) != 0) {
                    fprintf(stderr, "%s\n", err);
                    (*bad)++;
                    break;
                }
                d->nretry = (int)i + 1;
                step(pl, c, TG_HOOK_ON_UPSTREAM_ERROR, r, &stop, c->attempt, d);
            }
        }
    } else {
        if (c->naccounts) {
            d->nsel = 1;
            d->sel[0].index = -1;
            step(pl, c, TG_HOOK_SELECT_ACCOUNT, r, &stop, 1, d);
        }
        if (json_object_get(l->doc, "upstream_error")) {
            d->nretry = 1;
            step(pl, c, TG_HOOK_ON_UPSTREAM_ERROR, r, &stop, c->attempt, d);
        }
    }
    if (c->limits)
        step(pl, c, TG_HOOK_ON_LIMITER_DOWN, r, &stop, 0, d);
    if (c->usage_known)
        step(pl, c, TG_HOOK_PRICE, r, &stop, 0, d);
    stop = 0;
    step(pl, c, TG_HOOK_ON_LOG, r, &stop, 0, d);
}

/* ---- --compare ----------------------------------------------------------------------- */

static const char *const action_names[] = {"give_up", "same", "other"};
static const char *const limiter_names[] = {"closed", "open", "local"};

/* The recorded account `id` among an attempt's candidates, or NULL. */
static json_t *find_account(json_t *attempt, const char *id) {
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(attempt, "accounts"), i, a) {
        if (!strcmp(jstr(a, "id", ""), id))
            return a;
    }
    return NULL;
}

static void describe_account(tg_buf_t *b, json_t *a, const char *id) {
    tg_buf_appends(b, id);
    if (!a)
        return;
    double ttft = jnum(a, "ttft_ewma_ms", -1);
    tg_buf_printf(b, " (cost %.4g, TTFT EWMA ", jnum(a, "cost", 0));
    if (ttft >= 0)
        tg_buf_printf(b, "%.0f ms)", ttft);
    else
        tg_buf_appends(b, "unknown)");
}

/* One difference: printed (text) or kept for the JSON report. */
static void diff(report_t *r, const char *id, int hook, int attempt, const char *live, const char *cand,
                 const char *why) {
    r->by_hook[hook]++;
    if (r->json) {
        json_t *o = json_object();
        json_object_set_new(o, "id", json_string(id));
        json_object_set_new(o, "hook", json_string(tg_ffi_hook_name(hook)));
        if (attempt)
            json_object_set_new(o, "attempt", json_integer(attempt));
        json_object_set_new(o, "live", json_string(live));
        json_object_set_new(o, "candidate", json_string(cand));
        if (why && *why)
            json_object_set_new(o, "why", json_string(why));
        json_array_append_new(r->diffs, o);
        return;
    }
    printf("%s  %s", id, tg_ffi_hook_name(hook));
    if (attempt)
        printf(" (attempt %d)", attempt);
    printf(": live %s, candidate %s%s%s\n", live, cand, why && *why ? "; " : "", why ? why : "");
}

/* Sets the candidate's decisions on a captured line against its live ones. */
static void compare_line(report_t *r, const tg_hookctx_t *c, json_t *doc, const decided_t *d) {
    json_t *lv = json_object_get(doc, "live");
    if (!json_is_object(lv))
        return;
    char id[160];
    snprintf(id, sizeof(id), "%.*s", (int)c->request_id_len, c->request_id);
    int before = 0;
    for (int h = 0; h < TG_HOOK__COUNT; h++)
        before += r->by_hook[h];
    r->compared++;
    char live[512], cand[512];
    json_t *lrej = json_object_get(lv, "reject");
    if (lrej || d->rejected) {
        int same = lrej && d->rejected && (int)jnum(lrej, "status", 0) == d->reject_status &&
                   !strcmp(jstr(lrej, "code", ""), d->reject_code) && !strcmp(jstr(lrej, "hook", ""), d->reject_hook);
        if (!same) {
            if (lrej)
                snprintf(live, sizeof(live), "reject %d %s in %s", (int)jnum(lrej, "status", 0), jstr(lrej, "code", ""),
                         jstr(lrej, "hook", "?"));
            else
                snprintf(live, sizeof(live), "pass");
            if (d->rejected)
                snprintf(cand, sizeof(cand), "reject %d %s in %s", d->reject_status, d->reject_code, d->reject_hook);
            else
                snprintf(cand, sizeof(cand), "pass");
            int hook = !strcmp(lrej ? jstr(lrej, "hook", "") : d->reject_hook, "map_model") ? TG_HOOK_MAP_MODEL
                       : !strcmp(lrej ? jstr(lrej, "hook", "") : d->reject_hook, "select_account")
                           ? TG_HOOK_SELECT_ACCOUNT
                           : TG_HOOK_ON_REQUEST;
            diff(r, id, hook, 0, live, cand, d->rejected ? d->reject_message : "");
        }
        goto done; /* a rejected request has no later decisions to compare */
    }
    const char *lmodel = jstr(lv, "model", NULL);
    if (lmodel && strcmp(lmodel, d->model) != 0) {
        snprintf(live, sizeof(live), "model %s", lmodel);
        snprintf(cand, sizeof(cand), "model %s", d->model);
        diff(r, id, TG_HOOK_MAP_MODEL, 0, live, cand, "");
    }
    json_t *lsel = json_object_get(lv, "select"), *attempts = json_object_get(doc, "attempts");
    for (int k = 0; k < d->nsel && k < (int)json_array_size(lsel); k++) {
        json_t *ls = json_array_get(lsel, (size_t)k), *at = json_array_get(attempts, (size_t)k);
        const char *lid = jstr(ls, "account", "?");
        if (!strcmp(jstr(ls, "by", ""), "sticky"))
            continue; /* the live policy was not asked either */
        const char *cid = jstr(ls, "builtin", "?");
        char cidbuf[128];
        if (d->sel[k].ran && d->sel[k].index >= 0 && d->sel[k].index < c->naccounts + 64) {
            json_t *acc = json_array_get(json_object_get(at, "accounts"), (size_t)d->sel[k].index);
            snprintf(cidbuf, sizeof(cidbuf), "%s", jstr(acc, "id", "?"));
            cid = cidbuf;
        }
        json_t *la = find_account(at, lid), *ca = find_account(at, cid);
        if (la && ca) {
            r->live_cost += jnum(la, "cost", 0);
            r->cand_cost += jnum(ca, "cost", 0);
            r->ncost++;
            if (jnum(la, "ttft_ewma_ms", -1) >= 0 && jnum(ca, "ttft_ewma_ms", -1) >= 0) {
                r->live_ttft += jnum(la, "ttft_ewma_ms", -1);
                r->cand_ttft += jnum(ca, "ttft_ewma_ms", -1);
                r->nttft++;
            }
        }
        if (strcmp(lid, cid) != 0) {
            tg_buf_t lb, cb;
            tg_buf_init(&lb);
            tg_buf_init(&cb);
            describe_account(&lb, la, lid);
            describe_account(&cb, ca, cid);
            diff(r, id, TG_HOOK_SELECT_ACCOUNT, k + 1, lb.data, cb.data,
                 d->sel[k].ran ? d->sel[k].why : "the candidate does not select: the built-in order");
            tg_buf_free(&lb);
            tg_buf_free(&cb);
        }
    }
    for (int k = 0; k < d->nretry && k < (int)json_array_size(attempts); k++) {
        json_t *lr = json_object_get(json_array_get(attempts, (size_t)k), "retry");
        if (!lr)
            continue;
        const char *la = jstr(lr, "action", "give_up");
        /* A candidate without the hook leaves the core's default: another account. */
        const char *ca = d->retry_action[k] >= 0 && d->retry_action[k] <= 2 ? action_names[d->retry_action[k]]
                                                                             : "other";
        if (strcmp(la, ca) != 0)
            diff(r, id, TG_HOOK_ON_UPSTREAM_ERROR, k + 1, la, ca, "");
    }
    json_t *llim = json_object_get(lv, "limiter");
    if (llim) {
        for (int k = 0; k < 4; k++) {
            static const char *const lim[] = {"rate", "tokens", "concurrency", "money"};
            json_t *x = json_object_get(llim, lim[k]);
            if (!x)
                continue;
            int v = d->limiter[k];
            const char *cv = v >= 0 && v <= 2 ? limiter_names[v] : "default";
            if (strcmp(json_string_value(x) ? json_string_value(x) : "", cv) != 0) {
                snprintf(live, sizeof(live), "%s %s", lim[k], json_string_value(x) ? json_string_value(x) : "?");
                snprintf(cand, sizeof(cand), "%s %s", lim[k], cv);
                diff(r, id, TG_HOOK_ON_LIMITER_DOWN, 0, live, cand, "");
            }
        }
    }
    json_t *lcost = json_object_get(lv, "cost_nanousd");
    if (lcost && c->usage_known) {
        int64_t lc = json_is_integer(lcost) ? json_integer_value(lcost) : -1;
        int64_t cc = d->has_price ? d->cost : -1;
        if (lc != cc) {
            snprintf(live, sizeof(live), lc < 0 ? "unpriced" : "%lld nano-USD", (long long)lc);
            snprintf(cand, sizeof(cand), cc < 0 ? "unpriced" : "%lld nano-USD", (long long)cc);
            diff(r, id, TG_HOOK_PRICE, 0, live, cand, "");
        }
    }
done:;
    int after = 0;
    for (int h = 0; h < TG_HOOK__COUNT; h++)
        after += r->by_hook[h];
    if (after > before)
        r->differ++;
}

static void compare_summary(report_t *r, const char *name, const char *requests, int nreq, int bad) {
    if (r->json) {
        json_t *o = json_object();
        json_object_set_new(o, "policy", json_string(name));
        json_object_set_new(o, "requests_file", json_string(requests));
        json_object_set_new(o, "requests", json_integer(nreq));
        json_object_set_new(o, "compared", json_integer(r->compared));
        json_object_set_new(o, "differ", json_integer(r->differ));
        json_object_set_new(o, "same", json_integer(r->compared - r->differ));
        json_t *bh = json_object();
        for (int h = 0; h < TG_HOOK__COUNT; h++)
            json_object_set_new(bh, tg_ffi_hook_name(h), json_integer(r->by_hook[h]));
        json_object_set_new(o, "differences_by_hook", bh);
        json_t *cost = json_object(), *ttft = json_object();
        json_object_set_new(cost, "live", r->ncost ? json_real(r->live_cost / r->ncost) : json_null());
        json_object_set_new(cost, "candidate", r->ncost ? json_real(r->cand_cost / r->ncost) : json_null());
        json_object_set_new(ttft, "live", r->nttft ? json_real(r->live_ttft / r->nttft) : json_null());
        json_object_set_new(ttft, "candidate", r->nttft ? json_real(r->cand_ttft / r->nttft) : json_null());
        json_object_set_new(o, "mean_choice_cost", cost);
        json_object_set_new(o, "mean_choice_ttft_ewma_ms", ttft);
        json_object_set_new(o, "plugin_errors", json_integer(r->errors));
        json_object_set_new(o, "errors", json_incref(r->errlist));
        json_object_set_new(o, "bad_lines", json_integer(bad));
        json_object_set_new(o, "diffs", json_incref(r->diffs));
        char *s = json_dumps(o, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(o);
        return;
    }
    printf("%d requests, %d compared with their live decisions: %d differ, %d the same", nreq, r->compared, r->differ,
           r->compared - r->differ);
    int any = 0;
    for (int h = 0; h < TG_HOOK__COUNT; h++)
        if (r->by_hook[h])
            printf("%s%s %d", any++ ? ", " : " (", tg_ffi_hook_name(h), r->by_hook[h]);
    printf("%s\n", any ? ")" : "");
    if (r->ncost)
        printf("mean cost of the chosen account: live %.4g, candidate %.4g (%+.1f%%)\n", r->live_cost / r->ncost,
               r->cand_cost / r->ncost,
               r->live_cost > 0 ? (r->cand_cost - r->live_cost) / r->live_cost * 100 : 0.0);
    if (r->nttft)
        printf("mean TTFT EWMA of the chosen account: live %.0f ms, candidate %.0f ms (%+.1f%%)\n",
               r->live_ttft / r->nttft, r->cand_ttft / r->nttft,
               r->live_ttft > 0 ? (r->cand_ttft - r->live_ttft) / r->live_ttft * 100 : 0.0);
    printf("%d plugin errors, %d bad lines\n", r->errors, bad);
}

/* Resolves POLICY into (dir, name). */
static int resolve(const char *policy, char **dirs, size_t ndirs, char *dir, size_t dlen, char *name, size_t nlen) {
    struct stat st;
    char path[4096];
    snprintf(path, sizeof(path), "%s", policy);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        path[--n] = '\0';
    if (stat(path, &st) == 0) {
        char *slash = strrchr(path, '/');
        const char *base = slash ? slash + 1 : path;
        snprintf(dir, dlen, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
        snprintf(name, nlen, "%s", base);
        size_t bl = strlen(name);
        if (S_ISREG(st.st_mode) && bl > 4 && !strcmp(name + bl - 4, ".lua"))
            name[bl - 4] = '\0';
        if (S_ISREG(st.st_mode) && !strcmp(name, "handler")) {
            /* plugins/x/handler.lua means the folder plugins/x. */
            char *s2 = strrchr(dir, '/');
            const char *folder = s2 ? s2 + 1 : dir;
            size_t fl = TG_MIN(strlen(folder), nlen - 1);
            memcpy(name, folder, fl);
            name[fl] = '\0';
            if (s2)
                *s2 = '\0';
            else
                snprintf(dir, dlen, ".");
        }
        return 0;
    }
    for (size_t i = 0; i < ndirs; i++) {
        snprintf(path, sizeof(path), "%s/%s", dirs[i], policy);
        char p2[4200];
        snprintf(p2, sizeof(p2), "%s.lua", path);
        if (stat(path, &st) == 0 || stat(p2, &st) == 0) {
            snprintf(dir, dlen, "%s", dirs[i]);
            snprintf(name, nlen, "%s", policy);
            return 0;
        }
    }
    return -1;
}

static int arg_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int arg_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "tollgate policy test: %s; see tollgate policy test --help\n", msg);
    return 2;
}

/* The folder holding the running binary (from /proc/self/exe), or "" when unknown. */
static void exe_dir(char *out, size_t n) {
    char path[4096];
    ssize_t len = readlink("/proc/self/exe", path, sizeof(path) - 1);
    out[0] = '\0';
    if (len <= 0)
        return;
    path[len] = '\0';
    char *slash = strrchr(path, '/');
    if (slash) {
        *slash = '\0';
        snprintf(out, n, "%s", path);
    }
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/*
 * The default folders, not the working directory's: the gateway config's plugins.dirs
 * (relative ones taken from the config file's folder) with -c, else the install's:
 * <bin>/../plugins and <bin>/../policies (a build tree: build/tollgate), or
 * <bin>/../share/tollgate/{plugins,policies} (an installed binary). Writes a
 * comma-separated list into out; TG_ERROR + err when -c does not load.
 */
static int default_dirs(const char *config_file, char *out, size_t n, char *err, size_t errlen) {
    out[0] = '\0';
    if (config_file) {
        tg_config_t cfg;
        if (tg_config_load(config_file, &cfg, err, errlen) != TG_OK)
            return TG_ERROR;
        char base[4096];
        snprintf(base, sizeof(base), "%s", config_file);
        char *slash = strrchr(base, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(base, sizeof(base), ".");
        tg_buf_t b;
        tg_buf_init(&b);
        for (size_t i = 0; i < cfg.plugins.ndirs; i++) {
            const char *d = cfg.plugins.dirs[i];
            tg_buf_printf(&b, "%s%s%s%s", i ? "," : "", d[0] == '/' ? "" : base, d[0] == '/' ? "" : "/", d);
        }
        snprintf(out, n, "%s", b.data ? b.data : "");
        tg_buf_free(&b);
        tg_config_free(&cfg);
        return TG_OK;
    }
    char bin[4096], a[4200], b[4200];
    exe_dir(bin, sizeof(bin));
    static const char *const roots[] = {"/..", "/../share/tollgate"};
    for (size_t i = 0; bin[0] && i < 2; i++) {
        snprintf(a, sizeof(a), "%s%s/plugins", bin, roots[i]);
        snprintf(b, sizeof(b), "%s%s/policies", bin, roots[i]);
        if (is_dir(a) || is_dir(b)) {
            char ra[PATH_MAX], rb[PATH_MAX];
            tg_buf_t o;
            tg_buf_init(&o);
            tg_buf_printf(&o, "%s,%s", realpath(a, ra) ? ra : a, realpath(b, rb) ? rb : b);
            snprintf(out, n, "%.*s", (int)TG_MIN(o.len, n - 1), o.data);
            tg_buf_free(&o);
            return TG_OK;
        }
    }
    snprintf(out, n, "plugins,policies");
    return TG_OK;
}

int tg_policy_test_main(int argc, char **argv) {
    const char *policy = NULL, *requests = NULL, *config = "{}", *dirs_arg = NULL, *config_file = NULL;
    long seed = 1;
    report_t r = {0};
    tg_plugin_enable_t en[17];
    size_t nen = 1;
    if (argc < 2) {
        fprintf(stderr, "tollgate policy: missing subcommand (expected: test); see tollgate policy test --help\n");
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "test") != 0) {
        fprintf(stderr, "tollgate policy: unknown subcommand \"%s\" (expected: test)\n", argv[1]);
        return 2;
    }
    /* Every argument error is one line naming the problem, and exit 2. */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int takes = !strcmp(a, "--requests") || !strcmp(a, "--config") || !strcmp(a, "--with") ||
                    !strcmp(a, "--dirs") || !strcmp(a, "--seed") || !strcmp(a, "-c");
        if (takes && i + 1 >= argc)
            return arg_error("%s needs a value", a);
        if (!strcmp(a, "--requests"))
            requests = argv[++i];
        else if (!strcmp(a, "--config"))
            config = argv[++i];
        else if (!strcmp(a, "-c"))
            config_file = argv[++i];
        else if (!strcmp(a, "--with")) {
            if (nen >= 17)
                return arg_error("too many --with (at most 16)");
            char *w = argv[++i], *eq = strchr(w, '=');
            if (eq)
                *eq = '\0';
            en[nen].name = w;
            en[nen++].config_lua = eq ? eq + 1 : "{}";
        } else if (!strcmp(a, "--dirs"))
            dirs_arg = argv[++i];
        else if (!strcmp(a, "--seed")) {
            char *end = NULL;
            errno = 0;
            seed = strtol(argv[++i], &end, 10);
            if (errno || !*argv[i] || *end)
                return arg_error("--seed: expected a whole number, got \"%s\"", argv[i]);
        } else if (!strcmp(a, "--json"))
            r.json = 1;
        else if (!strcmp(a, "--compare"))
            r.compare = 1;
        else if (!strcmp(a, "--fail-on-diff"))
            r.fail_on_diff = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (a[0] != '-' && !policy)
            policy = a;
        else
            return arg_error("unexpected argument \"%s\"", a);
    }
    if (!policy)
        return arg_error("missing POLICY (a file, a plugin folder, or a name in --dirs)");
    if (!requests)
        return arg_error("missing --requests FILE.jsonl (\"-\" reads standard input)");
    if (r.fail_on_diff && !r.compare)
        return arg_error("--fail-on-diff needs --compare");
    if (strcmp(requests, "-") != 0) {
        struct stat rst;
        if (stat(requests, &rst) != 0)
            return arg_error("--requests %s: %s", requests, strerror(errno));
        if (!S_ISREG(rst.st_mode))
            return arg_error("--requests %s: not a regular file", requests);
    }
    char err[1024], dirs_def[8192];
    if (!dirs_arg) {
        if (default_dirs(config_file, dirs_def, sizeof(dirs_def), err, sizeof(err)) != TG_OK) {
            fprintf(stderr, "tollgate policy test: -c %s: %s\n", config_file, err);
            return 2;
        }
        dirs_arg = dirs_def;
    }
    char *dirs[16];
    size_t ndirs = 0;
    char *dcopy = strdup(dirs_arg), *save = NULL;
    for (char *t = strtok_r(dcopy, ",", &save); t && ndirs < 16; t = strtok_r(NULL, ",", &save))
        dirs[ndirs++] = t;
    char dir[4096], name[256];
    if (resolve(policy, dirs, ndirs, dir, sizeof(dir), name, sizeof(name)) != 0) {
        fprintf(stderr, "tollgate policy test: no policy \"%s\" (not a file or folder, not in %s)\n", policy,
                dirs_arg);
        free(dcopy);
        return 2;
    }
    /* The policy's own folder first, then --dirs for the --with plugins. */
    char *all_dirs[17] = {dir};
    for (size_t k = 0; k < ndirs; k++)
        all_dirs[k + 1] = dirs[k];
    en[0].name = name;
    en[0].config_lua = (char *)config;
    tg_plugins_config_t cfg = {.dirs = all_dirs, .ndirs = ndirs + 1, .enabled = en, .nenabled = nen, .max_hook_ms = 50};
    tg_plugin_src_t *src = tg__plugin_src_read(&cfg, 0, err, sizeof(err));
    free(dcopy);
    if (!src || tg__plugins_validate(src, err, sizeof(err)) != TG_OK) {
        fprintf(stderr, "tollgate policy test: %s\n", err);
        tg__plugin_src_unref(src);
        return 2;
    }
    src->number = 1;
    tg_plugins_t *pl = tg__plugins_new(NULL, 0, 1, 0, 50, err, sizeof(err));
    if (!pl || tg__plugins_install(pl, src, err, sizeof(err)) != TG_OK) {
        fprintf(stderr, "tollgate policy test: %s\n", err);
        tg__plugins_free(pl);
        tg__plugin_src_unref(src);
        return 2;
    }
    tg__plugin_src_unref(src);
    pl->quiet = 1;
    tg_plugins_seed(pl, (uint32_t)seed);

    FILE *f = strcmp(requests, "-") ? fopen(requests, "r") : stdin;
    if (!f) {
        fprintf(stderr, "tollgate policy test: %s: %s\n", requests, strerror(errno));
        tg__plugins_free(pl);
        return 2;
    }
    int report_json = r.json && r.compare;
    if (report_json) {
        r.diffs = json_array();
        r.errlist = json_array();
    }
    if (!r.json)
        printf("policy %s (%s/%s)%s, requests from %s%s\n", name, dir, name, nen > 1 ? " with others" : "",
               requests, r.compare ? ", compared with the live decisions" : "");
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, nreq = 0, bad = 0;
    while ((len = getline(&buf, &cap, f)) > 0) {
        lineno++;
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
            buf[--len] = '\0';
        if (!len || buf[0] == '#')
            continue;
        line_t *l = calloc(1, sizeof(*l));
        json_error_t jerr;
        l->doc = json_loads(buf, JSON_DECODE_ANY, &jerr);
        tg_hookctx_t c;
        tg_plugins_begin(pl, &c);
        if (!l->doc) {
            fprintf(stderr, "%s:%d: not valid JSON: %s\n", requests, lineno, jerr.text);
            bad++;
        } else if (!json_is_object(l->doc)) {
            fprintf(stderr, "%s:%d: expected a JSON object (a request context), got %s\n", requests, lineno,
                    json_is_array(l->doc) ? "an array" : json_is_string(l->doc) ? "a string" : "a scalar");
            bad++;
        } else if (fill(&c, l, lineno, err, sizeof(err)) != 0) {
            fprintf(stderr, "%s:%d: %s\n", requests, lineno, err);
            bad++;
        } else {
            nreq++;
            tg_buf_init(&r.out);
            json_t *sd = json_object_get(l->doc, "seed");
            line_seed = json_is_integer(sd) ? (uint32_t)json_integer_value(sd) : 0;
            decided_t d;
            int json_saved = r.json;
            r.json = r.json && !r.compare;
            run_line(pl, &c, l, &r, &d, err, sizeof(err), &bad);
            r.json = json_saved;
            if (r.compare) {
                compare_line(&r, &c, l->doc, &d);
            } else if (r.json) {
                printf("{\"id\":\"");
                tg_buf_t idb;
                tg_buf_init(&idb);
                tg_buf_append_json_escaped(&idb, c.request_id, c.request_id_len);
                printf("%s\",\"model\":\"%s\"%s", idb.data ? idb.data : "", c.model, r.out.data ? r.out.data : "");
                tg_buf_free(&idb);
                if (c.log_fields_len)
                    printf(",\"log\":{%s}", c.log_fields + 1);
                printf("}\n");
            } else {
                printf("%.*s  model %s%s", (int)c.request_id_len, c.request_id, c.model, r.out.data ? r.out.data : "");
                if (c.resp_headers_len) {
                    printf("\n  %-18s ", "headers");
                    for (size_t k = 0; k < c.resp_headers_len; k++) {
                        if (c.resp_headers[k] == '\r')
                            continue;
                        if (c.resp_headers[k] == '\n')
                            fputs(k + 1 < c.resp_headers_len ? "; " : "", stdout);
                        else
                            putchar(c.resp_headers[k]);
                    }
                }
                if (c.log_fields_len)
                    printf("\n  %-18s {%s}", "log", c.log_fields + 1);
                printf("\n");
            }
            tg_buf_free(&r.out);
        }
        tg_plugins_end(pl, &c);
        json_decref(l->doc);
        free(l);
    }
    free(buf);
    if (f != stdin)
        fclose(f);
    if (r.compare)
        compare_summary(&r, name, requests, nreq, bad);
    else if (!r.json)
        printf("%d requests, %d plugin errors, %d bad lines\n", nreq, r.errors, bad);
    json_decref(r.diffs);
    json_decref(r.errlist);
    tg__plugins_free(pl);
    if (!nreq && !bad) {
        fprintf(stderr, "tollgate policy test: %s holds no requests (one JSON object per line)\n", requests);
        return 2;
    }
    return bad ? 2 : r.errors ? 1 : r.fail_on_diff && r.differ ? 3 : 0;
}
