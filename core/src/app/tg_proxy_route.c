/*
 * Where an attempt goes (tg_proxy.c runs these phases) and what happens when it fails:
 *
 *   sticky   a conversation's bound account, read from Redis
 *   select   the key's group's accounts in order of preference (tg_select, then the
 *            select_account hook), or the config file's static upstream
 *   (admit, tg_proxy_admit.c, runs here: its script takes the first account's slot
 *            too, tg__slot_with_admission)
 *   slot     the first account in that order whose concurrency slot is free (a Redis
 *            lease, renewed while the call runs): the early answer, or asked now; all
 *            full: wait, bounded
 *
 *   tg__maybe_retry  the one place that decides a retry after a failed attempt
 *            (tg_proxy_relay.c calls it): health and cooldown, the on_upstream_error
 *            hook or the default, the failed attempt's hold returned, the attempt state
 *            zeroed and the pipeline resumed at select
 */
#include <stdio.h>
#include <stdlib.h>

#include "tg_proxy_internal.h"

static void cleanup_sticky(proxy_req_t *p) {
    if (p->sticky_rq)
        tg_redis_cancel(p->sticky_rq);
}

void tg__cleanup_snapshot(proxy_req_t *p) { tg_snapshot_release(p->snap); }

/* ---- phase: sticky ------------------------------------------------------------------ */

/*
 * A conversation stays on the account that holds its prompt cache. The binding's source,
 * first found: the x-session-id header, the body's prompt_cache_key (chat and the
 * Responses API), previous_response_id, Anthropic's metadata.user_id, the prefix a
 * client marked for caching (tools, system and messages up to the last cache_control
 * block: what the provider caches), or — for a conversation of three messages or more —
 * the hash of its first two messages (the same opening means the same conversation).
 * The binding lives in Redis for an hour and is left at once when the bound account is
 * cooling, saturated, failing (error EWMA ≥ 0.5), slow (TTFT EWMA over 30 s) or spent
 * (its provider said so). The first answer binds (SET NX), so requests of one
 * conversation that start together, on any instance, converge on one account; an
 * answer from another account than the bound one (it was left) moves the binding.
 */
static void sticky_got(void *ud, redisReply *r, const char *err) {
    proxy_req_t *p = ud;
    p->sticky_rq = NULL;
    if (!err && r && r->type == REDIS_REPLY_STRING)
        p->sticky_account = atoll(r->str);
    tg__proxy_run(p);
}

/* A block (or an array of blocks) that carries cache_control. */
static int marked(json_t *v) {
    if (json_is_object(v))
        return json_object_get(v, "cache_control") != NULL;
    size_t i;
    json_t *b;
    json_array_foreach(v, i, b) {
        if (json_is_object(b) && json_object_get(b, "cache_control"))
            return 1;
    }
    return 0;
}

static void append_dump(tg_buf_t *src, json_t *v) {
    char *m = tg_json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    if (m)
        tg_buf_appends(src, m);
    free(m);
}

/* The prefix the client marked for the provider's prompt cache (Anthropic's order:
 * tools, system, messages), up to its last cache_control; 0 when nothing is marked. */
static int cache_prefix(json_t *root, tg_buf_t *src) {
    json_t *tools = json_object_get(root, "tools"), *sys = json_object_get(root, "system");
    json_t *msgs = json_object_get(root, "messages");
    size_t last = 0, i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (json_is_object(m) && marked(json_object_get(m, "content")))
            last = i + 1;
    }
    int sys_marked = marked(sys), tools_marked = marked(tools);
    if (!last && !sys_marked && !tools_marked)
        return 0;
    tg_buf_appends(src, "p:");
    append_dump(src, tools ? tools : json_null());
    if (last || sys_marked)
        append_dump(src, sys ? sys : json_null());
    for (i = 0; i + 1 < last; i++)
        append_dump(src, json_array_get(msgs, i));
    if (last) {
        /* The last marked message up to its last marked block: what follows it (the new
         * question) is not part of the cached prefix. */
        json_t *lm = json_array_get(msgs, last - 1), *content = json_object_get(lm, "content"), *b;
        size_t upto = 0, k;
        json_array_foreach(content, k, b) {
            if (json_is_object(b) && json_object_get(b, "cache_control"))
                upto = k + 1;
        }
        append_dump(src, json_object_get(lm, "role"));
        for (k = 0; k < upto; k++)
            append_dump(src, json_array_get(content, k));
    }
    return 1;
}

