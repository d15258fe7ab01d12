/*
 * An incremental parser for Server-Sent Events (the WHATWG event-stream format) as
 * sent by OpenAI and Anthropic streaming APIs.
 *
 * Bytes are fed as they arrive from the network, in pieces of any size: an event may be
 * split anywhere, even inside a CRLF. Lines end in LF, CR or CRLF; lines starting with
 * ':' are comments; several `data:` lines of one event are joined with '\n'; one space
 * after the colon is dropped; an empty line dispatches the event. `id:` and `retry:` are
 * accepted and ignored. The parser copies only the current event's fields, bounded by
 * `max_event` bytes, so memory does not grow with the stream.
 */
#ifndef TOLLGATE_TG_SSE_H
#define TOLLGATE_TG_SSE_H

#include "tollgate/tg_common.h"

/**
 * Called once per dispatched event. `event` is the `event:` field (length 0 when
 * absent), `data` the joined data lines. Both are valid only during the call. Events
 * with no data lines are not dispatched (as the spec says).
 */
typedef void (*tg_sse_event_cb)(void *ud, const char *event, size_t event_len, const char *data,
                                size_t data_len);

typedef struct {
    tg_sse_event_cb cb;
    void *ud;
    size_t max_event;
    tg_buf_t line;  /* the current, unfinished line */
    tg_buf_t event; /* event: field of the current event */
    tg_buf_t data;  /* joined data: lines of the current event */
    int has_data;
    int last_cr;    /* the previous chunk ended in CR: skip a leading LF */
    int overflow;   /* the current event exceeded max_event: it is dropped */
    uint64_t events;   /* events dispatched */
    uint64_t dropped;  /* events dropped for size */
} tg_sse_parser_t;

/** Initialises a parser; `max_event` bounds one event's size (e.g. 1 MiB). */
void tg_sse_init(tg_sse_parser_t *p, size_t max_event, tg_sse_event_cb cb, void *ud);
/** Feeds bytes; dispatches every event completed by them. Never fails: oversized events
 *  are dropped and counted in `dropped`. */
void tg_sse_feed(tg_sse_parser_t *p, const char *buf, size_t len);
/** Releases the parser's buffers. The parser may be initialised again afterwards. */
void tg_sse_free(tg_sse_parser_t *p);

#endif
