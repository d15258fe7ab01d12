/*
 * The policy workbench's admin API (see tg_admin_policies.h):
 *
 *   GET  policies                  every plugin and policy: shipped ones (read-only, from
 *                                  the folders) and stored ones (Postgres, with their
 *                                  generation and where they run)
 *   GET  policies/{name}           its source (a stored one: its config, deployment and
 *                                  generations too)
 *   PUT  policies/{name}           {source, config?}: validated as a reload would (size,
 *                                  no bytecode, sandbox, schema, init, a dry call of every
 *                                  hook under the budgets), then stored as a new generation
 *   POST policies/{name}/replay    {capture?}: `tollgate policy test NAME --compare --json`
 *                                  on this gateway's capture (or the lines given), in a
 *                                  child process, its report as the answer
 *   POST policies/{name}/shadow    {group_id, sample?}
 *   POST policies/{name}/promote   {group_id} live for a group; {} live for every request
 *   POST policies/{name}/rollback  the generation before, restored whole
 *   GET  policy-audit              ?name=&limit=: who changed what, when, which generation
 *
 * A change is one call of tg_policy_change (sql/0013_policies.sql) in one transaction;
 * the answer waits until this gateway holds it (written, reloaded: tg_policy_store.h),
 * then "policies:N" tells every other instance.
 */
#include "tollgate/tg_admin_policies.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tollgate/tg_admin_errors.h"
#include "tollgate/tg_capture.h"
#include "tollgate/tg_pg.h"
#include "tollgate/tg_plugin.h"
#include "tollgate/tg_policy_store.h"
#include "tollgate/tg_state.h"
#include "tollgate/tg_worker.h"

#define REPLAY_MAX_OUT (8u << 20)
#define REPLAY_TIMEOUT_MS 30000
#define REPLAY_MAX_CAPTURE (32u << 20)

typedef struct replay_s replay_t;

struct tg_polreq_s {
    tg_request_t *req;
    tg_polreq_t **slot;
    tg_pg_req_t *q;
    tg_policy_wait_t *wait;
    replay_t *replay;
    int list; /* q lists the stored policies (merged with the folders' on answer) */
    char *result;
};

/* A replay's child process: owns itself until its handles are closed, answers its
 * request if that is still there. */
struct replay_s {
    tg_polreq_t *p; /* NULL once the request went away */
    uv_process_t proc;
    uv_pipe_t out, err;
    uv_timer_t timer;
    int open;
    int spawned, exited, eofs;
    int64_t status;
    int timed_out;
    tg_buf_t obuf, ebuf;
    char capture[256];
    int given; /* the lines came in the request, not from the capture file */
};

static void reply_json(tg_request_t *req, int status, const char *body, size_t n) {
    tg_response_send(req, status, "application/json", "Cache-Control: no-store\r\n", body, n);
}

static void reply_error(tg_request_t *req, int status, const char *code, const char *msg) {
    tg_admin_reply_error(req, status, code, NULL, msg);
}

static void polreq_free(tg_polreq_t *p) {
    if (p->slot)
        *p->slot = NULL;
    free(p->result);
    free(p);
}

void tg_admin_policies_abort(tg_polreq_t *p) {
    if (!p)
        return;
    if (p->q)
        tg_pg_cancel(p->q);
    tg_policy_store_cancel(p->wait);
    if (p->replay) {
        p->replay->p = NULL;
        if (!p->replay->exited)
            uv_process_kill(&p->replay->proc, SIGKILL);
    }
    polreq_free(p);
}

/* Answers and lets go: the request is freed with its answer's end. */
static void done(tg_polreq_t *p) {
    p->q = NULL;
    p->wait = NULL;
    p->replay = NULL;
}

static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (!n || n > 63)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '-' || *s == '_'))
            return 0;
    return 1;
}

static tg_pg_t *pg_of(tg_request_t *req) { return tg_state_pg(req->worker->ctx->state); }

/* Who made a change, for the audit list: the name the caller gives in x-tollgate-actor
 * (printable, 64 bytes), then how (console session or token) and from where. */
static void actor_of(tg_request_t *req, char *out, size_t outlen) {
    char who[80] = "admin";
    const tg_str_t *h = tg_request_header(req, "x-tollgate-actor");
    if (h && h->len) {
        size_t o = 0;
        for (size_t i = 0; i < h->len && o < 64; i++)
            who[o++] = h->p[i] >= 32 && h->p[i] < 127 ? h->p[i] : '?';
        who[o] = '\0';
    }
    int console = tg_request_header(req, "authorization") == NULL;
    snprintf(out, outlen, "%s (%s, %s)", who, console ? "console" : "API token", req->client_ip);
}

