/*
 * tg_loadgen: the benchmark's load client for the three measurements wrk cannot make
 * (spec/bench/core_bench.sh builds it with cc; it is not part of the tollgate build).
 *
 *   tg_loadgen rate    HOST:PORT --rate R --conns C --duration S [--warmup S] [--samples F]
 *       Open loop at a fixed rate (what wrk2 does): request i is due at t0 + i/R and is
 *       sent then on an idle keep-alive connection, whatever happened to the requests
 *       before it. Latency is reported twice: from the moment the request was written
 *       ("service") and from the moment it was due ("corrected": includes any wait for
 *       a free connection, so a stalled server cannot hide behind coordinated omission).
 *       --samples F appends every measured response's two latencies to F, so that
 *       runs can be pooled.
 *   tg_loadgen ttfb    HOST:PORT --conns C --requests N [--spread MS] [--samples F]
 *       Closed loop of streaming requests: time to the response head, to the first
 *       body byte (the first SSE event) and to the end of the stream (--samples F
 *       appends "head first_byte total" per response). Without --spread the C first
 *       requests go out at once, and as every stream lasts as long, the C requests of
 *       each later turn arrive together too (a burst of C every stream length); with
 *       --spread MS connection k sends its first request k·MS/C after the first, so
 *       with MS the length of a stream the arrivals stay spread evenly over it.
 *   tg_loadgen streams HOST:PORT --conns N [--ramp K] [--hold S] [--timeout S] [--pid P]...
 *       Opens N connections (K new ones per millisecond), each starting one slow stream,
 *       waits until every one has received a body byte within the last --window ms,
 *       then samples VmRSS / VmHWM / open fds of each --pid while all stay open.
 *
 * Every mode sends the same request bytes on every connection: POST /v1/chat/completions
 * with --body (JSON) and an optional --auth bearer token. Results are one line of
 * key=value pairs on stdout (times in microseconds), diagnostics on stderr.
 *
 * One thread, one uv_loop: all connections share a single read buffer, consumed
 * entirely inside each read callback. Responses are parsed by llhttp (Content-Length
 * and chunked bodies, keep-alive).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

enum { MODE_RATE, MODE_TTFB, MODE_STREAMS };
#define MAX_PIDS 8

typedef struct conn_s {
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_write_t write_req;
    llhttp_t parser;
    int connected;
    int busy;        /* a request is outstanding */
    int done;        /* set by on_message_complete, handled after llhttp_execute */
    int failed;
    int status;
    int got_head, got_body;
    uint64_t t_due, t_send, t_head, t_body, t_last;
    uint64_t body_bytes;
    struct conn_s *next_idle;
} conn_t;

/* Growable array of latencies in nanoseconds. */
typedef struct {
    uint64_t *v;
    size_t n, cap;
} samples_t;

static struct {
    int mode;
    const char *host;
    int port;
    char *request;
    size_t request_len;
    int nconns;
    double rate;
    double duration_s, warmup_s, hold_s, timeout_s;
    long requests;
    double spread_ms; /* ttfb: the connections' first requests spread evenly over this time */
    int kicked;       /* ttfb: connections whose first request has been sent */
    uint64_t t_kick;
    int ramp;
    int window_ms;
    FILE *samples_out; /* one line of latencies (microseconds) per measured response */
    int pids[MAX_PIDS];
    int npids;

    uv_loop_t *loop;
    struct sockaddr_in addr;
    conn_t *conns;
    conn_t *idle;
    int nconnected, nstarted;
    uv_timer_t tick;
    int pace_fd;       /* rate: timerfd armed for the next due request */
    uv_poll_t pace;
    uint64_t t0, t_measure, t_end, t_deadline;

    long due_sent;  /* rate: index of the next request to send */
    long started, completed, errors, non2xx, late;
    samples_t service, corrected, head, body, total;

    /* streams */
    uint64_t t_all_receiving;
    long rss_max_kb[MAX_PIDS], hwm_kb[MAX_PIDS], fds[MAX_PIDS], rss_first_kb[MAX_PIDS];
    int sampled;
    int finished;
    int exit_code;
} g;

static char rbuf[256 * 1024];

