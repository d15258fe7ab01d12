/*
 * The policy workbench's store (see tg_policy_store.h): Postgres -> the store folder ->
 * a hot reload, once per process per change, on every instance.
 */
#include "tollgate/tg_policy_store.h"

#include <dirent.h>
#include <errno.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tollgate/tg_pg.h"
#include "tollgate/tg_plugin.h"

#define POLL_MS 20
#define POLL_MAX_MS 10000
#define CHECK_MS 5000

/* The sync number of the last change applied, and of the one a worker is applying. */
static _Atomic uint64_t synced_seq, claimed_seq;

/* Each stored policy's config as Lua (for the workbench's replay), under mu. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static tg_plugin_enable_t *configs;
static size_t nconfigs;
static char *last_rows; /* the configs and fleet flags the last rows held (text) */

static const char SYNC_SQL[] =
    "SELECT a.seq, p.name, g.source, g.config::text, coalesce((g.deployed->>'all')::boolean, false) "
    "FROM (SELECT coalesce(max(id), 0) AS seq FROM policy_audit) a LEFT JOIN "
    "(policies p JOIN policy_generations g ON g.name = p.name AND g.generation = p.generation) ON true "
    "ORDER BY p.name";

struct tg_policy_wait_s {
    tg_policy_store_t *ps;
    uint64_t seq;
    uint64_t deadline_ms;
    tg_policy_synced_cb cb;
    void *ud;
    tg_policy_wait_t *next;
};

struct tg_policy_store_s {
    uv_loop_t *loop;
    tg_state_t *st;
    const tg_config_t *cfg;
    int worker;
    tg_pg_req_t *q;       /* the sync query (or worker 0's check) in flight */
    uint64_t q_seq;       /* what the sync claimed */
    int q_check;          /* q is the periodic check */
    uv_timer_t poll;      /* while waiters wait for another worker's sync */
    uv_timer_t check;     /* worker 0: the periodic comparison with the database */
    int open_handles;
    tg_policy_wait_t *waiters;
};

uint64_t tg_policy_store_synced(void) { return atomic_load(&synced_seq); }

char *tg_policy_store_config_lua(const char *name) {
    char *out = NULL;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nconfigs && !out; i++)
        if (!strcmp(configs[i].name, name))
            out = strdup(configs[i].config_lua);
    pthread_mutex_unlock(&mu);
    return out;
}

/* ---- applying the rows: shared by startup (blocking) and the workers ------------------ */

static int mkdirs(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Writes path with text unless it holds exactly that already: 1 written, 0 same, -1 error. */
static int write_if_changed(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "rb");
    if (f) {
        char *have = malloc(len + 2);
        size_t n = fread(have, 1, len + 1, f);
        fclose(f);
        int same = n == len && !memcmp(have, text, len);
        free(have);
        if (same)
            return 0;
    }
    char tmp[1200];
    snprintf(tmp, sizeof(tmp), "%.1100s.tmp.%ld", path, (long)getpid());
    f = fopen(tmp, "wb");
    if (!f)
        return -1;
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 1;
}

/* The rows of SYNC_SQL into the folder, the fleet's list and the configs. Returns 1 when
 * something changed (a reload is due), 0 when not; sets *seq to the rows' number. */
static int apply_rows(const char *store, const PGresult *res, uint64_t *seq) {
    int n = PQntuples(res), changed = 0;
    *seq = n ? strtoull(PQgetvalue(res, 0, 0), NULL, 10) : 0;
    tg_plugin_enable_t *conf = calloc((size_t)n + 1, sizeof(*conf)), *fl = calloc((size_t)n + 1, sizeof(*fl));
    size_t nconf = 0, nfl = 0;
    char path[1100], err[256];
    for (int i = 0; i < n; i++) {
        if (PQgetisnull(res, i, 1))
            continue;
        const char *name = PQgetvalue(res, i, 1);
        snprintf(path, sizeof(path), "%s/%s.lua", store, name);
        int w = write_if_changed(path, PQgetvalue(res, i, 2), (size_t)PQgetlength(res, i, 2));
        if (w < 0)
            tg_log_error("policy store: writing %s: %s", path, strerror(errno));
        changed |= w > 0;
        char *lua = NULL;
        if (tg_plugins_config_to_lua(PQgetvalue(res, i, 3), (size_t)PQgetlength(res, i, 3), &lua, err, sizeof(err)) != TG_OK)
            lua = strdup("{}");
        conf[nconf++] = (tg_plugin_enable_t){strdup(name), lua};
        if (*PQgetvalue(res, i, 4) == 't')
            fl[nfl++] = (tg_plugin_enable_t){strdup(name), strdup(lua)};
    }
    /* The files of policies no longer stored go: the folder holds the database's, only. */
    DIR *d = opendir(store);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".lua") != 0)
            continue;
        int kept = 0;
        for (size_t k = 0; k < nconf && !kept; k++)
            kept = strlen(conf[k].name) == len - 4 && !strncmp(conf[k].name, de->d_name, len - 4);
        if (!kept) {
            snprintf(path, sizeof(path), "%s/%s", store, de->d_name);
            changed |= unlink(path) == 0;
        }
    }
    if (d)
        closedir(d);
    /* What the runtime loads besides the files: the configs and who runs for all,
     * compared as text with the last rows'. */
    tg_buf_t now;
    tg_buf_init(&now);
    for (int i = 0; i < n; i++)
        if (!PQgetisnull(res, i, 1))
            tg_buf_printf(&now, "%s=%s%s;", PQgetvalue(res, i, 1), PQgetvalue(res, i, 3), PQgetvalue(res, i, 4));
    pthread_mutex_lock(&mu);
    if (!last_rows || strcmp(last_rows, now.data ? now.data : "")) {
        changed = 1;
        free(last_rows);
        last_rows = strdup(now.data ? now.data : "");
    }
    tg_buf_free(&now);
    for (size_t i = 0; i < nconfigs; i++) {
        free(configs[i].name);
        free(configs[i].config_lua);
    }
    free(configs);
    configs = conf;
    nconfigs = nconf;
    pthread_mutex_unlock(&mu);
    tg_plugins_set_fleet(fl, nfl);
    for (size_t i = 0; i < nfl; i++) {
        free(fl[i].name);
        free(fl[i].config_lua);
    }
    free(fl);
    return changed;
}

