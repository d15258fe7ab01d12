/*
 * Unit tests of the translation layer (core/src/proto/tg_translate*.c).
 *
 * Most of them are table-driven golden files: every folder of spec/golden/translate/
 * is one case, with a case.json saying what it is
 *   {"kind": "request" | "response" | "error" | "stream",
 *    "from": "openai_chat" | "anthropic" | "responses" | "embeddings", "to": ...,
 *    "model": upstream model (request), "client_model": (response, stream),
 *    "status": HTTP status (error), "usage_chunk": false (stream), "finish": false
 *    (stream: the upstream connection failed, tg_xlate_finish is not called),
 *    "error": "text the refusal message must contain" (request, response)}
 * and its input and expected output: in.json / out.json (requests, responses, errors;
 * compared as JSON values) or in.sse / out.sse (streams; compared byte for byte).
 * A stream is fed through the real SSE parser (tg_sse) whole, split in two at every
 * byte offset, and byte by byte: all must give exactly out.sse, so the translator does
 * not depend on how the network cut the upstream's bytes. Every translated stream is
 * also parsed back: each event must carry JSON (or [DONE]) and, for Anthropic and
 * Responses clients, an event name equal to the data's "type".
 *
 * In outputs, a "created" / "created_at" within a day of now (the translator's clock,
 * used when the upstream gives no time) is compared as 0. TG_GOLDEN_UPDATE=1 rewrites the
 * expected outputs from what the code produces (then review the diff).
 */
#include "tollgate/tg_aws.h"
#include "tollgate/tg_json.h"
#include "tollgate/tg_sse.h"
#include "tollgate/tg_translate.h"

#include <dirent.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "tg_test.h"

#define GOLDEN_DIR TG_SOURCE_DIR "/spec/golden/translate"
/* The cases of issue #15 (label fidelity): the same format, run the same way. */
#define FIDELITY_DIR TG_SOURCE_DIR "/spec/golden/fidelity"
/* The cases of issue #19 (label providers): Gemini, the same format. */
#define GEMINI_DIR TG_SOURCE_DIR "/spec/golden/gemini"
#define BEDROCK_DIR TG_SOURCE_DIR "/spec/golden/bedrock"

/* ---- files -------------------------------------------------------------------------- */

static int read_file(const char *dir, const char *name, tg_buf_t *b) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char tmp[65536];
    size_t n;
    tg_buf_init(b);
    tg_buf_reserve(b, 0);
    while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
        tg_buf_append(b, tmp, n);
    fclose(f);
    return 1;
}

static void write_file(const char *dir, const char *name, const char *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    ASSERT(f);
    fwrite(data, 1, len, f);
    fclose(f);
}

static int update_mode(void) {
    const char *u = getenv("TG_GOLDEN_UPDATE");
    return u && *u && strcmp(u, "0") != 0;
}

static tg_proto_t proto_of(const char *name) {
    if (!strcmp(name, "openai_chat"))
        return TG_PROTO_OPENAI_CHAT;
    if (!strcmp(name, "anthropic"))
        return TG_PROTO_ANTHROPIC;
    if (!strcmp(name, "responses"))
        return TG_PROTO_RESPONSES;
    if (!strcmp(name, "embeddings"))
        return TG_PROTO_EMBEDDINGS;
    if (!strcmp(name, "gemini"))
        return TG_PROTO_GEMINI;
    fprintf(stderr, "unknown protocol %s\n", name);
    exit(1);
}

/* Replaces "created":N / "created_at":N within a day of now by 0. */
static void normalize_clock(tg_buf_t *b) {
    static const char *const keys[] = {"\"created\":", "\"created_at\":"};
    long long now = (long long)time(NULL);
    tg_buf_t o;
    tg_buf_init(&o);
    size_t i = 0;
    while (i < b->len) {
        size_t k, klen = 0;
        for (k = 0; k < 2; k++) {
            size_t n = strlen(keys[k]);
            if (i + n <= b->len && !memcmp(b->data + i, keys[k], n)) {
                klen = n;
                break;
            }
        }
        if (!klen) {
            tg_buf_append(&o, b->data + i, 1);
            i++;
            continue;
        }
        tg_buf_append(&o, b->data + i, klen);
        i += klen;
        size_t j = i;
        long long v = 0;
        while (j < b->len && b->data[j] >= '0' && b->data[j] <= '9' && j - i < 18)
            v = v * 10 + (b->data[j++] - '0');
        if (j > i && llabs(v - now) < 86400) {
            tg_buf_append(&o, "0", 1);
            i = j;
        }
    }
    tg_buf_free(b);
    *b = o;
    if (!b->data)
        tg_buf_reserve(b, 0);
}