static void samples_add(samples_t *s, uint64_t v) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 4096;
        s->v = realloc(s->v, s->cap * sizeof(*s->v));
        if (!s->v) {
            perror("realloc");
            exit(2);
        }
    }
    s->v[s->n++] = v;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Prints " <name>_p50=… _p90 _p99 _p999 _max _mean" in microseconds (nearest-rank). */
static void samples_print(const char *name, samples_t *s) {
    if (s->n == 0) {
        printf(" %s_n=0", name);
        return;
    }
    qsort(s->v, s->n, sizeof(*s->v), cmp_u64);
    static const double q[] = {50, 90, 99, 99.9};
    static const char *const qn[] = {"p50", "p90", "p99", "p999"};
    for (int i = 0; i < 4; i++) {
        size_t rank = (size_t)(q[i] / 100.0 * (double)s->n + 0.999999);
        if (rank < 1)
            rank = 1;
        if (rank > s->n)
            rank = s->n;
        printf(" %s_%s_us=%.1f", name, qn[i], (double)s->v[rank - 1] / 1e3);
    }
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += (double)s->v[i];
    printf(" %s_max_us=%.1f %s_mean_us=%.1f %s_n=%zu", name, (double)s->v[s->n - 1] / 1e3, name,
           sum / (double)s->n / 1e3, name, s->n);
}

/* ---- /proc sampling ---------------------------------------------------------------- */

static long proc_status_kb(int pid, const char *field) {
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kb = -1;
    size_t fl = strlen(field);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, field, fl) && line[fl] == ':') {
            kb = strtol(line + fl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

static long proc_fds(int pid) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static void sample_pids(void) {
    for (int i = 0; i < g.npids; i++) {
        long rss = proc_status_kb(g.pids[i], "VmRSS");
        if (!g.sampled)
            g.rss_first_kb[i] = rss;
        if (rss > g.rss_max_kb[i])
            g.rss_max_kb[i] = rss;
        g.hwm_kb[i] = proc_status_kb(g.pids[i], "VmHWM");
        long fds = proc_fds(g.pids[i]);
        if (fds > g.fds[i])
            g.fds[i] = fds;
    }
    g.sampled = 1;
}

/* ---- connections ------------------------------------------------------------------- */

static void start_request(conn_t *c, uint64_t due);
static void finish(int code);

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)h;
    (void)suggested;
    *buf = uv_buf_init(rbuf, sizeof(rbuf));
}

static void on_closed(uv_handle_t *h) {
    (void)h;
}

