/*
 * Periodic budgets: the period a request falls in (see tg_budgets.h).
 *
 * Calendar periods in a time zone other than UTC are computed with the C library's own
 * conversions (localtime_r, mktime) under TZ set to the zone, which is process-wide
 * state: they run under one mutex, and only when a budget's cached period has ended (a
 * worker recomputes a budget's period once per period), so the request path does not
 * convert at all. Nothing else in the gateway reads local time.
 */
#include "tollgate/tg_budgets.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_valid.h"

static int64_t clock_offset_s;
static pthread_mutex_t tz_mu = PTHREAD_MUTEX_INITIALIZER;
static char tz_saved[256];

int64_t tg_budget_now_s(void) { return (int64_t)(tg_wall_ms() / 1000) + __atomic_load_n(&clock_offset_s, __ATOMIC_RELAXED); }

void tg_budget_set_clock_offset(int64_t seconds) { __atomic_store_n(&clock_offset_s, seconds, __ATOMIC_RELAXED); }

void tg_budget_tz_init(void) {
    const char *tz = getenv("TZ");
    /* Unset means the system's local time, which ":/etc/localtime" names. */
    snprintf(tz_saved, sizeof(tz_saved), "%s", tz ? tz : ":/etc/localtime");
    setenv("TZ", tz_saved, 1);
    tzset();
}

int tg_budget_kind(const char *s) {
    static const char *const names[] = {"day", "week", "month", "hours"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

const char *tg_budget_kind_text(const tg_budget_t *b, char *buf, int len) {
    switch (b->kind) {
    case TG_BUDGET_DAY: return "daily";
    case TG_BUDGET_WEEK: return "weekly";
    case TG_BUDGET_MONTH: return "monthly";
    default: snprintf(buf, (size_t)len, "%d-hour", b->hours); return buf;
    }
}

static int is_utc(const char *tz) { return !strcmp(tz, "UTC") || !strcmp(tz, "Etc/UTC"); }

/* Midnight starting the day / week / month of `tm` (a broken-down local time), and the
 * same of the next period, both as broken-down times still to be normalised. */
static void bounds_tm(int kind, const struct tm *now, struct tm *s, struct tm *e) {
    *s = *now;
    s->tm_hour = s->tm_min = s->tm_sec = 0;
    s->tm_isdst = -1;
    if (kind == TG_BUDGET_WEEK)
        s->tm_mday -= (now->tm_wday + 6) % 7; /* back to Monday */
    else if (kind == TG_BUDGET_MONTH)
        s->tm_mday = 1;
    *e = *s;
    if (kind == TG_BUDGET_DAY)
        e->tm_mday += 1;
    else if (kind == TG_BUDGET_WEEK)
        e->tm_mday += 7;
    else
        e->tm_mon += 1;
}

static int calendar(const tg_budget_t *b, int64_t now_s, int64_t *start, int64_t *end) {
    time_t t = (time_t)now_s;
    struct tm now, s, e;
    if (is_utc(b->tz)) {
        gmtime_r(&t, &now);
        bounds_tm(b->kind, &now, &s, &e);
        *start = (int64_t)timegm(&s);
        *end = (int64_t)timegm(&e);
        return 0;
    }
    /* glibc quietly falls back to UTC for a zone it cannot read: the zone is checked
     * first (the admin API refuses unknown zones; one could still vanish from the
     * system), and a budget in a zone that is not there refuses its requests. */
    if (tg_valid_timezone(b->tz, strlen(b->tz)))
        return -1;
    char val[80];
    snprintf(val, sizeof(val), ":%s", b->tz);
    pthread_mutex_lock(&tz_mu);
    setenv("TZ", val, 1);
    tzset();
    localtime_r(&t, &now);
    bounds_tm(b->kind, &now, &s, &e);
    time_t ts = mktime(&s), te = mktime(&e);
    setenv("TZ", tz_saved, 1);
    tzset();
    pthread_mutex_unlock(&tz_mu);
    if (ts == (time_t)-1 || te == (time_t)-1 || te <= ts || ts > t || te <= t)
        return -1;
    *start = (int64_t)ts;
    *end = (int64_t)te;
    return 0;
}

int tg_budget_period(tg_budget_t *b, int64_t now_s, int64_t *start, int64_t *end) {
    if (b->cur_end > b->cur_start && now_s >= b->cur_start && now_s < b->cur_end) {
        *start = b->cur_start;
        *end = b->cur_end;
        return 0;
    }
    if (b->kind == TG_BUDGET_HOURS) {
        int64_t w = (int64_t)b->hours * 3600;
        if (w <= 0)
            return -1;
        int64_t k = (now_s - b->anchor_s) / w;
        if (now_s < b->anchor_s && (now_s - b->anchor_s) % w)
            k--; /* floor for a clock before the anchor */
        *start = b->anchor_s + k * w;
        *end = *start + w;
    } else if (calendar(b, now_s, start, end) != 0) {
        return -1;
    }
    b->cur_start = *start;
    b->cur_end = *end;
    return 0;
}