/* ---- database errors ------------------------------------------------------------------ */

static void reply_pg_failure(tg_request_t *req, const PGresult *res, const char *err) {
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    if (state && msg && !strcmp(state, "P0001"))
        reply_error(req, 409, "policy_conflict", msg);
    else if (state && msg && !strcmp(state, "P0002"))
        reply_error(req, 404, "not_found", msg);
    else if (state && !strcmp(state, "42P01"))
        reply_error(req, 503, "database_unavailable", "the policies tables are missing: run tollgate migrate");
    else if (err && !strcmp(err, "timeout"))
        reply_error(req, 504, "database_timeout", "the database did not answer in time");
    else {
        tg_log_error("admin %s: policies: database error: %s", req->id, err ? err : "?");
        reply_error(req, 503, "database_unavailable", "the database is unavailable");
    }
}

/* ---- reads ---------------------------------------------------------------------------- */

static const char LIST_SQL[] =
    "SELECT coalesce(json_agg(json_build_object('name', p.name, 'generation', p.generation, 'deployed', g.deployed, "
    "'config', g.config, 'sha256', g.sha256, 'updated_by', g.created_by, 'updated_at', p.updated_at) ORDER BY p.name), "
    "'[]') FROM policies p JOIN policy_generations g ON g.name = p.name AND g.generation = p.generation";

static const char GET_SQL[] =
    "SELECT json_build_object('name', p.name, 'shipped', false, 'file', $2::text, 'generation', p.generation, "
    "'source', g.source, 'config', g.config, 'deployed', g.deployed, 'sha256', g.sha256, 'generations', "
    "(SELECT json_agg(json_build_object('generation', x.generation, 'sha256', x.sha256, 'created_by', x.created_by, "
    "'created_at', x.created_at, 'deployed', x.deployed) ORDER BY x.generation DESC) FROM policy_generations x "
    "WHERE x.name = p.name)) FROM policies p JOIN policy_generations g ON g.name = p.name AND g.generation = "
    "p.generation WHERE p.name = $1";

/* The folders' plugins with the stored ones merged in (and stored ones this gateway has
 * not written yet). */
static void answer_list(tg_polreq_t *p, const PGresult *res) {
    char *cat = tg_plugins_catalog_json();
    json_t *all = json_loads(cat ? cat : "[]", 0, NULL), *stored = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
    free(cat);
    json_t *out = json_array();
    size_t i, k;
    json_t *c, *s;
    json_array_foreach(all, i, c) {
        if (json_is_true(json_object_get(c, "shipped")))
            json_array_append(out, c);
    }
    json_array_foreach(stored, k, s) {
        json_t *o = json_deep_copy(s);
        json_object_set_new(o, "kind", json_string("stored"));
        json_object_set_new(o, "shipped", json_false());
        json_array_foreach(all, i, c) {
            if (!json_equal(json_object_get(c, "name"), json_object_get(s, "name")) ||
                json_is_true(json_object_get(c, "shipped")))
                continue;
            json_object_set(o, "file", json_object_get(c, "file"));
            json_object_set(o, "enabled", json_object_get(c, "enabled"));
        }
        json_array_append_new(out, o);
    }
    json_t *root = json_object();
    json_object_set_new(root, "data", out);
    json_object_set_new(root, "synced", json_integer((json_int_t)tg_policy_store_synced()));
    json_object_set_new(root, "store", json_boolean(p->req->worker->ctx->policies != NULL));
    char *text = json_dumps(root, JSON_COMPACT);
    reply_json(p->req, 200, text, strlen(text));
    free(text);
    json_decref(root);
    json_decref(all);
    json_decref(stored);
}

static void read_cb(void *ud, const PGresult *res, const char *err) {
    tg_polreq_t *p = ud;
    tg_request_t *req = p->req;
    int list = p->list;
    done(p);
    if (err)
        reply_pg_failure(req, res, err);
    else if (list)
        answer_list(p, res);
    else if (PQntuples(res) == 0)
        reply_error(req, 404, "not_found", "no such policy");
    else
        reply_json(req, 200, PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0));
}

