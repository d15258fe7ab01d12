/*
 * The capture's recorder (see tollgate/tg_capture.h): the sampling decision, a bounded
 * queue of finished lines, and one writer thread that appends them to the file and
 * rotates it. Workers never touch the file: tg_capture_submit moves a line into the
 * queue under a mutex.
 *
 * The writer writes in batches: woken by the first line of an empty queue, it waits up
 * to FLUSH_MS for more (or until BATCH lines are queued, a reader asks, or the recorder
 * stops), then writes them all with one flush. A worker signals only the first line and
 * the BATCH-th, so at 1% of 45,000 requests a second the writer wakes 20 times a second,
 * not 450 (each wake-up and each write(2) were the kernel's time on a loaded core). A
 * reader (tg_capture_read: the download, a replay) has the queue written first.
 *
 * "Never lose a sampled request": room for a line is reserved when the request is
 * sampled (`owed` counts the lines promised and not yet written) and the decision
 * says no when the queue could not take one more. So the queue never overflows, and
 * the cap and a slow disk turn into fewer samples, never into lost ones.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tollgate/tg_capture.h"

#define QUEUE_MAX 4096
#define BATCH 256    /* lines that wake the writer at once */
#define FLUSH_MS 50  /* the longest a finished line waits in the queue */

int tg__capture_active;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cond, drained;
    pthread_t thread;
    int running, stopping;
    /* config (a copy) */
    double rate;
    int max_per_s;
    char *file;
    long max_bytes;
    int keep;
    char **headers;
    size_t nheaders;
    tg_capture_group_t *groups;
    size_t ngroups;
    /* the queue: a ring of lines */
    char *lines[QUEUE_MAX];
    size_t lens[QUEUE_MAX];
    size_t head, count;
    uint64_t submitted; /* lines ever queued (`written` counts them once flushed) */
    int flush_wanted;   /* readers waiting for the queue to be written */
    /* the file (writer thread only, and tg_capture_read under mu) */
    FILE *f;
    long size;
    /* counters */
    _Atomic int owed; /* sampled, line not yet written */
    _Atomic uint64_t sampled, written, skipped_cap, skipped_full, bytes, rotations, write_errors;
    _Atomic uint64_t window_s, window_n; /* the cap's current second and its samples */
    char last_error[256];
} C = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .drained = PTHREAD_COND_INITIALIZER};

/* ---- the writer ----------------------------------------------------------------------- */

static int open_file(void) {
    C.f = fopen(C.file, "a");
    if (!C.f)
        return -errno;
    fseek(C.f, 0, SEEK_END);
    C.size = ftell(C.f);
    return 0;
}

/* FILE -> FILE.1 -> ... -> FILE.keep (the oldest goes); then a fresh FILE. */
static void rotate(void) {
    fclose(C.f);
    C.f = NULL;
    char from[4200], to[4200];
    if (C.keep == 0) {
        unlink(C.file);
    } else {
        for (int i = C.keep; i >= 1; i--) {
            if (i == 1)
                snprintf(from, sizeof(from), "%s", C.file);
            else
                snprintf(from, sizeof(from), "%s.%d", C.file, i - 1);
            snprintf(to, sizeof(to), "%s.%d", C.file, i);
            rename(from, to);
        }
    }
    atomic_fetch_add(&C.rotations, 1);
    int r = open_file();
    if (r < 0)
        snprintf(C.last_error, sizeof(C.last_error), "%s: %s", C.file, strerror(-r));
}

static void write_line(char *line, size_t len) {
    if (C.f && C.size > 0 && C.size + (long)len + 1 > C.max_bytes)
        rotate();
    if (!C.f && open_file() < 0) {
        atomic_fetch_add(&C.write_errors, 1);
        return;
    }
    line[len] = '\n';
    if (fwrite(line, 1, len + 1, C.f) != len + 1) {
        atomic_fetch_add(&C.write_errors, 1);
        snprintf(C.last_error, sizeof(C.last_error), "%s: %s", C.file, strerror(errno));
        clearerr(C.f);
        return;
    }
    C.size += (long)len + 1;
    atomic_fetch_add(&C.bytes, len + 1);
}

static void *writer_main(void *arg) {
    TG_UNUSED(arg);
    pthread_mutex_lock(&C.mu);
    for (;;) {
        while (!C.count && !C.stopping)
            pthread_cond_wait(&C.cond, &C.mu);
        if (!C.count && C.stopping)
            break;
        /* Let more lines come, for at most FLUSH_MS. */
        if (C.count < BATCH && !C.stopping && !C.flush_wanted) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += FLUSH_MS * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            while (C.count < BATCH && !C.stopping && !C.flush_wanted)
                if (pthread_cond_timedwait(&C.cond, &C.mu, &until) == ETIMEDOUT)
                    break;
        }
        /* Take what is queued, write it without the lock (the file is this thread's). */
        size_t n = C.count, at = C.head;
        char *batch[QUEUE_MAX];
        size_t lens[QUEUE_MAX];
        for (size_t i = 0; i < n; i++) {
            batch[i] = C.lines[(at + i) % QUEUE_MAX];
            lens[i] = C.lens[(at + i) % QUEUE_MAX];
        }
        C.head = (at + n) % QUEUE_MAX;
        C.count = 0;
        pthread_mutex_unlock(&C.mu);
        for (size_t i = 0; i < n; i++) {
            write_line(batch[i], lens[i]);
            free(batch[i]);
        }
        pthread_mutex_lock(&C.mu);
        if (C.f)
            fflush(C.f);
        /* Counted once flushed: a reader that sees `written` sees the lines. */
        atomic_fetch_add(&C.written, n);
        atomic_fetch_sub(&C.owed, (int)n);
        pthread_cond_broadcast(&C.drained);
    }
    pthread_cond_broadcast(&C.drained);
    pthread_mutex_unlock(&C.mu);
    return NULL;
}

