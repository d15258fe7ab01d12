/*
 * GET /v1/models (tg_proxy_route.c's select phase hands the route here): the models a
 * key can call, in the client's protocol's shape — OpenAI's {"object":"list","data":
 * [{id,object,created,owned_by}]} by default, Anthropic's {"data":[{type,id,
 * display_name,created_at}],"has_more","first_id","last_id"} (paged by limit, after_id,
 * before_id) for a client that sends anthropic-version.
 *
 *   a group that lists its models    that list, as it is
 *   a group that offers every model  each active account's own list, read in its
 *                                    provider's shape (tg_models.h; Anthropic's and
 *                                    Google's followed page by page), authenticated as
 *                                    the account's requests are (its key, its
 *                                    identity's token, SigV4 for Bedrock's control
 *                                    plane), asked of every account at once and merged
 *                                    in the accounts' order of priority, first id wins;
 *                                    an account that lists its models contributes
 *                                    those instead of asking, an Azure account with a
 *                                    model_map its mapped names (its deployments);
 *                                    model_map names are added. Cached per worker for
 *                                    60 s per (group, account snapshot), 5 s when an
 *                                    account failed.
 *   the config file's upstream       its list, the same way
 *
 * An entry read in the client's own shape goes back as the provider wrote it; one read
 * in another is converted (created <-> created_at). The key's model restrictions apply
 * to the merged list. Every account failing is a 502; some failing leaves them out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tg_proxy_internal.h"
#include "tollgate/tg_aws.h"
#include "tollgate/tg_models.h"

#define MODELS_SOURCES_MAX 32
#define MODELS_PAGES_MAX 50
#define MODELS_BODY_MAX ((size_t)4 << 20)
#define MODELS_CACHE_SLOTS 32
#define MODELS_TTL_MS 60000
#define MODELS_TTL_PARTIAL_MS 5000

struct models_fetch_s;

/* One account (or the static upstream) asked for its list (a Vertex account: once per
 * publisher). */
typedef struct {
    struct models_fetch_s *f;
    tg_upstream_t *up;
    const tg_account_t *acc; /* the snapshot's (held by the request); NULL: the config's upstream */
    const char *credential;  /* the account's key or the config's; NULL with an identity */
    const char *publisher;   /* Vertex: "anthropic" or "google" */
    tg_models_shape_t shape;
    tg_upcall_t *call;
    tg_identity_wait_t *wait; /* waiting for the identity's token */
    uint64_t token_gen;
    int auth_retried;
    int status;
    tg_buf_t body;
    int too_big;
    int pages;
    int ok;
    char cursor[TG_MODELS_CURSOR_MAX]; /* the page being asked for ("" the first) */
    json_t *entries; /* normalised, in the provider's order */
} models_src_t;

typedef struct models_fetch_s {
    proxy_req_t *p;
    int64_t group_id;
    uint64_t generation;
    int nsrc, pending;
    models_src_t src[MODELS_SOURCES_MAX];
    json_t *extra; /* names the accounts list or map themselves */
    char why[96];  /* the first failure, for the 502 */
} models_fetch_t;

typedef struct {
    int64_t group_id;
    uint64_t generation;
    uint64_t expires_ms;
    json_t *entries;
} models_slot_t;

struct tg_models_cache_s {
    models_slot_t slot[MODELS_CACHE_SLOTS];
};

void tg__models_cache_free(proxy_worker_t *pw) {
    if (!pw->models)
        return;
    for (int i = 0; i < MODELS_CACHE_SLOTS; i++)
        json_decref(pw->models->slot[i].entries);
    free(pw->models);
    pw->models = NULL;
}

static json_t *cache_get(proxy_worker_t *pw, int64_t group_id, uint64_t generation) {
    if (!pw->models)
        return NULL;
    uint64_t now = tg_now_ms();
    for (int i = 0; i < MODELS_CACHE_SLOTS; i++) {
        models_slot_t *s = &pw->models->slot[i];
        if (s->entries && s->group_id == group_id && s->generation == generation && now < s->expires_ms)
            return s->entries;
    }
    return NULL;
}

