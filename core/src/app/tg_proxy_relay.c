/*
 * The response path: the upstream call's callbacks (tg__up_cbs, given to tg_upcall_start
 * by tg_proxy_upstream.c) and the client's side of the connection.
 *
 *   up_head   a retryable error is deferred (a retry may replace it); a stream gets its
 *             SSE parser and, across protocols, a translator; a translated answer or an
 *             Anthropic client's error is kept whole; anything else starts the answer
 *   up_body   passed through as it arrives (usage read from the events, the usage
 *             chunk the client did not ask for removed), or kept; a slow client pauses
 *             the upstream
 *   up_done   a deferred error retries (tg__maybe_retry) or is answered; a kept answer
 *             is translated and sent; health, sticky binding, usage
 *   up_error  retried before the first byte, else an error or a cut stream
 *
 * A client that leaves aborts the call (tg__on_abort); one that drains its queue
 * resumes it (tg__on_drain).
 */
#include <stdio.h>
#include <stdlib.h>

#include "tg_proxy_internal.h"

#define BODY_COPY_MAX (16u * 1024 * 1024)
#define SSE_EVENT_MAX (4u * 1024 * 1024)

static void sse_event(void *ud, const char *event, size_t event_len, const char *data, size_t data_len) {
    proxy_req_t *p = ud;
    int usage_found = 0;
    if (data_len && (memmem(data, data_len, "\"content\"", 9) || memmem(data, data_len, "text_delta", 10) ||
                     memmem(data, data_len, "output_text.delta", 17))) {
        /* Time to first token: the first event that carries content. */
        if (!p->at.stream_chunks++)
            p->at.first_token_ns = tg_now_ns();
    }
    if (data_len && memmem(data, data_len, "usage", 5))
        usage_found = tg_usage_merge_json(&p->at.usage, p->at.up_proto, data, data_len) == 1;
    if (p->at.xlate) {
        tg_buf_t out;
        tg_buf_init(&out);
        tg_xlate_event(p->at.xlate, event, event_len, data, data_len, &out);
        if (out.len)
            tg_response_body(p->req, out.data, out.len);
        tg_buf_free(&out);
        return;
    }
    if (!p->at.strip_usage_chunk)
        return;
    /* Re-emit the event unless it is the usage-only chunk the client did not ask for. */
    if (usage_found && data_len && memmem(data, data_len, "\"choices\":[]", 12))
        return;
    tg_buf_t b;
    tg_buf_init(&b);
    if (event_len) {
        tg_buf_appends(&b, "event: ");
        tg_buf_append(&b, event, event_len);
        tg_buf_appends(&b, "\n");
    }
    /* Multi-line data goes back out as several data: lines. */
    const char *s = data, *end = data + data_len;
    while (s <= end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        tg_buf_appends(&b, "data: ");
        tg_buf_append(&b, s, (size_t)(e - s));
        tg_buf_appends(&b, "\n");
        if (!nl)
            break;
        s = nl + 1;
    }
    tg_buf_appends(&b, "\n");
    tg_response_body(p->req, b.data, b.len);
    tg_buf_free(&b);
}

/* A Bedrock stream's Anthropic event (tg_bedrock_stream_t): read like an upstream SSE
 * event, its invocation metrics filling only the usage the events left unknown, and
 * written as one for a client that gets the events as they are. */
static void aws_event(void *ud, const char *event, size_t event_len, const char *data, size_t data_len) {
    proxy_req_t *p = ud;
    /* Before the event is relayed: a translator writes its usage chunk at message_stop
     * from this fold (tg_xlate_use_usage), so the chunk shows the bill. The metrics fill
     * only what no event gave, so the order does not change the bill. */
    if (event_len == 12 && !memcmp(event, "message_stop", 12))
        tg_bedrock_metrics_usage(&p->at.usage, data, data_len);
    sse_event(p, event, event_len, data, data_len);
    if (p->at.xlate || p->at.strip_usage_chunk)
        return;
    tg_buf_t b;
    tg_buf_init(&b);
    tg_buf_reserve(&b, event_len + data_len + 16);
    tg_buf_appends(&b, "event: ");
    tg_buf_append(&b, event, event_len);
    tg_buf_appends(&b, "\ndata: ");
    tg_buf_append(&b, data, data_len);
    tg_buf_appends(&b, "\n\n");
    tg_response_body(p->req, b.data, b.len);
    tg_buf_free(&b);
}