int tg__phase_sticky(proxy_req_t *p) {
    if (p->trace)
        tg__trace_select_start(p);
    const tg_principal_t *pr = p->principal;
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (!pr || !pr->group_id || !redis || !p->parsed || p->attempt > 1)
        return TG_OK;
    const tg_str_t *h = tg_request_header(p->req, "x-session-id");
    int header = h && h->len;
    if (!header && !p->json && !p->scan_sticky)
        return TG_OK; /* the body's scan found nothing to key on (parse_scanned) */
    if (!header)
        tg__proxy_json(p);
    tg_buf_t src;
    tg_buf_init(&src);
    json_t *pck = json_object_get(p->json, "prompt_cache_key");
    json_t *prev = json_object_get(p->json, "previous_response_id");
    json_t *msgs = json_object_get(p->json, "messages");
    json_t *meta = json_object_get(p->json, "metadata");
    json_t *uid = json_is_object(meta) ? json_object_get(meta, "user_id") : NULL;
    if (header) {
        tg_buf_appends(&src, "s:");
        tg_buf_append(&src, h->p, TG_MIN(h->len, (size_t)256));
    } else if (json_is_string(pck)) {
        tg_buf_appends(&src, "c:");
        tg_buf_appends(&src, json_string_value(pck));
    } else if (json_is_string(prev)) {
        tg_buf_appends(&src, "r:");
        tg_buf_appends(&src, json_string_value(prev));
    } else if (json_is_string(uid) && json_string_length(uid)) {
        tg_buf_appends(&src, "u:");
        tg_buf_append(&src, json_string_value(uid), TG_MIN(json_string_length(uid), (size_t)256));
    } else if (cache_prefix(p->json, &src)) {
        /* src holds the marked prefix */
    } else if (json_is_array(msgs) && json_array_size(msgs) >= 3) {
        /* A continued conversation (its opening plus an answer and a new turn). */
        for (size_t i = 0; i < 2; i++)
            append_dump(&src, json_array_get(msgs, i));
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
    tg__cleanup_add(p, cleanup_sticky);
    return p->sticky_rq ? TG_AGAIN : TG_OK;
}

void tg__sticky_bind(proxy_req_t *p) {
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (!p->sticky_key[0] || !p->at.account || !redis)
        return;
    char id[24];
    tg_fmt_i64z(id, p->at.account->id);
    if (p->sticky_account == p->at.account->id) {
        const char *argv[3] = {"EXPIRE", p->sticky_key, "3600"};
        tg_redis_command(redis, NULL, NULL, 3, argv, NULL);
        return;
    }
    /* Unbound: the first answer binds (NX); bound elsewhere: the conversation moved. */
    const char *argv[6] = {"SET", p->sticky_key, id, "EX", "3600", "NX"};
    tg_redis_command(redis, NULL, NULL, p->sticky_account ? 5 : 6, argv, NULL);
}

/* ---- phase: select ------------------------------------------------------------------ */

static int was_tried(const proxy_req_t *p, int64_t id) {
    for (int i = 0; i < p->ntried; i++)
        if (p->tried[i] == id)
            return 1;
    return 0;
}

/* What the upstream speaks: an Anthropic account speaks Messages, a Gemini one
 * generateContent, a Vertex one Messages for a Claude model (rawPredict) and
 * generateContent for the others, an Azure one chat completions (and embeddings); an OpenAI one speaks the client's OpenAI protocol, or chat
 * completions for an Anthropic client. */
static tg_proto_t upstream_proto(const proxy_req_t *p, const char *provider, const char *model) {
    if (!strcmp(provider, "vertex")) /* Claude through rawPredict, else Gemini's generateContent */
        return model && !strncmp(model, "claude", 6) ? TG_PROTO_ANTHROPIC : TG_PROTO_GEMINI;
    if (!strcmp(provider, "anthropic") || !strcmp(provider, "bedrock")) /* Bedrock: Anthropic models */
        return TG_PROTO_ANTHROPIC;
    if (!strcmp(provider, "gemini"))
        return TG_PROTO_GEMINI;
    if (!strcmp(provider, "azure")) /* chat completions and embeddings per deployment */
        return p->proto == TG_PROTO_EMBEDDINGS ? TG_PROTO_EMBEDDINGS : TG_PROTO_OPENAI_CHAT;
    return p->proto == TG_PROTO_ANTHROPIC ? TG_PROTO_OPENAI_CHAT : p->proto;
}

/* The request's token estimate for the quota check: the limiter's when it made one,
 * else the prompt's bytes / 4. */
static int64_t quota_estimate(const proxy_req_t *p) {
    return p->est_tokens > 0 ? p->est_tokens : (int64_t)(p->req->body.len / 4) + 1;
}

/* Fills p->order through tg_select (the default order, no plugin) and returns how many. */
static int select_order(proxy_req_t *p, tg_select_t *q, int *sticky, int *quota_skipped) {
    *q = (tg_select_t){
        .group_id = p->principal->group_id,
        .model = p->req->route == TG_ROUTE_MODELS ? "" : p->model,
        .now_ms = (int64_t)tg_wall_ms(),
        .openai_only = p->proto == TG_PROTO_EMBEDDINGS, /* embeddings are not translated */
        .avoid = p->retry_other ? p->tried : NULL,
        .navoid = p->retry_other ? p->ntried : 0,
        .sticky = p->attempt == 1 ? p->sticky_account : 0,
        .est_tokens = quota_estimate(p),
        .quota_stale_ms = p->req->worker->gw->cfg->routing.quota_stale_ms,
        .quota_skipped = quota_skipped,
    };
    return tg_select(p->snap, p->pw->ctx->health, q, p->order, (int)(sizeof(p->order) / sizeof(p->order[0])), sticky);
}

int tg__phase_select(proxy_req_t *p) {
    if (p->trace)
        tg__trace_select_start(p);
    const tg_principal_t *pr = p->principal;
    proxy_worker_t *pw = p->pw;
    if (p->req->route == TG_ROUTE_MODELS)
        return tg__models_list(p);
    if (!pr || !pr->group_id || !pw->ctx->accounts) {
        p->at.up = pw->ctx->upstream;
        p->at.credential = p->req->worker->gw->cfg->upstream.api_key;
        p->at.up_proto = upstream_proto(p, p->req->worker->gw->cfg->upstream.provider, p->model);
        if (p->proto == TG_PROTO_EMBEDDINGS && p->at.up_proto != TG_PROTO_EMBEDDINGS)
            return tg__proxy_fail(p, 400, "invalid_request_error", "unsupported", "embeddings need an OpenAI upstream");
        if (!p->at.up)
            return tg__proxy_fail(p, 502, "upstream_error", "upstream_unreachable", "no upstream is configured");
        return TG_OK;
    }
    if (!p->snap && (p->snap = tg_accounts_snapshot(pw->ctx->accounts)) != NULL)
        tg__cleanup_add(p, tg__cleanup_snapshot);
    if (!p->snap) {
        /* Just started: the first snapshot is on its way; wait for it (up to 3 s). */
        if (tg_now_ns() - p->req->start_ns < 3000000000ull) {
            return tg__run_phase_later(p, PH_SELECT, 20);
        }
        return tg__proxy_fail(p, 503, "server_error", "accounts_unavailable", "the account pool is not loaded yet; try again");
    }
    if (p->attempt == 1)
        tg__estimate_tokens(p); /* the learned quotas weigh the admission's estimate */
    /* The accounts to try, best first: a bounded sample of the group (tg_select.h). */
    int sticky = 0, skips = 0;
    tg_select_t q;
    int n = select_order(p, &q, &sticky, &skips);
    if (skips)
        atomic_fetch_add_explicit(&p->req->worker->metrics.quota_skips, (uint64_t)skips, memory_order_relaxed);
    if (p->attempt == 1 && p->sticky_account)
        atomic_fetch_add_explicit(&p->req->worker->metrics.sticky_bound, 1, memory_order_relaxed);
    if (n == 0) {
        char msg[256];
        snprintf(msg, sizeof(msg), "no upstream account of this key's group can serve model \"%s\" right now", q.model);
        return tg__proxy_fail(p, 503, "server_error", "no_account_available", msg);
    }
    tg_plugins_t *pl = pw->ctx->plugins;
    int hook = !sticky && p->ctx_on && tg_plugins_has_hook(pl, &p->ctx, TG_HOOK_SELECT_ACCOUNT);
    const tg_account_t *builtin = p->order[0];
    if (hook || p->cap) {
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
            fa->trial = tg_health_trial_due(e, q.now_ms);
            fa->headroom = fa->window_left = fa->window_reset_in_ms = -1;
            const tg_quota_t *qt = e->quota ? tg_health_quota(e, q.now_ms, q.quota_stale_ms) : NULL;
            if (qt) {
                /* What the provider said wins over the operator's reset_at. */
                double reset;
                fa->headroom = tg_quota_headroom(qt, q.now_ms, &reset);
                if (reset >= 0)
                    fa->reset_in_ms = reset;
                tg_quota_window_soonest(qt, q.now_ms, &fa->window_left, &fa->window_reset_in_ms);
            }
        }
        p->ctx.accounts = p->accts;
        p->ctx.naccounts = n;
        p->ctx.selected = -1;
        if (p->cap)
            tg__capture_accounts(p, n, sticky);
    }
    if (hook) {
        /* A due trial goes first whatever the plugins pick (tg_plugins_run). */
        if (tg__hook(p, TG_HOOK_SELECT_ACCOUNT) == TG_DONE)
            return tg__plugin_reject(p);
        if (p->ctx.selected > 0 && p->ctx.selected < n) {
            const tg_account_t *chosen = p->order[p->ctx.selected];
            memmove(&p->order[1], &p->order[0], (size_t)p->ctx.selected * sizeof(p->order[0]));
            p->order[0] = chosen;
        }
    }
    if (p->cap)
        tg__capture_select(p, sticky ? "sticky" : hook && p->ctx.decided ? "plugin" : "builtin", builtin);
    p->norder = n;
    p->next_order = 0;
    return TG_OK;
}