static void conn_fail(conn_t *c, const char *what, int err) {
    if (c->failed)
        return;
    c->failed = 1;
    g.errors++;
    if (g.errors <= 5)
        fprintf(stderr, "tg_loadgen: connection %ld: %s: %s\n", (long)(c - g.conns), what,
                err ? uv_strerror(err) : "protocol error");
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void push_idle(conn_t *c) {
    c->next_idle = g.idle;
    g.idle = c;
}

static int on_headers_complete(llhttp_t *p) {
    conn_t *c = p->data;
    c->status = p->status_code;
    c->got_head = 1;
    c->t_head = uv_hrtime();
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len) {
    (void)at;
    conn_t *c = p->data;
    uint64_t now = uv_hrtime();
    if (!c->got_body) {
        c->got_body = 1;
        c->t_body = now;
    }
    c->t_last = now;
    c->body_bytes += len;
    return 0;
}

static int on_message_complete(llhttp_t *p) {
    conn_t *c = p->data;
    c->done = 1;
    return HPE_PAUSED; /* handle one response at a time */
}

static llhttp_settings_t settings;

/* A response ended: record it and give the connection its next request. */
static void complete(conn_t *c) {
    uint64_t now = uv_hrtime();
    c->busy = 0;
    g.completed++;
    if (c->status < 200 || c->status > 299) {
        g.non2xx++;
        if (g.non2xx <= 3)
            fprintf(stderr, "tg_loadgen: status %d\n", c->status);
    }
    if (g.mode == MODE_RATE) {
        if (c->t_due >= g.t_measure && c->t_due < g.t_end) {
            samples_add(&g.service, now - c->t_send);
            samples_add(&g.corrected, now - c->t_due);
            if (g.samples_out)
                fprintf(g.samples_out, "%.1f %.1f\n", (double)(now - c->t_send) / 1e3,
                        (double)(now - c->t_due) / 1e3);
        }
        long due = (long)((double)(now - g.t0) / 1e9 * g.rate);
        if (now < g.t_end && g.due_sent < due) { /* a request is already late: send it */
            uint64_t t_due = g.t0 + (uint64_t)((double)g.due_sent * 1e9 / g.rate);
            g.due_sent++;
            g.late++;
            start_request(c, t_due);
        } else {
            push_idle(c);
        }
    } else if (g.mode == MODE_TTFB) {
        if (c->got_body) {
            samples_add(&g.head, c->t_head - c->t_send);
            samples_add(&g.body, c->t_body - c->t_send);
            if (g.samples_out)
                fprintf(g.samples_out, "%.1f %.1f %.1f\n", (double)(c->t_head - c->t_send) / 1e3,
                        (double)(c->t_body - c->t_send) / 1e3, (double)(now - c->t_send) / 1e3);
        }
        samples_add(&g.total, now - c->t_send);
        if (g.started < g.requests)
            start_request(c, now);
        else if (g.completed + g.errors >= g.requests)
            finish(0);
    } else {
        /* A stream that ends while held: it counts as not receiving. */
        g.errors++;
        fprintf(stderr, "tg_loadgen: stream %ld ended early\n", (long)(c - g.conns));
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    conn_t *c = s->data;
    if (nread == 0)
        return;
    if (nread < 0) {
        conn_fail(c, "read", nread == UV_EOF ? 0 : (int)nread);
        return;
    }
    const char *p = buf->base;
    size_t left = (size_t)nread;
    while (left > 0) {
        llhttp_errno_t e = llhttp_execute(&c->parser, p, left);
        if (e == HPE_PAUSED) {
            size_t used = (size_t)(llhttp_get_error_pos(&c->parser) - p);
            llhttp_resume(&c->parser);
            p += used;
            left -= used;
        } else if (e != HPE_OK) {
            fprintf(stderr, "tg_loadgen: parse error: %s\n", llhttp_errno_name(e));
            conn_fail(c, "parse", 0);
            return;
        } else {
            left = 0;
        }
        if (c->done) {
            c->done = 0;
            complete(c);
        }
    }
}

static void on_written(uv_write_t *req, int status) {
    conn_t *c = req->data;
    if (status < 0)
        conn_fail(c, "write", status);
}

static void start_request(conn_t *c, uint64_t due) {
    c->busy = 1;
    c->got_head = c->got_body = 0;
    c->status = 0;
    c->t_due = due;
    c->t_send = uv_hrtime();
    g.started++;
    uv_buf_t b = uv_buf_init(g.request, (unsigned)g.request_len);
    int r = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (r == (int)g.request_len)
        return;
    if (r < 0 && r != UV_EAGAIN) {
        conn_fail(c, "write", r);
        return;
    }
    if (r > 0)
        b = uv_buf_init(g.request + r, (unsigned)(g.request_len - (size_t)r));
    c->write_req.data = c;
    r = uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &b, 1, on_written);
    if (r < 0)
        conn_fail(c, "write", r);
}

static void on_connect(uv_connect_t *req, int status) {
    conn_t *c = req->data;
    if (status < 0) {
        conn_fail(c, "connect", status);
        return;
    }
    c->connected = 1;
    g.nconnected++;
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (g.mode == MODE_STREAMS)
        start_request(c, uv_hrtime());
    else
        push_idle(c);
}

static void conn_open(conn_t *c) {
    llhttp_init(&c->parser, HTTP_RESPONSE, &settings);
    c->parser.data = c;
    uv_tcp_init(g.loop, &c->tcp);
    c->tcp.data = c;
    c->connect_req.data = c;
    int r = uv_tcp_connect(&c->connect_req, &c->tcp, (const struct sockaddr *)&g.addr, on_connect);
    if (r < 0)
        conn_fail(c, "connect", r);
    g.nstarted++;
}

/* ---- the modes' clocks ------------------------------------------------------------- */

static void close_walk_cb(uv_handle_t *h, void *arg) {
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, on_closed);
}

