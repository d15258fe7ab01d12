/*
 * What the stream-translation fuzz targets check of a translated stream
 * (fuzz_translate_stream.c, fuzz_gemini_stream.c): included by each; FUZZ_NAME names the
 * target in the failure message.
 */
#ifndef TG_FUZZ_XLATE_CHECK_H
#define TG_FUZZ_XLATE_CHECK_H

#include "tollgate/tg_sse.h"
#include "tollgate/tg_translate.h"

#include <stdio.h>
#include <stdlib.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, FUZZ_NAME " invariant failed: %s\n", what);
        abort();
    }
}

/* Zeroes the digits of "created":N and "created_at":N: the translator stamps the time
 * when the upstream gives none, and the clock may tick between two runs (the result
 * is only compared, never parsed: leading zeros are not JSON). */
static void zero_clock(tg_buf_t *b) {
    static const char *const keys[] = {"\"created\":", "\"created_at\":"};
    for (int k = 0; k < 2; k++) {
        size_t kl = strlen(keys[k]);
        for (char *p = b->data; p && (p = memmem(p, b->len - (size_t)(p - b->data), keys[k], kl)) != NULL;) {
            p += kl;
            while (p < b->data + b->len && *p >= '0' && *p <= '9')
                *p++ = '0';
        }
    }
}

typedef struct {
    int to;
    int ended;
} verify_t;

/* One event of the client's stream: JSON data (or chat's [DONE]), Anthropic and
 * Responses events named after their "type", nothing after the end. */
static void verify_cb(void *ud, const char *event, size_t elen, const char *data, size_t dlen) {
    verify_t *v = ud;
    check(!v->ended, "an event after the end of the stream");
    if (v->to == TG_PROTO_OPENAI_CHAT && dlen == 6 && !memcmp(data, "[DONE]", 6)) {
        v->ended = 1;
        return;
    }
    json_error_t e;
    json_t *doc = json_loadb(data, dlen, 0, &e);
    check(json_is_object(doc), "event data is not a JSON object");
    if (v->to == TG_PROTO_OPENAI_CHAT) {
        check(elen == 0, "a chat event with a name");
        if (json_object_get(doc, "error"))
            v->ended = 1;
    } else {
        const char *t = json_string_value(json_object_get(doc, "type"));
        check(t && strlen(t) == elen && !memcmp(t, event, elen), "event name differs from its type");
        if (!strcmp(t, "message_stop") || !strcmp(t, "error") || !strcmp(t, "response.completed") ||
            !strcmp(t, "response.incomplete"))
            v->ended = 1;
    }
    json_decref(doc);
}

/* The client's bytes `out` of a stream to `to` parsed back: well formed to the end. */
static void verify_stream(int to, const tg_buf_t *out) {
    verify_t v = {to, 0};
    tg_sse_parser_t p;
    tg_sse_init(&p, (size_t)1 << 30, verify_cb, &v);
    tg_sse_feed(&p, out->data, out->len);
    check(p.line.len == 0 && !p.has_data, "output ends inside an event");
    tg_sse_free(&p);
}

#endif