/* Compares JSON text with the expected file as values; prints both on a difference. */
static int same_json(const char *name, const char *what, const char *got, size_t len, const tg_buf_t *want) {
    json_error_t e1, e2;
    json_t *a = tg_json_loadb(got, len, 0, &e1);
    json_t *b = tg_json_loadb(want->data, want->len, 0, &e2);
    int ok = a && b && json_equal(a, b);
    if (!ok) {
        char *sa = a ? tg_json_dumps(a, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
        char *sb = b ? tg_json_dumps(b, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
        fprintf(stderr, "FAIL %s: %s differs\n--- got\n%s\n--- want\n%s\n", name, what, sa ? sa : got,
                sb ? sb : "(invalid expected JSON)");
        free(sa);
        free(sb);
    }
    json_decref(a);
    json_decref(b);
    return ok;
}

static char *pretty(const json_t *v) {
    return tg_json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
}


/* ---- the golden cases --------------------------------------------------------------- */

typedef struct {
    char name[256];
    char dir[768];
    json_t *meta;
} gcase_t;

static int case_cmp(const void *a, const void *b) {
    return strcmp(((const gcase_t *)a)->name, ((const gcase_t *)b)->name);
}

/* A case's "contains": strings the output bytes must hold (numbers exactly as written). */
static int check_contains(const gcase_t *c, const char *got, size_t len) {
    size_t i;
    json_t *v;
    int ok = 1;
    json_array_foreach(json_object_get(c->meta, "contains"), i, v) {
        const char *want = json_string_value(v);
        if (want && !memmem(got, len, want, strlen(want))) {
            fprintf(stderr, "FAIL %s: output lacks %s\n--- got\n%.*s\n", c->name, want, (int)len, got);
            ok = 0;
        }
    }
    return ok;
}

/* Loads every case folder of `dir` whose kind is `kind`, sorted by name. */
static int load_cases(const char *dir, const char *kind, gcase_t *cases, int max) {
    DIR *d = opendir(dir);
    ASSERT(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < max) {
        if (de->d_name[0] == '.')
            continue;
        gcase_t *c = &cases[n];
        snprintf(c->name, sizeof(c->name), "%s", de->d_name);
        snprintf(c->dir, sizeof(c->dir), "%s/%s", dir, de->d_name);
        tg_buf_t b;
        if (!read_file(c->dir, "case.json", &b))
            continue;
        json_error_t e;
        c->meta = json_loadb(b.data, b.len, 0, &e);
        tg_buf_free(&b);
        if (!c->meta) {
            fprintf(stderr, "%s/case.json: %s\n", c->name, e.text);
            exit(1);
        }
        const char *k = json_string_value(json_object_get(c->meta, "kind"));
        if (k && !strcmp(k, kind))
            n++;
        else
            json_decref(c->meta);
    }
    closedir(d);
    qsort(cases, (size_t)n, sizeof(cases[0]), case_cmp);
    return n;
}

static const char *meta_str(const gcase_t *c, const char *key) {
    return json_string_value(json_object_get(c->meta, key));
}

static int run_request(const gcase_t *c) {
    tg_buf_t in;
    ASSERT(read_file(c->dir, "in.json", &in));
    json_error_t je;
    json_t *body = tg_json_loadb(in.data, in.len, 0, &je);
    ASSERT(body);
    json_t *before = json_deep_copy(body);
    json_t *out = NULL;
    char err[512];
    int rc = tg_translate_request(proto_of(meta_str(c, "from")), proto_of(meta_str(c, "to")), body,
                                  meta_str(c, "model"), &out, err, sizeof(err));
    int ok = 1;
    if (!json_equal(body, before)) {
        fprintf(stderr, "FAIL %s: the client body was modified\n", c->name);
        ok = 0;
    }
    const char *want_err = meta_str(c, "error");
    if (want_err) {
        if (rc != TG_ERROR || out || !strstr(err, want_err)) {
            fprintf(stderr, "FAIL %s: want error containing \"%s\", got rc %d \"%s\"\n", c->name, want_err, rc, err);
            ok = 0;
        }
    } else if (rc != TG_OK || !out) {
        fprintf(stderr, "FAIL %s: refused: %s\n", c->name, err);
        ok = 0;
    } else {
        char *got = pretty(out);
        char *wire = tg_json_dumps(out, JSON_COMPACT); /* what the gateway sends */
        ok &= check_contains(c, wire, strlen(wire));
        free(wire);
        tg_buf_t want;
        if (update_mode()) {
            tg_buf_t o;
            tg_buf_init(&o);
            tg_buf_appends(&o, got);
            tg_buf_appends(&o, "\n");
            write_file(c->dir, "out.json", o.data, o.len);
            tg_buf_free(&o);
        } else {
            ASSERT(read_file(c->dir, "out.json", &want));
            ok &= same_json(c->name, "translated request", got, strlen(got), &want);
            tg_buf_free(&want);
        }
        free(got);
    }
    json_decref(out);
    json_decref(body);
    json_decref(before);
    tg_buf_free(&in);
    return ok;
}

/* Writes the output pretty-printed (a JSON body) so the golden file reads well. */
static void write_pretty_json(const char *dir, const char *name, const tg_buf_t *b) {
    json_error_t e;
    json_t *v = tg_json_loadb(b->data, b->len, 0, &e);
    ASSERT(v);
    char *s = pretty(v);
    tg_buf_t o;
    tg_buf_init(&o);
    tg_buf_appends(&o, s);
    tg_buf_appends(&o, "\n");
    write_file(dir, name, o.data, o.len);
    tg_buf_free(&o);
    free(s);
    json_decref(v);
}

static int run_response(const gcase_t *c) {
    tg_buf_t in, out;
    ASSERT(read_file(c->dir, "in.json", &in));
    tg_buf_init(&out);
    int rc = tg_translate_response(proto_of(meta_str(c, "from")), proto_of(meta_str(c, "to")), in.data, in.len,
                                   meta_str(c, "client_model"), &out);
    int ok = 1;
    if (meta_str(c, "error")) {
        if (rc != TG_ERROR || out.len) {
            fprintf(stderr, "FAIL %s: want TG_ERROR and no output, got %d\n", c->name, rc);
            ok = 0;
        }
    } else if (rc != TG_OK) {
        fprintf(stderr, "FAIL %s: translation failed\n", c->name);
        ok = 0;
    } else {
        normalize_clock(&out);
        ok &= check_contains(c, out.data, out.len);
        tg_buf_t want;
        if (update_mode()) {
            write_pretty_json(c->dir, "out.json", &out);
        } else {
            ASSERT(read_file(c->dir, "out.json", &want));
            ok = same_json(c->name, "translated response", out.data, out.len, &want);
            tg_buf_free(&want);
        }
    }
    tg_buf_free(&in);
    tg_buf_free(&out);
    return ok;
}

static int run_error(const gcase_t *c) {
    tg_buf_t in, out;
    if (!read_file(c->dir, "in.json", &in))
        ASSERT(read_file(c->dir, "in.txt", &in));
    tg_buf_init(&out);
    json_t *st = json_object_get(c->meta, "status");
    tg_translate_error(proto_of(meta_str(c, "to")), (int)json_integer_value(st), in.data, in.len, &out);
    int ok = 1;
    tg_buf_t want;
    if (update_mode()) {
        write_pretty_json(c->dir, "out.json", &out);
    } else {
        ASSERT(read_file(c->dir, "out.json", &want));
        ok = same_json(c->name, "translated error", out.data, out.len, &want);
        tg_buf_free(&want);
    }
    tg_buf_free(&in);
    tg_buf_free(&out);
    return ok;
}

/* ---- streams ------------------------------------------------------------------------ */

typedef struct {
    tg_xlate_t *x;
    tg_buf_t out;
} stream_run_t;

static void xlate_cb(void *ud, const char *event, size_t elen, const char *data, size_t dlen) {
    stream_run_t *r = ud;
    tg_xlate_event(r->x, event, elen, data, dlen, &r->out);
}

/* Feeds `in` cut at the offsets in cuts[0..ncuts) (ascending); returns the client bytes. */
static tg_buf_t run_stream(const gcase_t *c, const tg_buf_t *in, const size_t *cuts, int ncuts) {
    stream_run_t r;
    r.x = tg_xlate_create(proto_of(meta_str(c, "from")), proto_of(meta_str(c, "to")), meta_str(c, "client_model"),
                          "req1");
    ASSERT(r.x);
    if (json_is_false(json_object_get(c->meta, "usage_chunk")))
        tg_xlate_set_usage_chunk(r.x, 0);
    tg_buf_init(&r.out);
    tg_buf_reserve(&r.out, 0);
    tg_sse_parser_t p;
    tg_sse_init(&p, 1 << 20, xlate_cb, &r);
    size_t at = 0;
    for (int i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : in->len;
        tg_sse_feed(&p, in->data + at, end - at);
        at = end;
    }
    if (!json_is_false(json_object_get(c->meta, "finish")))
        tg_xlate_finish(r.x, &r.out);
    tg_sse_free(&p);
    tg_xlate_destroy(r.x);
    return r.out;
}

typedef struct {
    const char *name;
    int is_chat;
    int bad;
    int events;
} check_t;

static void check_cb(void *ud, const char *event, size_t elen, const char *data, size_t dlen) {
    check_t *k = ud;
    k->events++;
    if (k->is_chat && dlen == 6 && !memcmp(data, "[DONE]", 6))
        return;
    json_error_t e;
    json_t *v = json_loadb(data, dlen, 0, &e);
    if (!json_is_object(v)) {
        fprintf(stderr, "FAIL %s: event data is not a JSON object: %.*s\n", k->name, (int)dlen, data);
        k->bad++;
    } else if (!k->is_chat) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!t || strlen(t) != elen || memcmp(t, event, elen)) {
            fprintf(stderr, "FAIL %s: event name %.*s but type %s\n", k->name, (int)elen, event, t ? t : "(none)");
            k->bad++;
        }
    }
    json_decref(v);
}