static void cache_put(proxy_worker_t *pw, int64_t group_id, uint64_t generation, json_t *entries, uint64_t ttl) {
    if (!pw->models && !(pw->models = calloc(1, sizeof(*pw->models))))
        return;
    models_slot_t *pick = &pw->models->slot[0];
    for (int i = 0; i < MODELS_CACHE_SLOTS; i++) {
        models_slot_t *s = &pw->models->slot[i];
        if (s->entries && s->group_id == group_id) {
            pick = s;
            break;
        }
        if (!s->entries || s->expires_ms < pick->expires_ms)
            pick = s; /* an empty or the oldest slot */
    }
    json_decref(pick->entries);
    pick->group_id = group_id;
    pick->generation = generation;
    pick->expires_ms = tg_now_ms() + ttl;
    pick->entries = json_incref(entries);
}

/* ---- entries: one normalised form (tg_models.h) ------------------------------------------ */

static json_t *rfc3339(int64_t t) {
    char out[32];
    time_t tt = (time_t)t;
    struct tm tm;
    if (!gmtime_r(&tt, &tm) || !strftime(out, sizeof(out), "%Y-%m-%dT%H:%M:%SZ", &tm))
        strcpy(out, "1970-01-01T00:00:00Z");
    return json_string(out);
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* ---- the answer ------------------------------------------------------------------------- */

/* The client's query parameter `name`, percent-decoded into out; 0 if absent. The
 * router cut the URL at '?': the query follows the path's NUL. */
static int query_param(const tg_request_t *req, const char *name, char *out, size_t outlen) {
    size_t plen = strlen(req->url.data ? req->url.data : "");
    if (!req->url.data || req->url.len <= plen + 1)
        return 0;
    const char *q = req->url.data + plen + 1, *end = req->url.data + req->url.len;
    size_t nlen = strlen(name);
    while (q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *e = amp ? amp : end;
        if ((size_t)(e - q) > nlen && !memcmp(q, name, nlen) && q[nlen] == '=') {
            size_t o = 0;
            for (const char *c = q + nlen + 1; c < e && o + 1 < outlen; c++) {
                int hi, lo;
                if (*c == '%' && e - c >= 3 && (hi = hexval(c[1])) >= 0 && (lo = hexval(c[2])) >= 0) {
                    out[o++] = (char)(hi * 16 + lo);
                    c += 2;
                } else {
                    out[o++] = *c == '+' ? ' ' : *c;
                }
            }
            out[o] = '\0';
            return 1;
        }
        q = e + 1;
    }
    return 0;
}

static json_t *as_openai(json_t *e) {
    json_t *own = json_object_get(e, "oa");
    if (own)
        return json_incref(own);
    return json_pack("{s:O,s:s,s:O,s:O}", "id", json_object_get(e, "id"), "object", "model", "created",
                     json_object_get(e, "created"), "owned_by", json_object_get(e, "owned_by"));
}

static json_t *as_anthropic(json_t *e) {
    json_t *own = json_object_get(e, "an");
    if (own)
        return json_incref(own);
    return json_pack("{s:s,s:O,s:O,s:o}", "type", "model", "id", json_object_get(e, "id"), "display_name",
                     json_object_get(e, "display_name"), "created_at",
                     rfc3339(json_integer_value(json_object_get(e, "created"))));
}

static int answer(proxy_req_t *p, json_t *entries) {
    const tg_principal_t *pr = p->principal;
    json_t *all = json_array(), *e;
    size_t i;
    json_array_foreach(entries, i, e) {
        const char *id = json_string_value(json_object_get(e, "id"));
        if (!pr || tg_principal_allows_model(pr, id))
            json_array_append(all, e);
    }
    json_t *doc;
    if (p->proto == TG_PROTO_ANTHROPIC) {
        /* Anthropic's paging: limit (1..1000, default 20), after_id or before_id. */
        char v[256];
        long limit = 20;
        if (query_param(p->req, "limit", v, sizeof(v))) {
            char *endp;
            limit = strtol(v, &endp, 10);
            if (*endp || limit < 1 || limit > 1000) {
                json_decref(all);
                return tg__proxy_fail(p, 400, "invalid_request_error", "invalid_request",
                                      "limit: must be an integer from 1 to 1000");
            }
        }
        size_t n = json_array_size(all), from = 0, to = n;
        int before = 0;
        if (query_param(p->req, "after_id", v, sizeof(v))) {
            for (from = 0; from < n && strcmp(json_string_value(json_object_get(json_array_get(all, from), "id")), v); from++)
                ;
            from = from < n ? from + 1 : n;
        } else if (query_param(p->req, "before_id", v, sizeof(v))) {
            for (to = 0; to < n && strcmp(json_string_value(json_object_get(json_array_get(all, to), "id")), v); to++)
                ;
            before = 1;
        }
        int has_more;
        if (before) {
            has_more = to > (size_t)limit;
            from = has_more ? to - (size_t)limit : 0;
        } else {
            has_more = to - from > (size_t)limit;
            to = has_more ? from + (size_t)limit : to;
        }
        json_t *data = json_array();
        for (size_t k = from; k < to; k++)
            json_array_append_new(data, as_anthropic(json_array_get(all, k)));
        json_t *first = json_array_size(data) ? json_object_get(json_array_get(data, 0), "id") : json_null();
        json_t *last =
            json_array_size(data) ? json_object_get(json_array_get(data, json_array_size(data) - 1), "id") : json_null();
        doc = json_pack("{s:o,s:b,s:O,s:O}", "data", data, "has_more", has_more, "first_id", first, "last_id", last);
    } else {
        json_t *data = json_array();
        json_array_foreach(all, i, e) json_array_append_new(data, as_openai(e));
        doc = json_pack("{s:s,s:o}", "object", "list", "data", data);
    }
    json_decref(all);
    char *s = tg_json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    if (!s)
        return tg__proxy_fail(p, 500, "server_error", "internal_error", "internal error");
    tg_response_send(p->req, 200, "application/json", NULL, s, strlen(s));
    free(s);
    return TG_DONE;
}

/* ---- asking the accounts ---------------------------------------------------------------- */

static void fetch_free(models_fetch_t *f) {
    for (int i = 0; i < f->nsrc; i++) {
        models_src_t *s = &f->src[i];
        if (s->call)
            tg_upcall_abort(s->call);
        tg_identity_cancel(s->wait);
        tg_buf_free(&s->body);
        json_decref(s->entries);
    }
    json_decref(f->extra);
    free(f);
}

static void cleanup_fetch(proxy_req_t *p) {
    if (p->models_fetch)
        fetch_free(p->models_fetch);
    p->models_fetch = NULL;
}

static void src_start(models_src_t *s);

static void merge_into(json_t *out, json_t *seen, json_t *entries) {
    json_t *e;
    size_t i;
    json_array_foreach(entries, i, e) {
        const char *id = json_string_value(json_object_get(e, "id"));
        if (json_object_get(seen, id))
            continue;
        json_object_set_new(seen, id, json_true());
        json_array_append(out, e);
    }
}

static void fetch_done(models_fetch_t *f) {
    proxy_req_t *p = f->p;
    json_t *out = json_array(), *seen = json_object();
    int ok = 0, failed = 0;
    for (int i = 0; i < f->nsrc; i++) {
        if (f->src[i].ok)
            ok++, merge_into(out, seen, f->src[i].entries);
        else
            failed++;
    }
    merge_into(out, seen, f->extra);
    json_decref(seen);
    int64_t group_id = f->group_id;
    uint64_t generation = f->generation;
    char why[sizeof(f->why)];
    snprintf(why, sizeof(why), "%s", f->why);
    p->models_fetch = NULL;
    fetch_free(f);
    p->upstream_end_ns = tg_now_ns();
    if (failed && !ok && json_array_size(out) == 0) {
        json_decref(out);
        char msg[192];
        snprintf(msg, sizeof(msg), "no upstream account of this key's group could list its models (%s)",
                 why[0] ? why : "no answer");
        tg__proxy_fail(p, 502, "upstream_error", "upstream_error", msg);
        return;
    }
    cache_put(p->pw, group_id, generation, out, failed ? MODELS_TTL_PARTIAL_MS : MODELS_TTL_MS);
    answer(p, out);
    json_decref(out);
}

/* The source ended (ok says how); the last one answers. */
static void src_end(models_src_t *s, const char *why) {
    s->call = NULL;
    models_fetch_t *f = s->f;
    if (!s->ok) {
        tg_log_warn("request %s: models list of %s%s failed: %s", f->p->req->id, s->acc ? "account " : "",
                    s->acc ? s->acc->name : tg_upstream_name(s->up), why);
        if (!f->why[0])
            snprintf(f->why, sizeof(f->why), "%s", why);
    }
    if (--f->pending == 0)
        fetch_done(f);
}

static void src_head(void *ud, const tg_uphead_t *h) {
    models_src_t *s = ud;
    s->status = h->status;
}

static void src_body(void *ud, const char *d, size_t n) {
    models_src_t *s = ud;
    if (s->body.len + n > MODELS_BODY_MAX) {
        s->too_big = 1;
        return;
    }
    tg_buf_append(&s->body, d, n);
}

static void src_error(void *ud, tg_uperr_t err, const char *msg) {
    models_src_t *s = ud;
    TG_UNUSED(msg);
    s->ok = 0;
    src_end(s, err == TG_UPERR_CONNECT || err == TG_UPERR_TIMEOUT_CONNECT ? "the upstream could not be reached"
                                                                            : "the upstream's answer was cut off");
}

static void src_done(void *ud) {
    models_src_t *s = ud;
    s->call = NULL;
    tg_identity_t *id = s->f->p->pw->ctx->identity;
    if (s->status == 401 && s->acc && s->acc->auth && !s->auth_retried && id) {
        /* A token the upstream no longer takes: dropped, renewed, asked once more. */
        s->auth_retried = 1;
        tg_identity_rejected(id, s->acc->id, s->token_gen);
        src_start(s);
        return;
    }
    char next[TG_MODELS_CURSOR_MAX], why[64];
    s->ok = s->status == 200 && !s->too_big &&
            tg_models_page(s->shape, s->body.data, s->body.len, (int64_t)time(NULL), s->entries, next);
    if (!s->ok) {
        if (s->status != 200)
            snprintf(why, sizeof(why), "the upstream answered HTTP %d", s->status);
        else
            snprintf(why, sizeof(why), "%s", s->too_big ? "the upstream's list is too large" : "the upstream's list could not be read");
        src_end(s, why);
        return;
    }
    if (next[0] && ++s->pages < MODELS_PAGES_MAX) {
        memcpy(s->cursor, next, sizeof(s->cursor));
        src_start(s);
        return;
    }
    src_end(s, "");
}

static const tg_upcall_cbs_t src_cbs = {src_head, src_body, src_done, src_error};

/* Appends s percent-encoded for a query value. */
static void append_query_value(tg_buf_t *b, const char *s) {
    static const char hex[] = "0123456789ABCDEF";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
            c == '.' || c == '~') {
            tg_buf_append(b, (const char *)&c, 1);
        } else {
            char e[3] = {'%', hex[c >> 4], hex[c & 15]};
            tg_buf_append(b, e, 3);
        }
    }
}

