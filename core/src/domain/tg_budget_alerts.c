/*
 * Budget alerts (issue #24): a budget's thresholds (e.g. 50, 80, 100 % of its amount)
 * fire once per period each. They are raised in Postgres, by the settlement batch that
 * records a period's spend (tg_budget_settle, 0008_budgets.sql: one budget_alerts row
 * per budget, period and threshold — the primary key is the dedupe), and delivered here
 * by the reconciler (one per deployment, tg_billing_reconcile.c) at each of its passes:
 *
 *   - a pass claims up to ALERTS_PER_PASS pending alerts whose time has come (the claim
 *     moves their next attempt CLAIM_S ahead, so two passes never send one alert at
 *     once) and posts each to its budget's webhook_url on libuv's thread pool
 *     (uv_queue_work: a blocking HTTP/1.1 or HTTPS POST with 5 s timeouts, never on the
 *     event loop);
 *   - the body is the alert as JSON; X-Tollgate-Timestamp is the Unix time of the attempt
 *     and X-Tollgate-Signature "sha256=" + hex HMAC-SHA256 over "<timestamp>.<body>" with
 *     the budget's webhook_secret (absent when the budget has none);
 *   - every attempt is a budget_alert_deliveries row (status or error); a 2xx answer
 *     marks the alert delivered, anything else retries after 0.5, 1, 2, 4 s, and the
 *     ALERT_ATTEMPTS-th failure marks it failed;
 *   - counted in tollgate_budget_alerts_total{event="sent"|"delivered"|"retried"|"failed"}.
 */
#include "tg_billing_internal.h"

#include <errno.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tollgate/tg_pg.h"

#define ALERTS_PER_PASS 16
#define ALERT_ATTEMPTS 5
#define CLAIM_S 30

/* Claims the alerts due: their attempt is counted and their next one pushed CLAIM_S
 * ahead (the answer, when it comes, sets it). Returns what a delivery needs. */
static const char CLAIM_SQL[] =
    "WITH due AS (SELECT a.budget_id, a.period_start, a.threshold FROM budget_alerts a JOIN budgets b ON "
    "b.id = a.budget_id WHERE a.state = 'pending' AND a.next_at <= now() ORDER BY a.next_at LIMIT 16 "
    "FOR UPDATE OF a SKIP LOCKED) "
    "UPDATE budget_alerts a SET attempts = a.attempts + 1, next_at = now() + interval '30 seconds' "
    "FROM due, budgets b WHERE a.budget_id = due.budget_id AND a.period_start = due.period_start "
    "AND a.threshold = due.threshold AND b.id = a.budget_id "
    "RETURNING a.budget_id, a.period_start::text, a.threshold, a.attempts, b.webhook_url, "
    "coalesce(b.webhook_secret, ''), json_build_object('type', 'budget.threshold', 'budget', json_build_object("
    "'id', b.id, 'name', b.name, 'tenant_id', b.tenant_id, 'api_key_id', b.api_key_id, 'user_id', b.user_id, "
    "'period', b.period, 'period_hours', b.period_hours, 'timezone', b.timezone), 'threshold', a.threshold, "
    "'period_start', a.period_start, 'period_end', (tg_budget_period(b, a.period_start)).period_end, "
    "'spend', a.spend, 'amount', a.amount, 'raised_at', a.created_at)::text";

/* An attempt's outcome: its log row, and the alert delivered, failed, or due again. */
static const char RESULT_SQL[] =
    "WITH log AS (INSERT INTO budget_alert_deliveries (budget_id, period_start, threshold, attempt, status, error) "
    "VALUES ($1::bigint, $2::timestamptz, $3::int, $4::int, nullif($5, '0')::int, nullif($6, ''))) "
    "UPDATE budget_alerts SET state = CASE WHEN $7 = 'ok' THEN 'delivered' WHEN $4::int >= $8::int THEN 'failed' "
    "ELSE 'pending' END, delivered_at = CASE WHEN $7 = 'ok' THEN now() END, last_error = nullif($6, ''), "
    "next_at = now() + make_interval(secs => 0.5 * power(2, $4::int - 1)) "
    "WHERE budget_id = $1::bigint AND period_start = $2::timestamptz AND threshold = $3::int";