static void get_policy(tg_polreq_t *p, const char *name) {
    if (tg_plugins_is_shipped(name)) {
        char *s = tg_plugins_source_json(name);
        if (s)
            reply_json(p->req, 200, s, strlen(s));
        else
            reply_error(p->req, 404, "not_found", "no such policy");
        free(s);
        return;
    }
    char file[1100];
    const char *store = p->req->worker->gw->cfg->plugins.store;
    snprintf(file, sizeof(file), "%s/%s.lua", store ? store : "", name);
    const char *params[2] = {name, file};
    p->q = tg_pg_query(pg_of(p->req), GET_SQL, 2, params, read_cb, p);
    if (!p->q)
        reply_error(p->req, 503, "database_unavailable", "the database is unavailable");
}

static void audit_list(tg_polreq_t *p, const char *query) {
    char name[64] = "", limit[8] = "100";
    for (const char *s = query; s && *s;) {
        const char *amp = strchr(s, '&'), *end = amp ? amp : s + strlen(s);
        size_t n = (size_t)(end - s);
        if (n > 5 && !strncmp(s, "name=", 5) && n - 5 < sizeof(name))
            snprintf(name, sizeof(name), "%.*s", (int)(n - 5), s + 5);
        else if (n > 6 && !strncmp(s, "limit=", 6) && n - 6 < sizeof(limit))
            snprintf(limit, sizeof(limit), "%.*s", (int)(n - 6), s + 6);
        s = amp ? amp + 1 : end;
    }
    if ((*name && !valid_name(name)) || strspn(limit, "0123456789") != strlen(limit) || atoi(limit) < 1 ||
        atoi(limit) > 1000) {
        reply_error(p->req, 400, "invalid_request", "name must be a policy name; limit 1 to 1000");
        return;
    }
    const char *params[2] = {name, limit};
    p->q = tg_pg_query(pg_of(p->req),
                       "SELECT json_build_object('data', coalesce(json_agg(json_build_object('id', a.id, 'at', a.at, "
                       "'actor', a.actor, 'action', a.action, 'name', a.name, 'generation', a.generation, "
                       "'from_generation', a.from_generation, 'detail', a.detail) ORDER BY a.id DESC), '[]')) FROM "
                       "(SELECT * FROM policy_audit WHERE $1 = '' OR name = $1 ORDER BY id DESC LIMIT $2::int) a",
                       2, params, read_cb, p);
    if (!p->q)
        reply_error(p->req, 503, "database_unavailable", "the database is unavailable");
}

/* ---- changes -------------------------------------------------------------------------- */

static void synced_cb(void *ud, const char *err) {
    tg_polreq_t *p = ud;
    tg_request_t *req = p->req;
    p->wait = NULL;
    json_t *j = json_loads(p->result, 0, NULL);
    uint64_t seq = (uint64_t)json_integer_value(json_object_get(j, "audit_id"));
    char msg[40];
    snprintf(msg, sizeof(msg), "policies:%llu", (unsigned long long)seq);
    tg_state_publish_invalidation(req->worker->ctx->state, msg);
    char *status = tg_plugins_status_json();
    json_t *st = json_loads(status ? status : "{}", 0, NULL);
    free(status);
    json_t *gen = json_object_get(st, "generation"), *last = json_object_get(st, "last_reload");
    json_object_set_new(j, "serving_generation", gen ? json_incref(gen) : json_null());
    json_object_set_new(j, "last_reload", last ? json_incref(last) : json_null());
    if (err)
        json_object_set_new(j, "sync_error", json_string(err));
    json_decref(st);
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    done(p);
    reply_json(req, 200, text, strlen(text));
    free(text);
}

static void change_cb(void *ud, const PGresult *res, const char *err) {
    tg_polreq_t *p = ud;
    p->q = NULL;
    if (err) {
        tg_request_t *req = p->req;
        done(p);
        reply_pg_failure(req, res, err);
        return;
    }
    p->result = strdup(PQgetvalue(res, 0, 0));
    json_t *j = json_loads(p->result, 0, NULL);
    uint64_t seq = (uint64_t)json_integer_value(json_object_get(j, "audit_id"));
    json_decref(j);
    tg_log_info("admin %s: policy change %llu: %s", p->req->id, (unsigned long long)seq, p->result);
    p->wait = tg_policy_store_sync(p->req->worker->ctx->policies, seq, synced_cb, p);
}

