/*
 * Account selection alone, in process: the cost of one tg_select call (what
 * phase_select does for every request routed to a group) with 1, 10, 100 and 10,000
 * accounts in the group, next to the selection tollgate had before (commit 5a9f6cb,
 * reproduced below as legacy_select) in the same run.
 *
 * Each "request" is one selection followed by what phase_slot does with the first
 * account (its picks + 1), so the fair-share keys move as they do in the gateway. Per
 * size: a fresh snapshot and health table, a warm-up, then `repeats` timed runs of
 * `calls` requests; reported are the median run's CPU ns per call (thread CPU clock),
 * instructions per call (perf_event_open, user space; "–" when the counter is not
 * available) and, over all runs, how many distinct accounts got requests and the
 * smallest and largest share.
 *
 * Usage: tg_select_bench [calls (1000000)] [repeats (5)] [case (all) [before|tg_select]]
 * With a case (0-based row pair) only that case runs, and each run prints to stderr how
 * many selections it made: spec/bench/select_bench.sh runs each case under callgrind
 * (--toggle-collect on the selection function) for an instruction count per call that
 * the machine's load does not move, where perf_event_open has no hardware counter.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <linux/perf_event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tollgate/tg_select.h"

#define GID 1

/* ---- the selection before this change (phase_select + tg_snapshot_candidates) ------- */

typedef struct {
    const tg_account_t *acc;
    int trial;
    double key;
} ord_t;

static int ord_cmp(const void *x, const void *y) {
    const ord_t *a = x, *b = y;
    if (a->acc->priority != b->acc->priority)
        return a->acc->priority > b->acc->priority ? -1 : 1;
    if (a->trial != b->trial)
        return a->trial ? -1 : 1;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return a->acc->id < b->acc->id ? -1 : a->acc->id > b->acc->id;
}

/* The group as the old snapshot held it: members in id order, scanned per request. */
static int legacy_candidates(const tg_account_t *const *g, int gn, const char *model, int64_t now,
                             const tg_account_t **out, int max) {
    static unsigned rot;
    unsigned start = gn > max ? rot++ % (unsigned)gn : 0;
    int n = 0;
    for (int j = 0; j < gn && n < max; j++) {
        const tg_account_t *acc = g[(start + (unsigned)j) % (unsigned)gn];
        if (!acc->active || acc->cooldown_until_ms > now)
            continue;
        int serves = acc->nmodels == 0 || (acc->model_map && json_object_get(acc->model_map, model));
        for (int k = 0; k < acc->nmodels && !serves; k++)
            serves = !strcmp(acc->models[k], model);
        if (serves)
            out[n++] = acc;
    }
    return n;
}

__attribute__((noinline)) static int legacy_select(const tg_account_t *const *g, int gn, tg_health_t *h, const char *model, int64_t now,
                         const tg_account_t **order) {
    const tg_account_t *all[256], *cands[64];
    int nall = legacy_candidates(g, gn, model, now, all, 256);
    int n = 0;
    static unsigned rot;
    unsigned start = nall ? rot++ % (unsigned)nall : 0;
    for (int j = 0; j < nall && n < 64; j++) {
        int i = (int)((start + (unsigned)j) % (unsigned)nall);
        if (tg_health_available(tg_health_get(h, all[i]->id), now))
            cands[n++] = all[i];
    }
    ord_t ord[64];
    for (int i = 0; i < n; i++) {
        tg_health_entry_t *e = tg_health_get(h, cands[i]->id);
        const tg_account_t *acc = cands[i];
        double load = acc->concurrency > 0 ? (double)e->inflight / acc->concurrency : 0;
        double ok = 1 - e->err_ewma;
        double w = (double)TG_MAX(acc->weight, 1) * ok * ok * TG_MAX(1 - load, 0.01);
        ord[i] = (ord_t){acc, e->half_open && !e->probing && e->cooldown_until_ms && e->cooldown_until_ms <= now,
                         (e->picks + 1) / w};
    }
    qsort(ord, (size_t)n, sizeof(ord[0]), ord_cmp);
    for (int i = 0; i < n; i++)
        order[i] = ord[i].acc;
    return n;
}

/* ---- measuring -------------------------------------------------------------------------- */

static int perf_fd = -1;

static void counter_open(void) {
    struct perf_event_attr pe;
    memset(&pe, 0, sizeof(pe));
    pe.type = PERF_TYPE_HARDWARE;
    pe.size = sizeof(pe);
    pe.config = PERF_COUNT_HW_INSTRUCTIONS;
    pe.disabled = 1;
    pe.exclude_kernel = 1;
    pe.exclude_hv = 1;
    perf_fd = (int)syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0);
}

static long long counter_read(void) {
    long long v = 0;
    if (perf_fd < 0 || read(perf_fd, &v, sizeof(v)) != sizeof(v))
        return -1;
    return v;
}

static double thread_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int dbl_cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

typedef struct {
    double ns;      /* median run, CPU ns per call */
    double insns;   /* instructions per call in that run, < 0 unknown */
    int distinct;   /* accounts that got at least one request */
    double lo, hi;  /* fewest and most requests of one account, relative to an equal share */
} result_t;