/* Two runs' outputs are the same, but for the clock, which may tick between them. */
static int same_stream(const tg_buf_t *a, const tg_buf_t *b) {
    if (a->len == b->len && !memcmp(a->data, b->data, a->len))
        return 1;
    tg_buf_t x, y;
    tg_buf_init(&x);
    tg_buf_init(&y);
    tg_buf_append(&x, a->data, a->len);
    tg_buf_append(&y, b->data, b->len);
    normalize_clock(&x);
    normalize_clock(&y);
    int same = x.len == y.len && !memcmp(x.data, y.data, x.len);
    tg_buf_free(&x);
    tg_buf_free(&y);
    return same;
}

static int run_stream_case(const gcase_t *c) {
    tg_buf_t in;
    ASSERT(read_file(c->dir, "in.sse", &in));
    tg_buf_t whole = run_stream(c, &in, NULL, 0);
    int ok = 1;

    /* The output is a well-formed event stream of the client's protocol. */
    check_t k = {c->name, proto_of(meta_str(c, "to")) == TG_PROTO_OPENAI_CHAT, 0, 0};
    tg_sse_parser_t p;
    tg_sse_init(&p, 1 << 20, check_cb, &k);
    tg_sse_feed(&p, whole.data, whole.len);
    ok &= k.bad == 0 && p.line.len == 0 && !p.has_data;
    tg_sse_free(&p);

    for (size_t cut = 0; cut <= in.len && ok; cut++) {
        tg_buf_t split = run_stream(c, &in, &cut, 1);
        if (!same_stream(&split, &whole)) {
            fprintf(stderr, "FAIL %s: output differs when the input is split at byte %zu\n", c->name, cut);
            ok = 0;
        }
        tg_buf_free(&split);
    }
    size_t *cuts = malloc((in.len + 1) * sizeof(size_t));
    for (size_t i = 0; i < in.len; i++)
        cuts[i] = i + 1;
    tg_buf_t bytes = run_stream(c, &in, cuts, in.len ? (int)in.len - 1 : 0);
    free(cuts);
    if (!same_stream(&bytes, &whole)) {
        fprintf(stderr, "FAIL %s: output differs when the input is fed byte by byte\n", c->name);
        ok = 0;
    }
    tg_buf_free(&bytes);

    normalize_clock(&whole);
    if (update_mode()) {
        write_file(c->dir, "out.sse", whole.data, whole.len);
    } else {
        tg_buf_t want;
        ASSERT(read_file(c->dir, "out.sse", &want));
        if (want.len != whole.len || memcmp(want.data, whole.data, want.len)) {
            size_t i = 0;
            while (i < want.len && i < whole.len && want.data[i] == whole.data[i])
                i++;
            fprintf(stderr, "FAIL %s: stream differs at byte %zu\n--- got\n%s\n--- want\n%s\n", c->name, i,
                    whole.data, want.data);
            ok = 0;
        }
        tg_buf_free(&want);
    }
    tg_buf_free(&whole);
    tg_buf_free(&in);
    return ok;
}

