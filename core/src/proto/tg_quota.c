/*
 * Quota headers and error bodies of the providers (see tg_quota.h). Every value is read
 * in place from the header lines the upstream client already collected: no copies, no
 * allocation, one pass.
 */
#include "tollgate/tg_quota.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tg_quota_init(tg_quota_t *q, int64_t now_ms) {
    memset(q, 0, sizeof(*q));
    for (int i = 0; i < TG_QL__COUNT; i++)
        q->lim[i].limit = q->lim[i].remaining = -1;
    for (int i = 0; i < TG_QW__COUNT; i++)
        q->win[i].used = -1;
    q->at_ms = now_ms;
}

/* ---- values ----------------------------------------------------------------------- */

static void trim(const char **v, size_t *n) {
    while (*n && (**v == ' ' || **v == '\t' || **v == '"')) {
        (*v)++;
        (*n)--;
    }
    while (*n && ((*v)[*n - 1] == ' ' || (*v)[*n - 1] == '\t' || (*v)[*n - 1] == '"'))
        (*n)--;
}

/* A non-negative decimal number (digits, an optional fraction) at v[*i..n); advances *i.
 * 0 when there is none or it is absurdly long. */
static int decimal(const char *v, size_t n, size_t *i, double *out) {
    size_t s = *i, digits = 0;
    double x = 0, scale = 1;
    while (*i < n && v[*i] >= '0' && v[*i] <= '9' && digits < 18) {
        x = x * 10 + (v[(*i)++] - '0');
        digits++;
    }
    if (*i < n && v[*i] == '.') {
        (*i)++;
        while (*i < n && v[*i] >= '0' && v[*i] <= '9' && digits < 30) {
            scale /= 10;
            x += (v[(*i)++] - '0') * scale;
            digits++;
        }
    }
    if (!digits || (*i < n && v[*i] >= '0' && v[*i] <= '9')) {
        *i = s;
        return 0;
    }
    *out = x;
    return 1;
}

/* The whole value is one number. */
static int number(const char *v, size_t n, double *out) {
    trim(&v, &n);
    size_t i = 0;
    return decimal(v, n, &i, out) && i == n;
}

static int count(const char *v, size_t n, int64_t *out) {
    double x;
    if (!number(v, n, &x) || x > 1e15)
        return 0;
    *out = (int64_t)x;
    return 1;
}

/* A Go-style duration as OpenAI sends it: "1s", "6m0s", "20ms", "1h2m3.5s". */
static int duration_ms(const char *v, size_t n, double *out) {
    size_t i = 0;
    double ms = 0;
    int parts = 0;
    while (i < n) {
        double x;
        if (!decimal(v, n, &i, &x) || i >= n)
            return 0;
        double unit;
        if (v[i] == 'm' && i + 1 < n && v[i + 1] == 's') {
            unit = 1;
            i += 2;
        } else {
            char u = v[i++];
            unit = u == 's' ? 1e3 : u == 'm' ? 6e4 : u == 'h' ? 3.6e6 : u == 'd' ? 8.64e7 : -1;
            if (unit < 0)
                return 0;
        }
        ms += x * unit;
        parts++;
    }
    if (!parts || ms > 4e11)
        return 0;
    *out = ms;
    return 1;
}

static int two(const char *p, int *out) {
    if (p[0] < '0' || p[0] > '9' || p[1] < '0' || p[1] > '9')
        return 0;
    *out = (p[0] - '0') * 10 + (p[1] - '0');
    return 1;
}

/* Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* RFC 3339: 2025-01-01T12:00:00Z, with optional fraction and offset. */
static int rfc3339_ms(const char *v, size_t n, int64_t *out) {
    int y1, y2, mo, d, h, mi, s;
    if (n < 20 || !two(v, &y1) || !two(v + 2, &y2) || v[4] != '-' || !two(v + 5, &mo) || v[7] != '-' ||
        !two(v + 8, &d) || (v[10] != 'T' && v[10] != 't' && v[10] != ' ') || !two(v + 11, &h) || v[13] != ':' ||
        !two(v + 14, &mi) || v[16] != ':' || !two(v + 17, &s))
        return 0;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60)
        return 0;
    size_t i = 19;
    double frac = 0;
    if (i < n && v[i] == '.') {
        double scale = 1;
        i++;
        size_t st = i;
        while (i < n && v[i] >= '0' && v[i] <= '9') {
            if (i - st < 9) {
                scale /= 10;
                frac += (v[i] - '0') * scale;
            }
            i++;
        }
        if (i == st)
            return 0;
    }
    int64_t off = 0;
    if (i < n && (v[i] == 'Z' || v[i] == 'z')) {
        i++;
    } else if (i + 6 == n && (v[i] == '+' || v[i] == '-')) {
        int oh, om;
        if (!two(v + i + 1, &oh) || v[i + 3] != ':' || !two(v + i + 4, &om) || oh > 23 || om > 59)
            return 0;
        off = (v[i] == '-' ? -1 : 1) * (oh * 60 + om) * 60;
        i += 6;
    } else {
        return 0;
    }
    if (i != n)
        return 0;
    int64_t secs = days_from_civil(y1 * 100 + y2, mo, d) * 86400 + h * 3600 + mi * 60 + s - off;
    *out = secs * 1000 + (int64_t)(frac * 1000);
    return 1;
}