static void change(tg_polreq_t *p, const char *name, const char *action, const char *source, const char *config,
                   const char *group, const char *sample) {
    char actor[200];
    actor_of(p->req, actor, sizeof(actor));
    const char *params[7] = {name, action, source, config, group, sample, actor};
    p->q = tg_pg_query(pg_of(p->req),
                       "SELECT tg_policy_change($1, $2, $3, $4::jsonb, $5::bigint, $6::float8, $7)", 7, params,
                       change_cb, p);
    if (!p->q)
        reply_error(p->req, 503, "database_unavailable", "the database is unavailable");
}

static void reply_invalid(tg_request_t *req, const char *err) {
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_appends(&b, "{\"error\":{\"message\":\"");
    tg_buf_append_json_escaped(&b, err, strlen(err));
    tg_buf_appends(&b, "\",\"type\":\"invalid_request_error\",\"code\":\"policy_invalid\"}}");
    reply_json(req, 422, b.data, b.len);
    tg_buf_free(&b);
}

static void upload(tg_polreq_t *p, const char *name, json_t *body) {
    json_t *src = json_object_get(body, "source"), *conf = json_object_get(body, "config");
    if (!json_is_string(src) || (conf && !json_is_object(conf))) {
        reply_error(p->req, 400, "invalid_request", "expected {\"source\": \"<Lua source>\", \"config\": {...} (optional)}");
        return;
    }
    char err[1024] = "", version[64], hooks[256], *lua = NULL;
    char *conf_text = json_dumps(conf ? conf : json_object(), JSON_COMPACT | JSON_SORT_KEYS);
    int rc = tg_plugins_config_to_lua(conf_text, strlen(conf_text), &lua, err, sizeof(err));
    if (rc == TG_OK)
        rc = tg_plugins_validate_source(name, json_string_value(src), json_string_length(src), lua, version, hooks, err,
                                        sizeof(err));
    free(lua);
    if (rc != TG_OK)
        reply_invalid(p->req, err);
    else
        change(p, name, "upload", json_string_value(src), conf_text, NULL, NULL);
    free(conf_text);
}

static void deploy(tg_polreq_t *p, const char *name, const char *action, json_t *body) {
    json_t *g = json_object_get(body, "group_id"), *sample = json_object_get(body, "sample");
    if ((g && !json_is_integer(g)) || (sample && (!json_is_number(sample) || json_number_value(sample) <= 0 ||
                                                  json_number_value(sample) > 1 || strcmp(action, "shadow")))) {
        reply_error(p->req, 400, "invalid_request",
                    "expected {\"group_id\": <id>} (shadow: and \"sample\": a share above 0, at most 1)");
        return;
    }
    char gid[24] = "", smp[32] = "";
    if (g)
        snprintf(gid, sizeof(gid), "%lld", (long long)json_integer_value(g));
    if (sample)
        snprintf(smp, sizeof(smp), "%.6g", json_number_value(sample));
    if (!g && !strcmp(action, "promote")) {
        /* Live for every request: the whole list must load as a reload would load it. */
        char err[1024] = "", *lua = tg_policy_store_config_lua(name);
        tg_plugin_enable_t e = {(char *)name, lua ? lua : "{}"};
        int rc = lua ? tg_plugins_check_fleet(&e, 1, err, sizeof(err)) : TG_OK;
        free(lua);
        if (rc != TG_OK) {
            reply_invalid(p->req, err);
            return;
        }
    }
    change(p, name, action, NULL, NULL, g ? gid : NULL, sample ? smp : NULL);
}

/* ---- replay --------------------------------------------------------------------------- */

static void replay_closed(uv_handle_t *h) {
    replay_t *r = h->data;
    if (--r->open > 0)
        return;
    unlink(r->capture);
    tg_buf_free(&r->obuf);
    tg_buf_free(&r->ebuf);
    free(r);
}

static void replay_finish(replay_t *r) {
    if (!r->exited || r->eofs < 2)
        return;
    if (r->p) {
        tg_polreq_t *p = r->p;
        tg_request_t *req = p->req;
        r->p = NULL;
        done(p);
        json_t *rep = r->obuf.len ? json_loadb(r->obuf.data, r->obuf.len, 0, NULL) : NULL;
        if (r->timed_out) {
            reply_error(req, 504, "replay_timeout", "the replay ran longer than 30 s and was stopped");
        } else if (json_is_object(rep) && r->status != 2) {
            json_object_set_new(rep, "exit", json_integer(r->status));
            json_object_set_new(rep, "requests_file", json_string(r->given ? "the request's capture" : "capture.jsonl"));
            char *text = json_dumps(rep, JSON_COMPACT);
            reply_json(req, 200, text, strlen(text));
            free(text);
        } else {
            char msg[1024];
            snprintf(msg, sizeof(msg), "%.*s", (int)TG_MIN(r->ebuf.len, sizeof(msg) - 1),
                     r->ebuf.data ? r->ebuf.data : "the replay failed");
            msg[strcspn(msg, "\n")] = '\0';
            reply_error(req, 422, "replay_failed", msg);
        }
        json_decref(rep);
    }
    uv_close((uv_handle_t *)&r->timer, replay_closed);
    uv_close((uv_handle_t *)&r->proc, replay_closed);
}