static int64_t parse_retry_after_ms(const char *v) {
    if (!v || !*v)
        return -1;
    char *end;
    double secs = strtod(v, &end);
    if (end == v || secs < 0)
        return -1; /* an HTTP date: treated as unknown */
    return (int64_t)(secs * 1000);
}

static void up_head(void *ud, const tg_uphead_t *head) {
    proxy_req_t *p = ud;
    p->at.upstream_status = head->status;
    tg__quota_learn(p, head->status, head->extra_headers, NULL, 0);
    if ((tg__retryable_status(head->status) && tg__can_retry(p)) || tg__auth_retry_possible(p, head->status)) {
        /* Deferred: if a retry follows, the client never sees this attempt. */
        p->at.deferred = 1;
        p->at.deferred_status = head->status;
        snprintf(p->at.deferred_ctype, sizeof(p->at.deferred_ctype), "%s", head->content_type ? head->content_type : "application/json");
        int n = snprintf(p->at.deferred_extra, sizeof(p->at.deferred_extra), "%s", head->extra_headers ? head->extra_headers : "");
        if (head->retry_after && n >= 0 && (size_t)n < sizeof(p->at.deferred_extra))
            snprintf(p->at.deferred_extra + n, sizeof(p->at.deferred_extra) - (size_t)n, "Retry-After: %s\r\n", head->retry_after);
        return;
    }
    int is_sse = head->content_type && strncasecmp(head->content_type, "text/event-stream", 17) == 0;
    /* Bedrock's InvokeModelWithResponseStream: AWS's binary event stream, decoded into
     * the Anthropic events it carries (and sent to the client as SSE). */
    int aws = head->status == 200 && head->content_type && p->at.account &&
              strncasecmp(head->content_type, "application/vnd.amazon.eventstream", 34) == 0 &&
              !strcmp(p->at.account->provider, "bedrock");
    is_sse |= aws;
    int translating = p->at.up_proto != p->proto;
    if (is_sse && head->status == 200) {
        tg_sse_init(&p->at.sse, SSE_EVENT_MAX, sse_event, p);
        p->at.sse_on = 1;
        if (aws) {
            tg_bedrock_stream_init(&p->at.aws, SSE_EVENT_MAX, aws_event, p);
            p->at.aws_on = 1;
        }
        if (translating) {
            p->at.xlate = tg_xlate_create(p->at.up_proto, p->proto, p->model, p->req->id);
            if (p->at.xlate)
                tg_xlate_use_usage(p->at.xlate, &p->at.usage); /* sse_event folds it, to bill */
            if (p->at.xlate && p->proto == TG_PROTO_OPENAI_CHAT)
                tg_xlate_set_usage_chunk(p->at.xlate, !p->strip_usage_orig);
        }
    } else {
        p->at.strip_usage_chunk = 0;
        if (translating || (head->status >= 400 && p->proto == TG_PROTO_ANTHROPIC)) {
            /* A translated answer or error is sent whole at the end, in the client's shape. */
            p->at.buffer_whole = 1;
            return;
        }
    }
    /* The common case — a plain answer with nothing to add — passes the upstream's
     * header lines through without copying them. */
    const char *extra = head->extra_headers ? head->extra_headers : "";
    char more[2048];
    if (head->retry_after || is_sse || p->ctx_on) {
        /* Built with copies, not printf (this runs for every stream and plugin answer):
         * each piece cut to what fits, as snprintf cut it. */
        size_t n = tg_copy(more, sizeof(more), extra);
        if (head->retry_after) {
            n += tg_copy(more + n, sizeof(more) - n, "Retry-After: ");
            n += tg_copy(more + n, sizeof(more) - n, head->retry_after);
            n += tg_copy(more + n, sizeof(more) - n, "\r\n");
        }
        if (is_sse)
            n += tg_copy(more + n, sizeof(more) - n, "Cache-Control: no-cache\r\n");
        if (p->ctx_on) {
            n += tg_fmt_key(more + n, sizeof(more) - n, "x-tollgate-generation: ", (int64_t)p->ctx.generation, "\r\n");
            size_t k = TG_MIN((size_t)p->ctx.resp_headers_len, sizeof(more) - 1 - n);
            memcpy(more + n, p->ctx.resp_headers, k);
            more[n + k] = '\0';
        }
        extra = more;
    }
    /* A non-stream answer passed through byte for byte keeps its Content-Length (no
     * chunk framing); streams and translated answers are chunked. */
    int64_t length = !is_sse && !translating ? head->content_length : -1;
    tg_response_start(p->req, head->status,
                      p->at.xlate || aws ? "text/event-stream" : head->content_type ? head->content_type : "application/json",
                      extra, length);
}