/* Runs the cases of a kind in `dir` (and, when `from` is set, of that upstream protocol). */
static void run_dir_kind(const char *dir, const char *kind, const char *from, int (*fn)(const gcase_t *),
                         int min_cases) {
    static gcase_t cases[256];
    int n = load_cases(dir, kind, cases, 256);
    int failed = 0, ran = 0;
    for (int i = 0; i < n; i++) {
        if (!from || !strcmp(meta_str(&cases[i], "from"), from)) {
            ran++;
            if (!fn(&cases[i]))
                failed++;
        }
        json_decref(cases[i].meta);
    }
    printf("     %d %s cases%s%s, %d failed\n", ran, kind, from ? " from " : "", from ? from : "", failed);
    ASSERT(ran >= min_cases);
    ASSERT_EQ_INT(failed, 0);
}

static void run_kind(const char *kind, const char *from, int (*fn)(const gcase_t *), int min_cases) {
    run_dir_kind(GOLDEN_DIR, kind, from, fn, min_cases);
}

TG_TEST(translate, golden_requests) { run_kind("request", NULL, run_request, 10); }
TG_TEST(translate, golden_responses) { run_kind("response", NULL, run_response, 5); }
TG_TEST(translate, golden_errors) { run_kind("error", NULL, run_error, 3); }
/* Streams in three tests (each test has the runner's 20 s alarm; every byte offset is
 * a whole run). */
TG_TEST(translate, golden_streams_from_chat) { run_kind("stream", "openai_chat", run_stream_case, 3); }
TG_TEST(translate, golden_streams_from_anthropic) { run_kind("stream", "anthropic", run_stream_case, 3); }
TG_TEST(translate, golden_streams_from_responses) { run_kind("stream", "responses", run_stream_case, 3); }

/* Issue #15's cases (spec/golden/fidelity), registered as `tg_unit fidelity`. */
TG_TEST(fidelity, golden_requests) { run_dir_kind(FIDELITY_DIR, "request", NULL, run_request, 1); }
TG_TEST(fidelity, golden_responses) { run_dir_kind(FIDELITY_DIR, "response", NULL, run_response, 1); }
TG_TEST(fidelity, golden_streams) { run_dir_kind(FIDELITY_DIR, "stream", NULL, run_stream_case, 1); }

/* Issue #19's Gemini cases (spec/golden/gemini), registered as `tg_unit providers`. */
TG_TEST(providers, gemini_requests) { run_dir_kind(GEMINI_DIR, "request", NULL, run_request, 5); }
TG_TEST(providers, gemini_responses) { run_dir_kind(GEMINI_DIR, "response", NULL, run_response, 5); }
TG_TEST(providers, gemini_streams) { run_dir_kind(GEMINI_DIR, "stream", NULL, run_stream_case, 5); }

/* ---- Bedrock streams (spec/golden/bedrock) ------------------------------------------
 * A case's in.jsonl is the AWS event stream written readably, one message a line:
 * {"chunk": <Anthropic event>} (its payload {"bytes": base64 of the event}),
 * {"exception": "<type>", "message": "..."}, or {"corrupt": <Anthropic event>} (a chunk
 * whose last byte, the message CRC, is wrong). The runner encodes it, decodes it as the
 * gateway does (tg_bedrock_stream_t) split at every byte and byte by byte, and gives
 * the events to the client's translator — or, for a Messages client, writes them as the
 * SSE the gateway passes on. out.sse is what the client receives. */