/* ---- start, stop ---------------------------------------------------------------------- */

static void mkdirs_for(const char *file) {
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", file);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0755);
            *p = '/';
        }
    }
    mkdir(dir, 0755);
}

int tg_capture_start(const tg_capture_config_t *cfg, char *err, size_t errlen) {
    int any = cfg->rate > 0;
    for (size_t i = 0; i < cfg->ngroups; i++)
        any |= cfg->groups[i].rate > 0;
    if (!any || C.running)
        return TG_OK;
    C.rate = cfg->rate;
    C.max_per_s = cfg->max_per_s > 0 ? cfg->max_per_s : 50;
    C.file = strdup(cfg->file ? cfg->file : "var/capture.jsonl");
    C.max_bytes = cfg->max_bytes > 0 ? cfg->max_bytes : 64L << 20;
    C.keep = cfg->keep;
    C.headers = calloc(cfg->nheaders + 1, sizeof(char *));
    for (size_t i = 0; i < cfg->nheaders; i++)
        C.headers[i] = strdup(cfg->headers[i]);
    C.nheaders = cfg->nheaders;
    C.groups = calloc(cfg->ngroups + 1, sizeof(*C.groups));
    for (size_t i = 0; i < cfg->ngroups; i++)
        C.groups[i] = (tg_capture_group_t){strdup(cfg->groups[i].name), cfg->groups[i].rate};
    C.ngroups = cfg->ngroups;
    mkdirs_for(C.file);
    int r = open_file();
    if (r < 0) {
        snprintf(err, errlen, "config: plugins.capture.file: %s: %s", C.file, strerror(-r));
        tg_capture_stop();
        return TG_ERROR;
    }
    C.stopping = 0;
    /* The writer never takes signals meant for the workers (SIGHUP, the watchdog's). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r = pthread_create(&C.thread, NULL, writer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0) {
        snprintf(err, errlen, "capture: cannot start the writer thread: %s", strerror(r));
        tg_capture_stop();
        return TG_ERROR;
    }
    C.running = 1;
    tg__capture_active = 1;
    tg_log_info("capture: recording %g of requests (at most %d/s) to %s", C.rate, C.max_per_s, C.file);
    return TG_OK;
}

void tg_capture_stop(void) {
    tg__capture_active = 0;
    if (C.running) {
        pthread_mutex_lock(&C.mu);
        C.stopping = 1;
        pthread_cond_signal(&C.cond);
        pthread_mutex_unlock(&C.mu);
        pthread_join(C.thread, NULL);
        C.running = 0;
    }
    if (C.f)
        fclose(C.f);
    C.f = NULL;
    free(C.file);
    C.file = NULL;
    for (size_t i = 0; i < C.nheaders; i++)
        free(C.headers[i]);
    free(C.headers);
    C.headers = NULL;
    C.nheaders = 0;
    for (size_t i = 0; i < C.ngroups; i++)
        free(C.groups[i].name);
    free(C.groups);
    C.groups = NULL;
    C.ngroups = 0;
}

/* ---- the request's side ------------------------------------------------------------- */

/* A per-thread xorshift generator, seeded from the OS once. */
static uint64_t next_random(void) {
    static __thread uint64_t s;
    if (!s) {
        tg_random_bytes(&s, sizeof(s));
        s |= 1;
    }
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
}

int tg_capture_sample(const char *group, uint32_t *seed) {
    double rate = C.rate;
    for (size_t i = 0; group && *group && i < C.ngroups; i++)
        if (!strcmp(C.groups[i].name, group))
            rate = C.groups[i].rate;
    uint64_t r = next_random();
    if (rate <= 0 || (rate < 1 && (double)(r >> 11) * (1.0 / 9007199254740992.0) >= rate))
        return 0;
    /* The cap: at most max_per_s in each second of the monotonic clock. */
    uint64_t sec = tg_now_ms() / 1000;
    uint64_t w = atomic_load(&C.window_s);
    if (w != sec && atomic_compare_exchange_strong(&C.window_s, &w, sec))
        atomic_store(&C.window_n, 0);
    if (atomic_fetch_add(&C.window_n, 1) >= (uint64_t)C.max_per_s) {
        atomic_fetch_add(&C.skipped_cap, 1);
        return 0;
    }
    /* Room for its line, reserved now. */
    if (atomic_fetch_add(&C.owed, 1) >= QUEUE_MAX) {
        atomic_fetch_sub(&C.owed, 1);
        atomic_fetch_add(&C.skipped_full, 1);
        return 0;
    }
    atomic_fetch_add(&C.sampled, 1);
    *seed = (uint32_t)(r >> 33) | 1u;
    return 1;
}

void tg_capture_submit(char *line, size_t len) {
    pthread_mutex_lock(&C.mu);
    /* owed <= QUEUE_MAX, and every queued line is owed: there is room. */
    size_t at = (C.head + C.count) % QUEUE_MAX;
    C.lines[at] = line;
    C.lens[at] = len;
    C.count++;
    C.submitted++;
    /* The first line wakes the writer; the BATCH-th cuts its wait short. */
    if (C.count == 1 || C.count == BATCH)
        pthread_cond_signal(&C.cond);
    pthread_mutex_unlock(&C.mu);
}

void tg_capture_cancel(void) {
    atomic_fetch_sub(&C.owed, 1);
    atomic_fetch_sub(&C.sampled, 1);
}

int tg_capture_header_allowed(const char *name, size_t n) {
    for (size_t i = 0; i < C.nheaders; i++)
        if (strlen(C.headers[i]) == n && !strncasecmp(C.headers[i], name, n))
            return 1;
    return 0;
}

/* ---- admin -------------------------------------------------------------------------- */

char *tg_capture_status_json(void) {
    json_t *o = json_object();
    json_object_set_new(o, "enabled", json_boolean(tg__capture_active));
    if (tg__capture_active) {
        json_object_set_new(o, "rate", json_real(C.rate));
        json_t *g = json_object();
        for (size_t i = 0; i < C.ngroups; i++)
            json_object_set_new(g, C.groups[i].name, json_real(C.groups[i].rate));
        json_object_set_new(o, "groups", g);
        json_object_set_new(o, "max_per_s", json_integer(C.max_per_s));
        json_object_set_new(o, "file", json_string(C.file));
        json_object_set_new(o, "max_bytes", json_integer(C.max_bytes));
        json_object_set_new(o, "keep", json_integer(C.keep));
        json_t *h = json_array();
        for (size_t i = 0; i < C.nheaders; i++)
            json_array_append_new(h, json_string(C.headers[i]));
        json_object_set_new(o, "headers", h);
    }
    json_object_set_new(o, "sampled", json_integer((json_int_t)atomic_load(&C.sampled)));
    json_object_set_new(o, "written", json_integer((json_int_t)atomic_load(&C.written)));
    json_object_set_new(o, "pending", json_integer(atomic_load(&C.owed)));
    json_object_set_new(o, "skipped_cap", json_integer((json_int_t)atomic_load(&C.skipped_cap)));
    json_object_set_new(o, "skipped_full", json_integer((json_int_t)atomic_load(&C.skipped_full)));
    json_object_set_new(o, "bytes", json_integer((json_int_t)atomic_load(&C.bytes)));
    json_object_set_new(o, "rotations", json_integer((json_int_t)atomic_load(&C.rotations)));
    json_object_set_new(o, "write_errors", json_integer((json_int_t)atomic_load(&C.write_errors)));
    pthread_mutex_lock(&C.mu);
    json_object_set_new(o, "last_error", C.last_error[0] ? json_string(C.last_error) : json_null());
    pthread_mutex_unlock(&C.mu);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

int tg_capture_read(size_t max, char **out, size_t *len, char *err, size_t errlen) {
    *out = NULL;
    *len = 0;
    if (!tg__capture_active)
        return TG_DECLINED;
    /* What is queued is written first (the writer is told not to wait for more); the
     * file may still grow meanwhile: only complete lines are returned. */
    pthread_mutex_lock(&C.mu);
    uint64_t want = C.submitted;
    if (C.running && atomic_load(&C.written) < want) {
        C.flush_wanted++;
        pthread_cond_signal(&C.cond);
        while (C.running && !C.stopping && atomic_load(&C.written) < want)
            pthread_cond_wait(&C.drained, &C.mu);
        C.flush_wanted--;
    }
    FILE *f = fopen(C.file, "rb");
    int rc = TG_OK;
    if (!f) {
        snprintf(err, errlen, "%s: %s", C.file, strerror(errno));
        rc = errno == ENOENT ? TG_OK : TG_ERROR;
    } else {
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        long from = size > (long)max ? size - (long)max : 0;
        fseek(f, from, SEEK_SET);
        char *buf = malloc((size_t)(size - from) + 1);
        size_t n = fread(buf, 1, (size_t)(size - from), f);
        fclose(f);
        size_t start = 0;
        if (from > 0) {
            /* Cut to whole lines: skip the partial first one. */
            while (start < n && buf[start] != '\n')
                start++;
            if (start < n)
                start++;
        }
        size_t end = n;
        while (end > start && buf[end - 1] != '\n')
            end--;
        memmove(buf, buf + start, end - start);
        *out = buf;
        *len = end - start;
    }
    pthread_mutex_unlock(&C.mu);
    return rc;
}