/* n accounts in the group; `cooling` of them are cooling (snapshot) in a spread-out way. */
static result_t run(int n, int cooling, int legacy, long calls, int repeats) {
    tg_account_t *a = calloc((size_t)n, sizeof(*a));
    tg_membership_t *m = calloc((size_t)n, sizeof(*m));
    for (int i = 0; i < n; i++) {
        a[i] = (tg_account_t){.id = 593394825 + i, .name = "bench", .provider = "openai", .concurrency = 1000,
                              .weight = 100, .active = 1};
        if (cooling && i % (n / cooling ? n / cooling : 1) != 0)
            a[i].cooldown_until_ms = INT64_MAX;
        m[i] = (tg_membership_t){GID, a[i].id};
    }
    tg_snapshot_t *s = tg_snapshot_build(a, (size_t)n, m, (size_t)n);
    const tg_account_t **g = malloc((size_t)n * sizeof(*g)); /* the legacy group array, id order */
    for (int i = 0; i < n; i++)
        g[i] = tg_snapshot_member(s, GID, a[i].id);
    tg_health_t *h = tg_health_create();
    tg_select_t q = {.group_id = GID, .model = "mock-gpt", .now_ms = 1800000000000};
    const tg_account_t *out[64];
    double *ns = calloc((size_t)repeats, sizeof(double)), *insns = calloc((size_t)repeats, sizeof(double));
    for (int r = -1; r < repeats; r++) { /* r == -1: warm-up */
        long c = r < 0 ? calls / 10 : calls;
        if (perf_fd >= 0)
            ioctl(perf_fd, PERF_EVENT_IOC_RESET, 0), ioctl(perf_fd, PERF_EVENT_IOC_ENABLE, 0);
        double t0 = thread_ns();
        for (long i = 0; i < c; i++) {
            int sticky, k = legacy ? legacy_select(g, n, h, q.model, q.now_ms, out)
                                   : tg_select(s, h, &q, out, 64, &sticky);
            if (k > 0)
                tg_health_get(h, out[0]->id)->picks += 1;
        }
        double t1 = thread_ns();
        if (perf_fd >= 0)
            ioctl(perf_fd, PERF_EVENT_IOC_DISABLE, 0);
        if (r >= 0) {
            ns[r] = (t1 - t0) / (double)c;
            long long v = counter_read();
            insns[r] = v < 0 ? -1 : (double)v / (double)c;
        }
    }
    result_t res = {0};
    fprintf(stderr, "selections %ld\n", calls / 10 + calls * repeats);
    double *sorted = malloc((size_t)repeats * sizeof(double));
    memcpy(sorted, ns, (size_t)repeats * sizeof(double));
    qsort(sorted, (size_t)repeats, sizeof(double), dbl_cmp);
    res.ns = sorted[repeats / 2];
    res.insns = -1;
    for (int r = 0; r < repeats; r++)
        if (ns[r] == res.ns)
            res.insns = insns[r];
    int usable = cooling ? 0 : n;
    for (int i = 0; i < n && cooling; i++)
        usable += a[i].cooldown_until_ms == 0;
    res.lo = 1e300;
    double total = 0;
    for (int i = 0; i < n; i++) {
        if (a[i].cooldown_until_ms)
            continue;
        double p = tg_health_get(h, a[i].id)->picks;
        total += p;
        res.distinct += p > 0;
        res.lo = TG_MIN(res.lo, p);
        res.hi = TG_MAX(res.hi, p);
    }
    double share = total / usable;
    res.lo /= share;
    res.hi /= share;
    free(sorted);
    free(ns);
    free(insns);
    tg_health_destroy(h);
    free(g);
    tg_snapshot_release(s);
    free(a);
    free(m);
    return res;
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 1000000;
    int repeats = argc > 2 ? atoi(argv[2]) : 5;
    int only = argc > 3 ? atoi(argv[3]) : -1;
    const char *variant = argc > 4 ? argv[4] : NULL;
    if (calls <= 0 || repeats <= 0) {
        fprintf(stderr, "usage: %s [calls] [repeats]\n", argv[0]);
        return 2;
    }
    counter_open();
    tg_select_seed(0x5eed);
    static const struct {
        int n, cooling;
    } cases[] = {{1, 0}, {10, 0}, {100, 0}, {10000, 0}, {10000, 100}};
    printf("| accounts in the group | selection | CPU ns / call (median of %d × %ld) | instructions / call | "
           "accounts that got requests | fewest / most requests (× equal share) |\n",
           repeats, calls);
    printf("|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (only >= 0 && (size_t)only != i)
            continue;
        for (int legacy = 1; legacy >= 0; legacy--) {
            if (variant && strcmp(variant, legacy ? "before" : "tg_select") != 0)
                continue;
            /* The old code costs ~10x more: a fifth of the calls keeps the run short. */
            result_t r = run(cases[i].n, cases[i].cooling, legacy, legacy ? TG_MAX(calls / 5, 1) : calls, repeats);
            char label[64], in[32];
            if (cases[i].cooling)
                snprintf(label, sizeof(label), "%d (%d usable, the rest cooling)", cases[i].n, cases[i].cooling);
            else
                snprintf(label, sizeof(label), "%d", cases[i].n);
            if (r.insns < 0)
                snprintf(in, sizeof(in), "–");
            else
                snprintf(in, sizeof(in), "%.0f", r.insns);
            printf("| %s | %s | %.0f | %s | %d | %.2f / %.2f |\n", label, legacy ? "before (5a9f6cb)" : "tg_select", r.ns,
                   in, r.distinct, r.lo, r.hi);
            fflush(stdout);
        }
    }
    return 0;
}