static void mark_synced(uint64_t seq) {
    uint64_t have = atomic_load(&synced_seq);
    while (have < seq && !atomic_compare_exchange_weak(&synced_seq, &have, seq)) {
    }
}

int tg_policy_store_boot(const tg_config_t *cfg, char *err, size_t errlen) {
    const char *store = cfg->plugins.store;
    if (!store)
        return TG_OK;
    if (mkdirs(store) != 0) {
        snprintf(err, errlen, "plugins.store: cannot create %s: %s", store, strerror(errno));
        return TG_ERROR;
    }
    if (!cfg->pg_conninfo)
        return TG_OK;
    PGconn *c = PQconnectdb(cfg->pg_conninfo);
    PGresult *r = PQstatus(c) == CONNECTION_OK ? PQexec(c, SYNC_SQL) : NULL;
    if (r && PQresultStatus(r) == PGRES_TUPLES_OK) {
        uint64_t seq;
        apply_rows(store, r, &seq);
        mark_synced(seq);
    } else {
        tg_log_warn("policy store: the stored policies could not be read (%s); %s serves as it is until they can",
                    r ? PQresultErrorMessage(r) : PQerrorMessage(c), store);
    }
    PQclear(r);
    PQfinish(c);
    return TG_OK;
}

/* ---- a worker's part ------------------------------------------------------------------ */

static void start_sync(tg_policy_store_t *ps, uint64_t seq);

/* Answers the waiters whose change this process holds (or whose wait ran out). */
static void run_waiters(tg_policy_store_t *ps, const char *err) {
    uint64_t have = atomic_load(&synced_seq), now = tg_now_ms();
    tg_policy_wait_t **pp = &ps->waiters;
    while (*pp) {
        tg_policy_wait_t *w = *pp;
        if (w->seq <= have || err || now >= w->deadline_ms) {
            *pp = w->next;
            w->cb(w->ud, w->seq <= have ? NULL : err ? err : "another worker's sync did not finish in time");
            free(w);
        } else {
            pp = &w->next;
        }
    }
    if (!ps->waiters)
        uv_timer_stop(&ps->poll);
}

static void sync_cb(void *ud, const PGresult *res, const char *err) {
    tg_policy_store_t *ps = ud;
    ps->q = NULL;
    if (err) {
        tg_log_error("policy store: reading the stored policies failed: %s", err);
        /* Let another worker (or the periodic check) try again. */
        uint64_t mine = ps->q_seq;
        atomic_compare_exchange_strong(&claimed_seq, &mine, atomic_load(&synced_seq));
        run_waiters(ps, "the stored policies could not be read");
        return;
    }
    uint64_t seq;
    if (apply_rows(ps->cfg->plugins.store, res, &seq)) {
        char rerr[1024];
        if (tg_plugins_reload_trigger("store", rerr, sizeof(rerr)) < 0)
            tg_log_error("policy store: change %llu written, its reload refused (the running generation serves): %s",
                         (unsigned long long)seq, rerr);
    }
    mark_synced(TG_MAX(seq, ps->q_seq));
    tg_state_invalidate(ps->st, NULL);
    run_waiters(ps, NULL);
}