static void finish(int code) {
    if (g.finished)
        return;
    g.finished = 1;
    g.exit_code = code;
    uv_walk(g.loop, close_walk_cb, NULL);
}

/* Arms the pacing timerfd for absolute monotonic time t (uv_hrtime's clock). */
static void pace_arm(uint64_t t) {
    struct itimerspec its = {0};
    its.it_value.tv_sec = (time_t)(t / 1000000000ull);
    its.it_value.tv_nsec = (long)(t % 1000000000ull);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
        its.it_value.tv_nsec = 1;
    if (timerfd_settime(g.pace_fd, TFD_TIMER_ABSTIME, &its, NULL) < 0) {
        perror("timerfd_settime");
        exit(2);
    }
}

/* Sends every request that is due on an idle connection, then sleeps until the next.
 * Requests that find no idle connection are sent by complete() as soon as one frees. */
static void rate_pace(uv_poll_t *p, int status, int events) {
    (void)p;
    (void)status;
    (void)events;
    uint64_t expirations;
    if (read(g.pace_fd, &expirations, sizeof(expirations)) < 0 && errno != EAGAIN)
        perror("read timerfd");
    uint64_t now = uv_hrtime();
    if (now >= g.t_end) {
        uv_poll_stop(&g.pace);
        return;
    }
    long due = (long)((double)(now - g.t0) / 1e9 * g.rate);
    while (g.due_sent < due && g.idle) {
        conn_t *c = g.idle;
        g.idle = c->next_idle;
        if (c->failed)
            continue;
        uint64_t t_due = g.t0 + (uint64_t)((double)g.due_sent * 1e9 / g.rate);
        if (now - t_due > 1000000)
            g.late++;
        g.due_sent++;
        start_request(c, t_due);
    }
    pace_arm(g.t0 + (uint64_t)((double)(g.due_sent + 1) * 1e9 / g.rate));
}

/* After the measured window: wait for outstanding requests, up to the deadline. */
static void rate_tick(uv_timer_t *t) {
    (void)t;
    uint64_t now = uv_hrtime();
    if (now < g.t_end)
        return;
    long outstanding = 0;
    for (int i = 0; i < g.nconns; i++)
        outstanding += g.conns[i].busy && !g.conns[i].failed;
    if (outstanding == 0 || now >= g.t_deadline)
        finish(0);
}

static void rate_wait_connected(uv_timer_t *t) {
    if (g.nconnected + g.errors < g.nconns) {
        if (uv_hrtime() > g.t_deadline) {
            fprintf(stderr, "tg_loadgen: only %d of %d connections opened\n", g.nconnected, g.nconns);
            finish(1);
        }
        return;
    }
    uv_timer_stop(t);
    g.t0 = uv_hrtime();
    g.t_measure = g.t0 + (uint64_t)(g.warmup_s * 1e9);
    g.t_end = g.t_measure + (uint64_t)(g.duration_s * 1e9);
    g.t_deadline = g.t_end + 5000000000ull;
    uv_timer_start(t, rate_tick, 10, 10);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    g.pace_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (g.pace_fd < 0 || uv_poll_init(g.loop, &g.pace, g.pace_fd) != 0) {
        perror("timerfd_create");
        exit(2);
    }
    uv_poll_start(&g.pace, UV_READABLE, rate_pace);
    pace_arm(g.t0);
}

/* Starts the closed loop once every connection is open; afterwards a watchdog. */
static void ttfb_tick(uv_timer_t *t) {
    (void)t;
    if (uv_hrtime() > g.t_deadline) {
        fprintf(stderr, "tg_loadgen: timeout with %ld of %ld requests completed\n", g.completed, g.requests);
        g.errors++;
        finish(1);
        return;
    }
    if (g.kicked >= g.nconns || g.nconnected + g.errors < g.nconns)
        return;
    uint64_t now = uv_hrtime();
    if (!g.t_kick)
        g.t_kick = now;
    while (g.idle && g.started < g.requests && g.kicked < g.nconns &&
           now >= g.t_kick + (uint64_t)(g.spread_ms * 1e6 * g.kicked / g.nconns)) {
        conn_t *c = g.idle;
        g.idle = c->next_idle;
        g.kicked++;
        start_request(c, now);
    }
    if (!g.idle)
        g.kicked = g.nconns;
}