/* ---- learned quota ------------------------------------------------------------------ */

/* The fleet's copy of an account's learned quota: {a:<id>}:quota (the account's hash
 * tag, beside its slot set), the text of tg_quota_encode, expiring after
 * routing.quota_stale_ms. Written fire-and-forget (nothing waits for the reply) at most
 * once a second per account per worker, or at once when the account became spent, so a
 * busy account costs one SET per second per worker rather than one per request. */
static void quota_share(proxy_req_t *p, tg_health_entry_t *e, int64_t now, int urgent) {
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (!redis || (!urgent && now - e->quota_shared_ms < 1000))
        return;
    char key[48], text[TG_QUOTA_TEXT_MAX], px[16];
    size_t n = tg_quota_encode(e->quota, text, sizeof(text));
    if (!n)
        return;
    e->quota_shared_ms = now;
    snprintf(key, sizeof(key), "{a:%lld}:quota", (long long)e->account_id);
    snprintf(px, sizeof(px), "%d", p->req->worker->gw->cfg->routing.quota_stale_ms);
    const char *argv[5] = {"SET", key, text, "PX", px};
    size_t lens[5] = {3, strlen(key), n, 2, strlen(px)};
    tg_redis_command(redis, NULL, NULL, 5, argv, lens);
    atomic_fetch_add_explicit(&p->req->worker->metrics.quota_shared, 1, memory_order_relaxed);
}

