/*
 * Unit tests of the SSE parser (core/src/proto/tg_sse.c). The main table feeds each stream
 * whole, split in two at every byte offset, in three at every pair of offsets (short
 * streams), and byte by byte, and checks that every way yields exactly the expected
 * events: the gateway sees the same usage and first token however the network cuts
 * the upstream's bytes.
 */
#include "tollgate/tg_sse.h"

#include "tg_test.h"

/* Events are recorded as "[event](data)" one after the other. */
static void record_cb(void *ud, const char *event, size_t event_len, const char *data,
                      size_t data_len) {
    tg_buf_t *out = ud;
    tg_buf_append(out, "[", 1);
    tg_buf_append(out, event, event_len);
    tg_buf_append(out, "](", 2);
    tg_buf_append(out, data, data_len);
    tg_buf_append(out, ")", 1);
}

typedef struct {
    const char *name;
    const char *in;
    size_t max_event;   /* 0: 1 MiB */
    const char *want;   /* the recorded events */
    uint64_t dropped;
} sse_case_t;

#define LONG40 "0123456789012345678901234567890123456789"

static const sse_case_t cases[] = {
    {"openai",
     "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"
     "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
     "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9}}\n\n"
     "data: [DONE]\n\n",
     0,
     "[]({\"id\":\"c1\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]})"
     "[]({\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]})"
     "[]({\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9}})"
     "[]([DONE])",
     0},
    {"anthropic",
     "event: message_start\ndata: {\"type\":\"message_start\"}\n\n"
     "event: ping\ndata: {\"type\": \"ping\"}\n\n"
     "event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n"
     "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
     0,
     "[message_start]({\"type\":\"message_start\"})[ping]({\"type\": \"ping\"})"
     "[content_block_delta]({\"type\":\"content_block_delta\"})"
     "[message_stop]({\"type\":\"message_stop\"})",
     0},
    {"crlf", "event: a\r\ndata: 1\r\ndata: 2\r\n\r\ndata: 3\r\n\r\n", 0, "[a](1\n2)[](3)", 0},
    {"cr_only", "event: a\rdata: 1\rdata: 2\r\rdata: 3\r\r", 0, "[a](1\n2)[](3)", 0},
    {"mixed_ends", "data: 1\r\ndata: 2\rdata: 3\n\r\ndata: 4\r\r\n", 0, "[](1\n2\n3)[](4)", 0},
    {"comments", ": hello\n\n: ping\ndata: x\n: mid\ndata: y\n\n:\n\n", 0, "[](x\ny)", 0},
    {"multi_line", "data: a\ndata:b\ndata\ndata:  c\n\n", 0, "[](a\nb\n\n c)", 0},
    {"empty_data", "data:\n\ndata\n\n", 0, "[]()[]()", 0},
    {"event_reset", "event: x\n\ndata: y\n\nevent: e1\nevent: e2\ndata: z\n\n", 0,
     "[](y)[e2](z)", 0},
    {"event_is_per_event",
     "event: a\ndata: 1\n\ndata: 2\n\nevent: b\r\ndata: 3\r\n\r\ndata: 4\r\n\r\n", 0,
     "[a](1)[](2)[b](3)[](4)", 0},
    {"ignored_fields", "id: 7\nretry: 100\nfoo: bar\nDATA: no\ndata : no\ndata: yes\n\n", 0,
     "[](yes)", 0},
    {"no_blank_at_end", "data: 1\n\ndata: 2\n", 0, "[](1)", 0},
    {"leading_blanks", "\n\n\r\n\rdata: 1\n\n", 0, "[](1)", 0},
    {"colon_in_value", "data: a: b\n\n", 0, "[](a: b)", 0},
    {"oversized_single", "data: small\n\ndata: " LONG40 "\n\ndata: after\n\n", 16,
     "[](small)[](after)", 1},
    {"oversized_multi", "data: 12345678\ndata: 12345678\n\ndata: ok\n\n", 16, "[](ok)", 1},
    {"oversized_event_name", "event: " LONG40 "\ndata: x\n\nevent: e\ndata: y\n\n", 16,
     "[e](y)", 1},
    /* event + data (with the joining LF) of exactly max_event bytes still pass. */
    {"exact_bound", "event: ab\ndata: 1234567\ndata: 123456\n\n", 16, "[ab](1234567\n123456)", 0},
    {"one_over_bound", "event: ab\ndata: 1234567\ndata: 1234567\n\ndata: z\n\n", 16, "[](z)", 1},
    {"exact_bound_single", "data: 1234567890123456\n\n", 16, "[](1234567890123456)", 0},
    {"one_over_single", "data: 12345678901234567\n\ndata: z\n\n", 16, "[](z)", 1},
    {"long_comment_kept", ": " LONG40 LONG40 "\ndata: x\n\n", 16, "[](x)", 0},
    {"long_id_kept", "data: x\nid: " LONG40 LONG40 "\n\n", 16, "[](x)", 0},
    {"long_line_crlf", "data: " LONG40 LONG40 "\r\n\r\ndata: y\r\n\r\n", 16, "[](y)", 1},
};