/* A reset, in whichever form it comes: an RFC 3339 time, a duration ("6m0s"), seconds
 * since the epoch (or ms, when that large), or seconds from now. */
static int reset_at(const char *v, size_t n, int64_t now_ms, int64_t *out) {
    trim(&v, &n);
    if (!n)
        return 0;
    int64_t t;
    if (n >= 20 && v[4] == '-') {
        if (!rfc3339_ms(v, n, &t))
            return 0;
        *out = t;
        return 1;
    }
    double x;
    if (number(v, n, &x)) {
        if (x >= 1e12)
            *out = (int64_t)x; /* ms since the epoch */
        else if (x >= 1e9)
            *out = (int64_t)(x * 1000); /* seconds since the epoch */
        else
            *out = now_ms + (int64_t)(x * 1000); /* seconds from now */
        return 1;
    }
    if (duration_ms(v, n, &x)) {
        *out = now_ms + (int64_t)x;
        return 1;
    }
    return 0;
}

static int status_of(const char *v, size_t n) {
    trim(&v, &n);
    if (n == 7 && !strncasecmp(v, "allowed", 7))
        return TG_QS_ALLOWED;
    if (n == 15 && !strncasecmp(v, "allowed_warning", 15))
        return TG_QS_WARNING;
    if (n == 8 && !strncasecmp(v, "rejected", 8))
        return TG_QS_REJECTED;
    return TG_QS_UNKNOWN;
}

/* ---- headers ---------------------------------------------------------------------- */

/* ASCII case-insensitive equality of n bytes, `lit` lower case: inlined with the
 * literal's length known, no libc call per comparison. */
static inline int ci_eq(const char *p, const char *lit, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) { /* eight bytes at a time */
        uint64_t a, b;
        memcpy(&a, p + i, 8);
        memcpy(&b, lit + i, 8);
        if ((a | 0x2020202020202020ull) != b)
            return 0;
    }
    for (; i < n; i++)
        if ((p[i] | 0x20) != lit[i])
            return 0;
    return 1;
}

static inline int prefix_n(const char **name, size_t *n, const char *pre, size_t k) {
    if (*n < k || !ci_eq(*name, pre, k))
        return 0;
    *name += k;
    *n -= k;
    return 1;
}

/* The literal's length is a compile-time constant. (`| 0x20` folds case for letters; a
 * '-' (0x2d) stays itself, a digit too, so the lower-case literals compare exactly.) */
#define has_prefix(name, n, lit) prefix_n((name), (n), "" lit, sizeof(lit) - 1)
#define is(name, n, lit) ((n) == sizeof(lit) - 1 && ci_eq((name), "" lit, sizeof(lit) - 1))

/* limit/remaining/reset of counted limit `which`. */
static int limit_field(tg_quota_t *q, int which, int field, const char *v, size_t n, int64_t now_ms) {
    tg_quota_limit_t *l = &q->lim[which];
    if (field == 2)
        return reset_at(v, n, now_ms, &l->reset_at_ms);
    return count(v, n, field == 0 ? &l->limit : &l->remaining);
}

/* A plan window's field: utilisation (as a fraction, or a percentage when `percent`),
 * reset, length in minutes, status. */
enum { WF_USED, WF_PERCENT, WF_RESET, WF_RESET_AFTER, WF_MINUTES, WF_STATUS };