void tg__quota_learn(proxy_req_t *p, int status, const char *lines, const char *body, size_t body_len) {
    if (!p->at.account)
        return;
    int64_t now = (int64_t)tg_wall_ms();
    tg_quota_t q;
    tg_quota_init(&q, now);
    if (lines && *lines)
        tg_quota_parse_headers(&q, lines, strlen(lines), now);
    if (body && body_len)
        tg_quota_parse_error(&q, body, body_len, now);
    tg_metrics_t *m = &p->req->worker->metrics;
    if (q.malformed)
        atomic_fetch_add_explicit(&m->quota_malformed, (uint64_t)q.malformed, memory_order_relaxed);
    tg_health_entry_t *e = tg_health_get(p->pw->ctx->health, p->at.account->id);
    if (!q.known) {
        /* An answer that says nothing of the quota still says the account served it. */
        if (status < 400 && e->quota)
            e->quota->blocked_until_ms = 0;
        return;
    }
    atomic_fetch_add_explicit(&m->quota_values, (uint64_t)q.known, memory_order_relaxed);
    int was = e->quota && tg_quota_blocked_until(e->quota, now, 1) != 0;
    tg_health_learn(e, &q);
    if (status < 400 && !q.blocked_until_ms)
        e->quota->blocked_until_ms = 0;
    int is = tg_quota_blocked_until(e->quota, now, 1) != 0;
    quota_share(p, e, now, is && !was);
}