static void up_body(void *ud, const char *data, size_t n) {
    proxy_req_t *p = ud;
    if (p->at.deferred) {
        if (p->deferred_body.len + n <= 65536)
            tg_buf_append(&p->deferred_body, data, n);
        return;
    }
    if (!p->at.first_byte_ns)
        p->at.first_byte_ns = tg_now_ns();
    if (p->at.buffer_whole) {
        if (p->body_copy.len + n <= BODY_COPY_MAX)
            tg_buf_append(&p->body_copy, data, n);
        else
            p->at.body_copy_over = 1;
        return;
    }
    if (p->at.aws_on) {
        tg_bedrock_stream_feed(&p->at.aws, data, n);
    } else if (p->at.sse_on) {
        tg_sse_feed(&p->at.sse, data, n);
        if (!p->at.strip_usage_chunk && !p->at.xlate)
            tg_response_body(p->req, data, n);
    } else {
        tg_response_body(p->req, data, n);
        if (!p->at.body_copy_over) {
            if (p->body_copy.len + n > BODY_COPY_MAX) {
                p->at.body_copy_over = 1;
                tg_buf_free(&p->body_copy);
            } else {
                tg_buf_append(&p->body_copy, data, n);
            }
        }
    }
    /* Back-pressure: a slow client pauses the upstream instead of growing our buffers. */
    if (p->at.call && !p->at.paused &&
        tg_request_write_queue(p->req) > p->req->worker->gw->cfg->http_limits.max_write_buffer) {
        p->at.paused = 1;
        tg_upcall_pause(p->at.call);
    }
}

static void up_done(void *ud) {
    proxy_req_t *p = ud;
    p->at.call = NULL;
    p->upstream_end_ns = tg_now_ns();
    if (p->at.deferred) {
        const char *ra = strstr(p->at.deferred_extra, "Retry-After: ");
        int64_t retry_after = ra ? parse_retry_after_ms(ra + 13) : -1;
        p->error = "upstream_error";
        int status = p->at.deferred_status;
        if (status == 429 && p->deferred_body.len) /* usage_limit_reached ... resets_at */
            tg__quota_learn(p, status, NULL, p->deferred_body.data, p->deferred_body.len);
        if (status == 401 && tg__auth_retry(p))
            return;
        if (tg__maybe_retry(p, status, TG_UPFAIL_STATUS, retry_after))
            return;
        /* Giving up: the client gets this attempt's answer (in its own protocol's shape). */
        p->at.deferred = 0;
        if (p->at.up_proto != p->proto || p->proto == TG_PROTO_ANTHROPIC) {
            tg_buf_t out;
            tg_buf_init(&out);
            tg_translate_error(p->proto, status, p->deferred_body.data ? p->deferred_body.data : "", p->deferred_body.len, &out);
            tg_response_start(p->req, status, "application/json", p->at.deferred_extra, (int64_t)out.len);
            tg_response_body(p->req, out.data, out.len);
            tg_buf_free(&out);
        } else {
            tg_response_start(p->req, status, p->at.deferred_ctype, p->at.deferred_extra, (int64_t)p->deferred_body.len);
            tg_response_body(p->req, p->deferred_body.data, p->deferred_body.len);
        }
        tg_response_end(p->req);
        return;
    }
    if (p->at.health) {
        int ok = p->at.upstream_status < 500 && p->at.upstream_status != 429;
        double ttft = TTFT_NS(p) ? (double)(TTFT_NS(p) - p->upstream_start_ns) / 1e6 : -1;
        tg_health_end(p->at.health, ok, ttft);
        p->at.health = NULL;
    }
    if (p->at.upstream_status == 200)
        tg__sticky_bind(p);
    if (!p->at.first_byte_ns)
        p->at.first_byte_ns = p->upstream_end_ns;
    if (!p->at.sse_on && p->body_copy.len && p->at.upstream_status < 300)
        tg_usage_merge_json(&p->at.usage, p->at.up_proto, p->body_copy.data, p->body_copy.len);
    if (p->at.buffer_whole) {
        tg_buf_t out;
        tg_buf_init(&out);
        int status = p->at.upstream_status;
        if (p->at.body_copy_over) {
            tg__proxy_fail(p, 502, "upstream_error", "upstream_error", "the upstream's answer is too large to translate");
        } else if (status < 300) {
            if (tg_translate_response(p->at.up_proto, p->proto, p->body_copy.data ? p->body_copy.data : "", p->body_copy.len,
                                      p->model, &out) == TG_OK)
                tg_response_send(p->req, status, "application/json", NULL, out.data, out.len);
            else
                tg__proxy_fail(p, 502, "upstream_error", "upstream_error", "the upstream's answer could not be read");
        } else {
            tg_translate_error(p->proto, status, p->body_copy.data ? p->body_copy.data : "", p->body_copy.len, &out);
            tg_response_send(p->req, status, "application/json", NULL, out.data, out.len);
        }
        tg_buf_free(&out);
        return;
    }
    if (p->at.xlate) {
        tg_buf_t out;
        tg_buf_init(&out);
        tg_xlate_finish(p->at.xlate, &out);
        if (out.len)
            tg_response_body(p->req, out.data, out.len);
        tg_buf_free(&out);
    }
    tg_response_end(p->req);
}