static int window_field(tg_quota_t *q, int w, int f, const char *v, size_t n, int64_t now_ms) {
    tg_quota_window_t *x = &q->win[w];
    double d;
    switch (f) {
    case WF_USED:
        if (!number(v, n, &d))
            return 0;
        if (d > 1.5) /* a percentage where a fraction was expected */
            d /= 100;
        if (d > 1.5)
            return 0;
        x->used = TG_MIN(d, 1.0);
        return 1;
    case WF_PERCENT:
        if (!number(v, n, &d) || d > 150)
            return 0;
        x->used = TG_MIN(d / 100, 1.0);
        return 1;
    case WF_RESET:
        return reset_at(v, n, now_ms, &x->reset_at_ms);
    case WF_RESET_AFTER:
        if (!number(v, n, &d) || d > 1e9)
            return 0;
        x->reset_at_ms = now_ms + (int64_t)(d * 1000);
        return 1;
    case WF_MINUTES:
        if (!number(v, n, &d) || d > 1e7)
            return 0;
        x->window_ms = (int64_t)(d * 60000);
        return 1;
    default:
        x->status = status_of(v, n);
        return x->status != TG_QS_UNKNOWN;
    }
}

int tg_quota_header(tg_quota_t *q, const char *name, size_t nl, const char *v, size_t vl, int64_t now_ms) {
    int ok = -2; /* -2: not a header we read */
    if (has_prefix(&name, &nl, "x-ratelimit-")) {
        /* OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens} */
        int field = has_prefix(&name, &nl, "limit-") ? 0 : has_prefix(&name, &nl, "remaining-") ? 1
                                                      : has_prefix(&name, &nl, "reset-")       ? 2
                                                                                               : -1;
        int which = field < 0 ? -1 : is(name, nl, "requests") ? TG_QL_REQUESTS : is(name, nl, "tokens") ? TG_QL_TOKENS : -1;
        if (which >= 0)
            ok = limit_field(q, which, field, v, vl, now_ms);
    } else if (has_prefix(&name, &nl, "anthropic-ratelimit-")) {
        if (has_prefix(&name, &nl, "unified-")) {
            int w = has_prefix(&name, &nl, "5h-") ? TG_QW_SHORT : has_prefix(&name, &nl, "7d-") ? TG_QW_LONG : -1;
            if (w >= 0) {
                int f = is(name, nl, "utilization") ? WF_USED : is(name, nl, "reset") ? WF_RESET
                                                            : is(name, nl, "status")  ? WF_STATUS
                                                                                      : -1;
                if (f >= 0) {
                    ok = window_field(q, w, f, v, vl, now_ms);
                    if (ok && w == TG_QW_SHORT && !q->win[w].window_ms)
                        q->win[w].window_ms = 5 * 3600000LL;
                    else if (ok && w == TG_QW_LONG && !q->win[w].window_ms)
                        q->win[w].window_ms = 7 * 86400000LL;
                }
            } else if (is(name, nl, "status")) {
                q->plan_status = status_of(v, vl);
                ok = q->plan_status != TG_QS_UNKNOWN;
            } else if (is(name, nl, "reset")) {
                ok = reset_at(v, vl, now_ms, &q->plan_reset_ms);
            }
        } else {
            int which = has_prefix(&name, &nl, "requests-")        ? TG_QL_REQUESTS
                        : has_prefix(&name, &nl, "input-tokens-")  ? TG_QL_INPUT_TOKENS
                        : has_prefix(&name, &nl, "output-tokens-") ? TG_QL_OUTPUT_TOKENS
                        : has_prefix(&name, &nl, "tokens-")        ? TG_QL_TOKENS
                                                                   : -1;
            int field = which < 0 ? -1 : is(name, nl, "limit") ? 0 : is(name, nl, "remaining") ? 1 : is(name, nl, "reset") ? 2 : -1;
            if (field >= 0)
                ok = limit_field(q, which, field, v, vl, now_ms);
        }
    } else if (has_prefix(&name, &nl, "x-codex-")) {
        int w = has_prefix(&name, &nl, "primary-") ? TG_QW_SHORT : has_prefix(&name, &nl, "secondary-") ? TG_QW_LONG : -1;
        int f = w < 0 ? -1
                : is(name, nl, "used-percent")        ? WF_PERCENT
                : is(name, nl, "reset-after-seconds") ? WF_RESET_AFTER
                : is(name, nl, "reset-at")            ? WF_RESET
                : is(name, nl, "window-minutes")      ? WF_MINUTES
                                                      : -1;
        if (f >= 0)
            ok = window_field(q, w, f, v, vl, now_ms);
    }
    if (ok == -2)
        return 0;
    if (ok) {
        q->known++;
        return 1;
    }
    q->malformed++;
    return -1;
}