static void src_token(void *ud, const char *token, const char *err) {
    TG_UNUSED(token);
    models_src_t *s = ud;
    s->wait = NULL;
    if (err) {
        char why[96];
        snprintf(why, sizeof(why), "its credentials could not be renewed (%s)", err);
        s->ok = 0;
        src_end(s, why);
        return;
    }
    src_start(s); /* the token is there now */
}

/* Asks for the page s->cursor names (the first when ""). */
static void src_start(models_src_t *s) {
    const char *token = s->credential;
    if (s->acc && s->acc->auth) {
        /* The identity's access token, as the account's requests take it. */
        tg_identity_t *id = s->f->p->pw->ctx->identity;
        int rc = id ? tg_identity_token(id, s->acc, src_token, s, &token, &s->token_gen, &s->wait) : TG_ERROR;
        if (rc == TG_AGAIN)
            return;
        if (rc != TG_OK) {
            char why[96];
            snprintf(why, sizeof(why), "its credentials could not be renewed (%s)", token ? token : "no identity");
            s->ok = 0;
            src_end(s, why);
            return;
        }
        if (!token || tg_valid_no_ctl(token, strlen(token))) {
            s->ok = 0;
            src_end(s, "its access token cannot be sent");
            return;
        }
    }
    const char *cur = s->cursor[0] ? s->cursor : NULL;
    tg_buf_t b, path;
    tg_buf_init(&b);
    tg_buf_init(&path);
    tg_buf_reset(&s->body);
    s->status = 0;
    s->too_big = 0;
    tg_buf_appends(&path, tg_upstream_path_prefix(s->up));
    switch (s->shape) {
    case TG_MODELS_ANTHROPIC:
        tg_buf_appends(&path, "/models?limit=1000");
        if (cur) {
            tg_buf_appends(&path, "&after_id=");
            append_query_value(&path, cur);
        }
        break;
    case TG_MODELS_GEMINI:
    case TG_MODELS_VERTEX:
        if (s->shape == TG_MODELS_VERTEX) {
            tg_buf_appends(&path, "/v1beta1/publishers/");
            tg_buf_appends(&path, s->publisher);
        }
        tg_buf_appends(&path, "/models?pageSize=1000");
        if (cur) {
            tg_buf_appends(&path, "&pageToken=");
            append_query_value(&path, cur);
        }
        break;
    case TG_MODELS_AZURE:
        tg_buf_appends(&path, "/models?api-version=");
        append_query_value(&path, tg_account_setting(s->acc, "api_version", TG_AZURE_API_VERSION));
        break;
    case TG_MODELS_BEDROCK:
        tg_buf_appends(&path, "/foundation-models");
        break;
    case TG_MODELS_BEDROCK_PROFILES:
        tg_buf_appends(&path, "/inference-profiles?maxResults=1000");
        if (cur) {
            tg_buf_appends(&path, "&nextToken=");
            append_query_value(&path, cur); /* SigV4's encoding too: the query is canonical */
        }
        break;
    case TG_MODELS_OPENAI:
        tg_buf_appends(&path, "/models");
        break;
    }
    tg_buf_appends(&b, "GET ");
    tg_buf_append(&b, path.data, path.len);
    tg_buf_appends(&b, " HTTP/1.1\r\nHost: ");
    tg_buf_appends(&b, tg_upstream_host_header(s->up));
    if (s->shape == TG_MODELS_BEDROCK || s->shape == TG_MODELS_BEDROCK_PROFILES) {
        /* Signature Version 4, service bedrock, as the account's runtime calls. */
        tg_aws_creds_t cr;
        tg_aws_creds_split(s->credential, &cr);
        cr.region = tg_account_setting(s->acc, "region", "");
        cr.access_key = tg_account_setting(s->acc, "access_key_id", "");
        const char *q = strchr(path.data, '?');
        tg_aws_sign_get(&b, &cr, "bedrock", tg_upstream_host_header(s->up), path.data, q ? q + 1 : "", time(NULL));
    } else if (token && s->acc && s->acc->auth) {
        tg_buf_appends(&b, "\r\nAuthorization: Bearer ");
        tg_buf_appends(&b, token);
        if (s->shape == TG_MODELS_ANTHROPIC)
            tg_buf_appends(&b, "\r\nanthropic-version: 2023-06-01");
    } else if (token && s->shape == TG_MODELS_ANTHROPIC) {
        tg_buf_appends(&b, "\r\nx-api-key: ");
        tg_buf_appends(&b, token);
        tg_buf_appends(&b, "\r\nanthropic-version: 2023-06-01");
    } else if (token && s->shape == TG_MODELS_GEMINI) {
        tg_buf_appends(&b, "\r\nx-goog-api-key: ");
        tg_buf_appends(&b, token);
    } else if (token && s->shape == TG_MODELS_AZURE) {
        tg_buf_appends(&b, "\r\napi-key: ");
        tg_buf_appends(&b, token);
    } else if (token) {
        tg_buf_appends(&b, "\r\nAuthorization: Bearer ");
        tg_buf_appends(&b, token);
    }
    tg_buf_appends(&b, "\r\nx-request-id: ");
    tg_buf_appends(&b, s->f->p->req->id);
    tg_buf_appends(&b, "\r\nAccept: application/json\r\n\r\n");
    tg_buf_free(&path);
    s->call = tg_upcall_start(s->up, &b, &src_cbs, s);
    tg_buf_free(&b);
}

