/*
 * The admin REST API (see tg_admin.h). Resources are the tables of tg_tables.c, which
 * `tollgate apply` writes from the same description; one generic handler does list /
 * get / create / update / delete for all of them, with JSON validated by the tables'
 * checks (types, enums, unknown fields → 400) and written by Postgres's own
 * json_populate_record, so a value is converted exactly once, by the database's types.
 * Responses are built by Postgres too (json_build_object), so NUMERIC money never passes
 * through a C double.
 */
#include "tollgate/tg_access_log.h"
#include "tollgate/tg_admin.h"
#include "tollgate/tg_identity.h"
#include "tollgate/tg_aws.h"
#include "tollgate/tg_admin_accounts.h"
#include "tollgate/tg_admin_errors.h"
#include "tollgate/tg_admin_policies.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tollgate/tg_billing.h"
#include "tollgate/tg_capture.h"
#include "tollgate/tg_crypto.h"
#include "tollgate/tg_pg.h"
#include "tollgate/tg_plugin.h"
#include "tollgate/tg_quota.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_state.h"
#include "tollgate/tg_tables.h"
#include "tollgate/tg_ui.h"
#include "tollgate/tg_worker.h"

/* A resource of the API is a table of tg_tables.c: its path is the table's name. */
typedef tg_table_t resource_t;
typedef struct ureq_s ureq_t; /* a usage report's query (below) */

const char *const tg_admin_routes[] = {
    "GET /admin/api/v1/tenants",          "POST /admin/api/v1/tenants",
    "GET /admin/api/v1/tenants/{id}",     "PATCH /admin/api/v1/tenants/{id}",
    "DELETE /admin/api/v1/tenants/{id}",  "POST /admin/api/v1/tenants/{id}/topup",
    "GET /admin/api/v1/users",            "POST /admin/api/v1/users",
    "GET /admin/api/v1/users/{id}",       "PATCH /admin/api/v1/users/{id}",
    "DELETE /admin/api/v1/users/{id}",    "GET /admin/api/v1/groups",
    "POST /admin/api/v1/groups",          "GET /admin/api/v1/groups/{id}",
    "PATCH /admin/api/v1/groups/{id}",    "DELETE /admin/api/v1/groups/{id}",
    "GET /admin/api/v1/keys",             "POST /admin/api/v1/keys",
    "GET /admin/api/v1/keys/{id}",        "PATCH /admin/api/v1/keys/{id}",
    "DELETE /admin/api/v1/keys/{id}",     "GET /admin/api/v1/accounts",
    "POST /admin/api/v1/accounts",        "GET /admin/api/v1/accounts/{id}",
    "POST /admin/api/v1/accounts/{id}/test", "GET /admin/api/v1/accounts/{id}/quota",
    "PATCH /admin/api/v1/accounts/{id}",  "DELETE /admin/api/v1/accounts/{id}",
    "GET /admin/api/v1/prices",           "POST /admin/api/v1/prices",
    "GET /admin/api/v1/prices/{model}",   "PATCH /admin/api/v1/prices/{model}",
    "DELETE /admin/api/v1/prices/{model}", "GET /admin/api/v1/usage",
    "GET /admin/api/v1/usage/summary",    "GET /admin/api/v1/usage/report",
    "GET /admin/api/v1/usage/capacity",   "GET /admin/api/v1/usage/export",    "GET /admin/api/v1/ledger",          "GET /admin/api/v1/plugins",
    "POST /admin/api/v1/plugins/reload",  "GET /admin/api/v1/plugins/capture",
    "GET /admin/api/v1/plugins/capture/download", "POST /admin/api/v1/plugins/validate",
    "GET /admin/api/v1/budgets",          "POST /admin/api/v1/budgets",
    "GET /admin/api/v1/budgets/{id}",     "PATCH /admin/api/v1/budgets/{id}",
    "DELETE /admin/api/v1/budgets/{id}",  "GET /admin/api/v1/policies",
    "GET /admin/api/v1/policies/{name}",  "PUT /admin/api/v1/policies/{name}",
    "POST /admin/api/v1/policies/{name}/replay", "POST /admin/api/v1/policies/{name}/shadow",
    "POST /admin/api/v1/policies/{name}/promote", "POST /admin/api/v1/policies/{name}/rollback",
    "GET /admin/api/v1/policy-audit",     NULL,
};

/* ---- request context ----------------------------------------------------------------- */

typedef struct {
    tg_request_t *req;
    tg_pg_req_t *q;
    const resource_t *res;
    int kind; /* what the callback answers */
    int status_ok;
    char new_key[64];
    int64_t topup_tenant, topup_nano; /* applied to the live Redis balance once committed */
    char *account_groups; /* JSON array text of group ids to set after an account write */
    tg_acctest_t *test;   /* an account test in progress (tg_admin_accounts.c) */
    tg_redis_req_t *holds_q; /* a key delete's look at the holds in Redis */
    tg_polreq_t *pol;        /* a policy workbench request (tg_admin_policies.c) */
    char key_id[24];
    char path[256];
    ureq_t *usage; /* GET usage/export: the query, across its pages */
} actx_t;

enum { K_ROWS, K_ONE, K_CREATED, K_DELETED, K_PLAIN };

static void actx_free(actx_t *a) {
    tg_acctest_abort(a->test);
    tg_admin_policies_abort(a->pol);
    free(a->account_groups);
    free(a->usage);
    free(a);
}

static void admin_abort(tg_request_t *req) {
    actx_t *a = req->handler_data;
    if (a && a->q) {
        tg_pg_cancel(a->q);
        a->q = NULL;
    }
    if (a && a->holds_q) {
        tg_redis_cancel(a->holds_q);
        a->holds_q = NULL;
    }
    if (a) {
        tg_acctest_abort(a->test);
        tg_admin_policies_abort(a->pol);
    }
}

static void admin_finish(tg_request_t *req, int aborted) {
    actx_t *a = req->handler_data;
    if (!a)
        return;
    tg_access_line_t line = {.route = "admin", .path = a->path, .path_len = strlen(a->path)};
    tg_access_log(req, aborted, &line);
    req->handler_data = NULL;
    actx_free(a);
}

static void reply_error(tg_request_t *req, int status, const char *code, const char *msg) {
    tg_admin_reply_error(req, status, code, NULL, msg);
}

static void reply_json(tg_request_t *req, int status, const char *body, size_t n) {
    tg_response_send(req, status, "application/json", "Cache-Control: no-store\r\n", body, n);
}

/* GET plugins/capture: the recorder's status; plugins/capture/download: its current
 * file's complete lines (the newest 32 MiB at most), JSON lines as `tollgate policy
 * test --requests` reads them. */
static void capture_route(tg_request_t *req, int nseg) {
    if (nseg == 2) {
        char *s = tg_capture_status_json();
        reply_json(req, 200, s ? s : "{}", s ? strlen(s) : 2);
        free(s);
        return;
    }
    char *buf = NULL, err[256] = "";
    size_t n = 0;
    int rc = tg_capture_read(32u << 20, &buf, &n, err, sizeof(err));
    if (rc == TG_DECLINED)
        reply_error(req, 404, "capture_off", "the capture is off: set plugins.capture.rate (or a group's rate) in the config");
    else if (rc != TG_OK)
        reply_error(req, 503, "capture_unreadable", err);
    else
        tg_response_send(req, 200, "application/x-ndjson",
                         "Cache-Control: no-store\r\nContent-Disposition: attachment; filename=\"capture.jsonl\"\r\n",
                         buf ? buf : "", n);
    free(buf);
}

/* POST plugins/validate {"name", "source", "config_lua"?}: an uploaded policy checked as a
 * reload would check it (tg_plugins_validate_source), nothing saved. 200 with what it
 * declares, or 422 policy_invalid naming the problem (file and line for Lua errors). */