static void bedrock_encode(const tg_buf_t *jsonl, tg_buf_t *out) {
    static const char *const cn[] = {":event-type", ":content-type", ":message-type"};
    static const char *const cv[] = {"chunk", "application/json", "event"};
    static const char *const xn[] = {":exception-type", ":content-type", ":message-type"};
    const char *p = jsonl->data, *end = p + jsonl->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        if (e > p) {
            json_error_t je;
            json_t *line = json_loadb(p, (size_t)(e - p), 0, &je);
            ASSERT(json_is_object(line));
            json_t *ev = json_object_get(line, "chunk");
            if (!ev)
                ev = json_object_get(line, "corrupt");
            if (ev) {
                char *text = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
                size_t tl = strlen(text);
                tg_buf_t pay;
                tg_buf_init(&pay);
                tg_buf_reserve(&pay, 4 * (tl / 3 + 1) + 16);
                tg_buf_appends(&pay, "{\"bytes\":\"");
                pay.len += (size_t)EVP_EncodeBlock((unsigned char *)pay.data + pay.len, (const unsigned char *)text,
                                                   (int)tl);
                tg_buf_appends(&pay, "\"}");
                tg_es_encode(out, cn, cv, 3, pay.data, pay.len);
                if (json_object_get(line, "corrupt"))
                    out->data[out->len - 1] ^= 0x5a;
                tg_buf_free(&pay);
                free(text);
            } else {
                const char *xv[] = {json_string_value(json_object_get(line, "exception")), "application/json",
                                    "exception"};
                ASSERT(xv[0]);
                json_t *m = json_pack("{s:O}", "message", json_object_get(line, "message"));
                char *msg = json_dumps(m, JSON_COMPACT);
                json_decref(m);
                tg_es_encode(out, xn, xv, 3, msg, strlen(msg));
                free(msg);
            }
            json_decref(line);
        }
        p = e + 1;
    }
}

typedef struct {
    tg_xlate_t *x;
    tg_buf_t out;
} bedrock_run_t;

static void bedrock_cb(void *ud, const char *event, size_t elen, const char *data, size_t dlen) {
    bedrock_run_t *r = ud;
    if (r->x) {
        tg_xlate_event(r->x, event, elen, data, dlen, &r->out);
        return;
    }
    tg_buf_appends(&r->out, "event: ");
    tg_buf_append(&r->out, event, elen);
    tg_buf_appends(&r->out, "\ndata: ");
    tg_buf_append(&r->out, data, dlen);
    tg_buf_appends(&r->out, "\n\n");
}

static tg_buf_t bedrock_run(const gcase_t *c, const tg_buf_t *in, size_t cut_every, size_t cut) {
    bedrock_run_t r;
    tg_proto_t to = proto_of(meta_str(c, "to"));
    r.x = to == TG_PROTO_ANTHROPIC ? NULL : tg_xlate_create(TG_PROTO_ANTHROPIC, to, meta_str(c, "client_model"), "req1");
    tg_buf_init(&r.out);
    tg_buf_reserve(&r.out, 0);
    tg_bedrock_stream_t s;
    tg_bedrock_stream_init(&s, 1 << 20, bedrock_cb, &r);
    if (cut_every) {
        for (size_t at = 0; at < in->len; at += cut_every)
            tg_bedrock_stream_feed(&s, in->data + at, TG_MIN(cut_every, in->len - at));
    } else {
        tg_bedrock_stream_feed(&s, in->data, cut);
        tg_bedrock_stream_feed(&s, in->data + cut, in->len - cut);
    }
    if (r.x)
        tg_xlate_finish(r.x, &r.out);
    tg_bedrock_stream_free(&s);
    tg_xlate_destroy(r.x);
    return r.out;
}

static int run_bedrock_case(const gcase_t *c) {
    tg_buf_t jsonl, in;
    ASSERT(read_file(c->dir, "in.jsonl", &jsonl));
    tg_buf_init(&in);
    bedrock_encode(&jsonl, &in);
    tg_buf_t whole = bedrock_run(c, &in, 0, in.len);
    int ok = 1;
    for (size_t cut = 0; cut <= in.len && ok; cut++) {
        tg_buf_t split = bedrock_run(c, &in, 0, cut);
        if (!same_stream(&split, &whole)) {
            fprintf(stderr, "FAIL %s: output differs when the input is split at byte %zu\n", c->name, cut);
            ok = 0;
        }
        tg_buf_free(&split);
    }
    tg_buf_t bytes = bedrock_run(c, &in, 1, 0);
    if (!same_stream(&bytes, &whole)) {
        fprintf(stderr, "FAIL %s: output differs when the input is fed byte by byte\n", c->name);
        ok = 0;
    }
    tg_buf_free(&bytes);
    normalize_clock(&whole);
    ok &= check_contains(c, whole.data, whole.len);
    if (update_mode()) {
        write_file(c->dir, "out.sse", whole.data, whole.len);
    } else {
        tg_buf_t want;
        ASSERT(read_file(c->dir, "out.sse", &want));
        if (want.len != whole.len || memcmp(want.data, whole.data, want.len)) {
            fprintf(stderr, "FAIL %s: stream differs\n--- got\n%s\n--- want\n%s\n", c->name, whole.data, want.data);
            ok = 0;
        }
        tg_buf_free(&want);
    }
    tg_buf_free(&whole);
    tg_buf_free(&in);
    tg_buf_free(&jsonl);
    return ok;
}

