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
 */
#include <errno.h>
#include <jansson.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

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
               "  --dirs A,B        where names are looked up (default plugins,policies)\n"
               "  --seed N          seed math.random, for repeatable draws (default 1)\n"
               "  --json            one JSON object per request instead of text\n");
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
    json_t *accts = json_object_get(o, "accounts");
    size_t i;
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
    json_t *ue = json_object_get(o, "upstream_error");
    if (ue) {
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
    }
    json_t *ld = json_object_get(o, "limiter_down");
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

typedef struct {
    int json;
    tg_buf_t out; /* the current line's text, or its JSON members */
    int errors;
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

/* Runs one hook if the policy has it and reports the decision in words. */
static void step(tg_plugins_t *pl, tg_hookctx_t *c, int hook, report_t *r, int *stop) {
    if (*stop || !tg_plugins_has_hook(pl, c, hook))
        return;
    int before_errors = c->plugin_errors;
    char before_model[128];
    snprintf(before_model, sizeof(before_model), "%s", c->model);
    int rc = tg_plugins_run(pl, hook, c);
    char text[1024];
    tg_buf_t b;
    tg_buf_init(&b);
    if (c->plugin_errors > before_errors) {
        r->errors++;
        tg_buf_printf(&b, "ERROR %s; fallback: ", pl->last_hook_error);
    }
    if (rc == TG_DONE) {
        tg_buf_printf(&b, "reject %d %s: %s", c->reject_status, c->reject_code, c->reject_message);
        *stop = 1;
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
            break;
        }
        case TG_HOOK_ON_UPSTREAM_ERROR:
            if (c->retry_action == TG_RETRY_GIVE_UP)
                tg_buf_appends(&b, "give up");
            else
                tg_buf_printf(&b, "retry on %s account after %lld ms",
                              c->retry_action == TG_RETRY_SAME ? "the same" : "another",
                              (long long)c->retry_delay_ms);
            break;
        case TG_HOOK_ON_LIMITER_DOWN:
            for (int k = 0, n = 0; k < 4; k++) {
                static const char *const lim[] = {"rate", "tokens", "concurrency", "money"};
                int d = c->limiter_decision[k];
                if (!(c->limits & (1 << k)))
                    continue;
                tg_buf_printf(&b, "%s%s %s", n++ ? ", " : "", lim[k],
                              d == TG_LIMITER_OPEN    ? "open (not checked)"
                              : d == TG_LIMITER_LOCAL ? "local (this instance's bucket)"
                              : d == TG_LIMITER_CLOSED ? "closed (refuse)"
                                                       : "the configured policy");
            }
            break;
        case TG_HOOK_PRICE:
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

int tg_policy_test_main(int argc, char **argv) {
    const char *policy = NULL, *requests = NULL, *config = "{}", *dirs_arg = "plugins,policies";
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
                    !strcmp(a, "--dirs") || !strcmp(a, "--seed");
        if (takes && i + 1 >= argc)
            return arg_error("%s needs a value", a);
        if (!strcmp(a, "--requests"))
            requests = argv[++i];
        else if (!strcmp(a, "--config"))
            config = argv[++i];
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
    if (strcmp(requests, "-") != 0) {
        struct stat rst;
        if (stat(requests, &rst) != 0)
            return arg_error("--requests %s: %s", requests, strerror(errno));
        if (!S_ISREG(rst.st_mode))
            return arg_error("--requests %s: not a regular file", requests);
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
    char err[1024];
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
    lua_getglobal(pl->L, "math");
    lua_getfield(pl->L, -1, "randomseed");
    lua_pushnumber(pl->L, (double)seed);
    lua_call(pl->L, 1, 0);
    lua_pop(pl->L, 1);

    FILE *f = strcmp(requests, "-") ? fopen(requests, "r") : stdin;
    if (!f) {
        fprintf(stderr, "tollgate policy test: %s: %s\n", requests, strerror(errno));
        tg__plugins_free(pl);
        return 2;
    }
    if (!r.json)
        printf("policy %s (%s/%s)%s, requests from %s\n", name, dir, name, nen > 1 ? " with others" : "",
               requests);
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
            int stop = 0;
            step(pl, &c, TG_HOOK_ON_REQUEST, &r, &stop);
            step(pl, &c, TG_HOOK_MAP_MODEL, &r, &stop);
            if (c.naccounts)
                step(pl, &c, TG_HOOK_SELECT_ACCOUNT, &r, &stop);
            if (json_object_get(l->doc, "upstream_error"))
                step(pl, &c, TG_HOOK_ON_UPSTREAM_ERROR, &r, &stop);
            if (c.limits)
                step(pl, &c, TG_HOOK_ON_LIMITER_DOWN, &r, &stop);
            if (c.usage_known)
                step(pl, &c, TG_HOOK_PRICE, &r, &stop);
            stop = 0;
            step(pl, &c, TG_HOOK_ON_LOG, &r, &stop);
            if (r.json) {
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
    if (!r.json)
        printf("%d requests, %d plugin errors, %d bad lines\n", nreq, r.errors, bad);
    tg__plugins_free(pl);
    if (!nreq && !bad) {
        fprintf(stderr, "tollgate policy test: %s holds no requests (one JSON object per line)\n", requests);
        return 2;
    }
    return bad ? 2 : r.errors ? 1 : 0;
}