/* The fleet's copy, read when this worker's own is older than a second, in the same
 * pipeline as the account's slot (so no round trip of its own): newer than what this
 * worker has, it replaces it, and slot_got then sees a spent account before using it. */
static void quota_got(void *ud, redisReply *r, const char *err) {
    proxy_req_t *p = ud;
    p->quota_rq = NULL;
    if (err || !r || r->type != REDIS_REPLY_STRING || p->next_order >= p->norder)
        return;
    tg_quota_t q;
    if (!tg_quota_decode(&q, r->str, r->len))
        return;
    tg_health_entry_t *e = tg_health_get(p->pw->ctx->health, p->order[p->next_order]->id);
    if (!e->quota || q.at_ms > e->quota->at_ms) {
        if (!e->quota)
            tg_health_learn(e, &q);
        *e->quota = q;
    }
}

static void quota_read(proxy_req_t *p, tg_redis_t *redis, tg_health_entry_t *e) {
    int64_t now = (int64_t)tg_wall_ms();
    if (p->quota_rq || (e->quota && now - e->quota->at_ms < 1000) || now - e->quota_read_ms < 1000)
        return;
    e->quota_read_ms = now;
    char key[48];
    snprintf(key, sizeof(key), "{a:%lld}:quota", (long long)e->account_id);
    const char *argv[2] = {"GET", key};
    p->quota_rq = tg_redis_command(redis, quota_got, p, 2, argv, NULL);
}

/* ---- phase: slot -------------------------------------------------------------------- */

static void use_account(proxy_req_t *p, const tg_account_t *acc) {
    p->at.account = acc;
    if (p->attempt == 1 && p->sticky_account == acc->id)
        atomic_fetch_add_explicit(&p->req->worker->metrics.sticky_kept, 1, memory_order_relaxed);
    tg_health_get(p->pw->ctx->health, acc->id)->picks += 1;
    p->at.up_proto = upstream_proto(p, acc->provider, tg_account_map_model(acc, p->model));
    p->at.up = acc->upstream;
    p->at.credential = acc->credential;
    if (p->parsed) {
        /* The tree holds p->model unless the account maps it: only then is it built and
         * changed. */
        const char *mapped = tg_account_map_model(acc, p->model);
        if (strcmp(mapped, p->model) != 0 && tg__proxy_json(p)) {
            json_object_set_new(p->json, "model", json_string(mapped));
            p->json_dirty |= DIRTY_MODEL;
        } else if (p->json) {
            json_object_set_new(p->json, "model", json_string(mapped));
        }
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
        tg_fmt_key(key, sizeof(key), "{a:", p->slot_account, "}:conc");
        /* A command, not a script: one ZREM gains nothing from EVALSHA's cost. */
        const char *argv[3] = {"ZREM", key, p->req->id};
        tg_redis_command(redis, NULL, NULL, 3, argv, NULL);
    }
    p->slot_account = 0;
}