TG_TEST(providers, bedrock_streams) { run_dir_kind(BEDROCK_DIR, "bedrock-stream", NULL, run_bedrock_case, 6); }

/* Gemini is an upstream protocol only; its path carries the model and the method. */
TG_TEST(providers, gemini_pairs_and_path) {
    for (int c = 0; c < 3; c++) {
        ASSERT_EQ_INT(tg_translate_supported((tg_proto_t)c, TG_PROTO_GEMINI), 1);
        ASSERT_EQ_INT(tg_translate_supported(TG_PROTO_GEMINI, (tg_proto_t)c), 1);
        tg_xlate_t *x = tg_xlate_create(TG_PROTO_GEMINI, (tg_proto_t)c, "m", "r");
        ASSERT(x != NULL);
        tg_xlate_destroy(x);
    }
    ASSERT_EQ_INT(tg_translate_supported(TG_PROTO_GEMINI, TG_PROTO_GEMINI), 0);
    ASSERT_EQ_INT(tg_translate_supported(TG_PROTO_EMBEDDINGS, TG_PROTO_GEMINI), 0);
    ASSERT(tg_xlate_create(TG_PROTO_OPENAI_CHAT, TG_PROTO_GEMINI, "m", "r") == NULL);
    tg_buf_t b;
    tg_buf_init(&b);
    tg_translate_gemini_path("gemini-2.5-flash", 0, &b);
    ASSERT_MEM(b.data, b.len, "/models/gemini-2.5-flash:generateContent");
    tg_buf_reset(&b);
    tg_translate_gemini_path("tuned/x y", 1, &b);
    ASSERT_MEM(b.data, b.len, "/models/tuned%2Fx%20y:streamGenerateContent?alt=sse");
    tg_buf_free(&b);
}

/* Gemini's usageMetadata normalised: prompt includes the cached tokens, thoughts are
 * output not in candidates. */
TG_TEST(providers, gemini_usage) {
    const char *d = "{\"candidates\":[],\"usageMetadata\":{\"promptTokenCount\":100,\"candidatesTokenCount\":5,"
                    "\"cachedContentTokenCount\":60,\"thoughtsTokenCount\":20,\"toolUsePromptTokenCount\":3}}";
    tg_usage_t u = {0}, full = {0};
    ASSERT_EQ_INT(tg_usage_merge_json(&u, TG_PROTO_GEMINI, d, strlen(d)), 1);
    ASSERT_EQ_INT(tg_usage_merge_json_full(&full, TG_PROTO_GEMINI, d, strlen(d)), 1);
    ASSERT(memcmp(&u, &full, sizeof(u)) == 0);
    ASSERT_EQ_INT(u.input, 43);
    ASSERT_EQ_INT(u.cache_read, 60);
    ASSERT_EQ_INT(u.output, 25);
    ASSERT_EQ_INT(u.reasoning, 20);
    ASSERT_EQ_INT(u.known, TG_USAGE_INPUT | TG_USAGE_OUTPUT | TG_USAGE_CACHE_READ | TG_USAGE_REASONING);
    /* A chunk before any output: output stays unknown. */
    tg_usage_t early = {0};
    const char *e = "{\"usageMetadata\":{\"promptTokenCount\":7,\"totalTokenCount\":7}}";
    ASSERT_EQ_INT(tg_usage_merge_json(&early, TG_PROTO_GEMINI, e, strlen(e)), 1);
    ASSERT_EQ_INT(early.known, TG_USAGE_INPUT);
    /* "usage" elsewhere is not Gemini's. */
    tg_usage_t none = {0};
    const char *o = "{\"usage\":{\"prompt_tokens\":7}}";
    ASSERT_EQ_INT(tg_usage_merge_json(&none, TG_PROTO_GEMINI, o, strlen(o)), 0);
}

/* ---- properties and edge cases ------------------------------------------------------ */

static json_t *parse(const char *s) {
    json_error_t e;
    json_t *v = json_loads(s, 0, &e);
    ASSERT(v);
    return v;
}

TG_TEST(translate, supported_pairs) {
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            int want = a == b || (a != TG_PROTO_EMBEDDINGS && b != TG_PROTO_EMBEDDINGS);
            ASSERT_EQ_INT(tg_translate_supported((tg_proto_t)a, (tg_proto_t)b), want);
            tg_xlate_t *x = tg_xlate_create((tg_proto_t)a, (tg_proto_t)b, NULL, "r");
            ASSERT_EQ_INT(x != NULL, want && a != TG_PROTO_EMBEDDINGS);
            tg_xlate_destroy(x);
        }
    ASSERT_EQ_INT(tg_translate_supported((tg_proto_t)7, TG_PROTO_OPENAI_CHAT), 0);
    ASSERT_EQ_STR(tg_translate_path(TG_PROTO_ANTHROPIC), "/messages");
    ASSERT_EQ_STR(tg_translate_path(TG_PROTO_RESPONSES), "/responses");
    ASSERT_EQ_STR(tg_translate_proto_name(TG_PROTO_OPENAI_CHAT), "openai_chat");

    json_t *body = parse("{\"model\":\"e\",\"input\":\"hi\"}");
    json_t *out = NULL;
    char err[256];
    ASSERT_EQ_INT(tg_translate_request(TG_PROTO_EMBEDDINGS, TG_PROTO_OPENAI_CHAT, body, "m", &out, err, sizeof(err)),
                  TG_ERROR);
    ASSERT(out == NULL && strstr(err, "cannot be sent"));
    ASSERT_EQ_INT(tg_translate_request(TG_PROTO_EMBEDDINGS, TG_PROTO_EMBEDDINGS, body, "m2", &out, err, sizeof(err)),
                  TG_OK);
    ASSERT_EQ_STR(json_string_value(json_object_get(out, "model")), "m2");
    ASSERT_EQ_STR(json_string_value(json_object_get(out, "input")), "hi");
    json_decref(out);
    json_decref(body);

    body = parse("[1]");
    ASSERT_EQ_INT(tg_translate_request(TG_PROTO_OPENAI_CHAT, TG_PROTO_ANTHROPIC, body, "m", &out, err, sizeof(err)),
                  TG_ERROR);
    ASSERT_EQ_STR(err, "request body must be a JSON object");
    json_decref(body);
}