int tg_quota_parse_headers(tg_quota_t *q, const char *p, size_t len, int64_t now_ms) {
    int before = q->known;
    const char *end = p + len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *le = eol ? eol : end;
        const char *colon = memchr(p, ':', (size_t)(le - p));
        /* Only the three families are looked at: x-r..., anthropic-ratelimit-..., x-codex-... */
        if (colon && colon - p > 8 && (p[0] == 'x' || p[0] == 'X' || p[0] == 'a' || p[0] == 'A')) {
            const char *v = colon + 1;
            size_t vl = (size_t)(le - v);
            if (vl && v[vl - 1] == '\r')
                vl--;
            tg_quota_header(q, p, (size_t)(colon - p), v, vl, now_ms);
        }
        p = eol ? eol + 1 : end;
    }
    return q->known - before;
}

/* ---- error bodies ----------------------------------------------------------------- */

static const char *find(const char *s, size_t n, const char *what) {
    size_t k = strlen(what);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == what[0] && !memcmp(s + i, what, k))
            return s + i;
    return NULL;
}

/* The value after "key": in s (a number or a string), as a pointer and length. */
static int member(const char *s, size_t n, const char *key, const char **v, size_t *vl) {
    const char *k = find(s, n, key);
    if (!k)
        return 0;
    const char *p = k + strlen(key), *end = s + n;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    if (p >= end || *p != ':')
        return 0;
    p++;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    const char *st = p;
    if (p < end && *p == '"') {
        p++;
        st = p;
        while (p < end && *p != '"')
            p++;
    } else {
        while (p < end && ((*p >= '0' && *p <= '9') || *p == '.'))
            p++;
    }
    *v = st;
    *vl = (size_t)(p - st);
    return *vl > 0;
}

int tg_quota_parse_error(tg_quota_t *q, const char *body, size_t len, int64_t now_ms) {
    const char *v;
    size_t vl;
    int64_t t = 0;
    if (member(body, len, "\"resets_at\"", &v, &vl)) {
        if (!reset_at(v, vl, now_ms, &t)) {
            q->malformed++;
            t = 0;
        }
    }
    double secs;
    if (!t && member(body, len, "\"resets_in_seconds\"", &v, &vl)) {
        if (number(v, vl, &secs) && secs < 1e9)
            t = now_ms + (int64_t)(secs * 1000);
        else
            q->malformed++;
    }
    if (t <= now_ms)
        return 0;
    q->blocked_until_ms = t;
    q->known++;
    return 1;
}

/* ---- state ------------------------------------------------------------------------ */

void tg_quota_merge(tg_quota_t *st, const tg_quota_t *in) {
    for (int i = 0; i < TG_QL__COUNT; i++) {
        const tg_quota_limit_t *a = &in->lim[i];
        tg_quota_limit_t *b = &st->lim[i];
        if (a->limit >= 0)
            b->limit = a->limit;
        if (a->remaining >= 0)
            b->remaining = a->remaining;
        if (a->reset_at_ms)
            b->reset_at_ms = a->reset_at_ms;
    }
    for (int i = 0; i < TG_QW__COUNT; i++) {
        const tg_quota_window_t *a = &in->win[i];
        tg_quota_window_t *b = &st->win[i];
        if (a->used >= 0)
            b->used = a->used;
        if (a->reset_at_ms)
            b->reset_at_ms = a->reset_at_ms;
        if (a->window_ms)
            b->window_ms = a->window_ms;
        if (a->status)
            b->status = a->status;
    }
    if (in->blocked_until_ms > 0)
        st->blocked_until_ms = in->blocked_until_ms;
    if (in->plan_status)
        st->plan_status = in->plan_status;
    if (in->plan_reset_ms)
        st->plan_reset_ms = in->plan_reset_ms;
    st->at_ms = in->at_ms;
    st->known += in->known;
    st->malformed += in->malformed;
}

int64_t tg_quota_blocked_until(const tg_quota_t *q, int64_t now_ms, int64_t est_tokens) {
    int64_t until = q->blocked_until_ms > now_ms ? q->blocked_until_ms : 0;
    if (q->plan_status == TG_QS_REJECTED && q->plan_reset_ms > now_ms)
        until = TG_MAX(until, q->plan_reset_ms);
    for (int i = 0; i < TG_QW__COUNT; i++) {
        const tg_quota_window_t *w = &q->win[i];
        if (w->reset_at_ms > now_ms && (w->status == TG_QS_REJECTED || w->used >= 1.0))
            until = TG_MAX(until, w->reset_at_ms);
    }
    for (int i = 0; i < TG_QL__COUNT; i++) {
        const tg_quota_limit_t *l = &q->lim[i];
        if (l->reset_at_ms <= now_ms || l->remaining < 0)
            continue;
        int64_t need = i == TG_QL_REQUESTS ? 1 : i == TG_QL_OUTPUT_TOKENS ? 1 : TG_MAX(est_tokens, 1);
        if (l->remaining < need)
            until = TG_MAX(until, l->reset_at_ms);
    }
    return until;
}