static void start_sync(tg_policy_store_t *ps, uint64_t seq) {
    ps->q_seq = seq;
    ps->q_check = 0;
    ps->q = tg_pg_query(tg_state_pg(ps->st), SYNC_SQL, 0, NULL, sync_cb, ps);
    if (!ps->q) {
        uint64_t mine = seq;
        atomic_compare_exchange_strong(&claimed_seq, &mine, atomic_load(&synced_seq));
    }
}

/* Claims seq for this worker when no worker holds or applies it yet: 1 claimed. */
static int claim(uint64_t seq) {
    uint64_t c = atomic_load(&claimed_seq);
    while (c < seq)
        if (atomic_compare_exchange_weak(&claimed_seq, &c, seq))
            return 1;
    return 0;
}

static void poll_cb(uv_timer_t *t) {
    tg_policy_store_t *ps = t->data;
    /* A claimer that failed gave its number back: take it over. */
    uint64_t want = 0;
    for (tg_policy_wait_t *w = ps->waiters; w; w = w->next)
        want = TG_MAX(want, w->seq);
    if (!ps->q && want > atomic_load(&synced_seq) && claim(want))
        start_sync(ps, want);
    run_waiters(ps, NULL);
}

tg_policy_wait_t *tg_policy_store_sync(tg_policy_store_t *ps, uint64_t seq, tg_policy_synced_cb cb, void *ud) {
    tg_policy_wait_t *w = calloc(1, sizeof(*w));
    *w = (tg_policy_wait_t){ps, seq, tg_now_ms() + POLL_MAX_MS, cb, ud, ps->waiters};
    ps->waiters = w;
    if (seq > atomic_load(&synced_seq) && !ps->q && claim(seq))
        start_sync(ps, seq);
    /* Answered from the timer, never inside this call. */
    uv_timer_start(&ps->poll, poll_cb, seq <= atomic_load(&synced_seq) ? 0 : POLL_MS, POLL_MS);
    return w;
}

void tg_policy_store_cancel(tg_policy_wait_t *w) {
    if (!w)
        return;
    for (tg_policy_wait_t **pp = &w->ps->waiters; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            free(w);
            return;
        }
    }
}

/* "policies:N" from the channel: sync (or wait for the worker that does), then drop
 * this worker's key cache, whose group settings may name what was written. */
static void invalidated_cb(void *ud, const char *err) {
    tg_policy_store_t *ps = ud;
    if (err)
        tg_log_warn("policy store: %s", err);
    tg_state_invalidate(ps->st, NULL);
}

static void on_message(void *ud, uint64_t seq) {
    tg_policy_store_t *ps = ud;
    tg_policy_store_sync(ps, seq, invalidated_cb, ps);
}

static void check_cb(void *ud, const PGresult *res, const char *err) {
    tg_policy_store_t *ps = ud;
    ps->q = NULL;
    if (err || PQntuples(res) != 1)
        return;
    uint64_t seq = strtoull(PQgetvalue(res, 0, 0), NULL, 10);
    if (seq > atomic_load(&synced_seq))
        tg_policy_store_sync(ps, seq, invalidated_cb, ps);
}

static void check_timer_cb(uv_timer_t *t) {
    tg_policy_store_t *ps = t->data;
    if (ps->q || !tg_pg_connected(tg_state_pg(ps->st)))
        return;
    ps->q_check = 1;
    ps->q = tg_pg_query(tg_state_pg(ps->st), "SELECT coalesce(max(id), 0) FROM policy_audit", 0, NULL, check_cb, ps);
}

tg_policy_store_t *tg_policy_store_create(uv_loop_t *loop, tg_state_t *st, const tg_config_t *cfg, int worker) {
    if (!cfg->plugins.store || !st || !tg_state_pg(st))
        return NULL;
    tg_policy_store_t *ps = calloc(1, sizeof(*ps));
    ps->loop = loop;
    ps->st = st;
    ps->cfg = cfg;
    ps->worker = worker;
    uv_timer_init(loop, &ps->poll);
    ps->poll.data = ps;
    uv_timer_init(loop, &ps->check);
    ps->check.data = ps;
    ps->open_handles = 2;
    if (worker == 0)
        uv_timer_start(&ps->check, check_timer_cb, CHECK_MS, CHECK_MS);
    tg_state_on_policies(st, on_message, ps);
    return ps;
}

static void handle_closed(uv_handle_t *h) {
    tg_policy_store_t *ps = h->data;
    if (--ps->open_handles == 0)
        free(ps);
}

void tg_policy_store_destroy(tg_policy_store_t *ps) {
    if (!ps)
        return;
    if (ps->q)
        tg_pg_cancel(ps->q);
    ps->q = NULL;
    tg_state_on_policies(ps->st, NULL, NULL);
    while (ps->waiters) {
        tg_policy_wait_t *w = ps->waiters;
        ps->waiters = w->next;
        free(w);
    }
    uv_close((uv_handle_t *)&ps->poll, handle_closed);
    uv_close((uv_handle_t *)&ps->check, handle_closed);
}