/* Identity responses and streams pass the bytes through; usage is still tracked. */
TG_TEST(translate, passthrough) {
    const char *body = "{\"id\":\"x\", \"weird\" : [1,2]}";
    tg_buf_t out;
    tg_buf_init(&out);
    ASSERT_EQ_INT(tg_translate_response(TG_PROTO_ANTHROPIC, TG_PROTO_ANTHROPIC, body, strlen(body), "m", &out), TG_OK);
    ASSERT_MEM(out.data, out.len, "{\"id\":\"x\", \"weird\" : [1,2]}");
    tg_buf_reset(&out);

    tg_xlate_t *x = tg_xlate_create(TG_PROTO_OPENAI_CHAT, TG_PROTO_OPENAI_CHAT, "m", "r");
    const char *d1 = "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}";
    tg_xlate_event(x, "", 0, d1, strlen(d1), &out);
    tg_xlate_event(x, "ev", 2, "a\nb", 3, &out);
    tg_xlate_event(x, NULL, 0, "[DONE]", 6, &out);
    tg_xlate_finish(x, &out);
    ASSERT_MEM(out.data, out.len,
               "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n"
               "event: ev\ndata: a\ndata: b\n\ndata: [DONE]\n\n");
    const tg_usage_t *u = tg_xlate_usage(x);
    ASSERT_EQ_INT(u->input, 5);
    ASSERT_EQ_INT(u->output, 2);
    tg_xlate_destroy(x);
    tg_buf_free(&out);
}

/* An upstream that ends without a stop reason must never look like a success. */
TG_TEST(translate, truncated_stream_is_an_error) {
    const char *ev = "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}";
    const char *start = "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}";
    for (int to = 0; to < 3; to++) {
        if (to == TG_PROTO_ANTHROPIC)
            continue;
        tg_xlate_t *x = tg_xlate_create(TG_PROTO_ANTHROPIC, (tg_proto_t)to, "m", "r");
        tg_buf_t out;
        tg_buf_init(&out);
        tg_xlate_event(x, "content_block_start", 19, start, strlen(start), &out);
        tg_xlate_event(x, "content_block_delta", 19, ev, strlen(ev), &out);
        size_t before = out.len;
        tg_xlate_finish(x, &out);
        ASSERT(out.len > before);
        ASSERT(strstr(out.data + before, "ended before the response was complete"));
        ASSERT(!strstr(out.data, "[DONE]") && !strstr(out.data, "response.completed") &&
               !strstr(out.data, "finish_reason\":\"stop"));
        /* Nothing after the end, and finish twice is harmless. */
        size_t end = out.len;
        tg_xlate_event(x, "content_block_delta", 19, ev, strlen(ev), &out);
        tg_xlate_finish(x, &out);
        ASSERT_EQ_INT(out.len, end);
        tg_xlate_destroy(x);
        tg_buf_free(&out);
    }
}

/* The usage the translator reports is the one tg_usage extracts from the same events. */
TG_TEST(translate, usage_matches_tg_usage) {
    const char *evs[][2] = {
        {"message_start", "{\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":10,"
                          "\"cache_read_input_tokens\":90,\"output_tokens\":1}}}"},
        {"message_delta", "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":"
                          "{\"output_tokens\":7}}"},
        {"message_stop", "{\"type\":\"message_stop\"}"},
    };
    tg_xlate_t *x = tg_xlate_create(TG_PROTO_ANTHROPIC, TG_PROTO_OPENAI_CHAT, "m", "r");
    tg_usage_t ref = {0};
    tg_buf_t out;
    tg_buf_init(&out);
    for (int i = 0; i < 3; i++) {
        tg_xlate_event(x, evs[i][0], strlen(evs[i][0]), evs[i][1], strlen(evs[i][1]), &out);
        tg_usage_merge_json(&ref, TG_PROTO_ANTHROPIC, evs[i][1], strlen(evs[i][1]));
    }
    ASSERT(memcmp(tg_xlate_usage(x), &ref, sizeof(ref)) == 0);
    /* The chat client sees prompt = input + cache reads, cached_tokens = cache reads. */
    ASSERT(strstr(out.data, "\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":7,\"total_tokens\":107,"
                            "\"prompt_tokens_details\":{\"cached_tokens\":90}}"));
    tg_xlate_destroy(x);
    tg_buf_free(&out);
}