static void streams_tick(uv_timer_t *t) {
    (void)t;
    uint64_t now = uv_hrtime();
    for (int k = 0; k < g.ramp && g.nstarted < g.nconns; k++)
        conn_open(&g.conns[g.nstarted]);
    static uint64_t last_scan;
    if (now - last_scan < 100000000ull) /* the scan below runs every 100 ms */
        return;
    last_scan = now;
    int head = 0, body = 0, recent = 0;
    for (int i = 0; i < g.nstarted; i++) {
        conn_t *c = &g.conns[i];
        if (c->failed)
            continue;
        head += c->got_head;
        body += c->got_body;
        recent += c->got_body && now - c->t_last < (uint64_t)g.window_ms * 1000000ull;
    }
    static uint64_t last_report;
    if (now - last_report > 2000000000ull) {
        last_report = now;
        fprintf(stderr, "tg_loadgen: %.1fs connected=%d head=%d body=%d receiving=%d errors=%ld\n",
                (double)(now - g.t0) / 1e9, g.nconnected, head, body, recent, g.errors);
    }
    if (!g.t_all_receiving) {
        if (recent == g.nconns) {
            g.t_all_receiving = now;
            fprintf(stderr, "tg_loadgen: all %d streams receiving after %.1fs\n", g.nconns,
                    (double)(now - g.t0) / 1e9);
            sample_pids();
        } else if (now > g.t_deadline) {
            printf("mode=streams ok=0 conns=%d connected=%d head=%d body=%d receiving=%d errors=%ld\n",
                   g.nconns, g.nconnected, head, body, recent, g.errors);
            finish(1);
        }
        return;
    }
    sample_pids();
    if (now - g.t_all_receiving >= (uint64_t)(g.hold_s * 1e9)) {
        printf("mode=streams ok=%d conns=%d connected=%d head=%d body=%d receiving=%d errors=%ld "
               "ready_s=%.2f held_s=%.2f",
               recent == g.nconns, g.nconns, g.nconnected, head, body, recent, g.errors,
               (double)(g.t_all_receiving - g.t0) / 1e9, (double)(now - g.t_all_receiving) / 1e9);
        for (int i = 0; i < g.npids; i++)
            printf(" pid%d=%d rss_first_kb%d=%ld rss_max_kb%d=%ld hwm_kb%d=%ld fds%d=%ld", i, g.pids[i], i,
                   g.rss_first_kb[i], i, g.rss_max_kb[i], i, g.hwm_kb[i], i, g.fds[i]);
        printf("\n");
        finish(recent == g.nconns ? 0 : 1);
    }
}