/* The account slot: the lookup in flight, the lease, its renewal timer. A slot asked
 * for and not answered yet is given back too: the script may run all the same, and a ZREM
 * sent behind it on the same connection removes what it adds. */
static void cleanup_slot(proxy_req_t *p) {
    if (p->quota_rq)
        tg_redis_cancel(p->quota_rq);
    p->quota_rq = NULL;
    if (p->slot_rq) {
        tg_redis_cancel(p->slot_rq);
        p->slot_rq = NULL;
        if (!p->slot_account)
            p->slot_account = p->slot_asking;
    }
    slot_release(p);
    if (p->slot_timer)
        uv_close((uv_handle_t *)p->slot_timer, (uv_close_cb)free);
}

static int slot_try(proxy_req_t *p);

static void slot_renew_cb(uv_timer_t *t) {
    proxy_req_t *p = t->data;
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (!p->slot_account || !redis)
        return;
    char key[64], ttl[16];
    tg_fmt_key(key, sizeof(key), "{a:", p->slot_account, "}:conc");
    tg_fmt_key(ttl, sizeof(ttl), "", p->req->worker->gw->cfg->limiter.lease_ttl_ms, "");
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

/* Redis's answer to the slot script: 1 taken, 0 full, -1 none (the store is down). */
static int slot_reply(const redisReply *r, const char *err) {
    return err || !r || r->type != REDIS_REPLY_INTEGER ? -1 : r->integer == 1;
}

/* Acts on the answer for p->order[p->next_order]: TG_OK when the attempt has its
 * account, else what slot_try returns for the next one. */
static int slot_answer(proxy_req_t *p, int answer) {
    const tg_account_t *acc = p->order[p->next_order];
    if (answer < 0) {
        /* The slot store is down: the account's own limit is enforced per worker only. */
        use_account(p, acc);
        return TG_OK;
    }
    if (answer == 1) {
        p->slot_account = acc->id;
        tg_health_entry_t *e = tg_health_get(p->pw->ctx->health, acc->id);
        if (e->quota && p->next_order + 1 < p->norder) {
            /* The fleet's copy (read with the slot) may say the account is spent. */
            tg_select_t q = {.now_ms = (int64_t)tg_wall_ms(), .est_tokens = quota_estimate(p),
                             .quota_stale_ms = p->req->worker->gw->cfg->routing.quota_stale_ms};
            const tg_quota_t *qt = tg_health_quota(e, q.now_ms, q.quota_stale_ms);
            if (qt && tg_quota_blocked_until(qt, q.now_ms, q.est_tokens)) {
                atomic_fetch_add_explicit(&p->req->worker->metrics.quota_skips, 1, memory_order_relaxed);
                slot_release(p);
                p->next_order++;
                return slot_try(p);
            }
        }
        slot_renew_start(p);
        use_account(p, acc);
        return TG_OK;
    }
    p->next_order++;
    return slot_try(p);
}

static void slot_got(void *ud, redisReply *r, const char *err) {
    proxy_req_t *p = ud;
    p->slot_rq = NULL;
    if (slot_answer(p, slot_reply(r, err)) == TG_OK)
        tg__proxy_run(p);
}

/* Sends the slot script for `acc` (with the read of its learned quota). */
static tg_redis_req_t *slot_ask(proxy_req_t *p, tg_redis_t *redis, const tg_account_t *acc, tg_redis_cb cb) {
    char key[64], limit[16], ttl[16];
    tg_fmt_key(key, sizeof(key), "{a:", acc->id, "}:conc");
    tg_fmt_key(limit, sizeof(limit), "", acc->concurrency, "");
    tg_fmt_key(ttl, sizeof(ttl), "", p->req->worker->gw->cfg->limiter.lease_ttl_ms, "");
    const char *argv[4] = {key, p->req->id, limit, ttl};
    quota_read(p, redis, tg_health_get(p->pw->ctx->health, acc->id));
    p->slot_asking = acc->id;
    return tg_redis_eval(redis, p->pw->slot_script, 1, 4, argv, NULL, cb, p);
}

/* The first account's slot is free in this worker's count: 1, or 0 after skipping the
 * full ones; -1 when every account is (phase slot waits). */
static int slot_next_free(proxy_req_t *p) {
    while (p->next_order < p->norder) {
        const tg_account_t *acc = p->order[p->next_order];
        if (acc->concurrency <= 0 || tg_health_get(p->pw->ctx->health, acc->id)->inflight < acc->concurrency)
            return 1;
        p->next_order++;
    }
    return -1;
}

/* Takes the first account in order whose slot is free. TG_AGAIN while asking Redis. */
static int slot_try(proxy_req_t *p) {
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (slot_next_free(p) > 0) {
        const tg_account_t *acc = p->order[p->next_order];
        if (acc->concurrency <= 0 || !redis) {
            use_account(p, acc);
            return TG_OK;
        }
        if ((p->slot_rq = slot_ask(p, redis, acc, slot_got)) != NULL)
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
        int sticky, skips, n = select_order(p, &q, &sticky, &skips);
        if (n > 0)
            p->norder = n;
        p->next_order = 0;
        return tg__run_phase_later(p, PH_SLOT, 20 + r % 30);
    }
    return tg__proxy_fail_ex(p, 429, "rate_limit_error", "accounts_busy",
                             "every upstream account of this group is at its concurrency limit; retry shortly",
                             "Retry-After: 1\r\n");
}

/*
 * The first attempt's slot, taken by its admission script ("admit+slot", tg_limits.c):
 * phase admit asks here which account's slot the admission should take (the first in
 * order whose slot is free in this worker's count). 1: `key` and `limit` are filled, the
 * slot's answer comes with the admission's (tg__slot_admitted). Only on a single Redis
 * outside cluster mode (tg_redis_one_keyspace): on a cluster the account lives under
 * another hash tag, and phase slot asks after the admission with the slot script. A
 * refused admission takes no slot.
 */
int tg__slot_with_admission(proxy_req_t *p, char key[64], int64_t *limit) {
    tg_redis_t *redis = tg_state_redis(p->pw->ctx->state);
    if (p->attempt != 1 || !p->norder || p->slot_rq || p->slot_account || !tg_redis_one_keyspace(redis) ||
        slot_next_free(p) < 0 || p->order[p->next_order]->concurrency <= 0)
        return 0;
    const tg_account_t *acc = p->order[p->next_order];
    tg__cleanup_add(p, cleanup_slot);
    /* Read before the admission is sent, so its answer is in before the slot's. */
    quota_read(p, redis, tg_health_get(p->pw->ctx->health, acc->id));
    tg_fmt_key(key, 64, "{a:", acc->id, "}:conc");
    *limit = acc->concurrency;
    p->slot_asking = acc->id;
    p->slot_early = 1;
    return 1;
}

/* What the admission that admitted says of the slot: 1 taken (held from now on: the
 * request's end gives it back), 0 the account is full, -1 unknown (phase slot asks). */
void tg__slot_admitted(proxy_req_t *p, int slot) {
    if (p->slot_early != 1)
        return;
    if (slot == 1)
        p->slot_account = p->slot_asking;
    p->slot_early = slot >= 0 ? 2 : 0;
    p->slot_answer = slot;
}

int tg__phase_slot(proxy_req_t *p) {
    if (!p->norder)
        return TG_OK; /* the static upstream */
    tg__cleanup_add(p, cleanup_slot);
    if (p->slot_early == 2) {
        p->slot_early = 0;
        return slot_answer(p, p->slot_answer);
    }
    return slot_try(p);
}

/* ---- retries and failover ----------------------------------------------------------- */

int tg__retryable_status(int st) { return st == 429 || st == 529 || st == 401 || st == 403 || st == 408 || st >= 500; }

int tg__can_retry(const proxy_req_t *p) {
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    uint64_t elapsed = (tg_now_ns() - p->req->start_ns) / 1000000;
    return p->at.account && !p->req->resp_started && tg__is_model_route(p->req->route) &&
           p->attempt < cfg->routing.max_attempts &&
           elapsed < (uint64_t)cfg->routing.deadline_ms;
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
int tg__maybe_retry(proxy_req_t *p, int status, int failure, int64_t retry_after_ms) {
    const tg_config_t *cfg = p->req->worker->gw->cfg;
    if (p->trace)
        tg__trace_attempt_end(p, p->upstream_end_ns);
    /* Health and cooldown first: they apply whether or not we retry. */
    if (p->at.health) {
        tg_health_end(p->at.health, 0, -1);
        p->at.health = NULL;
    }
    int64_t learned = 0;
    if (p->at.account && (status == 429 || status == 529)) {
        /* The provider said when the account's quota comes back (headers or body): cool
         * until exactly then (its half-open trial comes at the reset). */
        tg_health_entry_t *e = tg_health_get(p->pw->ctx->health, p->at.account->id);
        int64_t now = (int64_t)tg_wall_ms();
        const tg_quota_t *qt = e->quota ? tg_health_quota(e, now, cfg->routing.quota_stale_ms) : NULL;
        int64_t until = qt ? tg_quota_blocked_until(qt, now, 1) : 0;
        learned = until > now ? until - now : 0;
    }
    if (learned > 0)
        cool_account(p, learned);
    else if (status == 429)
        cool_account(p, retry_after_ms > 0 ? retry_after_ms : cfg->routing.cooldown_429_ms);
    else if (status == 529)
        cool_account(p, retry_after_ms > 0 ? retry_after_ms : cfg->routing.cooldown_529_ms);
    else if (status == 401 || status == 403)
        cool_account(p, cfg->routing.cooldown_auth_ms);
    else if (p->at.account && tg_health_get(p->pw->ctx->health, p->at.account->id)->err_ewma >= 0.5)
        cool_account(p, cfg->routing.cooldown_5xx_ms);
    /* The static upstream of the config file is a single target: no retries there. */
    if (!p->at.account || !tg__can_retry(p))
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
        tg__hook(p, TG_HOOK_ON_UPSTREAM_ERROR);
        action = c->retry_action;
        delay = c->retry_delay_ms;
        if (p->cap)
            tg__capture_retry(p, status, failure, retry_after_ms, c->elapsed_ms, c->deadline_ms, action, delay, 1);
    } else if (p->cap) {
        tg__capture_retry(p, status, failure, retry_after_ms, (int64_t)((tg_now_ns() - p->req->start_ns) / 1000000),
                          cfg->routing.deadline_ms, action, delay, 0);
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
        tg_billing_release_failed(p->pw->ctx->billing, p->req->id, p->principal->tenant_id, p->principal->key_id,
                                  p->attempt);
    /* Reset this attempt's upstream state and go back to account selection. */
    if (p->at.account && p->ntried < 8)
        p->tried[p->ntried++] = p->at.account->id;
    slot_release(p);
    p->retry_other = action == TG_RETRY_OTHER;
    p->attempt++;
    tg__attempt_reset(p);
    tg_log_info("request %s: attempt %d after upstream %d/%d in %lld ms (%s)", p->req->id, p->attempt, status, failure,
                (long long)delay, action == TG_RETRY_SAME ? "same account" : "another account");
    tg__run_phase_later(p, PH_SELECT, (uint64_t)delay);
    return 1;
}
