/*
 * The incremental Server-Sent Events parser behind streamed responses: the upstream
 * reader feeds it every chunk it receives, and it calls back once per complete event so
 * the gateway can record the first token and the usage events while passing the bytes on
 * untouched.
 *
 * Lines are found with memchr, never byte by byte. A line that lies wholly inside the
 * fed chunk is parsed where it lies; only a line cut by the end of a chunk is copied into
 * `line` until its end arrives. In the common case (OpenAI's `data: {...}\n\n` arriving
 * whole) an event whose single data line is followed at once by the blank line is handed
 * to the callback straight from the caller's buffer, without any copy.
 *
 * Memory is bounded by `max_event`: `event` and `data` never hold more than that many
 * bytes together, and `line` never more than max_event + TG__SSE_LINE_SLACK. An event
 * that would exceed the bound is dropped whole (and counted) when its blank line comes;
 * the events after it are parsed as usual.
 */
#include "tollgate/tg_sse.h"

/*
 * Bits of `overflow`. DROP: the current event exceeded max_event and is dropped at its
 * blank line. SKIP: the rest of the current line is discarded up to its end, because
 * the line outgrew the line bound (set with DROP for data/event lines, alone for
 * comments and ignored fields, which must not cost the event).
 */
#define TG__SSE_DROP 1
#define TG__SSE_SKIP 2

/* Room for a field name, its colon and space beyond max_event in a buffered line, so a
 * data line whose value fits the bound always fits the line buffer. */
#define TG__SSE_LINE_SLACK 16

void tg_sse_init(tg_sse_parser_t *p, size_t max_event, tg_sse_event_cb cb, void *ud) {
    memset(p, 0, sizeof(*p));
    p->cb = cb;
    p->ud = ud;
    p->max_event = max_event;
    tg_buf_init(&p->line);
    tg_buf_init(&p->event);
    tg_buf_init(&p->data);
}

void tg_sse_free(tg_sse_parser_t *p) {
    tg_buf_free(&p->line);
    tg_buf_free(&p->event);
    tg_buf_free(&p->data);
    p->has_data = 0;
    p->last_cr = 0;
    p->overflow = 0;
}

/* Ends the current event at a blank line: dispatches it, or counts it as dropped. */
static void sse_dispatch(tg_sse_parser_t *p) {
    if (p->overflow & TG__SSE_DROP) {
        p->dropped++;
    } else if (p->has_data) {
        p->events++;
        p->cb(p->ud, p->event.data ? p->event.data : "", p->event.len,
              p->data.data ? p->data.data : "", p->data.len);
    }
    tg_buf_reset(&p->event);
    tg_buf_reset(&p->data);
    p->has_data = 0;
    p->overflow = 0;
}

/* Marks the current event as dropped and releases what it had gathered. */
static void sse_drop(tg_sse_parser_t *p) {
    p->overflow |= TG__SSE_DROP;
    tg_buf_reset(&p->event);
    tg_buf_reset(&p->data);
}

static int sse_is_field(const char *name, size_t n, const char *field, size_t flen) {
    return n == flen && memcmp(name, field, flen) == 0;
}

/* Handles one complete line (without its terminator). */
static void sse_line(tg_sse_parser_t *p, const char *s, size_t n) {
    if (n == 0) {
        sse_dispatch(p);
        return;
    }
    if (s[0] == ':')
        return;
    const char *colon = memchr(s, ':', n);
    size_t name_len = colon ? (size_t)(colon - s) : n;
    const char *v = colon ? colon + 1 : s + n;
    size_t vlen = (size_t)(s + n - v);
    if (vlen > 0 && v[0] == ' ') {
        v++;
        vlen--;
    }
    if (p->overflow & TG__SSE_DROP)
        return;
    if (sse_is_field(s, name_len, "data", 4)) {
        size_t sep = p->has_data ? 1 : 0;
        size_t used = p->event.len + p->data.len + sep;
        if (used > p->max_event || vlen > p->max_event - used) {
            sse_drop(p);
            return;
        }
        if (sep)
            tg_buf_append(&p->data, "\n", 1);
        tg_buf_append(&p->data, v, vlen);
        p->has_data = 1;
    } else if (sse_is_field(s, name_len, "event", 5)) {
        if (p->data.len > p->max_event || vlen > p->max_event - p->data.len) {
            sse_drop(p);
            return;
        }
        tg_buf_reset(&p->event);
        tg_buf_append(&p->event, v, vlen);
    }
    /* id, retry and unknown fields are ignored. */
}