static void validate_policy(tg_request_t *req) {
    json_error_t jerr;
    /* NUL bytes are let through to be refused in words (bytecode holds them). */
    json_t *body = json_loadb(req->body.data ? req->body.data : "", req->body.len,
                              JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    json_t *name = json_object_get(body, "name"), *src = json_object_get(body, "source");
    json_t *conf = json_object_get(body, "config_lua");
    if (!json_is_object(body) || !json_is_string(name) || !json_is_string(src) || (conf && !json_is_string(conf))) {
        reply_error(req, 400, "invalid_request",
                    "expected {\"name\": \"<policy>\", \"source\": \"<Lua source>\", \"config_lua\": \"{...}\" (optional)}");
        json_decref(body);
        return;
    }
    char version[64] = "", hooks[256] = "", err[1024] = "";
    int rc = tg_plugins_validate_source(json_string_value(name), json_string_value(src), json_string_length(src),
                                        conf ? json_string_value(conf) : NULL, version, hooks, err, sizeof(err));
    tg_buf_t b;
    tg_buf_init(&b);
    if (rc == TG_OK) {
        tg_buf_appends(&b, "{\"ok\":true,\"name\":\"");
        tg_buf_append_json_escaped(&b, json_string_value(name), json_string_length(name));
        tg_buf_appends(&b, "\",\"version\":\"");
        tg_buf_append_json_escaped(&b, version, strlen(version));
        tg_buf_appends(&b, "\",\"hooks\":\"");
        tg_buf_append_json_escaped(&b, hooks, strlen(hooks));
        tg_buf_appends(&b, "\"}");
        reply_json(req, 200, b.data, b.len);
    } else {
        tg_buf_appends(&b, "{\"error\":{\"message\":\"");
        tg_buf_append_json_escaped(&b, err, strlen(err));
        tg_buf_appends(&b, "\",\"type\":\"invalid_request_error\",\"code\":\"policy_invalid\"}}");
        reply_json(req, 422, b.data, b.len);
    }
    tg_buf_free(&b);
    json_decref(body);
}

/* Maps a database error to a client error in plain words where it is the client's fault
 * (tg_admin_errors.c). */
static void reply_pg_error(tg_request_t *req, const char *resource, int deleting, const PGresult *res,
                           const char *err) {
    tg_admin_err_t e;
    if (tg_admin_pg_error(res, resource, deleting, &e))
        tg_admin_reply_error(req, e.status, e.code, e.param, e.message);
    else if (err && !strcmp(err, "timeout"))
        reply_error(req, 504, "database_timeout", "the database did not answer in time");
    else if (err && !strcmp(err, "not connected"))
        /* The pool has no server (tg_pg.h): Postgres is down, or failing over to a standby. */
        reply_error(req, 503, "database_unavailable",
                    "no connection to the database (it is down, or failing over to a standby): nothing was "
                    "changed; try again shortly");
    else {
        tg_log_error("admin %s: database error: %s", req->id, err ? err : "?");
        reply_error(req, 503, "database_unavailable", "the database is unavailable");
    }
}

/* ---- query strings ------------------------------------------------------------------- */

static int unhex(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Finds `name` in the query string and percent-decodes its value into out. */
static int query_get(const char *query, const char *name, char *out, size_t outlen) {
    if (!query)
        return 0;
    size_t nlen = strlen(name);
    const char *s = query;
    while (*s) {
        const char *amp = strchr(s, '&');
        const char *end = amp ? amp : s + strlen(s);
        if ((size_t)(end - s) > nlen && !strncmp(s, name, nlen) && s[nlen] == '=') {
            size_t o = 0;
            for (const char *p = s + nlen + 1; p < end && o + 1 < outlen; p++) {
                if (*p == '%' && p + 2 < end + 0 + 1 && unhex(p[1]) >= 0 && unhex(p[2]) >= 0) {
                    out[o++] = (char)(unhex(p[1]) << 4 | unhex(p[2]));
                    p += 2;
                } else {
                    out[o++] = *p == '+' ? ' ' : *p;
                }
            }
            out[o] = '\0';
            return 1;
        }
        s = amp ? amp + 1 : end;
    }
    return 0;
}

/* A decimal id or count: 1 to 18 digits, so it fits a bigint (and atoll) everywhere. */
static int is_digits(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (s[n] < '0' || s[n] > '9')
            return 0;
    return n >= 1 && n <= 18;
}

/* ---- SQL building -------------------------------------------------------------------- */

static void select_json(const resource_t *r, tg_buf_t *b) {
    tg_buf_appends(b, "json_build_object(");
    int first = 1;
    for (const tg_column_t *c = r->cols; c->name; c++) {
        if (c->access == TG_COL_WO)
            continue;
        tg_buf_printf(b, "%s'%s', t.%s", first ? "" : ", ", c->name, c->name);
        first = 0;
    }
    if (r->extra_json)
        tg_buf_printf(b, ", %s", r->extra_json);
    tg_buf_appends(b, ")");
}

static void rows_cb(void *ud, const PGresult *res, const char *err) {
    actx_t *a = ud;
    a->q = NULL;
    tg_request_t *req = a->req;
    tg_state_t *st = req->worker->ctx->state; /* the request is gone once answered */
    if (err) {
        reply_pg_error(req, a->res ? a->res->name : NULL, a->kind == K_DELETED, res, err);
        return;
    }
    switch (a->kind) {
    case K_ROWS:
    case K_PLAIN: {
        /* Accounts read carry the live snapshot's "problem" (why the gateway skips one). */
        char *annotated = a->kind == K_ROWS && !strcmp(a->res->name, "accounts")
                              ? tg_admin_accounts_annotate(req, PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0))
                              : NULL;
        if (annotated)
            reply_json(req, 200, annotated, strlen(annotated));
        else
            reply_json(req, 200, PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0));
        free(annotated);
        break;
    }
    case K_ONE:
        if (PQntuples(res) == 0)
            reply_error(req, 404, "not_found", "no such object");
        else if (a->topup_tenant && PQgetisnull(res, 0, 0))
            reply_error(req, 400, "invalid_request",
                        "amount: the balance would exceed " TG_MONEY_BALANCE_MAX_TEXT
                        " (USD, the largest amount tollgate holds)");
        else {
            if (a->topup_tenant)
                tg_billing_topup(st, a->topup_tenant, a->topup_nano);
            if (a->status_ok)
                tg_state_publish_invalidation(st, "*");
            char *annotated = !a->status_ok && !strcmp(a->res->name, "accounts")
                                  ? tg_admin_accounts_annotate(req, PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0))
                                  : NULL;
            if (annotated)
                reply_json(req, 200, annotated, strlen(annotated));
            else
                reply_json(req, a->status_ok ? a->status_ok : 200, PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0));
            free(annotated);
        }
        break;
    case K_CREATED: {
        if (PQntuples(res) == 0) {
            reply_error(req, 404, "not_found", "no such object");
            break;
        }
        tg_state_publish_invalidation(st, "*");
        if (a->new_key[0]) {
            /* The plain key is shown once, in this response, and stored nowhere. */
            json_t *j = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
            json_object_set_new(j, "key", json_string(a->new_key));
            memset(a->new_key, 0, sizeof(a->new_key)); /* before replying: a is freed with the request */
            char *s = json_dumps(j, JSON_COMPACT);
            reply_json(req, 201, s, strlen(s));
            free(s);
            json_decref(j);
        } else {
            reply_json(req, 201, PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0));
        }
        break;
    }
    case K_DELETED:
        if (atoi(PQcmdTuples((PGresult *)res)) == 0) {
            reply_error(req, 404, "not_found", "no such object");
        } else {
            tg_state_publish_invalidation(st, "*");
            tg_response_send(req, 204, NULL, NULL, NULL, 0);
        }
        break;
    }
}

static void run(actx_t *a, const char *sql, int n, const char *const *params, int kind) {
    tg_pg_t *pg = tg_state_pg(a->req->worker->ctx->state);
    if (!pg) {
        reply_error(a->req, 503, "database_unavailable", "no database is configured (postgres / TOLLGATE_PG)");
        return;
    }
    a->kind = kind;
    a->q = tg_pg_query(pg, sql, n, params, rows_cb, a);
}

/* Validates a JSON body against the resource's columns. On success returns 0 and fills
 * `cols` with the names present (comma-separated). */