/* ---- main -------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr,
            "usage: tg_loadgen rate|ttfb|streams HOST:PORT [--body JSON] [--auth TOKEN] [--conns N]\n"
            "       rate:    --rate R --duration S [--warmup S] [--samples FILE]\n"
            "       ttfb:    --requests N [--spread MS] [--samples FILE]\n"
            "       streams: [--ramp K] [--hold S] [--timeout S] [--window MS] [--pid P]...\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 3)
        usage();
    if (!strcmp(argv[1], "rate"))
        g.mode = MODE_RATE;
    else if (!strcmp(argv[1], "ttfb"))
        g.mode = MODE_TTFB;
    else if (!strcmp(argv[1], "streams"))
        g.mode = MODE_STREAMS;
    else
        usage();
    char host[64];
    const char *colon = strrchr(argv[2], ':');
    if (!colon || (size_t)(colon - argv[2]) >= sizeof(host))
        usage();
    memcpy(host, argv[2], (size_t)(colon - argv[2]));
    host[colon - argv[2]] = 0;
    g.port = atoi(colon + 1);
    const char *body = "{\"model\":\"mock-gpt\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}";
    const char *auth = NULL;
    g.nconns = 16;
    g.rate = 1000;
    g.duration_s = 10;
    g.warmup_s = 1;
    g.requests = 1000;
    g.ramp = 10;
    g.hold_s = 5;
    g.timeout_s = 60;
    g.window_ms = 2500;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--body"))
            body = v;
        else if (!strcmp(a, "--auth"))
            auth = v;
        else if (!strcmp(a, "--conns"))
            g.nconns = atoi(v);
        else if (!strcmp(a, "--rate"))
            g.rate = atof(v);
        else if (!strcmp(a, "--duration"))
            g.duration_s = atof(v);
        else if (!strcmp(a, "--warmup"))
            g.warmup_s = atof(v);
        else if (!strcmp(a, "--requests"))
            g.requests = atol(v);
        else if (!strcmp(a, "--spread"))
            g.spread_ms = atof(v);
        else if (!strcmp(a, "--ramp"))
            g.ramp = atoi(v);
        else if (!strcmp(a, "--hold"))
            g.hold_s = atof(v);
        else if (!strcmp(a, "--timeout"))
            g.timeout_s = atof(v);
        else if (!strcmp(a, "--window"))
            g.window_ms = atoi(v);
        else if (!strcmp(a, "--samples")) {
            g.samples_out = fopen(v, "a");
            if (!g.samples_out) {
                perror(v);
                return 2;
            }
        } else if (!strcmp(a, "--pid") && g.npids < MAX_PIDS)
            g.pids[g.npids++] = atoi(v);
        else
            usage();
    }
    if (g.nconns < 1 || g.rate <= 0 || g.ramp < 1)
        usage();

    size_t cap = strlen(body) + (auth ? strlen(auth) : 0) + 512;
    g.request = malloc(cap);
    int n = snprintf(g.request, cap,
                     "POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     "%s%s%sContent-Length: %zu\r\n\r\n%s",
                     host, g.port, auth ? "Authorization: Bearer " : "", auth ? auth : "", auth ? "\r\n" : "",
                     strlen(body), body);
    g.request_len = (size_t)n;

    llhttp_settings_init(&settings);
    settings.on_headers_complete = on_headers_complete;
    settings.on_body = on_body;
    settings.on_message_complete = on_message_complete;

    g.loop = uv_default_loop();
    if (uv_ip4_addr(host, g.port, &g.addr) != 0)
        usage();
    g.conns = calloc((size_t)g.nconns, sizeof(conn_t));
    for (int i = 0; i < MAX_PIDS; i++)
        g.rss_max_kb[i] = g.hwm_kb[i] = g.fds[i] = -1;
    g.t0 = uv_hrtime();
    g.t_deadline = g.t0 + (uint64_t)(g.timeout_s * 1e9);
    uv_timer_init(g.loop, &g.tick);

    if (g.mode == MODE_STREAMS) {
        uv_timer_start(&g.tick, streams_tick, 1, 1);
    } else {
        for (int i = 0; i < g.nconns; i++)
            conn_open(&g.conns[i]);
        uv_timer_start(&g.tick, g.mode == MODE_RATE ? rate_wait_connected : ttfb_tick, 1, 1);
    }
    uv_run(g.loop, UV_RUN_DEFAULT);

    if (g.mode == MODE_RATE) {
        double secs = g.duration_s;
        printf("mode=rate target_rate=%.0f conns=%d sent=%ld completed=%ld errors=%ld non2xx=%ld late=%ld "
               "measured_rate=%.1f",
               g.rate, g.nconns, g.started, g.completed, g.errors, g.non2xx, g.late,
               (double)g.service.n / secs);
        samples_print("svc", &g.service);
        samples_print("cor", &g.corrected);
        printf("\n");
        if (g.errors || g.non2xx)
            g.exit_code = 1;
    } else if (g.mode == MODE_TTFB) {
        printf("mode=ttfb conns=%d requests=%ld completed=%ld errors=%ld non2xx=%ld", g.nconns, g.requests,
               g.completed, g.errors, g.non2xx);
        samples_print("head", &g.head);
        samples_print("body", &g.body);
        samples_print("total", &g.total);
        printf("\n");
        if (g.errors || g.non2xx)
            g.exit_code = 1;
    }
    if (g.samples_out)
        fclose(g.samples_out);
    uv_loop_close(g.loop);
    return g.exit_code;
}