static void up_error(void *ud, tg_uperr_t err, const char *msg) {
    proxy_req_t *p = ud;
    tg_request_t *req = p->req;
    p->at.call = NULL;
    p->at.up_err = (int)err;
    p->upstream_end_ns = tg_now_ns();
    atomic_fetch_add_explicit(&req->worker->metrics.upstream_errors, 1, memory_order_relaxed);
    tg_log_warn("request %s: upstream %s: %s", req->id, tg_upstream_name(p->at.up), msg);
    if (!req->resp_started) {
        int failure = err == TG_UPERR_CONNECT              ? TG_UPFAIL_CONNECT
                      : err == TG_UPERR_TIMEOUT_CONNECT    ? TG_UPFAIL_TIMEOUT_CONNECT
                      : err == TG_UPERR_TIMEOUT_FIRST_BYTE ? TG_UPFAIL_TIMEOUT_FIRST_BYTE
                      : err == TG_UPERR_TIMEOUT_IDLE       ? TG_UPFAIL_TIMEOUT_IDLE
                                                           : TG_UPFAIL_RESET;
        p->at.deferred = 0;
        if (tg__maybe_retry(p, 0, failure, -1))
            return;
    } else if (p->at.health) {
        tg_health_end(p->at.health, 0, -1);
        p->at.health = NULL;
    }
    if (req->resp_started) {
        p->error = "upstream_reset";
        tg_response_abort(req);
        return;
    }
    switch (err) {
    case TG_UPERR_TIMEOUT_CONNECT:
    case TG_UPERR_TIMEOUT_FIRST_BYTE:
    case TG_UPERR_TIMEOUT_IDLE:
        tg__proxy_fail(p, 504, "upstream_error", "upstream_timeout", "the upstream did not answer in time");
        break;
    case TG_UPERR_CONNECT:
        tg__proxy_fail(p, 502, "upstream_error", "upstream_unreachable", "the upstream could not be reached");
        break;
    default:
        tg__proxy_fail(p, 502, "upstream_error", "upstream_error", "the upstream closed the connection or sent an invalid response");
        break;
    }
}

const tg_upcall_cbs_t tg__up_cbs = {up_head, up_body, up_done, up_error};

void tg__health_detach(proxy_req_t *p) {
    /* The client left: not the account's fault, so no EWMA change. */
    if (p->at.health) {
        if (p->at.health->inflight > 0)
            p->at.health->inflight--;
        p->at.health->probing = 0;
        p->at.health = NULL;
    }
}

void tg__on_abort(tg_request_t *req) {
    proxy_req_t *p = req->handler_data;
    tg__health_detach(p);
    if (p->at.call) {
        tg_upcall_abort(p->at.call);
        p->at.call = NULL;
        p->upstream_end_ns = tg_now_ns();
    }
    p->error = "client_disconnected";
}

void tg__on_drain(tg_request_t *req) {
    proxy_req_t *p = req->handler_data;
    if (p->at.paused && p->at.call) {
        p->at.paused = 0;
        tg_upcall_resume(p->at.call);
    }
}