static int validate(actx_t *a, json_t *body, int create, tg_buf_t *cols, char *msg, size_t msglen) {
    const resource_t *r = a->res;
    if (!json_is_object(body)) {
        snprintf(msg, msglen, "the body must be a JSON object");
        return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach(body, key, v) {
        if (!strcmp(r->name, "accounts") && !strcmp(key, "groups")) {
            if (!json_is_array(v)) {
                snprintf(msg, msglen, "groups must be an array of group ids");
                return -1;
            }
            size_t i;
            json_t *g;
            json_array_foreach(v, i, g) if (!json_is_integer(g)) {
                snprintf(msg, msglen, "groups[%zu] must be an integer group id", i);
                return -1;
            }
            continue;
        }
        const tg_column_t *c = tg_table_column(r, key);
        if (!c) {
            snprintf(msg, msglen, "unknown field \"%s\"", key);
            return -1;
        }
        if (c->access == TG_COL_RO || (c->access == TG_COL_CREATE_ONLY && !create)) {
            snprintf(msg, msglen, "field \"%s\" cannot be %s", key, create ? "set" : "changed");
            return -1;
        }
        if (tg_column_check(c, v, &a->req->worker->gw->cfg->plugins, msg, msglen) != 0)
            return -1;
        tg_buf_printf(cols, "%s%s", cols->len ? ", " : "", key);
    }
    if (create)
        for (const tg_column_t *c = r->cols; c->name; c++)
            if (c->required && !json_object_get(body, c->name)) {
                tg_column_missing(c, msg, msglen);
                return -1;
            }
    /* A Bedrock account signs with its settings: a new one names them. */
    const char *why = NULL;
    if (create && !strcmp(r->name, "accounts") &&
        !strcmp(json_string_value(json_object_get(body, "provider")) ?: "", "bedrock") &&
        (why = tg_bedrock_check(json_object_get(body, "settings"))) != NULL) {
        snprintf(msg, msglen, "field \"settings\": %s", why);
        return -1;
    }
    return 0;
}

static void write_row(actx_t *a, const char *id, int create) {
    tg_request_t *req = a->req;
    json_error_t jerr;
    json_t *body = json_loadb(req->body.data ? req->body.data : "", req->body.len, JSON_REJECT_DUPLICATES, &jerr);
    if (!body) {
        char msg[256];
        snprintf(msg, sizeof(msg), "the body is not valid JSON: %s", jerr.text);
        reply_error(req, 400, "invalid_json", msg);
        return;
    }
    tg_buf_t cols;
    tg_buf_init(&cols);
    char msg[1024];
    if (validate(a, body, create, &cols, msg, sizeof(msg)) != 0) {
        reply_error(req, 400, "invalid_request", msg);
        goto done;
    }
    const resource_t *r = a->res;
    if (!strcmp(r->name, "accounts")) {
        /* The identity: its kind against the provider, a service account key that opens,
         * the settings it needs (tg_identity.h). */
        json_t *cr = json_object_get(body, "credential"), *st = json_object_get(body, "settings");
        json_t *none = json_object();
        const char *why = tg_identity_check(json_string_value(json_object_get(body, "provider")),
                                            json_string_value(json_object_get(body, "auth")), json_string_value(cr),
                                            json_string_length(cr), json_is_object(st) ? st : create ? none : NULL,
                                            msg, sizeof(msg));
        json_decref(none);
        if (why) {
            reply_error(req, 400, "invalid_request", why);
            goto done;
        }
    }
    if (!strcmp(r->name, "accounts")) {
        json_t *groups = json_object_get(body, "groups");
        if (groups) {
            a->account_groups = json_dumps(groups, JSON_COMPACT);
            json_object_del(body, "groups");
            /* rebuild the column list without "groups" */
            tg_buf_reset(&cols);
            const char *k;
            json_t *v;
            json_object_foreach(body, k, v) tg_buf_printf(&cols, "%s%s", cols.len ? ", " : "", k);
        }
        json_t *cred = json_object_get(body, "credential");
        if (json_is_string(cred)) {
            uint8_t key[32];
            if (tg_crypto_key(req->worker->gw->cfg->secret_key, key) != TG_OK) {
                reply_error(req, 400, "no_secret_key",
                            "credentials cannot be stored: the gateway has no TOLLGATE_SECRET_KEY");
                goto done;
            }
            tg_buf_t sealed;
            tg_buf_init(&sealed);
            tg_crypto_seal(key, json_string_value(cred), json_string_length(cred), &sealed);
            tg_buf_t hex;
            tg_buf_init(&hex);
            tg_buf_appends(&hex, "\\x");
            for (size_t i = 0; i < sealed.len; i++)
                tg_buf_printf(&hex, "%02x", (unsigned char)sealed.data[i]);
            json_object_set_new(body, "credential", json_string(hex.data));
            tg_buf_free(&hex);
            tg_buf_free(&sealed);
            OPENSSL_cleanse(key, sizeof(key));
        }
    }
    if (!strcmp(r->name, "keys") && create) {
        char plain[64];
        tg_crypto_new_api_key(plain);
        uint8_t d[32];
        SHA256((const unsigned char *)plain, strlen(plain), d);
        tg_buf_t hex;
        tg_buf_init(&hex);
        tg_buf_appends(&hex, "\\x");
        for (int i = 0; i < 32; i++)
            tg_buf_printf(&hex, "%02x", d[i]);
        json_object_set_new(body, "key_hash", json_string(hex.data));
        char prefix[16];
        snprintf(prefix, sizeof(prefix), "%.8s", plain);
        json_object_set_new(body, "prefix", json_string(prefix));
        tg_buf_printf(&cols, "%skey_hash, prefix", cols.len ? ", " : "");
        tg_buf_free(&hex);
        snprintf(a->new_key, sizeof(a->new_key), "%s", plain);
        OPENSSL_cleanse(plain, sizeof(plain));
    }
    for (const tg_column_t *c = r->cols; create && c->name; c++)
        if (c->also && json_object_get(body, c->name)) { /* a tenant's opening_balance */
            json_object_set(body, c->also, json_object_get(body, c->name));
            tg_buf_printf(&cols, ", %s", c->also);
        }
    if (!create && cols.len == 0 && !a->account_groups) {
        reply_error(req, 400, "invalid_request", "nothing to change");
        goto done;
    }
    char *json = json_dumps(body, JSON_COMPACT);
    tg_buf_t sql, sel;
    tg_buf_init(&sql);
    tg_buf_init(&sel);
    select_json(r, &sel);
    /* Account groups are set in the same statement, after the row is written. */
    char groups_cte[512] = "";
    if (a->account_groups)
        snprintf(groups_cte, sizeof(groups_cte),
                 "g_del AS (DELETE FROM account_groups WHERE account_id = (SELECT id FROM w) AND group_id NOT IN "
                 "(SELECT x::bigint FROM json_array_elements_text($%d::json) x)), "
                 "g_ins AS (INSERT INTO account_groups (account_id, group_id) "
                 "SELECT (SELECT id FROM w), x::bigint FROM json_array_elements_text($%d::json) x "
                 "ON CONFLICT DO NOTHING), ",
                 create ? 2 : 3, create ? 2 : 3);
    if (create) {
        if (cols.len == 0)
            tg_buf_printf(&sql, "WITH w AS (INSERT INTO %s DEFAULT VALUES RETURNING *), ", r->table);
        else
            tg_buf_printf(&sql,
                          "WITH w AS (INSERT INTO %s (%s) SELECT %s FROM json_populate_record(NULL::%s, $1::json) "
                          "RETURNING *), ",
                          r->table, cols.data, cols.data, r->table);
    } else {
        tg_buf_printf(&sql, "WITH w AS (UPDATE %s x SET ", r->table);
        const char *s = cols.data ? cols.data : "";
        int first = 1;
        while (*s) {
            const char *comma = strstr(s, ", ");
            size_t n = comma ? (size_t)(comma - s) : strlen(s);
            tg_buf_printf(&sql, "%s%.*s = j.%.*s", first ? "" : ", ", (int)n, s, (int)n, s);
            first = 0;
            s += n + (comma ? 2 : 0);
        }
        tg_buf_printf(&sql, "%s%s FROM json_populate_record(NULL::%s, $1::json) j WHERE x.%s = $2%s RETURNING x.*), ",
                      first ? "" : ", ", strcmp(r->table, "model_prices") && 1 ? "updated_at = now()" : "updated_at = now()",
                      r->table, r->id_col, r->text_id ? "" : "::bigint");
    }
    tg_buf_appends(&sql, groups_cte);
    tg_buf_appends(&sql, "done AS (SELECT 1) SELECT ");
    if (a->account_groups) {
        /* Read the groups from the CTE inputs: the new membership is not visible yet. */
        tg_buf_t sel2;
        tg_buf_init(&sel2);
        tg_buf_appends(&sel2, sel.data);
        char *p = strstr(sel2.data, "'groups', (SELECT");
        if (p) {
            *p = '\0';
            tg_buf_t fixed;
            tg_buf_init(&fixed);
            tg_buf_appends(&fixed, sel2.data);
            tg_buf_printf(&fixed, "'groups', (SELECT coalesce(json_agg(x::bigint ORDER BY x::bigint), '[]') FROM "
                                  "json_array_elements_text($%d::json) x))",
                          create ? 2 : 3);
            tg_buf_appends(&sql, fixed.data);
            tg_buf_free(&fixed);
        }
        tg_buf_free(&sel2);
    } else {
        tg_buf_appends(&sql, sel.data);
    }
    tg_buf_appends(&sql, " FROM w t");
    const char *params[3];
    int np = 0;
    params[np++] = json;
    if (!create)
        params[np++] = id;
    if (a->account_groups)
        params[np++] = a->account_groups;
    if (create) {
        run(a, sql.data, np, params, K_CREATED);
    } else {
        a->status_ok = 200;
        run(a, sql.data, np, params, K_ONE);
    }
    OPENSSL_cleanse(json, strlen(json));
    free(json);
    tg_buf_free(&sql);
    tg_buf_free(&sel);
done:
    tg_buf_free(&cols);
    json_decref(body);
}

static void list_rows(actx_t *a, const char *query) {
    const resource_t *r = a->res;
    char limit[16] = "50", after[256] = "", tenant[32] = "";
    query_get(query, "limit", limit, sizeof(limit));
    if (!is_digits(limit) || atoll(limit) < 1 || atoll(limit) > 500) {
        reply_error(a->req, 400, "invalid_request", "limit must be a number from 1 to 500");
        return;
    }
    int has_after = query_get(query, "after", after, sizeof(after));
    if (has_after && !r->text_id && !is_digits(after)) {
        reply_error(a->req, 400, "invalid_request", "after must be an id");
        return;
    }
    int has_tenant = query_get(query, "tenant_id", tenant, sizeof(tenant));
    if (has_tenant && (!is_digits(tenant) || (strcmp(r->name, "keys") && strcmp(r->name, "users")))) {
        reply_error(a->req, 400, "invalid_request", "tenant_id filters keys and users and must be an id");
        return;
    }
    tg_buf_t sql, sel;
    tg_buf_init(&sql);
    tg_buf_init(&sel);
    select_json(r, &sel);
    const char *params[3];
    int np = 0;
    params[np++] = limit;
    tg_buf_printf(&sql,
                  "WITH page AS (SELECT * FROM %s t WHERE true", r->table);
    if (has_after) {
        params[np++] = after;
        tg_buf_printf(&sql, " AND t.%s > $%d%s", r->id_col, np, r->text_id ? "" : "::bigint");
    }
    if (has_tenant) {
        params[np++] = tenant;
        tg_buf_printf(&sql, " AND t.tenant_id = $%d::bigint", np);
    }
    tg_buf_printf(&sql,
                  " ORDER BY t.%s LIMIT $1::int + 1), rows AS (SELECT %s AS j, t.%s AS k FROM page t ORDER BY t.%s) "
                  "SELECT json_build_object('data', coalesce((SELECT json_agg(j ORDER BY k) FROM (SELECT * FROM rows "
                  "LIMIT $1::int) x), '[]'), 'has_more', (SELECT count(*) FROM rows) > $1::int, 'next_after', "
                  "(SELECT max(k) FROM (SELECT k FROM rows ORDER BY k LIMIT $1::int) y))",
                  r->id_col, sel.data, r->id_col, r->id_col);
    run(a, sql.data, np, params, K_ROWS);
    tg_buf_free(&sql);
    tg_buf_free(&sel);
}

static void get_row(actx_t *a, const char *id) {
    tg_buf_t sql, sel;
    tg_buf_init(&sql);
    tg_buf_init(&sel);
    select_json(a->res, &sel);
    tg_buf_printf(&sql, "SELECT %s FROM %s t WHERE t.%s = $1%s", sel.data, a->res->table, a->res->id_col,
                  a->res->text_id ? "" : "::bigint");
    const char *params[1] = {id};
    run(a, sql.data, 1, params, K_ONE);
    tg_buf_free(&sql);
    tg_buf_free(&sel);
}

/* A key with billing history, or with a request held in Redis right now, is revoked
 * instead of deleted: its usage rows and ledger keep pointing at it, and the settlement
 * of a request in flight must find it (a deleted key's settlement would fail its foreign
 * key and the bill be lost). One without either is deleted. Either way it stops working
 * at once. $2: a hold of the key is in its tenant's holds index ({t:T}:holds, whose
 * values start with "<key id>|"); a hold whose Postgres row has not landed yet is only
 * there. */
static const char KEY_DELETE_SQL[] =
    "WITH h AS (SELECT $2::bool OR EXISTS (SELECT 1 FROM reservations WHERE api_key_id = $1::bigint) OR EXISTS "
    "(SELECT 1 FROM usage WHERE api_key_id = $1::bigint) AS kept), d AS (DELETE FROM api_keys WHERE id = $1::bigint "
    "AND NOT (SELECT kept FROM h) RETURNING 1), r AS (UPDATE api_keys SET status = 'revoked', updated_at = now() "
    "WHERE id = $1::bigint AND (SELECT kept FROM h) RETURNING 1) SELECT 1 FROM d UNION ALL SELECT 1 FROM r";

static void key_holds_cb(void *ud, redisReply *r, const char *err) {
    actx_t *a = ud;
    a->holds_q = NULL;
    if (err || !r || r->type != REDIS_REPLY_ARRAY) {
        reply_error(a->req, 503, "limiter_unavailable",
                    "the key's requests in flight could not be checked (Redis is unavailable); try again");
        return;
    }
    size_t n = strlen(a->key_id);
    int held = 0;
    for (size_t i = 0; i < r->elements && !held; i++) {
        const redisReply *v = r->element[i];
        held = v->str && v->len > n && !memcmp(v->str, a->key_id, n) && v->str[n] == '|';
    }
    const char *params[2] = {a->key_id, held ? "true" : "false"};
    run(a, KEY_DELETE_SQL, 2, params, K_DELETED);
}

static void key_tenant_cb(void *ud, const PGresult *res, const char *err) {
    actx_t *a = ud;
    a->q = NULL;
    if (err) {
        reply_pg_error(a->req, "keys", 1, res, err);
        return;
    }
    if (PQntuples(res) == 0) {
        reply_error(a->req, 404, "not_found", "no such object");
        return;
    }
    tg_redis_t *redis = tg_state_redis(a->req->worker->ctx->state);
    if (!redis) { /* no Redis, no billing: nothing can be held */
        const char *params[2] = {a->key_id, "false"};
        run(a, KEY_DELETE_SQL, 2, params, K_DELETED);
        return;
    }
    char hkey[64];
    snprintf(hkey, sizeof(hkey), "{t:%s}:holds", PQgetvalue(res, 0, 0));
    const char *argv[2] = {"HVALS", hkey};
    a->holds_q = tg_redis_command(redis, key_holds_cb, a, 2, argv, NULL);
    if (!a->holds_q)
        reply_error(a->req, 503, "limiter_unavailable",
                    "the key's requests in flight could not be checked (Redis is unavailable); try again");
}

/* ---- an account's learned quota (the fleet's copy in Redis) ----------------------- */

static void quota_cb(void *ud, redisReply *r, const char *err) {
    actx_t *a = ud;
    a->holds_q = NULL;
    if (err) {
        reply_error(a->req, 503, "limiter_unavailable", "Redis is unavailable; try again");
        return;
    }
    int64_t now = (int64_t)tg_wall_ms();
    tg_quota_t q;
    int known = r && r->type == REDIS_REPLY_STRING && tg_quota_decode(&q, r->str, r->len);
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_printf(&b, "{\"account_id\":%s,\"now_ms\":%lld,\"stale_ms\":%d", a->key_id, (long long)now,
                  a->req->worker->gw->cfg->routing.quota_stale_ms);
    if (!known) {
        tg_buf_appends(&b, ",\"known\":false}");
    } else {
        static const char *const lims[TG_QL__COUNT] = {"requests", "tokens", "input_tokens", "output_tokens"};
        static const char *const wins[TG_QW__COUNT] = {"short", "long"};
        static const char *const sts[] = {"unknown", "allowed", "warning", "rejected"};
        double reset, headroom = tg_quota_headroom(&q, now, &reset);
        tg_buf_printf(&b, ",\"known\":true,\"learned_at_ms\":%lld,\"blocked_until_ms\":%lld,\"headroom\":",
                      (long long)q.at_ms, (long long)tg_quota_blocked_until(&q, now, 1));
        if (headroom < 0)
            tg_buf_appends(&b, "null");
        else
            tg_buf_printf(&b, "%.4f", headroom);
        tg_buf_printf(&b, ",\"plan\":{\"status\":\"%s\",\"reset_at_ms\":%lld},\"limits\":[", sts[q.plan_status],
                      (long long)q.plan_reset_ms);
        int n = 0;
        for (int i = 0; i < TG_QL__COUNT; i++) {
            const tg_quota_limit_t *l = &q.lim[i];
            if (l->limit < 0 && l->remaining < 0)
                continue;
            tg_buf_printf(&b, "%s{\"name\":\"%s\",\"limit\":%lld,\"remaining\":%lld,\"reset_at_ms\":%lld}",
                          n++ ? "," : "", lims[i], (long long)l->limit, (long long)l->remaining,
                          (long long)l->reset_at_ms);
        }
        tg_buf_appends(&b, "],\"windows\":[");
        n = 0;
        for (int i = 0; i < TG_QW__COUNT; i++) {
            const tg_quota_window_t *w = &q.win[i];
            if (w->used < 0 && !w->reset_at_ms && !w->status)
                continue;
            tg_buf_printf(&b, "%s{\"name\":\"%s\",\"used\":", n++ ? "," : "", wins[i]);
            if (w->used < 0)
                tg_buf_appends(&b, "null");
            else
                tg_buf_printf(&b, "%.4f", w->used);
            tg_buf_printf(&b, ",\"reset_at_ms\":%lld,\"window_ms\":%lld,\"status\":\"%s\"}",
                          (long long)w->reset_at_ms, (long long)w->window_ms, sts[w->status]);
        }
        tg_buf_appends(&b, "]}");
    }
    reply_json(a->req, 200, b.data, b.len);
    tg_buf_free(&b);
}

static void account_quota(actx_t *a, const char *id) {
    tg_redis_t *redis = tg_state_redis(a->req->worker->ctx->state);
    snprintf(a->key_id, sizeof(a->key_id), "%.20s", id); /* digits only (is_digits) */
    if (!redis) {
        quota_cb(a, NULL, NULL);
        return;
    }
    char key[48];
    snprintf(key, sizeof(key), "{a:%s}:quota", a->key_id);
    const char *argv[2] = {"GET", key};
    a->holds_q = tg_redis_command(redis, quota_cb, a, 2, argv, NULL);
    if (!a->holds_q)
        reply_error(a->req, 503, "limiter_unavailable", "Redis is unavailable; try again");
}

static void delete_row(actx_t *a, const char *id) {
    if (!strcmp(a->res->name, "keys")) {
        tg_pg_t *pg = tg_state_pg(a->req->worker->ctx->state);
        if (!pg) {
            reply_error(a->req, 503, "database_unavailable", "no database is configured (postgres / TOLLGATE_PG)");
            return;
        }
        snprintf(a->key_id, sizeof(a->key_id), "%.20s", id); /* digits only (is_digits) */
        const char *params[1] = {a->key_id};
        a->q = tg_pg_query(pg, "SELECT tenant_id FROM api_keys WHERE id = $1::bigint", 1, params, key_tenant_cb, a);
        return;
    }
    char sql[256];
    snprintf(sql, sizeof(sql), "DELETE FROM %s WHERE %s = $1%s", a->res->table, a->res->id_col,
             a->res->text_id ? "" : "::bigint");
    const char *params[1] = {id};
    run(a, sql, 1, params, K_DELETED);
}

static void topup(actx_t *a, const char *id) {
    tg_request_t *req = a->req;
    json_t *body = json_loadb(req->body.data ? req->body.data : "", req->body.len, 0, NULL);
    json_t *amount = json_object_get(body, "amount");
    json_t *note = json_object_get(body, "note");
    char amt[64] = "";
    if (json_is_string(amount) && json_string_length(amount) < sizeof(amt))
        snprintf(amt, sizeof(amt), "%s", json_string_value(amount));
    else if (json_is_number(amount) && json_number_value(amount) < 1e40)
        snprintf(amt, sizeof(amt), "%.10f", json_number_value(amount)); /* plain digits, so the range is checked */
    else if (json_is_number(amount))
        snprintf(amt, sizeof(amt), "%s", TG_MONEY_BALANCE_MAX_TEXT "0"); /* past the largest: refused below */
    if (!tg_decimal_plain(amt) || amt[0] == '-' || strspn(amt, "0.") == strlen(amt) || tg_decimal_sub_nano(amt)) {
        reply_error(req, 400, "invalid_request",
                    "amount must be a positive decimal number of at most 9 decimal places, e.g. \"25.00\"");
        json_decref(body);
        return;
    }
    if (tg_money_check(amt) != TG_OK) {
        reply_error(req, 400, "invalid_request",
                    "amount must be at most " TG_MONEY_BALANCE_MAX_TEXT " (USD, the largest amount tollgate holds)");
        json_decref(body);
        return;
    }
    if (note && !json_is_string(note)) {
        reply_error(req, 400, "invalid_request", "note must be a string");
        json_decref(body);
        return;
    }
    const char *params[3] = {id, amt, note ? json_string_value(note) : NULL};
    a->status_ok = 200;
    a->topup_tenant = atoll(id);
    if (tg_money_parse(amt, &a->topup_nano) != TG_OK)
        a->topup_nano = 0;
    /* A balance past TG_MONEY_BALANCE_MAX is refused too: the row comes back NULL. */
    run(a,
        "WITH c AS (SELECT id FROM tenants WHERE id = $1::bigint), "
        "t AS (UPDATE tenants SET balance = balance + $2::numeric, updated_at = now() WHERE id = $1::bigint "
        "AND balance + $2::numeric <= " TG_MONEY_BALANCE_MAX_TEXT " RETURNING *), "
        "l AS (INSERT INTO ledger (tenant_id, kind, amount, note) SELECT id, 'topup', $2::numeric, $3 "
        "FROM t) SELECT CASE WHEN t.id IS NOT NULL THEN json_build_object('id', t.id, 'name', t.name, 'balance', "
        "t.balance) END FROM c LEFT JOIN t ON t.id = c.id",
        3, params, K_ONE);
    json_decref(body);
}

static void usage_query(actx_t *a, const char *query, int summary) {
    char tenant[32] = "", key[32] = "", model[200] = "", from[64] = "", to[64] = "", limit[16] = "100",
         after[32] = "", group_by[32] = "model";
    int ht = query_get(query, "tenant_id", tenant, sizeof(tenant));
    int hk = query_get(query, "key_id", key, sizeof(key));
    int hm = query_get(query, "model", model, sizeof(model));
    int hf = query_get(query, "from", from, sizeof(from));
    int hto = query_get(query, "to", to, sizeof(to));
    int ha = query_get(query, "after", after, sizeof(after));
    query_get(query, "limit", limit, sizeof(limit));
    query_get(query, "group_by", group_by, sizeof(group_by));
    if ((ht && !is_digits(tenant)) || (hk && !is_digits(key)) || (ha && !is_digits(after)) || !is_digits(limit) ||
        atoll(limit) < 1 || atoll(limit) > 1000) {
        reply_error(a->req, 400, "invalid_request", "tenant_id, key_id and after must be ids; limit 1 to 1000");
        return;
    }
    const char *gcol = !strcmp(group_by, "model")    ? "model"
                       : !strcmp(group_by, "key")    ? "api_key_id"
                       : !strcmp(group_by, "tenant") ? "tenant_id"
                       : !strcmp(group_by, "hour")   ? "date_trunc('hour', created_at)"
                       : !strcmp(group_by, "day")    ? "date_trunc('day', created_at)"
                                                     : NULL;
    if (summary && !gcol) {
        reply_error(a->req, 400, "invalid_request", "group_by must be model, key, tenant, hour or day");
        return;
    }
    tg_buf_t where;
    tg_buf_init(&where);
    const char *params[8];
    int np = 0;
    tg_buf_appends(&where, " WHERE true");
    if (ht) {
        params[np++] = tenant;
        tg_buf_printf(&where, " AND tenant_id = $%d::bigint", np);
    }
    if (hk) {
        params[np++] = key;
        tg_buf_printf(&where, " AND api_key_id = $%d::bigint", np);
    }
    if (hm) {
        params[np++] = model;
        tg_buf_printf(&where, " AND model = $%d", np);
    }
    if (hf) {
        params[np++] = from;
        tg_buf_printf(&where, " AND created_at >= $%d::timestamptz", np);
    }
    if (hto) {
        params[np++] = to;
        tg_buf_printf(&where, " AND created_at < $%d::timestamptz", np);
    }
    tg_buf_t sql;
    tg_buf_init(&sql);
    if (summary) {
        tg_buf_printf(&sql,
                      "SELECT json_build_object('group_by', '%s', 'data', coalesce(json_agg(r ORDER BY r.key), '[]')) "
                      "FROM (SELECT %s AS key, count(*) AS requests, sum(input_tokens) AS input_tokens, "
                      "sum(output_tokens) AS output_tokens, sum(cache_read_tokens) AS cache_read_tokens, "
                      "sum(cache_write_tokens) AS cache_write_tokens, sum(reasoning_tokens) AS reasoning_tokens, "
                      "sum(cost) AS cost FROM usage%s GROUP BY 1) r",
                      group_by, gcol, where.data);
    } else {
        if (ha) {
            params[np++] = after;
            tg_buf_printf(&where, " AND id > $%d::bigint", np);
        }
        params[np++] = limit;
        tg_buf_printf(&sql,
                      "SELECT json_build_object('data', coalesce(json_agg(to_jsonb(u) || jsonb_build_object("
                      "'started_at', CASE WHEN u.started_at > '-infinity' THEN u.started_at END) ORDER BY u.id), "
                      "'[]'), 'next_after', max(u.id)) FROM (SELECT * FROM usage%s ORDER BY id LIMIT $%d::int) u",
                      where.data, np);
    }
    run(a, sql.data, np, params, K_PLAIN);
    tg_buf_free(&sql);
    tg_buf_free(&where);
}

/* ---- usage reports from the rollups (sql/0010_rollups.sql) ---------------------------- */

/* A whole UTC hour: YYYY-MM-DD, or YYYY-MM-DDTHH[:MM[:SS]] with Z or +00:00 (minutes and
 * seconds zero). Returns Unix seconds, or -1 with *why set. */
static int64_t parse_hour(const char *s, const char **why) {
    int y, mo, d, h = 0, mi = 0, sec = 0, n = 0;
    size_t len = strlen(s);
    *why = "must be a UTC time such as 2026-12-01T13:00:00Z or a day such as 2026-12-01";
    if (len < 10 || sscanf(s, "%4d-%2d-%2d%n", &y, &mo, &d, &n) != 3 || n != 10 || s[4] != '-' || s[7] != '-')
        return -1;
    const char *p = s + 10;
    if (*p == 'T' || *p == 't' || *p == ' ') {
        int k = 0;
        if (sscanf(p + 1, "%2d%n", &h, &k) != 1 || k != 2)
            return -1;
        p += 3;
        if (*p == ':') {
            if (sscanf(p + 1, "%2d%n", &mi, &k) != 1 || k != 2)
                return -1;
            p += 3;
            if (*p == ':') {
                if (sscanf(p + 1, "%2d%n", &sec, &k) != 1 || k != 2)
                    return -1;
                p += 3;
            }
        }
        if (strcmp(p, "Z") && strcmp(p, "z") && strcmp(p, "+00:00") && strcmp(p, "+00"))
            return -1;
    } else if (*p) {
        return -1;
    }
    struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi, .tm_sec = sec};
    time_t t = timegm(&tm);
    struct tm back;
    if (t == (time_t)-1 || !gmtime_r(&t, &back) || back.tm_year != y - 1900 || back.tm_mon != mo - 1 ||
        back.tm_mday != d || back.tm_hour != h || y < 2000 || y > 2200)
        return -1;
    if (mi || sec) {
        *why = "must be a whole hour (the rollups are hourly): minutes and seconds 0";
        return -1;
    }
    return (int64_t)t;
}