typedef struct {
    uv_work_t work;
    tg_billing_t *b;
    char budget[24], period[48], threshold[16], attempt[16];
    char url[2048], secret[256];
    char *body;
    int status;    /* the receiver's HTTP status, 0 none */
    char err[400]; /* why there is none, or why it is not 2xx */
} alert_job_t;

/* ---- a blocking HTTP(S) POST (on the thread pool) ---------------------------------- */

static int url_parts(const char *url, int *tls, char host[256], char port[8], const char **path) {
    const char *p;
    if (!strncmp(url, "https://", 8)) {
        *tls = 1;
        p = url + 8;
    } else if (!strncmp(url, "http://", 7)) {
        *tls = 0;
        p = url + 7;
    } else {
        return -1;
    }
    size_t hl = strcspn(p, ":/");
    if (hl == 0 || hl >= 256)
        return -1;
    memcpy(host, p, hl);
    host[hl] = '\0';
    p += hl;
    snprintf(port, 8, "%s", *tls ? "443" : "80");
    if (*p == ':') {
        size_t pl = strspn(p + 1, "0123456789");
        if (pl == 0 || pl > 5)
            return -1;
        snprintf(port, 8, "%.*s", (int)pl, p + 1);
        p += 1 + pl;
    }
    *path = *p ? p : "/";
    return 0;
}