/* Bedrock's list is its control plane's (ListFoundationModels): the runtime endpoint
 * bedrock-runtime.<region>.amazonaws.com becomes bedrock.<region>.amazonaws.com; any
 * other base_url (a VPC endpoint, a test double) is asked as it is. */
static tg_upstream_t *bedrock_control(proxy_worker_t *pw, const tg_account_t *acc) {
    const char *name = tg_upstream_name(acc->upstream), *host = strstr(name, "://");
    if (!host || strncmp(host + 3, "bedrock-runtime.", 16) != 0)
        return acc->upstream;
    char url[512];
    snprintf(url, sizeof(url), "%.*sbedrock.%s%s", (int)(host + 3 - name), name, host + 3 + 16,
             tg_upstream_path_prefix(acc->upstream));
    tg_upstream_t *up = tg_accounts_upstream(pw->ctx->accounts, url);
    return up ? up : acc->upstream;
}

static tg_models_shape_t shape_of(const char *provider) {
    return !strcmp(provider, "anthropic") ? TG_MODELS_ANTHROPIC
           : !strcmp(provider, "gemini")  ? TG_MODELS_GEMINI
           : !strcmp(provider, "azure")   ? TG_MODELS_AZURE
           : !strcmp(provider, "bedrock") ? TG_MODELS_BEDROCK
           : !strcmp(provider, "vertex")  ? TG_MODELS_VERTEX
                                          : TG_MODELS_OPENAI;
}