/*
 * Buffers the start of a line cut by the end of a chunk. When the line outgrows its
 * bound, decides from its first bytes what it is and discards the rest of it: a data or
 * event line that long cannot fit max_event, so its event is dropped; anything else is
 * skipped without harming the event.
 */
static void sse_partial(tg_sse_parser_t *p, const char *s, size_t n) {
    if (p->overflow & TG__SSE_SKIP)
        return;
    size_t bound = p->max_event > SIZE_MAX - TG__SSE_LINE_SLACK
                       ? SIZE_MAX
                       : p->max_event + TG__SSE_LINE_SLACK;
    if (n <= bound - p->line.len) {
        tg_buf_append(&p->line, s, n);
        return;
    }
    /* The line is longer than TG__SSE_LINE_SLACK, so its head is all we need. */
    char head[TG__SSE_LINE_SLACK];
    size_t have = TG_MIN(p->line.len, sizeof(head));
    if (have)
        memcpy(head, p->line.data, have);
    size_t more = TG_MIN(sizeof(head) - have, n);
    if (more)
        memcpy(head + have, s, more);
    have += more;
    const char *colon = memchr(head, ':', have);
    size_t name_len = colon ? (size_t)(colon - head) : have;
    if (sse_is_field(head, name_len, "data", 4) || sse_is_field(head, name_len, "event", 5))
        sse_drop(p);
    p->overflow |= TG__SSE_SKIP;
    tg_buf_reset(&p->line);
}

void tg_sse_feed(tg_sse_parser_t *p, const char *buf, size_t len) {
    if (len == 0)
        return;
    size_t i = 0;
    if (p->last_cr) {
        p->last_cr = 0;
        if (buf[0] == '\n')
            i = 1;
    }
    /* Position of the next LF at or after i (len if none), kept across lines so that a
     * stream using bare CRs is not rescanned to its end for every line. */
    size_t lf = 0;
    int lf_known = 0;
    while (i < len) {
        if (!lf_known || lf < i) {
            const char *q = memchr(buf + i, '\n', len - i);
            lf = q ? (size_t)(q - buf) : len;
            lf_known = 1;
        }
        const char *cr = memchr(buf + i, '\r', lf - i);
        size_t e = cr ? (size_t)(cr - buf) : lf;
        if (e == len) {
            sse_partial(p, buf + i, len - i);
            return;
        }
        /* The line ends at e; `next` is the start of the line after it. */
        size_t next = e + 1;
        if (buf[e] == '\r') {
            if (next == len)
                p->last_cr = 1;
            else if (buf[next] == '\n')
                next++;
        }
        if (p->overflow & TG__SSE_SKIP) {
            p->overflow &= ~TG__SSE_SKIP;
            i = next;
            continue;
        }
        if (p->line.len > 0) {
            sse_partial(p, buf + i, e - i);
            if (p->overflow & TG__SSE_SKIP) {
                p->overflow &= ~TG__SSE_SKIP;
            } else {
                sse_line(p, p->line.data, p->line.len);
                tg_buf_reset(&p->line);
            }
            i = next;
            continue;
        }
        const char *s = buf + i;
        size_t n = e - i;
        /* Zero-copy path: a lone data line directly followed by the blank line. */
        if (!p->has_data && !p->overflow && next < len &&
            (buf[next] == '\n' || buf[next] == '\r') && n >= 4 && memcmp(s, "data", 4) == 0 &&
            (n == 4 || s[4] == ':')) {
            const char *v = s + (n == 4 ? 4 : 5);
            size_t vlen = (size_t)(s + n - v);
            if (vlen > 0 && v[0] == ' ') {
                v++;
                vlen--;
            }
            if (p->event.len <= p->max_event && vlen <= p->max_event - p->event.len) {
                p->events++;
                p->cb(p->ud, p->event.data ? p->event.data : "", p->event.len, v, vlen);
                tg_buf_reset(&p->event);
                i = next + 1;
                if (buf[next] == '\r') {
                    if (i == len)
                        p->last_cr = 1;
                    else if (buf[i] == '\n')
                        i++;
                }
                continue;
            }
        }
        sse_line(p, s, n);
        i = next;
    }
}