struct ureq_s {
    char from[32], to[32];     /* ISO, UTC */
    char groups[128];          /* Postgres text[] literal, e.g. {model,account} */
    char filt[5][208];         /* tenant_id, key_id, group_id, account_id, model ("" = none) */
    int has[5];
    char limit[16], offset[24], window[8];
    char next_token[80];
    char by[16];
    int64_t off;
    int lim;
    int csv_started;
};

static const char *const FILTERS[5] = {"tenant_id", "key_id", "group_id", "account_id", "model"};

/* The range [from, to) of the query (defaults: the `default_hours` up to the next whole
 * hour); 0 or a 400 sent. */
static int usage_range(actx_t *a, const char *query, int default_hours, ureq_t *u) {
    char from[64] = "", to[64] = "";
    int hf = query_get(query, "from", from, sizeof(from));
    int ht = query_get(query, "to", to, sizeof(to));
    const char *why = NULL;
    int64_t now = (int64_t)(tg_wall_ms() / 1000);
    int64_t t = ht ? parse_hour(to, &why) : (now / 3600 + 1) * 3600;
    if (t < 0) {
        char msg[200];
        snprintf(msg, sizeof(msg), "to %s", why);
        tg_admin_reply_error(a->req, 400, "invalid_range", "to", msg);
        return -1;
    }
    int64_t f = hf ? parse_hour(from, &why) : t - (int64_t)default_hours * 3600;
    if (f < 0) {
        char msg[200];
        snprintf(msg, sizeof(msg), "from %s", why);
        tg_admin_reply_error(a->req, 400, "invalid_range", "from", msg);
        return -1;
    }
    if (f >= t) {
        tg_admin_reply_error(a->req, 400, "invalid_range", "from", "from must be before to (the range is [from, to))");
        return -1;
    }
    if (t - f > 400LL * 86400) {
        tg_admin_reply_error(a->req, 400, "invalid_range", "to", "the range may span at most 400 days");
        return -1;
    }
    struct tm tm;
    time_t tt = (time_t)f;
    gmtime_r(&tt, &tm);
    strftime(u->from, sizeof(u->from), "%Y-%m-%dT%H:%M:%SZ", &tm);
    tt = (time_t)t;
    gmtime_r(&tt, &tm);
    strftime(u->to, sizeof(u->to), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return 0;
}

/* group_by (a comma list of hour, day, tenant, key, group, account, model) as a text[]
 * literal; 0 or a 400 sent. */
static int usage_groups(actx_t *a, const char *query, const char *dflt, ureq_t *u) {
    static const char *const names[] = {"hour", "day", "tenant", "key", "group", "account", "model", NULL};
    char g[160];
    if (!query_get(query, "group_by", g, sizeof(g)))
        snprintf(g, sizeof(g), "%s", dflt);
    unsigned seen = 0;
    size_t o = 0;
    u->groups[o++] = '{';
    char *save = NULL;
    for (char *tok = strtok_r(g, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (names[k] && strcmp(names[k], tok))
            k++;
        if (!names[k]) {
            char msg[256];
            snprintf(msg, sizeof(msg), "group_by: unknown grouping \"%.40s\": use a comma list of hour, day, tenant, key, "
                     "group, account, model", tok);
            tg_admin_reply_error(a->req, 400, "invalid_grouping", "group_by", msg);
            return -1;
        }
        if (seen & (1u << k)) {
            tg_admin_reply_error(a->req, 400, "invalid_grouping", "group_by", "group_by names a grouping twice");
            return -1;
        }
        seen |= 1u << k;
        o += (size_t)snprintf(u->groups + o, sizeof(u->groups) - o, "%s%s", o > 1 ? "," : "", names[k]);
    }
    if ((seen & 3u) == 3u) {
        tg_admin_reply_error(a->req, 400, "invalid_grouping", "group_by", "group_by: hour and day exclude each other");
        return -1;
    }
    snprintf(u->groups + o, sizeof(u->groups) - o, "}");
    return 0;
}

/* The filters, the page size and the page token (tied to the query by a hash of its
 * range, grouping and filters); 0 or a 400 sent. */
static int usage_page(actx_t *a, const char *query, int max_limit, ureq_t *u) {
    for (int i = 0; i < 5; i++) {
        u->has[i] = query_get(query, FILTERS[i], u->filt[i], sizeof(u->filt[i]));
        if (u->has[i] && (i < 4 ? !is_digits(u->filt[i]) : !u->filt[i][0] || strlen(u->filt[i]) > 200)) {
            char msg[128];
            snprintf(msg, sizeof(msg), "%s must be %s", FILTERS[i], i < 4 ? "an id" : "a model name (1 to 200 characters)");
            tg_admin_reply_error(a->req, 400, "invalid_request", FILTERS[i], msg);
            return -1;
        }
    }
    snprintf(u->limit, sizeof(u->limit), "100");
    query_get(query, "limit", u->limit, sizeof(u->limit));
    if (!is_digits(u->limit) || atoll(u->limit) < 1 || atoll(u->limit) > max_limit) {
        char msg[64];
        snprintf(msg, sizeof(msg), "limit must be 1 to %d", max_limit);
        tg_admin_reply_error(a->req, 400, "invalid_request", "limit", msg);
        return -1;
    }
    u->lim = atoi(u->limit);
    /* what the token is tied to */
    tg_buf_t k;
    tg_buf_init(&k);
    tg_buf_printf(&k, "%s|%s|%s", u->from, u->to, u->groups);
    for (int i = 0; i < 5; i++)
        tg_buf_printf(&k, "|%s", u->has[i] ? u->filt[i] : "");
    char hash[65];
    tg_sha256_hex(k.data, k.len, hash);
    tg_buf_free(&k);
    char tok[96];
    u->off = 0;
    if (query_get(query, "page_token", tok, sizeof(tok))) {
        /* hex of "v1:<offset>:<hash 12>" */
        char raw[48] = "";
        size_t n = strlen(tok), o = 0;
        int ok = n % 2 == 0 && n / 2 < sizeof(raw);
        for (size_t i = 0; ok && i < n; i += 2) {
            int hi = unhex(tok[i]), lo = unhex(tok[i + 1]);
            ok = hi >= 0 && lo >= 0;
            raw[o++] = (char)(hi << 4 | lo);
        }
        raw[o] = '\0';
        long long off = -1;
        char h[16] = "";
        int used = 0;
        if (!ok || sscanf(raw, "v1:%lld:%12[0-9a-f]%n", &off, h, &used) != 2 || used != (int)o || off < 0 ||
            off > 100000000) {
            tg_admin_reply_error(a->req, 400, "invalid_page_token", "page_token",
                                 "page_token is not a token this API returned (pass next_page_token as it is)");
            return -1;
        }
        if (strncmp(h, hash, 12)) {
            tg_admin_reply_error(a->req, 400, "invalid_page_token", "page_token",
                                 "page_token belongs to another query: it is tied to the range, grouping and filters "
                                 "it was returned for");
            return -1;
        }
        u->off = off;
    }
    snprintf(u->offset, sizeof(u->offset), "%lld", (long long)u->off);
    char raw[48];
    int rn = snprintf(raw, sizeof(raw), "v1:%lld:%.12s", (long long)(u->off + u->lim), hash);
    for (int i = 0; i < rn; i++)
        snprintf(u->next_token + 2 * i, 3, "%02x", (unsigned char)raw[i]);
    return 0;
}

/* GET usage/report: the rollups of a range, grouped, filtered, a page at a time. */
static void usage_report(actx_t *a, const char *query) {
    ureq_t u = {0};
    if (usage_range(a, query, 24, &u) || usage_groups(a, query, "model", &u) || usage_page(a, query, 1000, &u))
        return;
    const char *params[12] = {u.from, u.to, u.groups};
    for (int i = 0; i < 5; i++)
        params[3 + i] = u.has[i] ? u.filt[i] : NULL;
    params[8] = u.limit;
    params[9] = u.offset;
    params[10] = u.next_token;
    run(a,
        "SELECT (r || jsonb_build_object('from', $1::timestamptz, 'to', $2::timestamptz, 'group_by', "
        "to_jsonb($3::text[]), 'next_page_token', CASE WHEN (r->>'has_more')::boolean THEN $11 END, 'ttft_error', "
        "'P50/P95 within +-9.1% (fixed log buckets, 4 per doubling, from 20 ms to 57.9 s)'))::text FROM (SELECT "
        "tg_usage_report($1::timestamptz, $2::timestamptz, $3::text[], $4::bigint, $5::bigint, $6::bigint, $7::bigint, "
        "$8, $9::int, $10::int)::jsonb AS r) x",
        11, params, K_PLAIN);
}

/* GET usage/capacity: per account (by=account) or group (by=group). */
static void usage_capacity(actx_t *a, const char *query) {
    ureq_t u = {0};
    if (usage_range(a, query, 14 * 24, &u))
        return;
    snprintf(u.by, sizeof(u.by), "account");
    query_get(query, "by", u.by, sizeof(u.by));
    if (strcmp(u.by, "account") && strcmp(u.by, "group")) {
        tg_admin_reply_error(a->req, 400, "invalid_grouping", "by", "by must be account or group");
        return;
    }
    snprintf(u.window, sizeof(u.window), "5");
    query_get(query, "window_hours", u.window, sizeof(u.window));
    if (!is_digits(u.window) || atoi(u.window) < 1 || atoi(u.window) > 168) {
        tg_admin_reply_error(a->req, 400, "invalid_request", "window_hours", "window_hours must be 1 to 168");
        return;
    }
    const char *params[4] = {u.from, u.to, u.by, u.window};
    run(a, "SELECT tg_usage_capacity($1::timestamptz, $2::timestamptz, $3, $4::int)", 4, params, K_PLAIN);
}

/* GET usage/export: the rollups as CSV, streamed page by page (5,000 rows each): the
 * next page is asked for once the client has taken the last one. */
enum { EXPORT_PAGE = 5000 };
static void export_next(actx_t *a);

static void export_drain(tg_request_t *req) {
    actx_t *a = req->handler_data;
    if (a && !a->q && tg_request_write_queue(req) < (1u << 20)) {
        req->drain_cb = NULL;
        export_next(a);
    }
}

static void export_cb(void *ud, const PGresult *res, const char *err) {
    actx_t *a = ud;
    a->q = NULL;
    tg_request_t *req = a->req;
    ureq_t *u = a->usage;
    if (err) {
        if (u->csv_started)
            tg_response_abort(req);
        else
            reply_pg_error(req, NULL, 0, res, err);
        return;
    }
    const char *csv = PQgetvalue(res, 0, 0);
    size_t n = (size_t)PQgetlength(res, 0, 0);
    if (!u->csv_started) {
        u->csv_started = 1;
        tg_response_start(req, 200, "text/csv; charset=utf-8",
                          "Cache-Control: no-store\r\nContent-Disposition: attachment; filename=\"usage.csv\"\r\n", -1);
    }
    size_t lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += csv[i] == '\n';
    if (n)
        tg_response_body(req, csv, n);
    if (lines - (u->off == 0) < (size_t)EXPORT_PAGE) {
        tg_response_end(req);
        return;
    }
    u->off += EXPORT_PAGE;
    if (tg_request_write_queue(req) < (1u << 20))
        export_next(a);
    else
        req->drain_cb = export_drain;
}

static void export_next(actx_t *a) {
    ureq_t *u = a->usage;
    snprintf(u->offset, sizeof(u->offset), "%lld", (long long)u->off);
    const char *params[10] = {u->from, u->to, u->groups};
    for (int i = 0; i < 5; i++)
        params[3 + i] = u->has[i] ? u->filt[i] : NULL;
    params[8] = u->limit;
    params[9] = u->offset;
    tg_pg_t *pg = tg_state_pg(a->req->worker->ctx->state);
    a->q = tg_pg_query(pg,
                       "SELECT tg_usage_report($1::timestamptz, $2::timestamptz, $3::text[], $4::bigint, $5::bigint, "
                       "$6::bigint, $7::bigint, $8, $9::int, $10::int, 'csv')",
                       10, params, export_cb, a);
}

static void usage_export(actx_t *a, const char *query) {
    ureq_t *u = calloc(1, sizeof(*u));
    a->usage = u;
    if (usage_range(a, query, 24, u) || usage_groups(a, query, "hour,tenant,key,group,account,model", u) ||
        usage_page(a, query, 1000, u))
        return;
    if (!tg_state_pg(a->req->worker->ctx->state)) {
        reply_error(a->req, 503, "database_unavailable", "no database is configured (postgres / TOLLGATE_PG)");
        return;
    }
    snprintf(u->limit, sizeof(u->limit), "%d", EXPORT_PAGE);
    export_next(a);
}

/* GET ledger: the balance changes (opening, top-ups, usage debits, adjustments), newest
 * first, paged by ?before=<id>; ?tenant_id= and ?kind= filter. */
static void ledger_query(actx_t *a, const char *query) {
    char tenant[32] = "", kind[32] = "", limit[16] = "50", before[32] = "";
    int ht = query_get(query, "tenant_id", tenant, sizeof(tenant));
    int hk = query_get(query, "kind", kind, sizeof(kind));
    int hb = query_get(query, "before", before, sizeof(before));
    query_get(query, "limit", limit, sizeof(limit));
    if ((ht && !is_digits(tenant)) || (hb && !is_digits(before)) || !is_digits(limit) || atoll(limit) < 1 ||
        atoll(limit) > 500) {
        reply_error(a->req, 400, "invalid_request", "tenant_id and before must be ids; limit 1 to 500");
        return;
    }
    if (hk && strcmp(kind, "opening") && strcmp(kind, "topup") && strcmp(kind, "usage") && strcmp(kind, "adjustment")) {
        reply_error(a->req, 400, "invalid_request", "kind must be opening, topup, usage or adjustment");
        return;
    }
    const char *params[4];
    int np = 0;
    tg_buf_t sql;
    tg_buf_init(&sql);
    params[np++] = limit;
    tg_buf_appends(&sql, "WITH page AS (SELECT l.*, t.name AS tenant FROM ledger l JOIN tenants t ON t.id = l.tenant_id "
                         "WHERE true");
    if (ht) {
        params[np++] = tenant;
        tg_buf_printf(&sql, " AND l.tenant_id = $%d::bigint", np);
    }
    if (hk) {
        params[np++] = kind;
        tg_buf_printf(&sql, " AND l.kind = $%d", np);
    }
    if (hb) {
        params[np++] = before;
        tg_buf_printf(&sql, " AND l.id < $%d::bigint", np);
    }
    tg_buf_appends(&sql, " ORDER BY l.id DESC LIMIT $1::int + 1), shown AS (SELECT * FROM page ORDER BY id DESC LIMIT "
                         "$1::int) SELECT json_build_object('data', coalesce((SELECT json_agg(json_build_object('id', id, "
                         "'tenant_id', tenant_id, 'tenant', tenant, 'kind', kind, 'amount', amount, 'request_id', "
                         "request_id, 'note', note, 'created_at', created_at) ORDER BY id DESC) FROM shown), '[]'), "
                         "'has_more', (SELECT count(*) FROM page) > $1::int, 'next_before', (SELECT min(id) FROM shown))");
    run(a, sql.data, np, params, K_PLAIN);
    tg_buf_free(&sql);
}

/* ---- dispatch ------------------------------------------------------------------------ */

static int admin_authorized(tg_request_t *req) {
    const char *token = req->worker->gw->cfg->admin_token;
    if (!token || !*token)
        return 0;
    const tg_str_t *h = tg_request_header(req, "authorization");
    if (!h || h->len < 8 || strncasecmp(h->p, "Bearer ", 7) != 0)
        return 0;
    /* Compare digests so neither the content nor the length leaks through timing. */
    uint8_t a[32], b[32];
    SHA256((const unsigned char *)h->p + 7, h->len - 7, a);
    SHA256((const unsigned char *)token, strlen(token), b);
    return CRYPTO_memcmp(a, b, 32) == 0;
}

void tg_admin_handle(tg_request_t *req, const char *path, const char *query) {
    actx_t *a = calloc(1, sizeof(*a));
    a->req = req;
    snprintf(a->path, sizeof(a->path), "%s", path);
    req->route = TG_ROUTE_ADMIN;
    req->handler_data = a;
    req->abort_cb = admin_abort;
    req->drain_cb = NULL;
    req->finish_cb = admin_finish;
    if (!req->worker->gw->cfg->admin_token) {
        reply_error(req, 403, "admin_disabled", "the admin API is disabled: set admin_token or TOLLGATE_ADMIN_TOKEN");
        return;
    }
    if (!admin_authorized(req) && !tg_ui_authorized(req)) {
        reply_error(req, 401, "invalid_admin_token", "missing or wrong admin token");
        return;
    }
    const char *rest = path + strlen("/admin/api/v1");
    if (*rest == '/')
        rest++;
    char seg[3][256] = {{0}};
    int nseg = 0;
    while (*rest && nseg < 3) {
        const char *slash = strchr(rest, '/');
        size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
        if (n >= sizeof(seg[0]) || n == 0) {
            reply_error(req, 404, "not_found", "unknown admin route");
            return;
        }
        memcpy(seg[nseg], rest, n);
        /* percent-decode ids such as model names with slashes */
        char dec[256];
        size_t o = 0;
        for (size_t i = 0; i < n && o + 1 < sizeof(dec); i++) {
            if (seg[nseg][i] == '%' && i + 2 < n && unhex(seg[nseg][i + 1]) >= 0 && unhex(seg[nseg][i + 2]) >= 0) {
                dec[o++] = (char)(unhex(seg[nseg][i + 1]) << 4 | unhex(seg[nseg][i + 2]));
                i += 2;
            } else {
                dec[o++] = seg[nseg][i];
            }
        }
        dec[o] = '\0';
        memcpy(seg[nseg], dec, o + 1);
        nseg++;
        rest = slash ? slash + 1 : rest + n;
    }
    if (*rest) {
        reply_error(req, 404, "not_found", "unknown admin route");
        return;
    }
    /* HEAD reads like GET; the server sends its head only (tg_response_body). */
    int m = req->method == HTTP_HEAD ? HTTP_GET : req->method;
    if (!strcmp(seg[0], "plugins")) {
        if (nseg == 1 && m == HTTP_GET) {
            char *s = tg_plugins_status_json();
            reply_json(req, 200, s ? s : "{}", s ? strlen(s) : 2);
            free(s);
        } else if (!strcmp(seg[1], "capture") && (nseg == 2 || !strcmp(seg[2], "download")) && m == HTTP_GET) {
            capture_route(req, nseg);
        } else if (nseg == 2 && !strcmp(seg[1], "validate") && m == HTTP_POST) {
            validate_policy(req);
        } else if (nseg == 2 && !strcmp(seg[1], "reload") && m == HTTP_POST) {
            char err[512] = "";
            long gen = tg_plugins_request_reload(err, sizeof(err));
            tg_buf_t b;
            tg_buf_init(&b);
            if (gen > 0) {
                tg_buf_printf(&b, "{\"ok\":true,\"generation\":%ld}", gen);
                reply_json(req, 200, b.data, b.len);
            } else {
                tg_buf_appends(&b, "{\"error\":{\"message\":\"");
                tg_buf_append_json_escaped(&b, err, strlen(err));
                tg_buf_appends(&b, "\",\"type\":\"invalid_request_error\",\"code\":\"reload_failed\"}}");
                reply_json(req, 422, b.data, b.len);
            }
            tg_buf_free(&b);
        } else {
            reply_error(req, 404, "not_found", "unknown admin route");
        }
        return;
    }
    if (!strcmp(seg[0], "policies") || !strcmp(seg[0], "policy-audit")) {
        tg_admin_policies_handle(req, m, seg, nseg, query, &a->pol);
        return;
    }
    if (!strcmp(seg[0], "ledger")) {
        if (m != HTTP_GET)
            reply_error(req, 405, "method_not_allowed", "the ledger is read-only: top up a tenant to add to it");
        else if (nseg == 1)
            ledger_query(a, query);
        else
            reply_error(req, 404, "not_found", "unknown admin route");
        return;
    }
    if (!strcmp(seg[0], "usage")) {
        if (m != HTTP_GET)
            reply_error(req, 405, "method_not_allowed", "usage is read-only");
        else if (nseg == 1)
            usage_query(a, query, 0);
        else if (nseg == 2 && !strcmp(seg[1], "summary"))
            usage_query(a, query, 1);
        else if (nseg == 2 && !strcmp(seg[1], "report"))
            usage_report(a, query);
        else if (nseg == 2 && !strcmp(seg[1], "capacity"))
            usage_capacity(a, query);
        else if (nseg == 2 && !strcmp(seg[1], "export"))
            usage_export(a, query);
        else
            reply_error(req, 404, "not_found", "unknown admin route");
        return;
    }
    const resource_t *r = tg_table_find(seg[0]);
    if (!r) {
        reply_error(req, 404, "not_found", "unknown admin route");
        return;
    }
    a->res = r;
    if (nseg >= 2 && !r->text_id && !is_digits(seg[1])) {
        reply_error(req, 404, "not_found", "ids are numbers");
        return;
    }
    if (nseg == 1) {
        if (m == HTTP_GET)
            list_rows(a, query);
        else if (m == HTTP_POST)
            write_row(a, NULL, 1);
        else
            reply_error(req, 405, "method_not_allowed", "use GET or POST");
    } else if (nseg == 2) {
        if (m == HTTP_GET)
            get_row(a, seg[1]);
        else if (m == HTTP_PATCH || m == HTTP_PUT)
            write_row(a, seg[1], 0);
        else if (m == HTTP_DELETE)
            delete_row(a, seg[1]);
        else
            reply_error(req, 405, "method_not_allowed", "use GET, PATCH or DELETE");
    } else if (nseg == 3 && !strcmp(r->name, "accounts") && !strcmp(seg[2], "test")) {
        if (m == HTTP_POST)
            tg_acctest_start(req, atoll(seg[1]), &a->test);
        else
            reply_error(req, 405, "method_not_allowed", "use POST");
    } else if (nseg == 3 && !strcmp(r->name, "accounts") && !strcmp(seg[2], "quota")) {
        if (m == HTTP_GET)
            account_quota(a, seg[1]);
        else
            reply_error(req, 405, "method_not_allowed", "use GET");
    } else if (nseg == 3 && !strcmp(r->name, "tenants") && !strcmp(seg[2], "topup")) {
        if (m == HTTP_POST)
            topup(a, seg[1]);
        else
            reply_error(req, 405, "method_not_allowed", "use POST");
    } else {
        reply_error(req, 404, "not_found", "unknown admin route");
    }
}