static void replay_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    TG_UNUSED(h);
    buf->base = malloc(suggested);
    buf->len = suggested;
}

static void replay_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
    replay_t *r = s->data;
    tg_buf_t *b = s == (uv_stream_t *)&r->out ? &r->obuf : &r->ebuf;
    if (n > 0 && b->len + (size_t)n <= REPLAY_MAX_OUT)
        tg_buf_append(b, buf->base, (size_t)n);
    free(buf->base);
    if (n < 0) {
        uv_read_stop(s);
        uv_close((uv_handle_t *)s, replay_closed);
        r->eofs++;
        replay_finish(r);
    }
}

static void replay_exit(uv_process_t *proc, int64_t status, int sig) {
    replay_t *r = proc->data;
    r->exited = 1;
    r->status = sig ? -sig : status;
    uv_timer_stop(&r->timer);
    replay_finish(r);
}

static void replay_timeout(uv_timer_t *t) {
    replay_t *r = t->data;
    r->timed_out = 1;
    uv_process_kill(&r->proc, SIGKILL);
}

static void replay(tg_polreq_t *p, const char *name, json_t *body) {
    tg_request_t *req = p->req;
    json_t *given = json_object_get(body, "capture");
    if (given && !json_is_string(given)) {
        reply_error(req, 400, "invalid_request", "capture: expected the capture's JSON lines as a string");
        return;
    }
    char *buf = NULL, err[256] = "";
    size_t n = 0;
    if (given) {
        n = json_string_length(given);
        buf = malloc(n + 1);
        memcpy(buf, json_string_value(given), n);
    } else {
        int rc = tg_capture_read(REPLAY_MAX_CAPTURE, &buf, &n, err, sizeof(err));
        if (rc == TG_DECLINED) {
            reply_error(req, 404, "capture_off",
                        "the capture is off: set plugins.capture.rate in the config, or give the lines as \"capture\"");
            return;
        }
        if (rc != TG_OK) {
            reply_error(req, 503, "capture_unreadable", err);
            return;
        }
    }
    if (!n) {
        free(buf);
        reply_error(req, 409, "capture_empty", "the capture holds no request yet: send traffic, then replay");
        return;
    }
    replay_t *r = calloc(1, sizeof(*r));
    r->given = given != NULL;
    const char *tmp = getenv("TMPDIR");
    snprintf(r->capture, sizeof(r->capture), "%s/tollgate-replay-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(r->capture);
    int bad = fd < 0 || write(fd, buf, n) != (ssize_t)n;
    if (fd >= 0)
        close(fd);
    free(buf);
    if (bad) {
        if (fd >= 0)
            unlink(r->capture);
        free(r);
        reply_error(req, 503, "capture_unreadable", "the capture could not be written for the replay");
        return;
    }
    const tg_config_t *cfg = req->worker->gw->cfg;
    char exe[1024];
    size_t exelen = sizeof(exe);
    tg_buf_t dirs;
    tg_buf_init(&dirs);
    for (size_t i = 0; i < cfg->plugins.ndirs; i++)
        tg_buf_printf(&dirs, "%s%s", i ? "," : "", cfg->plugins.dirs[i]);
    char *conf = tg_plugins_is_shipped(name) ? NULL : tg_policy_store_config_lua(name);
    char *args[16] = {exe, "policy", "test", (char *)name, "--dirs", dirs.data ? dirs.data : "", "--requests",
                      r->capture, "--compare", "--json", NULL};
    if (conf) {
        args[10] = "--config";
        args[11] = conf;
    }
    uv_stdio_container_t io[3] = {{.flags = UV_IGNORE},
                                  {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&r->out},
                                  {.flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE, .data.stream = (uv_stream_t *)&r->err}};
    uv_process_options_t opt = {.file = exe, .args = args, .exit_cb = replay_exit, .stdio = io, .stdio_count = 3};
    uv_loop_t *loop = &req->worker->loop;
    uv_pipe_init(loop, &r->out, 0);
    uv_pipe_init(loop, &r->err, 0);
    uv_timer_init(loop, &r->timer);
    r->out.data = r->err.data = r->timer.data = r->proc.data = r;
    r->open = 4;
    int rc = uv_exepath(exe, &exelen);
    if (rc == 0) {
        r->spawned = 1;
        rc = uv_spawn(loop, &r->proc, &opt);
    }
    tg_buf_free(&dirs);
    free(conf);
    if (rc != 0) {
        tg_log_error("admin %s: replay: cannot start %s: %s", req->id, exe, uv_strerror(rc));
        reply_error(req, 503, "replay_failed", "the replay could not be started");
        r->open = 3 + r->spawned; /* a failed spawn's handle is closed too */
        if (r->spawned)
            uv_close((uv_handle_t *)&r->proc, replay_closed);
        uv_close((uv_handle_t *)&r->out, replay_closed);
        uv_close((uv_handle_t *)&r->err, replay_closed);
        uv_close((uv_handle_t *)&r->timer, replay_closed);
        return;
    }
    r->p = p;
    p->replay = r;
    uv_read_start((uv_stream_t *)&r->out, replay_alloc, replay_read);
    uv_read_start((uv_stream_t *)&r->err, replay_alloc, replay_read);
    uv_timer_start(&r->timer, replay_timeout, REPLAY_TIMEOUT_MS, 0);
}

/* ---- dispatch ------------------------------------------------------------------------- */

void tg_admin_policies_handle(tg_request_t *req, int m, char (*seg)[256], int nseg, const char *query,
                              tg_polreq_t **slot) {
    tg_polreq_t *p = calloc(1, sizeof(*p));
    p->req = req;
    p->slot = slot;
    *slot = p;
    if (!req->worker->ctx->policies || !pg_of(req)) {
        reply_error(req, 404, "workbench_off",
                    "the policy workbench is off: set plugins.store (a folder the gateway owns) and postgres in the config");
        return;
    }
    if (!strcmp(seg[0], "policy-audit")) {
        if (nseg != 1)
            reply_error(req, 404, "not_found", "unknown admin route");
        else if (m != HTTP_GET)
            reply_error(req, 405, "method_not_allowed", "the audit list is read-only");
        else
            audit_list(p, query);
        return;
    }
    if (nseg == 1) {
        if (m != HTTP_GET) {
            reply_error(req, 405, "method_not_allowed", "use GET (PUT policies/{name} uploads one)");
            return;
        }
        p->list = 1;
        p->q = tg_pg_query(pg_of(req), LIST_SQL, 0, NULL, read_cb, p);
        if (!p->q)
            reply_error(req, 503, "database_unavailable", "the database is unavailable");
        return;
    }
    const char *name = seg[1];
    if (!valid_name(name)) {
        reply_error(req, 400, "invalid_request", "name: a policy name holds only a-z, 0-9, - and _ (at most 63)");
        return;
    }
    if (nseg == 2 && m == HTTP_GET) {
        get_policy(p, name);
        return;
    }
    if ((nseg == 2 && m != HTTP_PUT) || (nseg == 3 && m != HTTP_POST)) {
        reply_error(req, 405, "method_not_allowed", nseg == 2 ? "use GET or PUT" : "use POST");
        return;
    }
    if (nseg == 3 && strcmp(seg[2], "replay") && strcmp(seg[2], "shadow") && strcmp(seg[2], "promote") &&
        strcmp(seg[2], "rollback")) {
        reply_error(req, 404, "not_found", "unknown admin route");
        return;
    }
    json_error_t jerr;
    /* NUL bytes are let through to be refused in words (bytecode holds them). */
    json_t *body = req->body.len ? json_loadb(req->body.data, req->body.len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
                                              &jerr)
                                 : json_object();
    if (!json_is_object(body)) {
        reply_error(req, 400, "invalid_json", "the body must be a JSON object");
    } else if (nseg == 3 && !strcmp(seg[2], "replay")) {
        replay(p, name, body);
    } else if (tg_plugins_is_shipped(name)) {
        reply_error(req, 409, "read_only",
                    "a shipped plugin or policy is read-only here: upload your own under another name (edit the files "
                    "in the folder and reload to change a shipped one)");
    } else if (nseg == 2) {
        upload(p, name, body);
    } else {
        deploy(p, name, seg[2], body);
    }
    json_decref(body);
}