/* The translator's usage is the fold over every upstream event, as the proxy bills
 * them (tg_proxy_relay.c folds each event's usage): an error event's usage and one
 * after the end count too, for every upstream protocol — not only the events a
 * decoder reads its usage from. */
TG_TEST(translate, usage_is_the_billed_fold_of_every_event) {
    const struct {
        tg_proto_t from;
        const char *ev[3];
    } cases[] = {
        {TG_PROTO_OPENAI_CHAT,
         {"{\"error\":{\"message\":\"boom\"},\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}",
          "[DONE]", "{\"choices\":[],\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":4}}"}},
        {TG_PROTO_ANTHROPIC,
         {"{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"},"
          "\"usage\":{\"input_tokens\":5,\"output_tokens\":3}}",
          "{\"type\":\"message_stop\"}", "{\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}"}},
        {TG_PROTO_RESPONSES,
         {"{\"type\":\"error\",\"message\":\"boom\",\"response\":{\"usage\":{\"input_tokens\":5,"
          "\"output_tokens\":3}}}",
          "{\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":"
          "{\"input_tokens\":6,\"output_tokens\":4}}}",
          "{\"type\":\"response.failed\",\"response\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":8}}}"}},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++)
        for (int to = 0; to < 3; to++) {
            tg_xlate_t *x = tg_xlate_create(cases[c].from, (tg_proto_t)to, "m", "r");
            tg_usage_t ref = {0};
            tg_buf_t out;
            tg_buf_init(&out);
            for (int i = 0; i < 3; i++) {
                const char *d = cases[c].ev[i];
                tg_xlate_event(x, NULL, 0, d, strlen(d), &out);
                tg_usage_merge_json(&ref, cases[c].from, d, strlen(d));
            }
            tg_xlate_finish(x, &out);
            ASSERT(ref.input > 0);
            ASSERT(memcmp(tg_xlate_usage(x), &ref, sizeof(ref)) == 0);
            tg_xlate_destroy(x);
            tg_buf_free(&out);
        }
}

/* Requests round-trip: chat -> Anthropic -> chat keeps what both can express. */
TG_TEST(translate, request_round_trip) {
    json_t *chat = parse(
        "{\"model\":\"a\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
        "\"function\":{\"name\":\"weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"18C\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"max_completion_tokens\":50}");
    char err[256];
    for (int via = TG_PROTO_ANTHROPIC; via <= TG_PROTO_RESPONSES; via++) {
        json_t *mid = NULL, *back = NULL;
        ASSERT_EQ_INT(tg_translate_request(TG_PROTO_OPENAI_CHAT, (tg_proto_t)via, chat, "b", &mid, err, sizeof(err)),
                      TG_OK);
        ASSERT_EQ_INT(tg_translate_request((tg_proto_t)via, TG_PROTO_OPENAI_CHAT, mid, "a", &back, err, sizeof(err)),
                      TG_OK);
        ASSERT(json_equal(json_object_get(back, "messages"), json_object_get(chat, "messages")));
        json_t *want_tools = json_deep_copy(json_object_get(chat, "tools"));
        if (via == TG_PROTO_RESPONSES) /* a Responses upstream is told the tool is not strict */
            json_object_set_new(json_object_get(json_array_get(want_tools, 0), "function"), "strict", json_false());
        ASSERT(json_equal(json_object_get(back, "tools"), want_tools));
        json_decref(want_tools);
        ASSERT_EQ_INT(json_integer_value(json_object_get(back, "max_completion_tokens")), 50);
        json_decref(mid);
        json_decref(back);
    }
    json_decref(chat);
}

TG_TEST(translate, estimate_tokens) {
    ASSERT_EQ_INT(tg_estimate_tokens(TG_PROTO_ANTHROPIC, NULL), TG_ERROR);
    json_t *a = parse("{\"model\":\"m\",\"messages\":[]}");
    ASSERT_EQ_INT(tg_estimate_tokens(TG_PROTO_ANTHROPIC, a), 1);
    json_decref(a);
    /* 40 bytes of text = 10 tokens, + 3 for the message. */
    a = parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"0123456789012345678901234567890123456789\"}]}");
    ASSERT_EQ_INT(tg_estimate_tokens(TG_PROTO_ANTHROPIC, a), 13);
    json_decref(a);
    /* The system prompt and an image count too. */
    a = parse("{\"system\":\"abcdefgh\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
              "\"source\":{\"type\":\"url\",\"url\":\"https://x/y.png\"}},{\"type\":\"text\",\"text\":\"abcd\"}]}]}");
    ASSERT_EQ_INT(tg_estimate_tokens(TG_PROTO_ANTHROPIC, a), 2 + 1 + 3 + 1600);
    json_decref(a);
    /* Tools are counted as their JSON text; the same body in each protocol is close. */
    a = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"hello there\"}],"
              "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]}");
    int64_t n = tg_estimate_tokens(TG_PROTO_ANTHROPIC, a);
    ASSERT(n > 3 + 3 && n < 30);
    json_decref(a);
    a = parse("{\"input\":\"hello there\",\"instructions\":\"be nice\"}");
    ASSERT_EQ_INT(tg_estimate_tokens(TG_PROTO_RESPONSES, a), (11 + 7 + 3) / 4);
    json_decref(a);
}