typedef struct {
    tg_sse_parser_t p;
    tg_buf_t out;
    size_t bound;
} run_t;

static void run_start(run_t *r, const sse_case_t *c) {
    tg_buf_init(&r->out);
    tg_buf_append(&r->out, "", 0);
    size_t max = c->max_event ? c->max_event : 1 << 20;
    r->bound = max;
    tg_sse_init(&r->p, max, record_cb, &r->out);
}

static void run_feed(run_t *r, const char *s, size_t n) {
    tg_sse_feed(&r->p, s, n);
    /* Memory stays bounded whatever is fed. */
    ASSERT(r->p.event.len + r->p.data.len <= r->bound);
    ASSERT(r->p.line.len <= r->bound + 16);
}

static void run_check(run_t *r, const sse_case_t *c, const char *how, size_t a, size_t b) {
    if (strcmp(r->out.data, c->want) != 0 || r->p.dropped != c->dropped) {
        fprintf(stderr,
                "case %s, %s (%zu, %zu): got \"%s\" dropped %llu, want \"%s\" dropped %llu\n",
                c->name, how, a, b, r->out.data, (unsigned long long)r->p.dropped, c->want,
                (unsigned long long)c->dropped);
        exit(1);
    }
    tg_sse_free(&r->p);
    tg_buf_free(&r->out);
}

TG_TEST(sse, table_whole) {
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const sse_case_t *c = &cases[k];
        run_t r;
        run_start(&r, c);
        run_feed(&r, c->in, strlen(c->in));
        run_check(&r, c, "whole", 0, 0);
    }
}

TG_TEST(sse, table_every_split) {
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const sse_case_t *c = &cases[k];
        size_t n = strlen(c->in);
        for (size_t a = 0; a <= n; a++) {
            run_t r;
            run_start(&r, c);
            run_feed(&r, c->in, a);
            run_feed(&r, c->in + a, n - a);
            run_check(&r, c, "split", a, 0);
        }
    }
}

TG_TEST(sse, table_every_three_way_split) {
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const sse_case_t *c = &cases[k];
        size_t n = strlen(c->in);
        if (n > 160)
            continue;
        for (size_t a = 0; a <= n; a++) {
            for (size_t b = a; b <= n; b++) {
                run_t r;
                run_start(&r, c);
                run_feed(&r, c->in, a);
                run_feed(&r, c->in + a, b - a);
                run_feed(&r, c->in + b, n - b);
                run_check(&r, c, "split3", a, b);
            }
        }
    }
}

TG_TEST(sse, table_byte_by_byte) {
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const sse_case_t *c = &cases[k];
        size_t n = strlen(c->in);
        run_t r;
        run_start(&r, c);
        for (size_t i = 0; i < n; i++) {
            run_feed(&r, c->in + i, 1);
            run_feed(&r, c->in + i, 0); /* empty reads change nothing, even after a CR */
        }
        run_check(&r, c, "bytes", 0, 0);
    }
}

