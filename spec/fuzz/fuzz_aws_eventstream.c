/*
 * libFuzzer target for the AWS event-stream decoder and Bedrock's stream
 * (core/src/proto/tg_aws.c: tg_es_*, tg_bedrock_stream_*, tg_bedrock_metrics_usage),
 * and the Anthropic stream translation behind it.
 *
 * Input: byte 0 picks where the stream is split in two; byte 1's low bit says how the
 * rest is read: raw bytes (the decoder's framing, CRCs and lengths, as they come), or
 * records the target frames with valid CRCs so the fuzzer reaches the payloads — each
 * record a kind byte, a length byte and that many bytes: 0 a chunk whose event is the
 * bytes (base64-encoded here), 1 a chunk whose payload is the bytes ({"bytes":...} or
 * not), 2 an exception whose payload is the bytes, 3 the bytes unframed, 4 a message of
 * another :message-type (error, with :error-code). Beyond ASan/UBSan it checks that
 *   - the events (and each client's stream) are the same whether the input came in one
 *     piece or two, and the events when it came byte by byte (inputs up to 4 KiB);
 *   - nothing follows an error event, and an event's name is its JSON's top-level type;
 *   - each event translated for chat, Messages and Responses clients gives a
 *     well-formed client stream (fuzz_xlate_check.h).
 */
#include "tollgate/tg_aws.h"
#include "tollgate/tg_usage.h"

#include <openssl/evp.h>

#define FUZZ_NAME "fuzz_aws_eventstream"
#include "fuzz_xlate_check.h"

typedef struct {
    tg_buf_t events; /* "name\ndata\n" per event */
    int errored;
    tg_xlate_t *x[3];
    tg_buf_t out[3];
    tg_usage_t usage;
} run_t;

static void event_cb(void *ud, const char *event, size_t elen, const char *data, size_t dlen) {
    run_t *r = ud;
    check(!r->errored, "an event after the error event");
    if (elen == 5 && !memcmp(event, "error", 5))
        r->errored = 1;
    json_error_t e;
    json_t *doc = json_loadb(data, dlen, JSON_REJECT_DUPLICATES, &e);
    const char *t = json_string_value(json_object_get(doc, "type"));
    if (t && !memchr(t, '\\', strlen(t)))
        check(strlen(t) == elen && !memcmp(t, event, elen), "the event's name is not its top-level type");
    json_decref(doc);
    tg_buf_append(&r->events, event, elen);
    tg_buf_appends(&r->events, "\n");
    tg_buf_append(&r->events, data, dlen);
    tg_buf_appends(&r->events, "\n");
    tg_usage_merge_json(&r->usage, TG_PROTO_ANTHROPIC, data, dlen);
    tg_bedrock_metrics_usage(&r->usage, data, dlen);
    for (int to = 0; to < 3; to++)
        if (r->x[to])
            tg_xlate_event(r->x[to], event, elen, data, dlen, &r->out[to]);
}

static void run(run_t *r, const char *s, size_t n, const size_t *cuts, size_t ncuts, int translate) {
    memset(r, 0, sizeof(*r));
    tg_buf_init(&r->events);
    for (int to = 0; to < 3; to++) {
        tg_buf_init(&r->out[to]);
        if (translate && to != TG_PROTO_ANTHROPIC)
            r->x[to] = tg_xlate_create(TG_PROTO_ANTHROPIC, (tg_proto_t)to, "client-model", "fuzz");
    }
    tg_bedrock_stream_t bs;
    tg_bedrock_stream_init(&bs, 1 << 16, event_cb, r);
    size_t at = 0;
    for (size_t i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        tg_bedrock_stream_feed(&bs, s + at, end - at);
        at = end;
    }
    tg_bedrock_stream_free(&bs);
    for (int to = 0; to < 3; to++)
        if (r->x[to]) {
            tg_xlate_finish(r->x[to], &r->out[to]);
            verify_stream(to, &r->out[to]);
        }
}

static void done(run_t *r) {
    tg_buf_free(&r->events);
    for (int to = 0; to < 3; to++) {
        tg_xlate_destroy(r->x[to]);
        tg_buf_free(&r->out[to]);
    }
}

/* The records of the input framed as an event stream (see the top). */
static void frame(const uint8_t *p, size_t n, tg_buf_t *out) {
    static const char *const chunk_n[] = {":event-type", ":content-type", ":message-type"};
    static const char *const chunk_v[] = {"chunk", "application/json", "event"};
    static const char *const exc_n[] = {":exception-type", ":content-type", ":message-type"};
    static const char *const exc_v[] = {"modelStreamErrorException", "application/json", "exception"};
    static const char *const err_n[] = {":error-code", ":error-message", ":message-type"};
    static const char *const err_v[] = {"InternalFailure", "it broke", "error"};
    tg_buf_t pay;
    tg_buf_init(&pay);
    while (n >= 2) {
        uint8_t kind = p[0] % 5;
        size_t len = TG_MIN((size_t)p[1], n - 2);
        const uint8_t *b = p + 2;
        p += 2 + len;
        n -= 2 + len;
        pay.len = 0;
        switch (kind) {
        case 0:
            tg_buf_reserve(&pay, 4 * (len / 3 + 1) + 16);
            tg_buf_appends(&pay, "{\"bytes\":\"");
            pay.len += (size_t)EVP_EncodeBlock((unsigned char *)pay.data + pay.len, b, (int)len);
            tg_buf_appends(&pay, "\"}");
            tg_es_encode(out, chunk_n, chunk_v, 3, pay.data, pay.len);
            break;
        case 1: tg_es_encode(out, chunk_n, chunk_v, 3, b, len); break;
        case 2: tg_es_encode(out, exc_n, exc_v, 3, b, len); break;
        case 3: tg_buf_append(out, b, len); break;
        default: tg_es_encode(out, err_n, err_v, 3, b, len); break;
        }
    }
    tg_buf_free(&pay);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    tg_buf_t in;
    tg_buf_init(&in);
    if (data[1] & 1)
        frame(data + 2, size - 2, &in);
    else
        tg_buf_append(&in, data + 2, size - 2);
    const char *s = in.data ? in.data : "";
    size_t n = in.len;
    size_t split = n * data[0] / 255;
    run_t a, b;
    run(&a, s, n, NULL, 0, 1);
    run(&b, s, n, &split, 1, 1);
    check(a.events.len == b.events.len && (!a.events.len || !memcmp(a.events.data, b.events.data, a.events.len)),
          "the events depend on how the input was split");
    for (int to = 0; to < 3; to++) {
        zero_clock(&a.out[to]);
        zero_clock(&b.out[to]);
        check(a.out[to].len == b.out[to].len && (!a.out[to].len || !memcmp(a.out[to].data, b.out[to].data, a.out[to].len)),
              "the client's stream depends on how the input was split");
    }
    done(&b);
    if (n <= 4096) {
        size_t *cuts = malloc((n + 1) * sizeof(size_t));
        for (size_t i = 0; i + 1 < n; i++)
            cuts[i] = i + 1;
        run(&b, s, n, cuts, n > 1 ? n - 1 : 0, 0);
        free(cuts);
        check(a.events.len == b.events.len && (!a.events.len || !memcmp(a.events.data, b.events.data, a.events.len)),
              "the events differ when the input comes byte by byte");
        done(&b);
    }
    done(&a);
    tg_buf_free(&in);
    return 0;
}