double tg_quota_headroom(const tg_quota_t *q, int64_t now_ms, double *reset_in_ms) {
    double best = -1;
    int64_t reset = 0;
    for (int i = 0; i < TG_QL__COUNT; i++) {
        const tg_quota_limit_t *l = &q->lim[i];
        if (l->limit <= 0 || l->remaining < 0 || l->reset_at_ms <= now_ms)
            continue;
        double h = TG_MIN((double)l->remaining / (double)l->limit, 1.0);
        if (best < 0 || h < best) {
            best = h;
            reset = l->reset_at_ms;
        }
    }
    for (int i = 0; i < TG_QW__COUNT; i++) {
        const tg_quota_window_t *w = &q->win[i];
        if (w->used < 0 || w->reset_at_ms <= now_ms)
            continue;
        double h = 1 - w->used;
        if (best < 0 || h < best) {
            best = h;
            reset = w->reset_at_ms;
        }
    }
    *reset_in_ms = best < 0 ? -1 : (double)(reset - now_ms);
    return best;
}

int tg_quota_window_soonest(const tg_quota_t *q, int64_t now_ms, double *left, double *reset_in_ms) {
    int best = -1;
    for (int i = 0; i < TG_QW__COUNT; i++) {
        const tg_quota_window_t *w = &q->win[i];
        if (w->used >= 0 && w->reset_at_ms > now_ms && (best < 0 || w->reset_at_ms < q->win[best].reset_at_ms))
            best = i;
    }
    if (best < 0) {
        *left = *reset_in_ms = -1;
        return 0;
    }
    *left = 1 - q->win[best].used;
    *reset_in_ms = (double)(q->win[best].reset_at_ms - now_ms);
    return 1;
}

/* ---- the fleet's copy ------------------------------------------------------------- */

#define NFIELDS (4 + 3 * TG_QL__COUNT + 4 * TG_QW__COUNT)

size_t tg_quota_encode(const tg_quota_t *q, char *out, size_t cap) {
    int n = snprintf(out, cap, "q1 %lld %lld %d %lld", (long long)q->at_ms, (long long)q->blocked_until_ms,
                     q->plan_status, (long long)q->plan_reset_ms);
    for (int i = 0; i < TG_QL__COUNT && n > 0 && (size_t)n < cap; i++)
        n += snprintf(out + n, cap - (size_t)n, " %lld %lld %lld", (long long)q->lim[i].limit,
                      (long long)q->lim[i].remaining, (long long)q->lim[i].reset_at_ms);
    for (int i = 0; i < TG_QW__COUNT && n > 0 && (size_t)n < cap; i++)
        n += snprintf(out + n, cap - (size_t)n, " %lld %lld %lld %d",
                      q->win[i].used < 0 ? -1LL : (long long)(q->win[i].used * 10000 + 0.5),
                      (long long)q->win[i].reset_at_ms, (long long)q->win[i].window_ms, q->win[i].status);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

int tg_quota_decode(tg_quota_t *q, const char *s, size_t len) {
    char buf[TG_QUOTA_TEXT_MAX];
    if (len < 3 || len >= sizeof(buf) || memcmp(s, "q1 ", 3) != 0)
        return 0;
    memcpy(buf, s, len);
    buf[len] = '\0';
    long long f[NFIELDS];
    char *p = buf + 3;
    for (int i = 0; i < NFIELDS; i++) {
        char *e;
        f[i] = strtoll(p, &e, 10);
        if (e == p)
            return 0;
        p = e;
    }
    if (*p)
        return 0;
    tg_quota_t t;
    tg_quota_init(&t, f[0]);
    t.blocked_until_ms = f[1];
    if (f[2] < TG_QS_UNKNOWN || f[2] > TG_QS_REJECTED)
        return 0;
    t.plan_status = (int)f[2];
    t.plan_reset_ms = f[3];
    int k = 4;
    for (int i = 0; i < TG_QL__COUNT; i++, k += 3)
        t.lim[i] = (tg_quota_limit_t){f[k], f[k + 1], f[k + 2]};
    for (int i = 0; i < TG_QW__COUNT; i++, k += 4) {
        if (f[k + 3] < TG_QS_UNKNOWN || f[k + 3] > TG_QS_REJECTED || f[k] > 10000)
            return 0;
        t.win[i] = (tg_quota_window_t){f[k] < 0 ? -1 : (double)f[k] / 10000, f[k + 1], f[k + 2], (int)f[k + 3]};
    }
    *q = t;
    return 1;
}