TG_TEST(sse, crlf_split_across_feeds) {
    tg_buf_t out;
    tg_buf_init(&out);
    tg_buf_append(&out, "", 0);
    tg_sse_parser_t p;
    tg_sse_init(&p, 1024, record_cb, &out);
    tg_sse_feed(&p, "data: a\r", 8);
    ASSERT(p.last_cr);
    tg_sse_feed(&p, "", 0);
    tg_sse_feed(&p, "\n", 1);
    /* The LF completed the CRLF: it is not a blank line, so nothing is dispatched yet. */
    ASSERT_EQ_INT(p.events, 0);
    tg_sse_feed(&p, "data: b\r", 8);
    tg_sse_feed(&p, "\n\r", 2);
    ASSERT_EQ_INT(p.events, 1);
    ASSERT_EQ_STR(out.data, "[](a\nb)");
    /* A CR at the end of one feed and a CR at the start of the next are two line ends. */
    tg_sse_feed(&p, "data: c\r", 8);
    tg_sse_feed(&p, "\rdata: d\n\n", 10);
    ASSERT_EQ_STR(out.data, "[](a\nb)[](c)[](d)");
    ASSERT_EQ_INT(p.events, 3);
    tg_sse_free(&p);
    tg_buf_free(&out);
}

static const char *zc_base;
static size_t zc_len;
static int zc_inside;

static void zero_copy_cb(void *ud, const char *event, size_t event_len, const char *data,
                         size_t data_len) {
    if (data >= zc_base && data + data_len <= zc_base + zc_len)
        zc_inside++;
}

TG_TEST(sse, whole_chunks_are_not_copied) {
    static const char chunk[] = "data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n";
    zc_base = chunk;
    zc_len = sizeof(chunk) - 1;
    tg_sse_parser_t p;
    tg_sse_init(&p, 1024, zero_copy_cb, NULL);
    tg_sse_feed(&p, chunk, sizeof(chunk) - 1);
    ASSERT_EQ_INT(p.events, 2);
    ASSERT_EQ_INT(zc_inside, 2);
    ASSERT_EQ_INT(p.data.len, 0);
    ASSERT_EQ_INT(p.line.len, 0);
    tg_sse_free(&p);
}

TG_TEST(sse, huge_line_in_small_reads_stays_bounded) {
    tg_buf_t out;
    tg_buf_init(&out);
    tg_buf_append(&out, "", 0);
    tg_sse_parser_t p;
    tg_sse_init(&p, 64, record_cb, &out);
    tg_sse_feed(&p, "data: ", 6);
    char block[1000];
    memset(block, 'x', sizeof(block));
    for (int i = 0; i < 1000; i++) {
        tg_sse_feed(&p, block, sizeof(block));
        ASSERT(p.line.cap <= 4 * 64);
        ASSERT(p.data.cap <= 4 * 64);
    }
    tg_sse_feed(&p, "\n\ndata: next\n\n", 14);
    ASSERT_EQ_STR(out.data, "[](next)");
    ASSERT_EQ_INT(p.dropped, 1);
    ASSERT_EQ_INT(p.events, 1);
    tg_sse_free(&p);
    tg_buf_free(&out);
}

TG_TEST(sse, free_then_init_again) {
    tg_buf_t out;
    tg_buf_init(&out);
    tg_buf_append(&out, "", 0);
    tg_sse_parser_t p;
    tg_sse_init(&p, 1024, record_cb, &out);
    tg_sse_feed(&p, "event: half\ndata: unfinished", 28);
    tg_sse_free(&p);
    tg_sse_init(&p, 1024, record_cb, &out);
    tg_sse_feed(&p, "data: fresh\n\n", 13);
    ASSERT_EQ_STR(out.data, "[](fresh)");
    tg_sse_free(&p);
    tg_buf_free(&out);
}