static void add_source(models_fetch_t *f, tg_upstream_t *up, const tg_account_t *acc, const char *credential,
                       tg_models_shape_t shape, const char *publisher) {
    if (!up || f->nsrc >= MODELS_SOURCES_MAX)
        return;
    if (credential && tg_valid_no_ctl(credential, strlen(credential)))
        return; /* never sent (see tg__phase_upstream) */
    int ident = acc && acc->auth;
    for (int i = 0; i < f->nsrc; i++) { /* the same upstream and credential (or identity): asked once */
        models_src_t *o = &f->src[i];
        if (o->up == up && o->shape == shape && !strcmp(o->publisher ? o->publisher : "", publisher ? publisher : "") &&
            (ident ? o->acc && o->acc->auth && o->acc->id == acc->id
                   : !(o->acc && o->acc->auth) &&
                         !strcmp(o->credential ? o->credential : "", credential ? credential : "")))
            return;
    }
    models_src_t *s = &f->src[f->nsrc++];
    s->f = f;
    s->up = up;
    s->acc = acc;
    s->credential = ident ? NULL : credential;
    s->publisher = publisher;
    s->shape = shape;
    tg_buf_init(&s->body);
    s->entries = json_array();
}

static void add_extra(models_fetch_t *f, const char *id, const char *owner) {
    json_array_append_new(f->extra, tg_models_entry(id, 0, NULL, owner));
}