static int io_write(int fd, SSL *ssl, const char *p, size_t n) {
    while (n) {
        ssize_t w = ssl ? SSL_write(ssl, p, (int)n) : write(fd, p, n);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void post(alert_job_t *j) {
    int tls;
    char host[256], port[8];
    const char *path;
    if (url_parts(j->url, &tls, host, port, &path) != 0) {
        snprintf(j->err, sizeof(j->err), "the webhook URL cannot be used");
        return;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) {
        snprintf(j->err, sizeof(j->err), "resolving %.100s: %s", host, gai_strerror(rc));
        return;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        struct timeval tv = {.tv_sec = 5};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)); /* connect() too */
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            snprintf(j->err, sizeof(j->err), "connecting to %.100s:%s: %s", host, port, strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return;
    SSL_CTX *ctx = NULL;
    SSL *ssl = NULL;
    if (tls) {
        ctx = SSL_CTX_new(TLS_client_method());
        SSL_CTX_set_default_verify_paths(ctx);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        ssl = SSL_new(ctx);
        SSL_set_fd(ssl, fd);
        SSL_set_tlsext_host_name(ssl, host);
        SSL_set1_host(ssl, host);
        if (SSL_connect(ssl) != 1) {
            snprintf(j->err, sizeof(j->err), "TLS with %.100s: %s", host,
                     ERR_reason_error_string(ERR_get_error()) ?: "handshake failed");
            goto out;
        }
    }
    {
        char ts[24], sig[160] = "";
        snprintf(ts, sizeof(ts), "%lld", (long long)time(NULL));
        if (j->secret[0]) {
            /* HMAC-SHA256 over "<timestamp>.<body>" with the budget's secret. */
            tg_buf_t msg;
            tg_buf_init(&msg);
            tg_buf_printf(&msg, "%s.%s", ts, j->body);
            unsigned char mac[EVP_MAX_MD_SIZE];
            unsigned maclen = 0;
            HMAC(EVP_sha256(), j->secret, (int)strlen(j->secret), (const unsigned char *)msg.data, msg.len, mac,
                 &maclen);
            tg_buf_free(&msg);
            char *q = sig + snprintf(sig, sizeof(sig), "X-Tollgate-Signature: sha256=");
            for (unsigned i = 0; i < maclen; i++)
                q += sprintf(q, "%02x", mac[i]);
            strcat(sig, "\r\n");
        }
        tg_buf_t req;
        tg_buf_init(&req);
        tg_buf_printf(&req,
                      "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tollgate\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nX-Tollgate-Event: budget.threshold\r\nX-Tollgate-Timestamp: %s\r\n%s"
                      "Connection: close\r\n\r\n%s",
                      path, host, strlen(j->body), ts, sig, j->body);
        int wrc = io_write(fd, ssl, req.data, req.len);
        tg_buf_free(&req);
        if (wrc != 0) {
            snprintf(j->err, sizeof(j->err), "sending to %.100s: %s", host, strerror(errno));
            goto out;
        }
        char head[512];
        size_t got = 0;
        while (got < sizeof(head) - 1 && !memchr(head, '\n', got)) {
            ssize_t r = ssl ? SSL_read(ssl, head + got, (int)(sizeof(head) - 1 - got))
                            : read(fd, head + got, sizeof(head) - 1 - got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        head[got] = '\0';
        int status = 0;
        if (sscanf(head, "HTTP/%*d.%*d %d", &status) != 1 || status < 100 || status > 599) {
            snprintf(j->err, sizeof(j->err), "no HTTP answer from %.100s", host);
            goto out;
        }
        j->status = status;
        if (status < 200 || status > 299)
            snprintf(j->err, sizeof(j->err), "the receiver answered %d", status);
    }
out:
    if (ssl) {
        SSL_shutdown(ssl);
        SSL_free(ssl);
    }
    if (ctx)
        SSL_CTX_free(ctx);
    close(fd);
}

static void post_work(uv_work_t *w) { post((alert_job_t *)w->data); }

/* ---- the pass (the reconciler's worker, on its loop) -------------------------------- */

static void result_done(void *ud, const PGresult *res, const char *err) {
    TG_UNUSED(ud);
    TG_UNUSED(res);
    if (err)
        tg_log_warn("budgets: recording an alert's delivery failed (%s): it is sent again", err);
}

static void post_done(uv_work_t *w, int status) {
    alert_job_t *j = w->data;
    tg_billing_t *b = j->b;
    int ok = status == 0 && j->status >= 200 && j->status <= 299;
    if (status != 0)
        snprintf(j->err, sizeof(j->err), "cancelled");
    int last = atoi(j->attempt) >= ALERT_ATTEMPTS;
    if (ok)
        b->stats.alerts_delivered++;
    else if (last)
        b->stats.alerts_failed++;
    else
        b->stats.alerts_retried++;
    if (!ok)
        tg_log_warn("budgets: alert %s%% of budget %s (period %s), attempt %s: %s%s", j->threshold, j->budget,
                    j->period, j->attempt, j->err, last ? ": given up, logged failed" : ": retried");
    char st[16], most[16];
    snprintf(st, sizeof(st), "%d", j->status);
    snprintf(most, sizeof(most), "%d", ALERT_ATTEMPTS);
    const char *params[8] = {j->budget, j->period, j->threshold, j->attempt, st, ok ? "" : j->err, ok ? "ok" : "no",
                             most};
    tg_pg_t *pg = tg_state_pg(b->st);
    if (pg)
        tg_pg_query(pg, RESULT_SQL, 8, params, result_done, NULL);
    b->alerts_inflight--;
    free(j->body);
    free(j);
}

static void claimed(void *ud, const PGresult *res, const char *err) {
    tg_billing_t *b = ud;
    b->alerts_claiming = 0;
    if (err) {
        tg_log_warn("budgets: reading the alerts due failed: %s", err);
        return;
    }
    for (int i = 0; i < PQntuples(res); i++) {
        alert_job_t *j = calloc(1, sizeof(*j));
        if (!j)
            abort();
        j->work.data = j;
        j->b = b;
        snprintf(j->budget, sizeof(j->budget), "%s", PQgetvalue(res, i, 0));
        snprintf(j->period, sizeof(j->period), "%s", PQgetvalue(res, i, 1));
        snprintf(j->threshold, sizeof(j->threshold), "%s", PQgetvalue(res, i, 2));
        snprintf(j->attempt, sizeof(j->attempt), "%s", PQgetvalue(res, i, 3));
        snprintf(j->url, sizeof(j->url), "%s", PQgetvalue(res, i, 4));
        snprintf(j->secret, sizeof(j->secret), "%s", PQgetvalue(res, i, 5));
        j->body = strdup(PQgetvalue(res, i, 6));
        if (atoi(j->attempt) == 1)
            b->stats.alerts_sent++;
        b->alerts_inflight++;
        if (uv_queue_work(b->loop, &j->work, post_work, post_done) != 0) {
            snprintf(j->err, sizeof(j->err), "could not be queued");
            post_done(&j->work, -1);
        }
    }
}

void tg__budget_alerts_pass(tg_billing_t *b) {
    tg_pg_t *pg = tg_state_pg(b->st);
    /* One pass at a time; while deliveries are out, the next pass waits for them. */
    if (!pg || b->stopping || b->alerts_claiming || b->alerts_inflight)
        return;
    b->alerts_claiming = 1;
    if (!tg_pg_query(pg, CLAIM_SQL, 0, NULL, claimed, b))
        b->alerts_claiming = 0;
}