static int prio_cmp(const void *x, const void *y) {
    const tg_account_t *a = *(const tg_account_t *const *)x, *b = *(const tg_account_t *const *)y;
    return a->priority != b->priority ? (a->priority > b->priority ? -1 : 1) : (a->id < b->id ? -1 : a->id > b->id);
}

int tg__models_list(proxy_req_t *p) {
    const tg_principal_t *pr = p->principal;
    proxy_worker_t *pw = p->pw;
    if (pr && pr->group_id && pr->ngroup_models > 0) {
        /* The group lists its models: that list. */
        json_t *entries = json_array();
        for (int i = 0; i < pr->ngroup_models; i++)
            json_array_append_new(entries, tg_models_entry(pr->group_models[i], 0, NULL, "tollgate"));
        int rc = answer(p, entries);
        json_decref(entries);
        return rc;
    }
    int64_t group_id = pr && pr->group_id && pw->ctx->accounts ? pr->group_id : 0;
    uint64_t generation = 0;
    if (group_id) {
        if (!p->snap && (p->snap = tg_accounts_snapshot(pw->ctx->accounts)) != NULL)
            tg__cleanup_add(p, tg__cleanup_snapshot);
        if (!p->snap) {
            if (tg_now_ns() - p->req->start_ns < 3000000000ull)
                return tg__run_phase_later(p, PH_SELECT, 20);
            return tg__proxy_fail(p, 503, "server_error", "accounts_unavailable",
                                  "the account pool is not loaded yet; try again");
        }
        generation = tg_snapshot_generation(p->snap);
    }
    json_t *hit = cache_get(pw, group_id, generation);
    if (hit)
        return answer(p, hit);
    models_fetch_t *f = calloc(1, sizeof(*f));
    if (!f)
        return TG_ERROR;
    f->p = p;
    f->group_id = group_id;
    f->generation = generation;
    f->extra = json_array();
    if (group_id) {
        const tg_account_t *const *members;
        int n = tg_snapshot_members(p->snap, group_id, &members);
        const tg_account_t **order = malloc(sizeof(*order) * (size_t)(n ? n : 1));
        if (!order) {
            fetch_free(f);
            return TG_ERROR;
        }
        memcpy(order, members, sizeof(*order) * (size_t)n);
        qsort(order, (size_t)n, sizeof(*order), prio_cmp);
        for (int i = 0; i < n; i++) {
            const tg_account_t *acc = order[i];
            if (!acc->active)
                continue;
            /* An account that lists its models serves those; an Azure account with a
             * model_map serves its deployments, which are those names (Azure's own list
             * is of models, not deployments). The others are asked. */
            int mapped = json_is_object(acc->model_map) && json_object_size(acc->model_map) > 0;
            if (acc->nmodels == 0 && !(mapped && !strcmp(acc->provider, "azure"))) {
                tg_models_shape_t shape = shape_of(acc->provider);
                if (shape == TG_MODELS_VERTEX) {
                    /* Claude through rawPredict, Google's models through generateContent. */
                    add_source(f, acc->upstream, acc, acc->credential, shape, "anthropic");
                    add_source(f, acc->upstream, acc, acc->credential, shape, "google");
                } else if (shape == TG_MODELS_BEDROCK) {
                    /* The models served on demand, then the inference profiles. */
                    tg_upstream_t *cp = bedrock_control(pw, acc);
                    add_source(f, cp, acc, acc->credential, shape, NULL);
                    add_source(f, cp, acc, acc->credential, TG_MODELS_BEDROCK_PROFILES, NULL);
                } else {
                    add_source(f, acc->upstream, acc, acc->credential, shape, NULL);
                }
            }
            for (int k = 0; k < acc->nmodels; k++)
                add_extra(f, acc->models[k], acc->provider);
            const char *name;
            json_t *v;
            if (json_is_object(acc->model_map))
                json_object_foreach(acc->model_map, name, v) add_extra(f, name, acc->provider);
        }
        free(order);
    } else {
        const tg_config_t *cfg = p->req->worker->gw->cfg;
        if (!pw->ctx->upstream) {
            fetch_free(f);
            return tg__proxy_fail(p, 502, "upstream_error", "upstream_unreachable", "no upstream is configured");
        }
        add_source(f, pw->ctx->upstream, NULL, cfg->upstream.api_key, shape_of(cfg->upstream.provider), NULL);
    }
    p->models_fetch = f;
    if (f->nsrc == 0) {
        fetch_done(f);
        return TG_DONE;
    }
    tg__cleanup_add(p, cleanup_fetch);
    f->pending = f->nsrc;
    p->upstream_start_ns = tg_now_ns();
    for (int i = 0; i < f->nsrc && p->models_fetch; i++)
        src_start(&f->src[i]);
    /* Every source may have failed at once (identities refused): answered already. */
    return p->models_fetch ? TG_AGAIN : TG_DONE;
}
