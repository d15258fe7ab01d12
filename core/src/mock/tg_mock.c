/*
 * `tollgate mock-upstream --listen HOST:PORT [--threads N] [--models a,b]`: a fast,
 * deterministic fake OpenAI / Anthropic provider. Integration tests, benchmarks and
 * the quickstart put it behind the gateway in place of a real provider; its fault
 * knobs let a test make the "provider" fail in every way a real one does.
 *
 * It is a small HTTP/1.1 server on libuv + llhttp (keep-alive, pipelining, chunked
 * and Content-Length bodies). Each of N threads runs its own uv_loop accepting on the
 * same port (SO_REUSEPORT). A request's JSON body is parsed once. Output is gathered
 * per read (pipelined answers), per stream step or per whole response, and written
 * with one uv_try_write plus, only if the kernel took part of it, one uv_write.
 * Shared state (stats, fault rules, the last request) sits behind one mutex taken
 * twice per request. A connection owns its timer, its buffers and the one request it
 * is answering; a pipelined request waits, parser paused, until that one is answered.
 *
 * Endpoints: POST /v1/chat/completions, /v1/messages (Anthropic), /v1/responses,
 * /v1/embeddings, GET /v1/models (the /v1 prefix is optional); Gemini's POST
 * /v1beta/models/<model>:generateContent and :streamGenerateContent?alt=sse (the key in
 * x-goog-api-key, required: 403 without; usageMetadata promptTokenCount = input tokens,
 * candidatesTokenCount = output tokens, cached and thoughts knobs below; errors in
 * Google's {"error":{"code","message","status"}}); Azure OpenAI's POST
 * /openai/deployments/<deployment>/chat/completions (and /embeddings) with
 * ?api-version= (404 without) and the key in api-key (401 without), the deployment
 * echoed as the model (the key in api-key, or an Entra token as Authorization: Bearer);
 * Vertex AI's POST /v1/projects/<p>/locations/<r>/publishers/anthropic/models/<m>:rawPredict
 * and :streamRawPredict (Messages without "model", anthropic_version "vertex-2023-10-16"
 * in the body, else 400) and .../publishers/google/models/<m>:generateContent (Gemini),
 * both with a bearer token this mock issued; POST <...>/token and /_mock/identity (the
 * token endpoints, tg_mock_identity.c: any "mt-" token it issued gets 401 once expired
 * or unknown on every route); AWS Bedrock's POST /model/<modelId>/invoke and
 * /model/<modelId>/invoke-with-response-stream (an Anthropic Messages body without
 * model and stream, anthropic_version bedrock-2023-05-31, else 400): the SigV4
 * signature recomputed from the request as received with the mock's key pair
 * (--aws-key ID:SECRET[:TOKEN], default AKIDEXAMPLE and the AWS docs' example secret;
 * the access key id is the request's credential here) — 403 with AWS's message on a
 * wrong signature, an unknown key, a missing or wrong session token, or an X-Amz-Date
 * more than 5 minutes off; errors {"message"} with x-amzn-ErrorType; the modelId echoed
 * as the model; a stream is application/vnd.amazon.eventstream, each Anthropic event a
 * chunk {"bytes": base64}, message_stop with amazon-bedrock-invocationMetrics; 404
 * elsewhere. Errors
 * are {"error":{"message","type","param","code"}}, or on /v1/messages
 * {"type":"error","error":{"type","message"}}. Answers echo the request's "model"
 * (default mock-gpt, mock-claude, mock-embed) and always end normally ("stop",
 * "end_turn", "completed"), even when a max-tokens cap shortened them.
 *
 * Usage formula (tests compute the expected numbers from it):
 *   text_bytes(v) = len(v) in UTF-8 bytes                        if v is a string
 *                 = sum(text_bytes(x) for x in v)                 if v is an array
 *                 = text_bytes(v.text) + text_bytes(v.content)    if v is an object
 *                 = 0 otherwise (numbers, so token arrays count 0)
 *   input tokens  = max(1, ceil(sum(text_bytes(body[k]) for k in
 *                                   system, instructions, messages, input) / 4))
 *   output tokens = chunks (default 8), capped by each of max_tokens,
 *                   max_completion_tokens and max_output_tokens that is given
 *   The answer text is "tok1 tok2 ... tokN " (one "tokI " per stream chunk).
 *   Embeddings: prompt_tokens = total_tokens = input tokens; one 8-float vector per
 *   input (a string or a token array is one input, an array of them is several).
 *
 * Knobs, per request. Later sources override earlier ones: the credential's fault
 * rule, then `x-mock-<key>: value` headers, then `[mock key=value ...]` directives
 * anywhere in the message text (so they survive any gateway and protocol
 * translation). '-' and '_' are interchangeable in keys (x-mock-delay-ms works).
 *
 *   status=N       answer N (100..599, not 200) with a provider-shaped error body;
 *                  a malformed request's own 400/404/405 wins over it
 *   retry_after=S  Retry-After seconds; 429 and 529 always carry it (default 1)
 *   delay_ms=N     wait before the response headers (first-byte timeouts)
 *   ttft_ms=N      stream: wait after the headers before the first content chunk
 *   chunks=N       number of content chunks = output tokens (default 8)
 *   interval_ms=N  stream: wait between content chunks
 *   close_after=K  stream: after K content chunks, close the connection without
 *                  finishing the chunked body (0 = right after the headers)
 *   hang=1         read the request, never answer (in flight until the client leaves)
 *   usage=0        send no usage at all, stream or not
 *   usage=2        chat only: usage with absurd counts (prompt and completion tokens
 *                  9223372036854775807, total the same)
 *   usage=3        chat only: a usage object whose counts cannot be read (strings)
 *   close_delimited=1  answer without Content-Length or chunked encoding and close the
 *                  connection after the body (HTTP/1.1 allows it: the close ends it)
 *   cached=N       Gemini: cachedContentTokenCount N of the prompt's tokens (at most all)
 *   thoughts=N     Gemini: thoughtsTokenCount N (thinking tokens, billed as output)
 *   aws_exception=K  Bedrock stream: after K content chunks, a throttlingException
 *                  message ends the stream
 *   aws_metrics=0  Bedrock stream: no amazon-bedrock-invocationMetrics in message_stop
 *   page=N         GET /models in Anthropic's shape: at most N models per page, whatever
 *                  limit the request asks for (so a client must follow has_more)
 *
 * GET /models answers in the shape of the API the request speaks: with an
 * anthropic-version header Anthropic's {"data":[{type,id,display_name,created_at}],
 * "has_more","first_id","last_id"} (limit, default 20, and after_id / before_id
 * honoured), listing mock-claude and the --models names; else OpenAI's
 * {"object":"list","data":[{id,object,created,owned_by}]} listing mock-gpt, mock-claude,
 * mock-embed and the --models names. The providers' own lists, each with its auth
 * checked as on its API routes: Gemini's (x-goog-api-key) {"models":[{name:
 * "models/<id>",displayName,supportedGenerationMethods}]} (plus text-embedding-mock,
 * embedContent only) and Vertex AI's GET /v1beta1/publishers/<p>/models
 * (a bearer token this mock issued) {"publisherModels":[{name:"publishers/<p>/models/
 * <id>",...}]} (anthropic: mock-claude and --models; google: gemini-<each id> and
 * imagen-mock), both paged by
 * pageSize (default 50) and the page knob with an opaque nextPageToken "pt/<offset>="
 * that must come back percent-encoded (else 400); Azure's GET /openai/models?api-version
 * (api-key or an Entra token) {"data":[{id,created_at,status,capabilities,deprecation,
 * object}],"object":"list"}, plus mock-retired (retired for inference) and
 * mock-tune-only (cannot infer); Bedrock's ListFoundationModels GET /foundation-models,
 * its SigV4 signature (GET, service bedrock) verified as InvokeModel's,
 * {"modelSummaries":[{modelArn,modelId:"anthropic.<id>",modelName,providerName:
 * "Anthropic",...}]} plus amazon.titan-text-express-v1 and
 * anthropic.claude-profile-only-v1:0 (inferenceTypesSupported INFERENCE_PROFILE only),
 * and ListInferenceProfiles GET /inference-profiles (signed the same way)
 * {"inferenceProfileSummaries":[{inferenceProfileId:"us.anthropic.<id>",...}]} plus
 * us.amazon.nova-lite-v1:0, paged by maxResults and the page knob with an opaque
 * nextToken like Google's.
 *
 * The credential of a request is the `Authorization: Bearer X` token, else the
 * `x-api-key` header, else "-". Control endpoints (never counted, any thread):
 *   POST   /_mock/faults  {"credential":"sk-x","count":3, <any knob>...} installs (or
 *                         replaces) that credential's rule: the next `count` (>= 1)
 *                         requests get it, or all until cleared if count is omitted;
 *                         credential "*" (or none) = every credential without a rule;
 *                         with "body": "<text>" the rule's requests are answered 200 with
 *                         that body verbatim (an event stream when the request streams:
 *                         a scripted upstream answer, e.g. a refusal or a tool call)
 *   GET    /_mock/faults  the installed rules;   DELETE /_mock/faults  clears them
 *   POST   /_mock/quota   {"credential":"sk-x","style":"openai"|"anthropic"|"unified"|
 *                         "codex"|"none","limit":N,"window_ms":M,"malformed":false}: the
 *                         credential's requests count against a window of M ms (from now,
 *                         then back to back) and carry that provider's quota headers with
 *                         the real countdown (x-ratelimit-*; anthropic-ratelimit-requests-*;
 *                         anthropic-ratelimit-unified-*; x-codex-primary-*); past N
 *                         requests (0: never) it answers 429 with that provider's body
 *                         (usage_limit_reached with resets_at for codex) and Retry-After
 *                         until the reset; "malformed" sends unreadable values instead.
 *                         Stats show {"quota":{"used","limit","rejected","reset_in_ms"}}
 *   GET    /_mock/stats   {"total","inflight","max_inflight","aborted","credentials":
 *                         {"<cred>":{"requests","inflight","max_inflight","aborted"}}}
 *   POST   /_mock/reset   zeroes the stats, clears the rules and the last request
 *   GET    /_mock/last    {"method","path","headers":{lowercased: value},"body":"raw"}
 *                         of the latest non-/_mock request ("path" is the raw target;
 *                         repeated headers are joined with ", ")
 * A request is in flight from its last byte read until its last byte is handed to the
 * socket, or until the client disconnects (it then also counts as aborted). A
 * close_after drop ends the request without counting it aborted. Bodies over 8 MiB
 * get 413, heads over 64 KiB 431, unparsable HTTP 400; each then closes the connection.
 */
#include "tollgate/tg_mock.h"
#include "tollgate/tg_aws.h"
#include "tg_mock_internal.h"
#include "tollgate/tg_common.h"
#include "tollgate/tg_crypto.h"
#include "tollgate/tg_json.h"

#include <errno.h>
#include <jansson.h>
#include <llhttp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define MOCK_MAX_BODY ((size_t)8 << 20)
#define MOCK_MAX_HEAD ((size_t)64 << 10)
#define MOCK_MAX_PENDING ((size_t)16 << 20)
#define MOCK_MAX_THREADS 64
#define MOCK_READ_BUF (64 * 1024)
#define MOCK_CRED_BUCKETS 256
#define MOCK_EMBED_DIM 8
#define MOCK_DRAIN_MS 2000

/* Appends a string literal (the "" makes anything else a compile error). */
#define BUF_LIT(b, lit) tg_buf_append((b), "" lit, sizeof(lit) - 1)

/* ---- knobs ---------------------------------------------------------------------- */

enum { K_STATUS, K_RETRY_AFTER, K_DELAY_MS, K_TTFT_MS, K_CHUNKS, K_INTERVAL_MS,
       K_CLOSE_AFTER, K_HANG, K_USAGE, K_CLOSE_DELIMITED, K_PAGE, K_CACHED, K_THOUGHTS, K_AWS_EXCEPTION,
       K_AWS_METRICS, K__COUNT };
static const char *const knob_names[K__COUNT] = {
    "status", "retry_after", "delay_ms", "ttft_ms", "chunks",
    "interval_ms", "close_after", "hang", "usage", "close_delimited", "page", "cached", "thoughts",
    "aws_exception", "aws_metrics"};

/** Knob values; -1 means "not set here". */
typedef struct {
    int v[K__COUNT];
} knobs_t;

static void knobs_clear(knobs_t *k) {
    for (int i = 0; i < K__COUNT; i++)
        k->v[i] = -1;
}

static void knobs_merge(knobs_t *dst, const knobs_t *src) {
    for (int i = 0; i < K__COUNT; i++)
        if (src->v[i] >= 0)
            dst->v[i] = src->v[i];
}

/* Parses a knob value: decimal digits (at most 9), or true/false. Returns -1 if bad. */
static int knob_value(const char *s, size_t n) {
    if (n == 4 && strncasecmp(s, "true", 4) == 0)
        return 1;
    if (n == 5 && strncasecmp(s, "false", 5) == 0)
        return 0;
    if (n == 0 || n > 9)
        return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static int knob_index(const char *name, size_t n) {
    for (int i = 0; i < K__COUNT; i++) {
        const char *k = knob_names[i];
        if (strlen(k) != n)
            continue;
        size_t j = 0;
        for (; j < n; j++) {
            char ch = name[j] == '-' ? '_' : name[j];
            if (ch >= 'A' && ch <= 'Z')
                ch = (char)(ch | 0x20);
            if (ch != k[j])
                break;
        }
        if (j == n)
            return i;
    }
    return -1;
}

static void knob_set(knobs_t *k, const char *name, size_t nlen, const char *val, size_t vlen) {
    int i = knob_index(name, nlen), v = knob_value(val, vlen);
    if (i >= 0 && v >= 0)
        k->v[i] = v;
}

static int is_sep(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* Applies every `[mock key=value ...]` directive found in s[0..n). */
static void directive_scan(const char *s, size_t n, knobs_t *k) {
    const char *end = s + n;
    while (s < end) {
        const char *m = memmem(s, (size_t)(end - s), "[mock", 5);
        if (!m)
            return;
        const char *p = m + 5;
        if (p < end && !is_sep(*p) && *p != ']') {
            s = p;
            continue;
        }
        while (p < end && *p != ']') {
            while (p < end && is_sep(*p))
                p++;
            const char *key = p;
            while (p < end && *p != '=' && *p != ']' && !is_sep(*p))
                p++;
            if (p < end && *p == '=') {
                size_t klen = (size_t)(p - key);
                const char *val = ++p;
                while (p < end && *p != ']' && !is_sep(*p))
                    p++;
                knob_set(k, key, klen, val, (size_t)(p - val));
            }
        }
        s = p;
    }
}

/* text_bytes() of the usage formula, applying directives found on the way. */
static size_t text_walk(json_t *v, knobs_t *k, int depth) {
    if (!v || depth > 64)
        return 0;
    size_t n = 0, i;
    json_t *x;
    switch (json_typeof(v)) {
    case JSON_STRING:
        n = json_string_length(v);
        directive_scan(json_string_value(v), n, k);
        return n;
    case JSON_ARRAY:
        json_array_foreach(v, i, x) n += text_walk(x, k, depth + 1);
        return n;
    case JSON_OBJECT:
        return text_walk(json_object_get(v, "text"), k, depth + 1) +
               text_walk(json_object_get(v, "content"), k, depth + 1) +
               text_walk(json_object_get(v, "parts"), k, depth + 1); /* Gemini */
    default:
        return 0;
    }
}

/* ---- shared state: stats, fault rules, last request ------------------------------ */

/* A credential's quota as a provider would state it (POST /_mock/quota). */
enum { Q_NONE = 0, Q_OPENAI, Q_ANTHROPIC, Q_UNIFIED, Q_CODEX };

typedef struct cred_s {
    struct cred_s *next;
    int64_t requests, inflight, max_inflight, aborted;
    int q_style, q_malformed;
    int64_t q_limit, q_window_ms, q_start_ms, q_used; /* limit 0: counted, never enforced */
    int64_t q_rejected; /* requests answered 429 because the window was spent */
    size_t len;
    char name[];
} cred_t;

typedef struct fault_s {
    struct fault_s *next;
    knobs_t k;
    char *body; /* the scripted reply body, or NULL */
    size_t body_len;
    int64_t count; /* -1 = until cleared */
    char cred[];
} fault_t;

static struct {
    pthread_mutex_t mu;
    uint64_t gen; /* bumped by reset; requests of an older generation are not counted */
    int64_t total, inflight, max_inflight, aborted;
    cred_t *creds[MOCK_CRED_BUCKETS];
    fault_t *faults;
    int have_last, last_method;
    tg_buf_t last_url, last_hdrs, last_body; /* swapped with a connection's buffers */
} g_st = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *g_models; /* --models, comma separated, or NULL */
static atomic_uint_fast64_t g_next_id;

static cred_t *cred_get(const char *name, size_t len) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)name[i]) * 16777619u;
    cred_t **slot = &g_st.creds[h % MOCK_CRED_BUCKETS];
    for (cred_t *c = *slot; c; c = c->next)
        if (c->len == len && memcmp(c->name, name, len) == 0)
            return c;
    cred_t *c = calloc(1, sizeof(*c) + len + 1);
    if (!c)
        abort();
    memcpy(c->name, name, len);
    c->len = len;
    c->next = *slot;
    *slot = c;
    return c;
}

static fault_t **fault_find(const char *cred, size_t len) {
    for (fault_t **f = &g_st.faults; *f; f = &(*f)->next)
        if (strlen((*f)->cred) == len && memcmp((*f)->cred, cred, len) == 0)
            return f;
    return NULL;
}

static void faults_clear_locked(void) {
    for (fault_t *f = g_st.faults, *next; f; f = next) {
        next = f->next;
        free(f->body);
        free(f);
    }
    g_st.faults = NULL;
}

/* Drops every credential entry, fault rule and the last request. Caller holds mu. */
static void state_clear_locked(void) {
    for (int i = 0; i < MOCK_CRED_BUCKETS; i++) {
        for (cred_t *c = g_st.creds[i], *next; c; c = next) {
            next = c->next;
            free(c);
        }
        g_st.creds[i] = NULL;
    }
    faults_clear_locked();
    g_st.total = g_st.inflight = g_st.max_inflight = g_st.aborted = 0;
    g_st.have_last = 0;
    g_st.gen++;
}

/* ---- connections ---------------------------------------------------------------- */

enum { API_CHAT, API_MESSAGES, API_RESPONSES, API_EMBEDDINGS, API_MODELS, API_GEMINI, API_NONE };

typedef struct worker_s worker_t;

/* The one request a connection is answering. */
typedef struct {
    int active; /* counted in flight, not yet answered */
    int api, stream, include_usage, keepalive;
    int whole; /* a whole response (non-stream or error) is in c->out or c->held */
    int raw;   /* close_delimited: no Content-Length, no chunking; the close ends the body */
    knobs_t k;
    int64_t in_tok;
    int out_n, sent, seq, n_inputs;
    uint64_t id;
    long long created;
    cred_t *cred;
    uint64_t gen;
    int models_anth, models_limit;    /* GET /models: Anthropic's shape, its page size */
    int models_gemini;                /* GET /models: Gemini's shape (x-goog-api-key) */
    int models_azure, models_bedrock; /* Azure's /openai/models, Bedrock's /foundation-models (1)
                                       * and /inference-profiles (2) */
    char models_pub[16];              /* Vertex's /v1beta1/publishers/<p>/models: p ("" not) */
    int models_page_size;             /* Google's pageSize (0 none) */
    int models_offset;                /* Google's pageToken, read back: where the page starts */
    int bedrock;                      /* Bedrock's InvokeModel: AWS errors, an event stream */
    char models_after[128], models_before[128]; /* its cursors ("" none) */
    char qhdr[640]; /* the credential's quota headers ("Name: value\r\n" lines), or "" */
} resp_t;

typedef struct conn_s {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shut;
    worker_t *w;
    struct conn_s *prev, *next;
    llhttp_t parser;
    int handles_open;
    unsigned closing : 1, busy : 1, want_close : 1, draining : 1, shutting : 1, read_stopped : 1;
    /* the request being read */
    tg_buf_t url, hdrs, body; /* hdrs holds "name\0value\0" pairs, names lowercased */
    size_t hname_off, hval_off, auth_off, auth_len, key_off, key_len;
    int method, err_status, expect_continue;
    knobs_t hk; /* from x-mock-* headers */
    /* the response */
    resp_t r;
    tg_buf_t model;   /* JSON-escaped model name */
    tg_buf_t held;    /* a whole response waiting for delay_ms */
    tg_buf_t out;     /* bytes to write at the next flush */
    tg_buf_t scratch; /* a body or event being rendered */
    tg_buf_t pending, spare; /* input that arrived while busy */
    tg_buf_t script;         /* the scripted reply body of this request, if any */
    int has_script;
} conn_t;

struct worker_s {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop;
    uv_signal_t sigterm, sigint;
    pthread_t thread;
    int index, stopping, has_signals;
    conn_t *conns;
    char rbuf[MOCK_READ_BUF];
};

typedef struct {
    uv_write_t req;
    conn_t *conn;
    char data[];
} wreq_t;

static const llhttp_settings_t g_settings;

static void conn_close(conn_t *c);

static void conn_free_cb(uv_handle_t *h) {
    conn_t *c = h->data;
    if (--c->handles_open > 0)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        c->w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    tg_buf_t *bufs[] = {&c->url, &c->hdrs, &c->body, &c->model, &c->held,
                        &c->out, &c->scratch, &c->pending, &c->spare, &c->script};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        tg_buf_free(bufs[i]);
    free(c);
}

/* Ends the current request's accounting: it left flight, aborted or not. */
static void req_done(conn_t *c, int aborted) {
    if (!c->r.active)
        return;
    c->r.active = 0;
    pthread_mutex_lock(&g_st.mu);
    if (c->r.gen == g_st.gen) {
        g_st.inflight--;
        c->r.cred->inflight--;
        if (aborted) {
            g_st.aborted++;
            c->r.cred->aborted++;
        }
    }
    pthread_mutex_unlock(&g_st.mu);
}

static void conn_close(conn_t *c) {
    if (c->closing)
        return;
    c->closing = 1;
    req_done(c, 1);
    c->handles_open = 2;
    uv_close((uv_handle_t *)&c->timer, conn_free_cb);
    uv_close((uv_handle_t *)&c->tcp, conn_free_cb);
}

static void write_cb(uv_write_t *req, int status) {
    wreq_t *wr = TG_CONTAINER_OF(req, wreq_t, req);
    conn_t *c = wr->conn;
    free(wr);
    if (status < 0 && status != UV_ECANCELED)
        conn_close(c);
}

/* Writes c->out: one try-write, and one uv_write for whatever the kernel did not take. */
static void conn_flush(conn_t *c) {
    size_t len = c->out.len, off = 0;
    c->out.len = 0;
    if (!len || c->closing)
        return;
    uv_buf_t b = uv_buf_init(c->out.data, (unsigned)len);
    if (c->tcp.write_queue_size == 0) {
        int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
        if (n == (int)len)
            return;
        if (n > 0)
            off = (size_t)n;
        else if (n != UV_EAGAIN && n != UV_ENOSYS) {
            conn_close(c);
            return;
        }
    }
    wreq_t *wr = malloc(sizeof(*wr) + len - off);
    if (!wr)
        abort();
    wr->conn = c;
    memcpy(wr->data, c->out.data + off, len - off);
    b = uv_buf_init(wr->data, (unsigned)(len - off));
    if (uv_write(&wr->req, (uv_stream_t *)&c->tcp, &b, 1, write_cb) < 0) {
        free(wr);
        conn_close(c);
    }
}

static void drain_timeout_cb(uv_timer_t *t) { conn_close(t->data); }

static void shutdown_cb(uv_shutdown_t *req, int status) {
    conn_t *c = req->data;
    if (c->draining && status == 0 && !c->closing)
        uv_timer_start(&c->timer, drain_timeout_cb, MOCK_DRAIN_MS, 0);
    else
        conn_close(c);
}

/* Sends FIN after every queued write; the connection closes once that is done. */
static void conn_shutdown(conn_t *c) {
    if (c->shutting || c->closing)
        return;
    c->shutting = 1;
    c->want_close = 1;
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, shutdown_cb) < 0)
        conn_close(c);
}

static void conn_after_io(conn_t *c) {
    conn_flush(c);
    if (c->want_close)
        conn_shutdown(c);
}

/* ---- rendering ------------------------------------------------------------------ */

static const char *reason_phrase(int status) {
    static const struct {
        int status;
        const char *text;
    } t[] = {{200, "OK"}, {400, "Bad Request"}, {401, "Unauthorized"}, {403, "Forbidden"},
             {404, "Not Found"}, {405, "Method Not Allowed"}, {408, "Request Timeout"},
             {413, "Payload Too Large"}, {429, "Too Many Requests"},
             {431, "Request Header Fields Too Large"}, {500, "Internal Server Error"},
             {502, "Bad Gateway"}, {503, "Service Unavailable"}, {504, "Gateway Timeout"},
             {529, "Overloaded"}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (t[i].status == status)
            return t[i].text;
    return "Status";
}

/* Appends status line, headers and c->scratch as the body to dst; resets scratch. */
static void put_response(conn_t *c, tg_buf_t *dst, int status, int retry_after, int keepalive) {
    tg_buf_printf(dst, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n", status, reason_phrase(status));
    if (!c->r.raw)
        tg_buf_printf(dst, "Content-Length: %zu\r\n", c->scratch.len);
    if (retry_after >= 0)
        tg_buf_printf(dst, "Retry-After: %d\r\n", retry_after);
    tg_buf_appends(dst, c->r.qhdr);
    if (!keepalive)
        BUF_LIT(dst, "Connection: close\r\n");
    BUF_LIT(dst, "\r\n");
    tg_buf_append(dst, c->scratch.data, c->scratch.len);
    c->scratch.len = 0;
}

static const char *const ES_NAMES[] = {":event-type", ":content-type", ":message-type"};

/* Bedrock: the Anthropic events rendered in c->scratch ("event: ...\ndata: ...\n\n")
 * become event-stream messages, each a chunk {"bytes": base64 of the event's data}; the
 * message_stop event carries amazon-bedrock-invocationMetrics (knob aws_metrics=0: not). */
static void scratch_to_eventstream(conn_t *c) {
    static const char *const values[] = {"chunk", "application/json", "event"};
    tg_buf_t frames, json, b64;
    tg_buf_init(&frames);
    tg_buf_init(&json);
    tg_buf_init(&b64);
    const char *p = c->scratch.data, *end = p + c->scratch.len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        if (e - p > 6 && !memcmp(p, "data: ", 6)) {
            json.len = 0;
            tg_buf_append(&json, p + 6, (size_t)(e - p - 6));
            static const char stop[] = "{\"type\":\"message_stop\"";
            if (c->r.k.v[K_AWS_METRICS] > 0 && json.len >= sizeof(stop) - 1 && !memcmp(json.data, stop, sizeof(stop) - 1)) {
                json.len = 0;
                tg_buf_printf(&json, "{\"type\":\"message_stop\",\"amazon-bedrock-invocationMetrics\":{"
                                     "\"inputTokenCount\":%lld,\"outputTokenCount\":%d,\"invocationLatency\":1,"
                                     "\"firstByteLatency\":1}}",
                              (long long)c->r.in_tok, c->r.out_n);
            }
            b64.len = 0;
            tg_buf_reserve(&b64, 4 * (json.len / 3 + 1) + 16);
            BUF_LIT(&b64, "{\"bytes\":\"");
            b64.len += (size_t)EVP_EncodeBlock((unsigned char *)b64.data + b64.len, (const unsigned char *)json.data,
                                               (int)json.len);
            BUF_LIT(&b64, "\"}");
            tg_es_encode(&frames, ES_NAMES, values, 3, b64.data, b64.len);
        }
        p = e + 1;
    }
    tg_buf_t t = c->scratch;
    c->scratch = frames;
    tg_buf_free(&t);
    tg_buf_free(&json);
    tg_buf_free(&b64);
}

/* Appends c->scratch to c->out as one HTTP chunk; resets scratch. */
static void put_chunk(conn_t *c) {
    if (c->r.bedrock)
        scratch_to_eventstream(c);
    if (c->r.raw) {
        tg_buf_append(&c->out, c->scratch.data, c->scratch.len);
        c->scratch.len = 0;
        return;
    }
    tg_buf_printf(&c->out, "%zx\r\n", c->scratch.len);
    tg_buf_append(&c->out, c->scratch.data, c->scratch.len);
    BUF_LIT(&c->out, "\r\n");
    c->scratch.len = 0;
}

/* Renders a provider-shaped error body into c->scratch. */
static void render_error(conn_t *c, int api, int status, const char *msg) {
    const char *otype, *code, *atype;
    switch (status) {
    case 400: otype = "invalid_request_error"; code = "invalid_request"; atype = "invalid_request_error"; break;
    case 401: otype = "authentication_error"; code = "invalid_api_key"; atype = "authentication_error"; break;
    case 403: otype = "permission_error"; code = "permission_denied"; atype = "permission_error"; break;
    case 404: otype = "not_found_error"; code = "not_found"; atype = "not_found_error"; break;
    case 405: otype = "invalid_request_error"; code = "method_not_allowed"; atype = "invalid_request_error"; break;
    case 413: otype = "invalid_request_error"; code = "request_too_large"; atype = "request_too_large"; break;
    case 429: otype = "rate_limit_error"; code = "rate_limit_exceeded"; atype = "rate_limit_error"; break;
    case 503: otype = "server_error"; code = "service_unavailable"; atype = "api_error"; break;
    case 529: otype = "server_error"; code = "overloaded"; atype = "overloaded_error"; break;
    default:
        otype = status >= 500 ? "server_error" : "invalid_request_error";
        code = status >= 500 ? "server_error" : "invalid_request";
        atype = status >= 500 ? "api_error" : "invalid_request_error";
    }
    tg_buf_t *b = &c->scratch;
    b->len = 0;
    if (c->r.bedrock) {
        /* AWS's shape: {"message"} and the exception's name in x-amzn-ErrorType. */
        const char *ex = status == 400   ? "ValidationException"
                         : status == 403 ? (strstr(msg, "security token") ? "UnrecognizedClientException"
                                            : strstr(msg, "ignature")     ? "InvalidSignatureException"
                                                                          : "AccessDeniedException")
                         : status == 404 ? "ResourceNotFoundException"
                         : status == 408 ? "ModelTimeoutException"
                         : status == 424 ? "ModelErrorException"
                         : status == 429 ? "ThrottlingException"
                         : status == 503 ? "ServiceUnavailableException"
                         : status >= 500 ? "InternalServerException"
                                         : "ValidationException";
        size_t ql = strlen(c->r.qhdr);
        snprintf(c->r.qhdr + ql, sizeof(c->r.qhdr) - ql, "x-amzn-ErrorType: %s:http://internal.amazon.com/coral/com.amazon.bedrock/\r\n", ex);
        BUF_LIT(b, "{\"message\":\"");
        tg_buf_append_json_escaped(b, msg, strlen(msg));
        BUF_LIT(b, "\"}");
        return;
    }
    if (api == API_GEMINI) {
        const char *gs = status == 400 ? "INVALID_ARGUMENT" : status == 401 ? "UNAUTHENTICATED"
                         : status == 403 ? "PERMISSION_DENIED" : status == 404 ? "NOT_FOUND"
                         : status == 429 ? "RESOURCE_EXHAUSTED" : status == 503 ? "UNAVAILABLE"
                         : status >= 500 ? "INTERNAL" : "FAILED_PRECONDITION";
        tg_buf_printf(b, "{\"error\":{\"code\":%d,\"message\":\"", status);
        tg_buf_append_json_escaped(b, msg, strlen(msg));
        tg_buf_printf(b, "\",\"status\":\"%s\"}}", gs);
        return;
    }
    if (api == API_MESSAGES) {
        tg_buf_printf(b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"", atype);
        tg_buf_append_json_escaped(b, msg, strlen(msg));
        BUF_LIT(b, "\"}}");
    } else {
        BUF_LIT(b, "{\"error\":{\"message\":\"");
        tg_buf_append_json_escaped(b, msg, strlen(msg));
        tg_buf_printf(b, "\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}", otype, code);
    }
}

static void put_text(tg_buf_t *b, int n) {
    for (int i = 1; i <= n; i++)
        tg_buf_printf(b, "tok%d ", i);
}

/* A Responses API output_text part holding the whole answer. */
static void put_text_part(tg_buf_t *b, int n) {
    BUF_LIT(b, "{\"type\":\"output_text\",\"text\":\"");
    put_text(b, n);
    BUF_LIT(b, "\",\"annotations\":[]}");
}

/* Chat's usage member (after a comma), as the usage knob has it (not 0). */
static void put_chat_usage(tg_buf_t *b, const resp_t *r) {
    if (r->k.v[K_USAGE] == 2)
        BUF_LIT(b, "\"usage\":{\"prompt_tokens\":9223372036854775807,\"completion_tokens\":9223372036854775807,"
                   "\"total_tokens\":9223372036854775807}");
    else if (r->k.v[K_USAGE] == 3)
        BUF_LIT(b, "\"usage\":{\"prompt_tokens\":\"many\",\"completion_tokens\":\"lots\",\"total_tokens\":\"?\"}");
    else
        tg_buf_printf(b, "\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%d,\"total_tokens\":%lld}",
                      (long long)r->in_tok, r->out_n, (long long)r->in_tok + r->out_n);
}

static void render_chat(conn_t *c) {
    resp_t *r = &c->r;
    tg_buf_t *b = &c->scratch;
    tg_buf_printf(b, "{\"id\":\"chatcmpl-mock%llu\",\"object\":\"chat.completion\",\"created\":%lld,"
                     "\"model\":\"%s\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                     "\"content\":\"",
                  (unsigned long long)r->id, r->created, c->model.data);
    put_text(b, r->out_n);
    BUF_LIT(b, "\"},\"logprobs\":null,\"finish_reason\":\"stop\"}]");
    if (r->k.v[K_USAGE]) {
        BUF_LIT(b, ",");
        put_chat_usage(b, r);
    }
    BUF_LIT(b, "}");
}

/* Gemini's usageMetadata member (after a comma); final: with the candidates' count. */
static void put_gemini_usage(tg_buf_t *b, const resp_t *r, int final) {
    long long cached = TG_MIN((long long)r->k.v[K_CACHED], (long long)r->in_tok);
    long long thoughts = r->k.v[K_THOUGHTS];
    tg_buf_printf(b, "\"usageMetadata\":{\"promptTokenCount\":%lld", (long long)r->in_tok);
    if (final)
        tg_buf_printf(b, ",\"candidatesTokenCount\":%d", r->out_n);
    if (cached > 0)
        tg_buf_printf(b, ",\"cachedContentTokenCount\":%lld", cached);
    if (thoughts > 0)
        tg_buf_printf(b, ",\"thoughtsTokenCount\":%lld", thoughts);
    tg_buf_printf(b, ",\"totalTokenCount\":%lld}", (long long)r->in_tok + (final ? r->out_n + thoughts : 0));
}

static void render_gemini(conn_t *c) {
    resp_t *r = &c->r;
    tg_buf_t *b = &c->scratch;
    BUF_LIT(b, "{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"");
    put_text(b, r->out_n);
    BUF_LIT(b, "\"}],\"role\":\"model\"},\"finishReason\":\"STOP\",\"index\":0}]");
    if (r->k.v[K_USAGE]) {
        BUF_LIT(b, ",");
        put_gemini_usage(b, r, 1);
    }
    tg_buf_printf(b, ",\"modelVersion\":\"%s\",\"responseId\":\"mockgem%llu\"}", c->model.data,
                  (unsigned long long)r->id);
}

static void render_message(conn_t *c) {
    resp_t *r = &c->r;
    tg_buf_t *b = &c->scratch;
    tg_buf_printf(b, "{\"id\":\"msg_mock%llu\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"%s\","
                     "\"content\":[{\"type\":\"text\",\"text\":\"",
                  (unsigned long long)r->id, c->model.data);
    put_text(b, r->out_n);
    BUF_LIT(b, "\"}],\"stop_reason\":\"end_turn\",\"stop_sequence\":null");
    if (r->k.v[K_USAGE])
        tg_buf_printf(b, ",\"usage\":{\"input_tokens\":%lld,\"output_tokens\":%d}", (long long)r->in_tok,
                      r->out_n);
    BUF_LIT(b, "}");
}

/* The Responses API object; in_progress (no output yet) or completed. */
static void render_response_obj(conn_t *c, tg_buf_t *b, int done) {
    resp_t *r = &c->r;
    tg_buf_printf(b, "{\"id\":\"resp_mock%llu\",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\","
                     "\"model\":\"%s\",\"output\":[",
                  (unsigned long long)r->id, r->created, done ? "completed" : "in_progress", c->model.data);
    if (done) {
        tg_buf_printf(b, "{\"type\":\"message\",\"id\":\"msg_mock%llu\",\"status\":\"completed\",\"role\":"
                         "\"assistant\",\"content\":[",
                      (unsigned long long)r->id);
        put_text_part(b, r->out_n);
        BUF_LIT(b, "]}");
    }
    BUF_LIT(b, "]");
    if (done && r->k.v[K_USAGE])
        tg_buf_printf(b, ",\"usage\":{\"input_tokens\":%lld,\"input_tokens_details\":{\"cached_tokens\":0},"
                         "\"output_tokens\":%d,\"output_tokens_details\":{\"reasoning_tokens\":0},"
                         "\"total_tokens\":%lld}",
                      (long long)r->in_tok, r->out_n, (long long)r->in_tok + r->out_n);
    else
        BUF_LIT(b, ",\"usage\":null");
    BUF_LIT(b, "}");
}

static void render_embeddings(conn_t *c) {
    resp_t *r = &c->r;
    tg_buf_t *b = &c->scratch;
    BUF_LIT(b, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < r->n_inputs; i++) {
        tg_buf_printf(b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":[", i ? "," : "", i);
        for (int j = 0; j < MOCK_EMBED_DIM; j++)
            tg_buf_printf(b, "%s0.%03d", j ? "," : "", ((i + 1) * 7919 + (j + 1) * 104729) % 1000);
        BUF_LIT(b, "]}");
    }
    tg_buf_printf(b, "],\"model\":\"%s\"", c->model.data);
    if (r->k.v[K_USAGE])
        tg_buf_printf(b, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}", (long long)r->in_tok,
                      (long long)r->in_tok);
    BUF_LIT(b, "}");
}

/* The models the mock lists: mock-gpt, mock-claude, mock-embed and --models, or for an
 * Anthropic request mock-claude and --models. Calls fn(id, n, ud) for each, in order. */
static void models_each(int anth, void (*fn)(const char *id, size_t n, void *ud), void *ud) {
    if (!anth)
        fn("mock-gpt", 8, ud);
    fn("mock-claude", 11, ud);
    if (!anth)
        fn("mock-embed", 10, ud);
    for (const char *p = g_models; p && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n)
            fn(p, n, ud);
        p = e ? e + 1 : p + n;
    }
}

typedef struct {
    tg_buf_t *b;
    const resp_t *r;
    int index, from, to, total, after_at, before_at;
    const char *prefix; /* Google's lists: the resource name's prefix */
} models_walk_t;

/* A paged list's window over w->total entries: the page size (its default, the
 * account's models_page_size, the page knob when smaller) from the offset the page
 * token carried; the walk starts again at index 0. */
static void models_window(models_walk_t *w, const resp_t *r, int dflt) {
    int size = r->models_page_size > 0 ? r->models_page_size : dflt;
    if (r->k.v[K_PAGE] > 0 && r->k.v[K_PAGE] < size)
        size = r->k.v[K_PAGE];
    w->index = 0;
    w->from = TG_MIN(r->models_offset, w->total);
    w->to = w->total - w->from > size ? w->from + size : w->total;
}

static void models_find(const char *id, size_t n, void *ud) {
    models_walk_t *w = ud;
    if (strlen(w->r->models_after) == n && !memcmp(w->r->models_after, id, n))
        w->after_at = w->index;
    if (strlen(w->r->models_before) == n && !memcmp(w->r->models_before, id, n))
        w->before_at = w->index;
    w->index++;
}

static void models_put(const char *id, size_t n, void *ud) {
    models_walk_t *w = ud;
    int i = w->index++;
    if (i < w->from || i >= w->to)
        return;
    tg_buf_t *b = w->b;
    if (i > w->from)
        BUF_LIT(b, ",");
    if (w->r->models_anth) {
        BUF_LIT(b, "{\"type\":\"model\",\"id\":\"");
        tg_buf_append_json_escaped(b, id, n);
        BUF_LIT(b, "\",\"display_name\":\"");
        tg_buf_append_json_escaped(b, id, n);
        BUF_LIT(b, "\",\"created_at\":\"2023-11-14T22:13:20Z\"}");
    } else {
        BUF_LIT(b, "{\"id\":\"");
        tg_buf_append_json_escaped(b, id, n);
        BUF_LIT(b, "\",\"object\":\"model\",\"created\":1700000000,\"owned_by\":\"tollgate-mock\"}");
    }
}

static void models_id_at(const char *id, size_t n, void *ud) {
    models_walk_t *w = ud;
    if (w->index == w->from)
        tg_buf_append_json_escaped(w->b, id, n);
    w->index++;
}

/* Google's lists (Gemini's models.list, Vertex's publishers.models.list): the entries
 * from..to, named <w->prefix><id>. */
static void models_put_google(const char *id, size_t n, void *ud) {
    models_walk_t *w = ud;
    int i = w->index++;
    if (i < w->from || i >= w->to)
        return;
    tg_buf_t *b = w->b;
    if (i > w->from)
        BUF_LIT(b, ",");
    BUF_LIT(b, "{\"name\":\"");
    tg_buf_appends(b, w->prefix);
    tg_buf_append_json_escaped(b, id, n);
    if (w->r->models_pub[0]) {
        BUF_LIT(b, "\",\"versionId\":\"001\",\"openSourceCategory\":\"PROPRIETARY\",\"launchStage\":\"GA\"}");
        return;
    }
    BUF_LIT(b, "\",\"displayName\":\"");
    tg_buf_append_json_escaped(b, id, n);
    BUF_LIT(b, "\",\"supportedGenerationMethods\":[\"generateContent\",\"countTokens\"]}");
}

/* Azure OpenAI's models list: the resource's models, each with its capabilities. */
static void models_put_azure(const char *id, size_t n, void *ud) {
    models_walk_t *w = ud;
    if (w->index++)
        BUF_LIT(w->b, ",");
    BUF_LIT(w->b, "{\"status\":\"succeeded\",\"capabilities\":{\"fine_tune\":false,\"inference\":true,"
                  "\"completion\":false,\"chat_completion\":true,\"embeddings\":false},\"lifecycle_status\":"
                  "\"generally-available\",\"deprecation\":{\"inference\":4102444800},\"id\":\"");
    tg_buf_append_json_escaped(w->b, id, n);
    BUF_LIT(w->b, "\",\"created_at\":1700000000,\"object\":\"model\"}");
}

/* Bedrock's ListInferenceProfiles: entries from..to of the Anthropic models, each as
 * <w->prefix><id>. */
static void models_put_profile(const char *id, size_t n, void *ud) {
    models_walk_t *w = ud;
    int i = w->index++;
    if (i < w->from || i >= w->to)
        return;
    tg_buf_t *b = w->b;
    if (i > w->from)
        BUF_LIT(b, ",");
    BUF_LIT(b, "{\"inferenceProfileId\":\"");
    tg_buf_appends(b, w->prefix);
    tg_buf_append_json_escaped(b, id, n);
    BUF_LIT(b, "\",\"inferenceProfileName\":\"US ");
    tg_buf_append_json_escaped(b, id, n);
    BUF_LIT(b, "\",\"status\":\"ACTIVE\",\"type\":\"SYSTEM_DEFINED\"}");
}

/* Bedrock's ListFoundationModels: the Anthropic models as anthropic.<id>. */
static void models_put_bedrock(const char *id, size_t n, void *ud) {
    models_walk_t *w = ud;
    tg_buf_t *b = w->b;
    if (w->index++)
        BUF_LIT(b, ",");
    BUF_LIT(b, "{\"modelArn\":\"arn:aws:bedrock:us-east-1::foundation-model/anthropic.");
    tg_buf_append_json_escaped(b, id, n);
    BUF_LIT(b, "\",\"modelId\":\"anthropic.");
    tg_buf_append_json_escaped(b, id, n);
    BUF_LIT(b, "\",\"modelName\":\"");
    tg_buf_append_json_escaped(b, id, n);
    BUF_LIT(b, "\",\"providerName\":\"Anthropic\",\"inputModalities\":[\"TEXT\",\"IMAGE\"],\"outputModalities\":"
               "[\"TEXT\"],\"responseStreamingSupported\":true,\"customizationsSupported\":[],"
               "\"inferenceTypesSupported\":[\"ON_DEMAND\"],\"modelLifecycle\":{\"status\":\"ACTIVE\"}}");
}

static void render_models(conn_t *c) {
    tg_buf_t *b = &c->scratch;
    const resp_t *r = &c->r;
    models_walk_t w = {.b = b, .r = r, .after_at = -1, .before_at = -1};
    if (r->models_gemini || r->models_pub[0]) {
        /* Google's shape, paged by pageSize (default 50) and the page knob; the
         * nextPageToken is opaque ("pt/<offset>=", so it must be sent encoded). */
        char prefix[48];
        int anth = r->models_pub[0] && !strcmp(r->models_pub, "anthropic");
        if (r->models_pub[0])
            snprintf(prefix, sizeof(prefix), "publishers/%s/models/%s", r->models_pub, anth ? "" : "gemini-");
        else
            snprintf(prefix, sizeof(prefix), "models/");
        w.prefix = prefix;
        models_each(anth, models_find, &w);
        /* Gemini: an embedding-only model last; Vertex's google: an image model last. */
        int gemini_extra = !anth;
        w.total = w.index + gemini_extra;
        models_window(&w, r, 50);
        tg_buf_printf(b, "{\"%s\":[", r->models_pub[0] ? "publisherModels" : "models");
        models_each(anth, models_put_google, &w);
        if (gemini_extra && w.to == w.total && r->models_pub[0])
            tg_buf_printf(b, "%s{\"name\":\"publishers/google/models/imagen-mock\",\"versionId\":\"001\"}",
                          w.to - 1 > w.from ? "," : "");
        else if (gemini_extra && w.to == w.total)
            tg_buf_printf(b, "%s{\"name\":\"models/text-embedding-mock\",\"displayName\":\"Text Embedding\","
                             "\"supportedGenerationMethods\":[\"embedContent\"]}",
                          w.to - 1 > w.from ? "," : "");
        BUF_LIT(b, "]");
        if (w.to < w.total)
            tg_buf_printf(b, ",\"nextPageToken\":\"pt/%d=\"", w.to);
        BUF_LIT(b, "}");
        return;
    }
    if (r->models_azure) {
        /* Azure's shape; a model retired for inference and one that cannot infer
         * (fine-tuning only) are listed too, as Azure lists them. */
        BUF_LIT(b, "{\"data\":[");
        models_each(0, models_put_azure, &w);
        BUF_LIT(b, ",{\"status\":\"succeeded\",\"capabilities\":{\"fine_tune\":false,\"inference\":true,"
                   "\"completion\":true,\"chat_completion\":false,\"embeddings\":false},\"lifecycle_status\":"
                   "\"generally-available\",\"deprecation\":{\"fine_tune\":1677662127,\"inference\":1709284527},"
                   "\"id\":\"mock-retired\",\"created_at\":1646126127,\"object\":\"model\"},"
                   "{\"status\":\"succeeded\",\"capabilities\":{\"fine_tune\":true,\"inference\":false,"
                   "\"completion\":false,\"chat_completion\":false,\"embeddings\":false},\"lifecycle_status\":"
                   "\"generally-available\",\"id\":\"mock-tune-only\",\"created_at\":1646126127,"
                   "\"object\":\"model\"}],\"object\":\"list\"}");
        return;
    }
    if (r->models_bedrock == 2) {
        /* ListInferenceProfiles: us.anthropic.<id> for each Anthropic model and an
         * Amazon one, paged by maxResults and the page knob, nextToken opaque. */
        models_each(1, models_find, &w);
        w.total = w.index + 1;
        models_window(&w, r, 1000);
        w.prefix = "us.anthropic.";
        BUF_LIT(b, "{\"inferenceProfileSummaries\":[");
        models_each(1, models_put_profile, &w);
        if (w.to == w.total)
            tg_buf_printf(b, "%s{\"inferenceProfileId\":\"us.amazon.nova-lite-v1:0\",\"inferenceProfileName\":"
                              "\"US Nova Lite\",\"status\":\"ACTIVE\",\"type\":\"SYSTEM_DEFINED\"}",
                          w.to - 1 > w.from ? "," : "");
        BUF_LIT(b, "]");
        if (w.to < w.total)
            tg_buf_printf(b, ",\"nextToken\":\"pt/%d=\"", w.to);
        BUF_LIT(b, "}");
        return;
    }
    if (r->models_bedrock) {
        /* Every provider's models; an Amazon one besides the Anthropic ones, and an
         * Anthropic one served only through an inference profile. */
        BUF_LIT(b, "{\"modelSummaries\":[");
        models_each(1, models_put_bedrock, &w);
        BUF_LIT(b, ",{\"modelArn\":\"arn:aws:bedrock:us-east-1::foundation-model/amazon.titan-text-express-v1\","
                   "\"modelId\":\"amazon.titan-text-express-v1\",\"modelName\":\"Titan Text G1 - Express\","
                   "\"providerName\":\"Amazon\",\"inputModalities\":[\"TEXT\"],\"outputModalities\":[\"TEXT\"],"
                   "\"responseStreamingSupported\":true,\"modelLifecycle\":{\"status\":\"ACTIVE\"}},"
                   "{\"modelId\":\"anthropic.claude-profile-only-v1:0\",\"modelName\":\"Claude (profiles only)\","
                   "\"providerName\":\"Anthropic\",\"inferenceTypesSupported\":[\"INFERENCE_PROFILE\"]}]}");
        return;
    }
    models_each(r->models_anth, models_find, &w);
    w.total = w.index;
    if (!r->models_anth) {
        w.index = 0, w.from = 0, w.to = w.total;
        BUF_LIT(b, "{\"object\":\"list\",\"data\":[");
        models_each(0, models_put, &w);
        BUF_LIT(b, "]}");
        return;
    }
    int limit = r->models_limit;
    if (r->k.v[K_PAGE] > 0 && r->k.v[K_PAGE] < limit)
        limit = r->k.v[K_PAGE];
    int has_more;
    if (r->models_before[0]) {
        w.to = w.before_at >= 0 ? w.before_at : w.total;
        w.from = w.to > limit ? w.to - limit : 0;
        has_more = w.from > 0;
    } else {
        w.from = r->models_after[0] ? (w.after_at >= 0 ? w.after_at + 1 : w.total) : 0;
        w.to = w.total - w.from > limit ? w.from + limit : w.total;
        has_more = w.to < w.total;
    }
    BUF_LIT(b, "{\"data\":[");
    w.index = 0;
    models_each(1, models_put, &w);
    tg_buf_printf(b, "],\"has_more\":%s,\"first_id\":", has_more ? "true" : "false");
    for (int k = 0; k < 2; k++) {
        int at = k ? w.to - 1 : w.from;
        if (w.to <= w.from) {
            BUF_LIT(b, "null");
        } else {
            models_walk_t one = {.b = b, .from = at};
            BUF_LIT(b, "\"");
            models_each(1, models_id_at, &one);
            BUF_LIT(b, "\"");
        }
        if (!k)
            BUF_LIT(b, ",\"last_id\":");
    }
    BUF_LIT(b, "}");
}

/* ---- streaming ------------------------------------------------------------------ */

static void resp_finished(conn_t *c);
static void stream_step(conn_t *c);
static void conn_feed(conn_t *c, const char *data, size_t len);
static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void stream_step_cb(uv_timer_t *t) { stream_step(t->data); }

/* Starts a Responses API event: its `event:` line and the type and sequence_number. */
static void resp_event(conn_t *c, const char *type) {
    tg_buf_printf(&c->scratch, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%d,", type, type, c->r.seq++);
}

static void put_chat_chunk_head(conn_t *c, tg_buf_t *b) {
    tg_buf_printf(b, "data: {\"id\":\"chatcmpl-mock%llu\",\"object\":\"chat.completion.chunk\",\"created\":%lld,"
                     "\"model\":\"%s\",",
                  (unsigned long long)c->r.id, c->r.created, c->model.data);
}

/* Headers and the events that precede any content (flushed before the first wait). */
static void stream_start(conn_t *c) {
    resp_t *r = &c->r;
    tg_buf_t *b = &c->scratch;
    if (r->bedrock)
        BUF_LIT(&c->out, "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.amazon.eventstream\r\n"
                         "x-amzn-bedrock-content-type: application/json\r\n");
    else
        BUF_LIT(&c->out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n");
    tg_buf_appends(&c->out, r->qhdr);
    if (!r->raw)
        BUF_LIT(&c->out, "Transfer-Encoding: chunked\r\n");
    if (!r->keepalive)
        BUF_LIT(&c->out, "Connection: close\r\n");
    BUF_LIT(&c->out, "\r\n");
    if (r->api == API_GEMINI)
        return; /* no events before the content */
    if (r->api == API_MESSAGES) {
        tg_buf_printf(b, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{"
                         "\"id\":\"msg_mock%llu\",\"type\":\"message\","
                         "\"role\":\"assistant\",\"model\":\"%s\",\"content\":[],\"stop_reason\":null,"
                         "\"stop_sequence\":null",
                      (unsigned long long)r->id, c->model.data);
        if (r->k.v[K_USAGE])
            tg_buf_printf(b, ",\"usage\":{\"input_tokens\":%lld,\"output_tokens\":1}", (long long)r->in_tok);
        BUF_LIT(b, "}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
                   "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
                   "event: ping\ndata: {\"type\":\"ping\"}\n\n");
        put_chunk(c);
    } else if (r->api == API_RESPONSES) {
        resp_event(c, "response.created");
        BUF_LIT(b, "\"response\":");
        render_response_obj(c, b, 0);
        BUF_LIT(b, "}\n\n");
        resp_event(c, "response.in_progress");
        BUF_LIT(b, "\"response\":");
        render_response_obj(c, b, 0);
        BUF_LIT(b, "}\n\n");
        resp_event(c, "response.output_item.added");
        tg_buf_printf(b, "\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_mock%llu\","
                         "\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n",
                      (unsigned long long)r->id);
        resp_event(c, "response.content_part.added");
        tg_buf_printf(b, "\"item_id\":\"msg_mock%llu\",\"output_index\":0,\"content_index\":0,\"part\":",
                      (unsigned long long)r->id);
        put_text_part(b, 0);
        BUF_LIT(b, "}\n\n");
        put_chunk(c);
    }
}

static void stream_content(conn_t *c, int i) {
    resp_t *r = &c->r;
    tg_buf_t *b = &c->scratch;
    if (r->api == API_GEMINI) {
        tg_buf_printf(b, "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"tok%d \"}],\"role\":\"model\"},"
                         "\"index\":0}],", i);
        if (r->k.v[K_USAGE])
            put_gemini_usage(b, r, 0), BUF_LIT(b, ",");
        tg_buf_printf(b, "\"modelVersion\":\"%s\",\"responseId\":\"mockgem%llu\"}\r\n\r\n", c->model.data,
                      (unsigned long long)r->id);
    } else if (r->api == API_CHAT) {
        put_chat_chunk_head(c, b);
        tg_buf_printf(b, "\"choices\":[{\"index\":0,\"delta\":{%s\"content\":\"tok%d \"},\"logprobs\":null,"
                         "\"finish_reason\":null}]%s}\n\n",
                      i == 1 ? "\"role\":\"assistant\"," : "", i, r->include_usage ? ",\"usage\":null" : "");
    } else if (r->api == API_MESSAGES) {
        tg_buf_printf(b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
                         "\"delta\":{\"type\":\"text_delta\",\"text\":\"tok%d \"}}\n\n",
                      i);
    } else {
        resp_event(c, "response.output_text.delta");
        tg_buf_printf(b, "\"item_id\":\"msg_mock%llu\",\"output_index\":0,\"content_index\":0,"
                         "\"delta\":\"tok%d \"}\n\n", (unsigned long long)r->id, i);
    }
    put_chunk(c);
}

/* Everything after the last content chunk, and the chunked-body terminator. */
static void stream_final(conn_t *c) {
    resp_t *r = &c->r;
    tg_buf_t *b = &c->scratch;
    if (r->api == API_GEMINI) {
        /* The last chunk: an empty text, the finish reason and the full counts. */
        BUF_LIT(b, "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"\"}],\"role\":\"model\"},"
                   "\"finishReason\":\"STOP\",\"index\":0}],");
        if (r->k.v[K_USAGE])
            put_gemini_usage(b, r, 1), BUF_LIT(b, ",");
        tg_buf_printf(b, "\"modelVersion\":\"%s\",\"responseId\":\"mockgem%llu\"}\r\n\r\n", c->model.data,
                      (unsigned long long)r->id);
    } else if (r->api == API_CHAT) {
        put_chat_chunk_head(c, b);
        tg_buf_printf(b, "\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]"
                         "%s}\n\n",
                      r->include_usage ? ",\"usage\":null" : "");
        if (r->include_usage && r->k.v[K_USAGE]) {
            put_chat_chunk_head(c, b);
            BUF_LIT(b, "\"choices\":[],");
            put_chat_usage(b, r);
            BUF_LIT(b, "}\n\n");
        }
        BUF_LIT(b, "data: [DONE]\n\n");
    } else if (r->api == API_MESSAGES) {
        BUF_LIT(b, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
                   "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
                   "\"end_turn\",\"stop_sequence\":null}");
        if (r->k.v[K_USAGE])
            tg_buf_printf(b, ",\"usage\":{\"output_tokens\":%d}", r->out_n);
        BUF_LIT(b, "}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    } else {
        unsigned long long id = (unsigned long long)r->id;
        resp_event(c, "response.output_text.done");
        tg_buf_printf(b, "\"item_id\":\"msg_mock%llu\",\"output_index\":0,\"content_index\":0,\"text\":\"", id);
        put_text(b, r->out_n);
        BUF_LIT(b, "\"}\n\n");
        resp_event(c, "response.content_part.done");
        tg_buf_printf(b, "\"item_id\":\"msg_mock%llu\",\"output_index\":0,\"content_index\":0,\"part\":", id);
        put_text_part(b, r->out_n);
        BUF_LIT(b, "}\n\n");
        resp_event(c, "response.output_item.done");
        tg_buf_printf(b, "\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_mock%llu\","
                         "\"status\":\"completed\",\"role\":\"assistant\",\"content\":[",
                      id);
        put_text_part(b, r->out_n);
        BUF_LIT(b, "]}}\n\n");
        resp_event(c, "response.completed");
        BUF_LIT(b, "\"response\":");
        render_response_obj(c, b, 1);
        BUF_LIT(b, "}\n\n");
    }
    put_chunk(c);
    if (!r->raw)
        BUF_LIT(&c->out, "0\r\n\r\n");
}

/* close_after: ends the request (not as aborted) and closes after what was sent. */
static void stream_drop(conn_t *c) {
    conn_flush(c);
    req_done(c, 0);
    conn_shutdown(c);
}

/* Sends content chunks until a wait is due, a close_after drop, or the end. */
static void stream_step(conn_t *c) {
    resp_t *r = &c->r;
    int close_after = r->k.v[K_CLOSE_AFTER], interval = r->k.v[K_INTERVAL_MS];
    while (r->sent < r->out_n && !c->closing) {
        if (r->bedrock && r->k.v[K_AWS_EXCEPTION] >= 0 && r->sent >= r->k.v[K_AWS_EXCEPTION]) {
            /* aws_exception=K: after K chunks, a throttlingException message ends the stream. */
            static const char *const xv[] = {"throttlingException", "application/json", "exception"};
            static const char *const xn[] = {":exception-type", ":content-type", ":message-type"};
            static const char msg[] = "{\"message\":\"mock: Too many requests, please wait before trying again.\"}";
            tg_es_encode(&c->scratch, xn, xv, 3, msg, sizeof(msg) - 1);
            c->r.bedrock = 0; /* the frame as it is */
            put_chunk(c);
            c->r.bedrock = 1;
            if (!r->raw)
                BUF_LIT(&c->out, "0\r\n\r\n");
            conn_flush(c);
            resp_finished(c);
            return;
        }
        stream_content(c, ++r->sent);
        if (close_after >= 0 && r->sent >= close_after) {
            stream_drop(c);
            return;
        }
        if (r->sent < r->out_n && interval > 0) {
            conn_flush(c);
            uv_timer_start(&c->timer, stream_step_cb, (uint64_t)interval, 0);
            return;
        }
    }
    if (c->closing)
        return;
    stream_final(c);
    conn_flush(c);
    resp_finished(c);
}

/* Runs after delay_ms (or at once): the whole held response, or the stream. */
static void resp_begin(conn_t *c) {
    resp_t *r = &c->r;
    if (r->whole) { /* flushed by resp_finished, or by the read path */
        tg_buf_append(&c->out, c->held.data, c->held.len);
        c->held.len = 0;
        resp_finished(c);
        return;
    }
    stream_start(c);
    if (r->k.v[K_CLOSE_AFTER] == 0) {
        stream_drop(c);
    } else if (r->k.v[K_TTFT_MS] > 0) {
        conn_flush(c);
        uv_timer_start(&c->timer, stream_step_cb, (uint64_t)r->k.v[K_TTFT_MS], 0);
    } else
        stream_step(c);
}

static void delay_cb(uv_timer_t *t) { resp_begin(t->data); }

/* ---- control endpoints ---------------------------------------------------------- */

static void render_stats_locked(tg_buf_t *b) {
    tg_buf_printf(b, "{\"total\":%lld,\"inflight\":%lld,\"max_inflight\":%lld,\"aborted\":%lld,\"credentials\":{",
                  (long long)g_st.total, (long long)g_st.inflight, (long long)g_st.max_inflight,
                  (long long)g_st.aborted);
    int first = 1;
    for (int i = 0; i < MOCK_CRED_BUCKETS; i++)
        for (cred_t *c = g_st.creds[i]; c; c = c->next) {
            tg_buf_appends(b, first ? "\"" : ",\"");
            first = 0;
            tg_buf_append_json_escaped(b, c->name, c->len);
            tg_buf_printf(b, "\":{\"requests\":%lld,\"inflight\":%lld,\"max_inflight\":%lld,\"aborted\":%lld",
                          (long long)c->requests, (long long)c->inflight, (long long)c->max_inflight,
                          (long long)c->aborted);
            if (c->q_style)
                tg_buf_printf(b, ",\"quota\":{\"used\":%lld,\"limit\":%lld,\"rejected\":%lld,\"reset_in_ms\":%lld}",
                              (long long)c->q_used, (long long)c->q_limit, (long long)c->q_rejected,
                              (long long)(c->q_start_ms + c->q_window_ms - (int64_t)tg_wall_ms()));
            BUF_LIT(b, "}");
        }
    BUF_LIT(b, "}}");
}

/* Steps over one "name\0value\0" pair of a header block. */
static const char *pair_next(const char *p) {
    p += strlen(p) + 1;
    return p + strlen(p) + 1;
}

static void render_last_locked(tg_buf_t *b) {
    if (!g_st.have_last) {
        BUF_LIT(b, "{\"method\":null,\"path\":null,\"headers\":{},\"body\":null}");
        return;
    }
    const char *m = llhttp_method_name((llhttp_method_t)g_st.last_method);
    tg_buf_printf(b, "{\"method\":\"%s\",\"path\":\"", m);
    tg_buf_append_json_escaped(b, g_st.last_url.data, g_st.last_url.len);
    BUF_LIT(b, "\",\"headers\":{");
    const char *h = g_st.last_hdrs.data, *end = h + g_st.last_hdrs.len;
    for (const char *p = h; p < end; p = pair_next(p)) {
        const char *q = h;
        while (q < p && strcmp(q, p) != 0)
            q = pair_next(q);
        if (q < p)
            continue; /* a repeated header: its values were joined with ", " at the first */
        tg_buf_appends(b, p == h ? "\"" : ",\"");
        tg_buf_append_json_escaped(b, p, strlen(p));
        BUF_LIT(b, "\":\"");
        for (int n = 0; q < end; q = pair_next(q))
            if (strcmp(q, p) == 0) {
                if (n++)
                    BUF_LIT(b, ", ");
                const char *v = q + strlen(q) + 1;
                tg_buf_append_json_escaped(b, v, strlen(v));
            }
        BUF_LIT(b, "\"");
    }
    BUF_LIT(b, "},\"body\":\"");
    tg_buf_append_json_escaped(b, g_st.last_body.data, g_st.last_body.len);
    BUF_LIT(b, "\"}");
}

static void render_faults_locked(tg_buf_t *b) {
    BUF_LIT(b, "[");
    for (fault_t *f = g_st.faults; f; f = f->next) {
        tg_buf_appends(b, f == g_st.faults ? "{\"credential\":\"" : ",{\"credential\":\"");
        tg_buf_append_json_escaped(b, f->cred, strlen(f->cred));
        tg_buf_printf(b, "\",\"count\":%lld", (long long)f->count);
        for (int i = 0; i < K__COUNT; i++)
            if (f->k.v[i] >= 0)
                tg_buf_printf(b, ",\"%s\":%d", knob_names[i], f->k.v[i]);
        BUF_LIT(b, "}");
    }
    BUF_LIT(b, "]");
}

/* ---- provider quota ------------------------------------------------------------- */

/* POST /_mock/quota {"credential","style": openai|anthropic|unified|codex, "limit": N
 * requests per window (0: counted, never enforced), "window_ms", "malformed": true}.
 * Returns NULL or an error message. */
static const char *quota_install(const char *body, size_t len) {
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    const char *st = json_string_value(json_object_get(root, "style"));
    const char *cred = json_string_value(json_object_get(root, "credential"));
    json_t *jl = json_object_get(root, "limit"), *jw = json_object_get(root, "window_ms");
    int style = !st                         ? -1
                : !strcmp(st, "openai")     ? Q_OPENAI
                : !strcmp(st, "anthropic")  ? Q_ANTHROPIC
                : !strcmp(st, "unified")    ? Q_UNIFIED
                : !strcmp(st, "codex")      ? Q_CODEX
                : !strcmp(st, "none")       ? Q_NONE
                                            : -1;
    int64_t limit = json_is_integer(jl) ? json_integer_value(jl) : -1;
    int64_t window = json_is_integer(jw) ? json_integer_value(jw) : 60000;
    if (!cred || style < 0 || limit < 0 || window < 100) {
        json_decref(root);
        return "quota: credential, style (openai, anthropic, unified, codex, none), limit >= 0 and "
               "window_ms >= 100 are required";
    }
    pthread_mutex_lock(&g_st.mu);
    cred_t *c = cred_get(cred, strlen(cred));
    c->q_style = style;
    c->q_limit = limit;
    c->q_window_ms = window;
    c->q_start_ms = (int64_t)tg_wall_ms();
    c->q_used = 0;
    c->q_malformed = json_is_true(json_object_get(root, "malformed"));
    pthread_mutex_unlock(&g_st.mu);
    json_decref(root);
    return NULL;
}

/* Counts a request against its credential's window (caller holds mu) and writes the
 * headers its provider would send into r->qhdr. Returns the window's reset (ms since
 * the epoch) when the window was already spent (the request gets a 429), else 0. */
static int64_t quota_step(cred_t *ce, resp_t *r) {
    r->qhdr[0] = '\0';
    if (!ce->q_style)
        return 0;
    int64_t now = (int64_t)tg_wall_ms();
    if (now >= ce->q_start_ms + ce->q_window_ms) { /* a new window: the countdown starts over */
        ce->q_start_ms += (now - ce->q_start_ms) / ce->q_window_ms * ce->q_window_ms;
        ce->q_used = 0;
    }
    int64_t reset = ce->q_start_ms + ce->q_window_ms;
    int spent = ce->q_limit > 0 && ce->q_used >= ce->q_limit;
    if (spent)
        ce->q_rejected++;
    else
        ce->q_used++;
    int64_t lim = ce->q_limit > 0 ? ce->q_limit : 1000000, left = TG_MAX(lim - ce->q_used, 0);
    double in_s = (double)(reset - now) / 1000, used = (double)ce->q_used / (double)lim;
    char *h = r->qhdr;
    size_t cap = sizeof(r->qhdr);
    if (ce->q_malformed) {
        snprintf(h, cap,
                 "x-ratelimit-remaining-requests: plenty\r\nx-ratelimit-reset-requests: whenever\r\n"
                 "anthropic-ratelimit-requests-reset: 2025-99-99T99:99:99Z\r\n"
                 "anthropic-ratelimit-unified-5h-utilization: -7%%\r\nanthropic-ratelimit-unified-5h-status: fine\r\n"
                 "x-codex-primary-used-percent: 1e999\r\nx-codex-primary-reset-after-seconds: later\r\n");
        return spent ? reset : 0;
    }
    switch (ce->q_style) {
    case Q_OPENAI:
        snprintf(h, cap,
                 "x-ratelimit-limit-requests: %lld\r\nx-ratelimit-remaining-requests: %lld\r\n"
                 "x-ratelimit-reset-requests: %.3fs\r\nx-ratelimit-limit-tokens: %lld\r\n"
                 "x-ratelimit-remaining-tokens: %lld\r\nx-ratelimit-reset-tokens: %.3fs\r\n",
                 (long long)lim, (long long)left, in_s, (long long)lim * 100000, (long long)left * 100000, in_s);
        break;
    case Q_ANTHROPIC: {
        char ts[32];
        time_t t = (time_t)(reset / 1000);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(h, cap,
                 "anthropic-ratelimit-requests-limit: %lld\r\nanthropic-ratelimit-requests-remaining: %lld\r\n"
                 "anthropic-ratelimit-requests-reset: %s.%03dZ\r\n",
                 (long long)lim, (long long)left, ts, (int)(reset % 1000));
        break;
    }
    case Q_UNIFIED:
        snprintf(h, cap,
                 "anthropic-ratelimit-unified-status: %s\r\nanthropic-ratelimit-unified-reset: %.3f\r\n"
                 "anthropic-ratelimit-unified-5h-status: %s\r\nanthropic-ratelimit-unified-5h-utilization: %.4f\r\n"
                 "anthropic-ratelimit-unified-5h-reset: %.3f\r\n",
                 spent ? "rejected" : "allowed", (double)reset / 1000, spent ? "rejected" : used >= 0.8 ? "allowed_warning" : "allowed",
                 TG_MIN(used, 1.0), (double)reset / 1000);
        break;
    default: /* Q_CODEX */
        snprintf(h, cap,
                 "x-codex-primary-used-percent: %.2f\r\nx-codex-primary-window-minutes: %.4f\r\n"
                 "x-codex-primary-reset-after-seconds: %.3f\r\n",
                 TG_MIN(used, 1.0) * 100, (double)ce->q_window_ms / 60000, in_s);
    }
    return spent ? reset : 0;
}

/* The 429 of a spent window, in its provider's shape, into c->scratch. */
static void render_spent(conn_t *c, int style, int64_t reset) {
    int64_t now = (int64_t)tg_wall_ms();
    tg_buf_t *b = &c->scratch;
    b->len = 0;
    if (style == Q_CODEX)
        tg_buf_printf(b,
                      "{\"error\":{\"type\":\"usage_limit_reached\",\"message\":\"The usage limit has been reached\","
                      "\"plan_type\":\"plus\",\"resets_at\":%.3f,\"resets_in_seconds\":%.3f}}",
                      (double)reset / 1000, (double)(reset - now) / 1000);
    else if (style == Q_OPENAI)
        render_error(c, API_CHAT, 429, "Rate limit reached for requests");
    else
        render_error(c, API_MESSAGES, 429, "Number of requests has exceeded your rate limit");
}

/* POST /_mock/faults. Returns NULL or an error message. */
static const char *fault_install(const char *body, size_t len) {
    json_error_t jerr;
    json_t *root = json_loadb(body, len, 0, &jerr);
    if (!json_is_object(root)) {
        json_decref(root);
        return "body must be a JSON object";
    }
    json_t *jc = json_object_get(root, "credential");
    const char *cred = json_is_string(jc) ? json_string_value(jc) : "*";
    json_t *jn = json_object_get(root, "count");
    int64_t count = json_is_integer(jn) && json_integer_value(jn) > 0 ? json_integer_value(jn) : -1;
    knobs_t k;
    knobs_clear(&k);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int i = knob_index(key, strlen(key));
        if (i < 0)
            continue;
        if (json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 999999999)
            k.v[i] = (int)json_integer_value(v);
        else if (json_is_boolean(v))
            k.v[i] = json_is_true(v);
        else if (json_is_string(v))
            knob_set(&k, key, strlen(key), json_string_value(v), json_string_length(v));
    }
    size_t clen = strlen(cred);
    fault_t *f = calloc(1, sizeof(*f) + clen + 1);
    if (!f)
        abort();
    memcpy(f->cred, cred, clen);
    f->k = k;
    f->count = count;
    json_t *jb = json_object_get(root, "body");
    if (json_is_string(jb)) {
        f->body_len = json_string_length(jb);
        f->body = malloc(f->body_len + 1);
        if (!f->body)
            abort();
        memcpy(f->body, json_string_value(jb), f->body_len + 1);
    }
    json_decref(root);
    pthread_mutex_lock(&g_st.mu);
    fault_t **old = fault_find(f->cred, clen);
    if (old) {
        fault_t *o = *old;
        *old = o->next;
        free(o->body);
        free(o);
    }
    f->next = g_st.faults;
    g_st.faults = f;
    pthread_mutex_unlock(&g_st.mu);
    return NULL;
}

static void handle_control(conn_t *c, const char *path, size_t plen) {
    tg_buf_t *b = &c->scratch;
    c->r.qhdr[0] = '\0';
    int m = c->method, status = 200;
    const char *err = NULL;
#define PATH_IS(lit) (plen == sizeof(lit) - 1 && memcmp(path, lit, plen) == 0)
    int install = PATH_IS("/_mock/faults") && m == HTTP_POST;
    if (install && (err = fault_install(c->body.data ? c->body.data : "", c->body.len)))
        status = 400;
    if (PATH_IS("/_mock/identity") && m == HTTP_POST) {
        install = 1;
        if ((err = tg_mock_id_config(c->body.data ? c->body.data : "", c->body.len)))
            status = 400;
    }
    if (PATH_IS("/_mock/identity") && m == HTTP_GET) {
        install = 1;
        tg_mock_id_stats(b);
    }
    if (PATH_IS("/_mock/reset") && m == HTTP_POST)
        tg_mock_id_reset();
    if (PATH_IS("/_mock/quota") && m == HTTP_POST) {
        install = 1;
        if ((err = quota_install(c->body.data ? c->body.data : "", c->body.len)))
            status = 400;
    }
    pthread_mutex_lock(&g_st.mu);
    if (PATH_IS("/_mock/stats") && m == HTTP_GET)
        render_stats_locked(b);
    else if (PATH_IS("/_mock/last") && m == HTTP_GET)
        render_last_locked(b);
    else if (PATH_IS("/_mock/faults") && m == HTTP_GET)
        render_faults_locked(b);
    else if (PATH_IS("/_mock/faults") && m == HTTP_DELETE)
        faults_clear_locked();
    else if (PATH_IS("/_mock/reset") && m == HTTP_POST)
        state_clear_locked();
    else if (!install)
        status = 404, err = "unknown mock control endpoint";
    pthread_mutex_unlock(&g_st.mu);
#undef PATH_IS
    if (err)
        render_error(c, API_NONE, status, err);
    else if (!b->len)
        BUF_LIT(b, "{\"ok\":true}");
    put_response(c, &c->out, status, -1, c->r.keepalive);
    if (!c->r.keepalive)
        c->want_close = 1;
}

/* ---- requests ------------------------------------------------------------------- */

/* Gemini's /models/<model>:generateContent or :streamGenerateContent (the prefix
 * removed): API_GEMINI with the model's span and whether it streams, else API_NONE. */
static int route_gemini(const char *path, size_t n, const char **model, size_t *mlen, int *stream) {
    if (n < 9 || memcmp(path, "/models/", 8) != 0)
        return API_NONE;
    const char *colon = memchr(path + 8, ':', n - 8);
    if (!colon || colon == path + 8)
        return API_NONE;
    size_t rest = (size_t)(path + n - colon);
    *model = path + 8;
    *mlen = (size_t)(colon - *model);
    if (rest == 16 && !memcmp(colon, ":generateContent", 16))
        *stream = 0;
    else if (rest == 22 && !memcmp(colon, ":streamGenerateContent", 22))
        *stream = 1;
    else
        return API_NONE;
    return API_GEMINI;
}

/* A path "<pre><segment><rest>" with a non-empty segment and rest starting at its '/':
 * the segment's span and the rest; 0 if the path is not one. */
static int path_segment(const char *path, size_t n, const char *pre, const char **seg, size_t *slen, const char **rest,
                        size_t *rlen) {
    size_t pl = strlen(pre);
    if (n <= pl || memcmp(path, pre, pl) != 0)
        return 0;
    const char *slash = memchr(path + pl, '/', n - pl);
    if (!slash || slash == path + pl)
        return 0;
    *seg = path + pl;
    *slen = (size_t)(slash - *seg);
    *rest = slash;
    *rlen = (size_t)(path + n - slash);
    return 1;
}

/* Vertex AI's /v1/projects/<p>/locations/<r>/publishers/<publisher>/models/<m>:<method>:
 * 1 with the publisher's span and the rest ("/models/<m>:<method>"), else 0. */
static int route_vertex(const char *path, size_t n, const char **pub, size_t *publen, const char **rest, size_t *rlen) {
    static const char pre[] = "/v1/projects/";
    if (n <= sizeof(pre) - 1 || memcmp(path, pre, sizeof(pre) - 1) != 0)
        return 0;
    const char *p = memmem(path, n, "/publishers/", 12);
    if (!p)
        return 0;
    p += 12;
    const char *slash = memchr(p, '/', (size_t)(path + n - p));
    if (!slash)
        return 0;
    *pub = p;
    *publen = (size_t)(slash - p);
    *rest = slash;
    *rlen = (size_t)(path + n - slash);
    return 1;
}

/* Claude on Vertex: /models/<m>:rawPredict or :streamRawPredict (the rest of the path). */
static int route_vertex_claude(const char *rest, size_t n, const char **model, size_t *mlen, int *stream) {
    if (n < 9 || memcmp(rest, "/models/", 8) != 0)
        return 0;
    const char *colon = memchr(rest + 8, ':', n - 8);
    if (!colon || colon == rest + 8)
        return 0;
    size_t tail = (size_t)(rest + n - colon);
    *model = rest + 8;
    *mlen = (size_t)(colon - *model);
    if (tail == 11 && !memcmp(colon, ":rawPredict", 11))
        *stream = 0;
    else if (tail == 17 && !memcmp(colon, ":streamRawPredict", 17))
        *stream = 1;
    else
        return 0;
    return 1;
}

/* Azure OpenAI's /openai/deployments/<deployment>/<operation>: the deployment's span
 * and the rest ("/chat/completions"); 0 if the path is not one. */
static int route_azure(const char *path, size_t n, const char **dep, size_t *dlen, const char **rest, size_t *rlen) {
    return path_segment(path, n, "/openai/deployments/", dep, dlen, rest, rlen);
}

/* Bedrock's /model/<modelId>/invoke and /model/<modelId>/invoke-with-response-stream:
 * the modelId's span (as sent, percent-encoded) and whether it streams; 0 if not one. */
static int route_bedrock(const char *path, size_t n, const char **id, size_t *idlen, int *stream) {
    const char *rest;
    size_t rl;
    if (!path_segment(path, n, "/model/", id, idlen, &rest, &rl))
        return 0;
    static const char inv[] = "/invoke", invs[] = "/invoke-with-response-stream";
    if (rl == sizeof(inv) - 1 && !memcmp(rest, inv, rl))
        *stream = 0;
    else if (rl == sizeof(invs) - 1 && !memcmp(rest, invs, rl))
        *stream = 1;
    else
        return 0;
    return 1;
}

static int route(const char *path, size_t n, int method, int *bad_method) {
    const char *dep, *rest;
    size_t dlen, rlen;
    int bst;
    if ((n == 18 && !memcmp(path, "/foundation-models", 18)) || (n == 19 && !memcmp(path, "/inference-profiles", 19)) ||
        (path_segment(path, n, "/v1beta1/publishers/", &dep, &dlen, &rest, &rlen) && rlen == 7 &&
         !memcmp(rest, "/models", 7))) {
        /* Bedrock's ListFoundationModels and ListInferenceProfiles, Vertex's
         * publishers.models.list. */
        *bad_method = method != HTTP_GET;
        return API_MODELS;
    }
    if (route_bedrock(path, n, &dep, &dlen, &bst)) {
        *bad_method = method != HTTP_POST;
        return API_MESSAGES;
    }
    if (route_vertex(path, n, &dep, &dlen, &rest, &rlen)) {
        const char *m;
        size_t ml;
        int st;
        *bad_method = method != HTTP_POST;
        if (dlen == 9 && !memcmp(dep, "anthropic", 9))
            return route_vertex_claude(rest, rlen, &m, &ml, &st) ? API_MESSAGES : API_NONE;
        if (dlen == 6 && !memcmp(dep, "google", 6))
            return route_gemini(rest, rlen, &m, &ml, &st) == API_GEMINI ? API_GEMINI : API_NONE;
        return API_NONE;
    }
    if (route_azure(path, n, &dep, &dlen, &rest, &rlen)) {
        path = rest;
        n = rlen;
    } else if (n == 14 && !memcmp(path, "/openai/models", 14)) {
        path += 7; /* Azure's models list */
        n -= 7;
    }
    if (n >= 4 && memcmp(path, "/v1/", 4) == 0) {
        path += 3;
        n -= 3;
    } else if (n >= 8 && memcmp(path, "/v1beta/", 8) == 0) {
        path += 7;
        n -= 7;
    }
    {
        const char *m;
        size_t ml;
        int st;
        if (route_gemini(path, n, &m, &ml, &st) == API_GEMINI) {
            *bad_method = method != HTTP_POST;
            return API_GEMINI;
        }
    }
    static const struct {
        const char *path;
        int api, method;
    } routes[] = {{"/chat/completions", API_CHAT, HTTP_POST},
                  {"/messages", API_MESSAGES, HTTP_POST},
                  {"/responses", API_RESPONSES, HTTP_POST},
                  {"/embeddings", API_EMBEDDINGS, HTTP_POST},
                  {"/models", API_MODELS, HTTP_GET}};
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (strlen(routes[i].path) == n && memcmp(routes[i].path, path, n) == 0) {
            *bad_method = method != routes[i].method;
            return routes[i].api;
        }
    *bad_method = 0;
    return API_NONE;
}

/* The value of request header `name` (lowercase) read so far, or NULL. */
static const char *hdr_get(const conn_t *c, const char *name) {
    const char *h = c->hdrs.data, *end = h ? h + c->hdrs.len : NULL;
    while (h && h < end) {
        const char *v = memchr(h, '\0', (size_t)(end - h));
        if (!v || ++v >= end)
            return NULL;
        const char *next = memchr(v, '\0', (size_t)(end - v));
        if (!next)
            return NULL;
        if (!strcmp(h, name))
            return v;
        h = next + 1;
    }
    return NULL;
}

/* Copies query parameter `name` of url[0..n) (not decoded) into out; "" if absent. */
static void query_get(const char *url, size_t n, const char *name, char *out, size_t outlen) {
    const char *q = memchr(url, '?', n), *end = url + n;
    size_t nlen = strlen(name);
    out[0] = '\0';
    for (q = q ? q + 1 : end; q < end;) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *e = amp ? amp : end;
        if ((size_t)(e - q) > nlen && !memcmp(q, name, nlen) && q[nlen] == '=') {
            size_t len = TG_MIN((size_t)(e - q) - nlen - 1, outlen - 1);
            memcpy(out, q + nlen + 1, len);
            out[len] = '\0';
            return;
        }
        q = e + 1;
    }
}

/* Bedrock's signer: the AWS documentation's example key pair unless --aws-key names
 * another (and a session token the requests must carry). */
static const char *g_aws_id = "AKIDEXAMPLE";
static const char *g_aws_secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
static const char *g_aws_token = "";

/* The value of `key=` in an Authorization header's list, up to ',' (or the end). */
static size_t auth_param(const char *auth, const char *key, const char **v) {
    const char *p = strstr(auth, key);
    if (!p)
        return 0;
    *v = p + strlen(key);
    size_t n = strcspn(*v, ", ");
    return n;
}

/* Verifies the request's Signature Version 4 for real: recomputed from the request as
 * received (the canonical URI of its path, its query, the signed headers' values, the
 * body's hash) with the configured secret. NULL when good, else AWS's 403 message; the
 * access key id goes to akid (the request's credential at the mock). */
static const char *sigv4_check(conn_t *c, const char *method, const char *url, size_t ulen, size_t plen, char *akid,
                               size_t akcap) {
    static __thread char msg[320];
    const char *auth = hdr_get(c, "authorization");
    if (!auth || strncmp(auth, "AWS4-HMAC-SHA256 ", 17) != 0)
        return "mock: Missing Authentication Token (Bedrock takes AWS Signature Version 4)";
    const char *cred = NULL, *sh = NULL, *sg = NULL;
    size_t credn = auth_param(auth, "Credential=", &cred), shn = auth_param(auth, "SignedHeaders=", &sh),
           sgn = auth_param(auth, "Signature=", &sg);
    /* Credential=AKID/YYYYMMDD/region/service/aws4_request */
    char cb[256];
    if (!credn || credn >= sizeof(cb) || !shn || sgn != 64)
        return "mock: Authorization header requires Credential, SignedHeaders and Signature";
    memcpy(cb, cred, credn);
    cb[credn] = '\0';
    char *parts[5], *save = NULL;
    int np = 0;
    for (char *t = strtok_r(cb, "/", &save); t && np < 5; t = strtok_r(NULL, "/", &save))
        parts[np++] = t;
    if (np != 5 || strcmp(parts[4], "aws4_request") != 0)
        return "mock: Credential must be AKID/date/region/service/aws4_request";
    snprintf(akid, akcap, "%s", parts[0]);
    if (strcmp(parts[0], g_aws_id) != 0)
        return "mock: The security token included in the request is invalid.";
    if (strcmp(parts[3], "bedrock") != 0)
        return "mock: Credential should be scoped to correct service: 'bedrock'.";
    const char *date = hdr_get(c, "x-amz-date");
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    if (!date || strlen(date) != 16 ||
        sscanf(date, "%4d%2d%2dT%2d%2d%2dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
               &tm.tm_sec) != 6)
        return "mock: Authorization requires an X-Amz-Date header (YYYYMMDDTHHMMSSZ) in the signature";
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm), now = time(NULL);
    if (t < now - 300 || t > now + 300) {
        char nowd[17], edge[17];
        tg_aws_amz_date(now, nowd);
        tg_aws_amz_date(t < now ? now - 300 : now + 300, edge);
        snprintf(msg, sizeof(msg), "mock: Signature expired: %s is now %s than %s (%s %c 5 min.)", date,
                 t < now ? "earlier" : "later", edge, nowd, t < now ? '-' : '+');
        return msg;
    }
    if (strncmp(parts[1], date, 8) != 0)
        return "mock: Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP";
    const char *tok = hdr_get(c, "x-amz-security-token");
    if (g_aws_token[0] && (!tok || strcmp(tok, g_aws_token) != 0))
        return "mock: The security token included in the request is invalid.";
    /* The signed headers, their values trimmed and inner runs of spaces made one. */
    char names[512];
    if (shn >= sizeof(names))
        return "mock: SignedHeaders too long";
    memcpy(names, sh, shn);
    names[shn] = '\0';
    tg_aws_header_t h[16];
    tg_buf_t vals;
    tg_buf_init(&vals);
    tg_buf_reserve(&vals, 4096);
    size_t offs[16], nh = 0;
    int have_host = 0, have_date = 0, have_tok = 0;
    save = NULL;
    for (char *nm = strtok_r(names, ";", &save); nm && nh < 16; nm = strtok_r(NULL, ";", &save)) {
        const char *v = hdr_get(c, nm);
        if (!v) {
            tg_buf_free(&vals);
            return "mock: The request signature we calculated does not match the signature you provided "
                   "(a signed header is missing)";
        }
        have_host |= !strcmp(nm, "host");
        have_date |= !strcmp(nm, "x-amz-date");
        have_tok |= !strcmp(nm, "x-amz-security-token");
        offs[nh] = vals.len;
        while (*v == ' ' || *v == '\t')
            v++;
        for (int sp = 0; *v; v++) {
            if (*v == ' ' || *v == '\t') {
                sp = 1;
                continue;
            }
            if (sp && vals.len > offs[nh])
                tg_buf_append(&vals, " ", 1);
            sp = 0;
            tg_buf_append(&vals, v, 1);
        }
        tg_buf_append(&vals, "", 1);
        h[nh].name = nm;
        nh++;
    }
    for (size_t i = 0; i < nh; i++)
        h[i].value = vals.data + offs[i];
    if (!have_host || !have_date || (tok && !have_tok)) {
        tg_buf_free(&vals);
        return "mock: The request signature we calculated does not match the signature you provided "
               "(host, x-amz-date and x-amz-security-token must be signed)";
    }
    tg_buf_t uri;
    tg_buf_init(&uri);
    tg_aws_canonical_uri(&uri, url, plen);
    char query[1024];
    snprintf(query, sizeof(query), "%.*s", plen < ulen ? (int)(ulen - plen - 1) : 0, plen < ulen ? url + plen + 1 : "");
    char phash[65], sig[65];
    tg_sha256_hex(c->body.data ? c->body.data : "", c->body.len, phash);
    tg_sigv4_t r = {method, uri.data, query, h, nh, phash, date, parts[2], "bedrock", g_aws_secret};
    tg_sigv4_signature(&r, sig, NULL, NULL);
    tg_buf_free(&uri);
    tg_buf_free(&vals);
    if (CRYPTO_memcmp(sig, sg, 64) != 0)
        return "mock: The request signature we calculated does not match the signature you provided. Check your "
               "AWS Secret Access Key and signing method. Consult the service documentation for details.";
    return NULL;
}

/* Handles the request just read: counts it, then answers it now or arms a timer. */
static void handle_request(conn_t *c) {
    c->r.qhdr[0] = '\0';
    resp_t *r = &c->r;
    if (c->closing)
        return;
    r->raw = 0;
    r->models_pub[0] = '\0';
    c->has_script = 0;
    const char *url = c->url.data ? c->url.data : "/";
    const char *q = memchr(url, '?', c->url.len);
    size_t plen = q ? (size_t)(q - url) : c->url.len;
    if (plen >= 7 && memcmp(url, "/_mock/", 7) == 0) {
        handle_control(c, url, plen);
        return;
    }
    if (c->method == HTTP_POST && tg_mock_id_is_token_path(url, plen)) {
        /* A token endpoint (tg_mock_identity.c): answered at once, not counted. */
        c->scratch.len = 0;
        int st = tg_mock_id_token(url, plen, c->body.data ? c->body.data : "", c->body.len, &c->scratch);
        put_response(c, &c->out, st, -1, c->r.keepalive);
        if (!c->r.keepalive)
            c->want_close = 1;
        return;
    }

    int bad_method, err_status = 0;
    const char *err_msg = NULL;
    int api = route(url, plen, c->method, &bad_method);
    int api_for_errors = api;
    if (api == API_NONE) {
        err_status = 404;
        err_msg = "mock: unknown path";
    } else if (bad_method) {
        err_status = 405;
        err_msg = "mock: method not allowed";
    }

    knobs_t dk, rk, k;
    knobs_clear(&dk);
    int64_t cap = -1;
    size_t in_bytes = 0;
    int stream = 0, include_usage = 0, n_inputs = 1;
    const char *model = NULL;
    size_t model_len = 0;
    json_t *root = NULL;
    if (!err_status && api != API_MODELS) {
        json_error_t jerr;
        root = tg_json_loadb(c->body.data ? c->body.data : "", c->body.len, 0, &jerr);
        if (!json_is_object(root)) {
            err_status = 400;
            err_msg = root ? "mock: request body must be a JSON object" : "mock: malformed JSON body";
        } else {
            static const char *const text_keys[] = {"system", "instructions", "messages", "input"};
            for (size_t i = 0; i < 4; i++)
                in_bytes += text_walk(json_object_get(root, text_keys[i]), &dk, 0);
            static const char *const cap_keys[] = {"max_tokens", "max_completion_tokens", "max_output_tokens"};
            for (size_t i = 0; i < 3; i++) {
                json_t *v = json_object_get(root, cap_keys[i]);
                if (json_is_integer(v) && json_integer_value(v) >= 0 &&
                    (cap < 0 || json_integer_value(v) < cap))
                    cap = json_integer_value(v);
            }
            stream = json_is_true(json_object_get(root, "stream"));
            if (api == API_GEMINI) {
                in_bytes += text_walk(json_object_get(root, "contents"), &dk, 0) +
                            text_walk(json_object_get(root, "systemInstruction"), &dk, 0);
                json_t *mot = json_object_get(json_object_get(root, "generationConfig"), "maxOutputTokens");
                if (json_is_integer(mot) && json_integer_value(mot) >= 0 && (cap < 0 || json_integer_value(mot) < cap))
                    cap = json_integer_value(mot);
            }
            json_t *so = json_object_get(root, "stream_options");
            include_usage = json_is_true(json_object_get(so, "include_usage"));
            json_t *jm = json_object_get(root, "model");
            if (json_is_string(jm)) {
                model = json_string_value(jm);
                model_len = TG_MIN(json_string_length(jm), (size_t)256);
            }
            json_t *in = json_object_get(root, "input");
            if (api == API_EMBEDDINGS && json_is_array(in) && json_array_size(in) > 0 &&
                !json_is_integer(json_array_get(in, 0)))
                n_inputs = (int)TG_MIN(json_array_size(in), (size_t)4096);
        }
    }
    const char *vx_pub, *vx_rest;
    size_t vx_publen, vx_rlen;
    int vertex = route_vertex(url, plen, &vx_pub, &vx_publen, &vx_rest, &vx_rlen);
    if (vertex && api == API_MESSAGES && !err_status) {
        /* Claude on Vertex: the model in the path, none in the body, the version in it. */
        route_vertex_claude(vx_rest, vx_rlen, &model, &model_len, &stream);
        json_error_t jerr;
        json_t *vb = tg_json_loadb(c->body.data ? c->body.data : "", c->body.len, 0, &jerr);
        const char *av = json_string_value(json_object_get(vb, "anthropic_version"));
        if (json_object_get(vb, "model"))
            err_status = 400, err_msg = "mock: model: Extra inputs are not permitted (Vertex: the model is in the URL)";
        else if (!av || strcmp(av, "vertex-2023-10-16") != 0)
            err_status = 400, err_msg = "mock: anthropic_version: must be vertex-2023-10-16 (in the body on Vertex)";
        else if (stream != json_is_true(json_object_get(vb, "stream")))
            err_status = 400, err_msg = "mock: streamRawPredict streams (stream: true), rawPredict does not";
        json_decref(vb);
        model_len = TG_MIN(model_len, (size_t)256);
    }
    if (api == API_GEMINI) {
        /* The model and the method are in the path. */
        const char *gp = vertex ? vx_rest : url;
        size_t gn = vertex ? vx_rlen : plen;
        if (gn >= 8 && memcmp(gp, "/v1beta/", 8) == 0)
            gp += 7, gn -= 7;
        else if (gn >= 4 && memcmp(gp, "/v1/", 4) == 0)
            gp += 3, gn -= 3;
        route_gemini(gp, gn, &model, &model_len, &stream);
        model_len = TG_MIN(model_len, (size_t)256);
    }
    /* Bedrock: the modelId (percent-decoded) and the operation in the path; an
     * InvokeModel body without model and stream, with Bedrock's anthropic_version; the
     * request signed with SigV4. */
    const char *bd_id;
    size_t bd_len;
    int bd_stream = 0;
    char bd_model[257], bd_key[129] = "";
    r->bedrock = route_bedrock(url, plen, &bd_id, &bd_len, &bd_stream);
    if (r->bedrock) {
        stream = bd_stream;
        size_t o = 0;
        for (size_t i = 0; i < bd_len && o < 256; i++) {
            unsigned hx;
            if (bd_id[i] == '%' && i + 2 < bd_len && sscanf(bd_id + i + 1, "%2x", &hx) == 1) {
                bd_model[o++] = (char)hx;
                i += 2;
            } else
                bd_model[o++] = bd_id[i];
        }
        bd_model[o] = '\0';
        model = bd_model;
        model_len = o;
        const char *av = json_string_value(json_object_get(root, "anthropic_version"));
        if (!err_status && json_object_get(root, "model")) {
            err_status = 400;
            err_msg = "mock: extraneous key [model] is not permitted";
        } else if (!err_status && json_object_get(root, "stream")) {
            err_status = 400;
            err_msg = "mock: extraneous key [stream] is not permitted";
        } else if (!err_status && (!av || strcmp(av, "bedrock-2023-05-31") != 0)) {
            err_status = 400;
            err_msg = "mock: anthropic_version: must be bedrock-2023-05-31";
        }
        const char *why = sigv4_check(c, "POST", url, c->url.len, plen, bd_key, sizeof(bd_key));
        if (why && (!err_status || err_status == 400)) { /* AWS checks the signature first */
            err_status = 403;
            err_msg = why;
        }
    }
    /* Bedrock's control plane: ListFoundationModels, a GET signed for service bedrock. */
    int bd_list = api == API_MODELS && ((plen == 18 && !memcmp(url, "/foundation-models", 18)) ||
                                        (plen == 19 && !memcmp(url, "/inference-profiles", 19)));
    if (bd_list) {
        r->bedrock = 1; /* AWS's error shape */
        const char *why = sigv4_check(c, "GET", url, c->url.len, plen, bd_key, sizeof(bd_key));
        if (why && !err_status)
            err_status = 403, err_msg = why;
    }
    c->model.len = 0;
    if (!model) {
        model = api == API_MESSAGES ? "mock-claude" : api == API_EMBEDDINGS ? "mock-embed" : "mock-gpt";
        model_len = strlen(model);
    }
    tg_buf_append_json_escaped(&c->model, model, model_len);
    BUF_LIT(&c->model, ""); /* keeps model.data a NUL-terminated string */
    json_decref(root);

    const char *goog_key = hdr_get(c, "x-goog-api-key");
    /* Azure OpenAI: the deployment is the model; the key in api-key, an api-version. */
    const char *az_dep, *az_rest, *az_key = NULL;
    size_t az_dlen, az_rlen;
    int azure = route_azure(url, plen, &az_dep, &az_dlen, &az_rest, &az_rlen);
    int az_list = api == API_MODELS && plen == 14 && !memcmp(url, "/openai/models", 14);
    if (azure || az_list) {
        char ver[64];
        query_get(url, c->url.len, "api-version", ver, sizeof(ver));
        az_key = hdr_get(c, "api-key");
        if (!err_status && (!az_key || !*az_key) && !c->auth_len) {
            err_status = 401;
            err_msg = "mock: Access denied due to a missing api-key header (Azure OpenAI)";
        } else if (!err_status && !ver[0]) {
            err_status = 404;
            err_msg = "mock: Resource not found (an Azure OpenAI call needs ?api-version=)";
        }
        if (!err_status && azure) {
            c->model.len = 0;
            tg_buf_append_json_escaped(&c->model, az_dep, TG_MIN(az_dlen, (size_t)256));
            BUF_LIT(&c->model, "");
        }
    }
    if (api == API_GEMINI && !vertex && !err_status && (!goog_key || !*goog_key)) {
        err_status = 403;
        err_msg = "mock: Method doesn't allow unregistered callers (send the API key in x-goog-api-key)";
    }
    if (api == API_MODELS) {
        char lim[16];
        r->models_anth = hdr_get(c, "anthropic-version") != NULL;
        r->models_gemini = goog_key != NULL;
        r->models_azure = az_list;
        r->models_bedrock = bd_list ? (plen == 19 ? 2 : 1) : 0;
        const char *pub, *prest;
        size_t publen, prlen;
        if (path_segment(url, plen, "/v1beta1/publishers/", &pub, &publen, &prest, &prlen))
            snprintf(r->models_pub, sizeof(r->models_pub), "%.*s", (int)TG_MIN(publen, (size_t)15), pub);
        char ps[16], pt[256];
        query_get(url, c->url.len, bd_list ? "maxResults" : "pageSize", ps, sizeof(ps));
        r->models_page_size = atoi(ps);
        query_get(url, c->url.len, bd_list ? "nextToken" : "pageToken", pt, sizeof(pt));
        r->models_offset = 0;
        if (pt[0] && (sscanf(pt, "pt%%2F%d%%3D", &r->models_offset) != 1 || r->models_offset < 0) && !err_status) {
            err_status = 400; /* the token as given, percent-encoded: '/' and '=' are not plain */
            err_msg = "mock: pageToken: not a page token this mock gave (or not percent-encoded)";
        }
        query_get(url, c->url.len, "limit", lim, sizeof(lim));
        r->models_limit = lim[0] ? atoi(lim) : 20;
        if (r->models_limit < 1 || r->models_limit > 1000)
            r->models_limit = 20;
        query_get(url, c->url.len, "after_id", r->models_after, sizeof(r->models_after));
        query_get(url, c->url.len, "before_id", r->models_before, sizeof(r->models_before));
    }

    /* The credential: Bearer token, else x-api-key, else "-". */
    const char *cred = "-";
    size_t cred_len = 1;
    if (r->bedrock && bd_key[0]) {
        cred = bd_key; /* the access key id */
        cred_len = strlen(bd_key);
    } else if (c->auth_len > 7 && strncasecmp(c->hdrs.data + c->auth_off, "bearer ", 7) == 0) {
        cred = c->hdrs.data + c->auth_off + 7;
        cred_len = c->auth_len - 7;
        while (cred_len && *cred == ' ')
            cred++, cred_len--;
    } else if (c->key_len) {
        cred = c->hdrs.data + c->key_off;
        cred_len = c->key_len;
    } else if (goog_key && *goog_key) {
        cred = goog_key;
        cred_len = strlen(goog_key);
    } else if (az_key && *az_key) {
        cred = az_key;
        cred_len = strlen(az_key);
    }
    cred_len = TG_MIN(cred_len, (size_t)256);
    if (!err_status && api != API_NONE) {
        /* An access token this mock issued (tg_mock_identity.c) must be live; Vertex
         * takes nothing else. */
        const char *why = tg_mock_id_check(cred, cred_len);
        if (!why && (vertex || r->models_pub[0]) && (cred_len < 3 || memcmp(cred, "mt-", 3) != 0))
            why = "mock: Vertex AI needs an OAuth access token (Authorization: Bearer)";
        if (why)
            err_status = 401, err_msg = why;
    }

    knobs_clear(&rk);
    pthread_mutex_lock(&g_st.mu);
    cred_t *ce = cred_get(cred, cred_len);
    r->cred = ce;
    r->gen = g_st.gen;
    g_st.total++;
    g_st.inflight++;
    g_st.max_inflight = TG_MAX(g_st.max_inflight, g_st.inflight);
    ce->requests++;
    ce->inflight++;
    ce->max_inflight = TG_MAX(ce->max_inflight, ce->inflight);
    int64_t spent_until = quota_step(ce, r);
    int q_style = ce->q_style;
    fault_t **fp = fault_find(cred, cred_len);
    if (!fp)
        fp = fault_find("*", 1);
    if (fp) {
        fault_t *f = *fp;
        rk = f->k;
        c->has_script = f->body != NULL;
        c->script.len = 0;
        if (f->body)
            tg_buf_append(&c->script, f->body, f->body_len);
        if (f->count > 0 && --f->count == 0) {
            *fp = f->next;
            free(f->body);
            free(f);
        }
    }
    tg_buf_t t;
    t = g_st.last_url, g_st.last_url = c->url, c->url = t;
    t = g_st.last_hdrs, g_st.last_hdrs = c->hdrs, c->hdrs = t;
    t = g_st.last_body, g_st.last_body = c->body, c->body = t;
    g_st.last_method = c->method;
    g_st.have_last = 1;
    pthread_mutex_unlock(&g_st.mu);

    static const knobs_t defaults = {{-1, -1, 0, 0, 8, 0, -1, 0, 1, 0, -1, 0, 0, -1, 1}};
    k = defaults;
    knobs_merge(&k, &rk);
    knobs_merge(&k, &c->hk);
    knobs_merge(&k, &dk);

    r->active = 1;
    r->raw = k.v[K_CLOSE_DELIMITED] > 0;
    if (r->raw)
        r->keepalive = 0; /* the body ends when the connection does */
    r->api = api;
    r->k = k;
    r->stream = stream && (api == API_CHAT || api == API_MESSAGES || api == API_RESPONSES || api == API_GEMINI);
    r->include_usage = include_usage;
    r->in_tok = TG_MAX((int64_t)1, (int64_t)((in_bytes + 3) / 4));
    r->out_n = TG_MIN(k.v[K_CHUNKS], 100000);
    if (cap >= 0 && cap < r->out_n)
        r->out_n = (int)cap;
    r->sent = r->seq = 0;
    r->n_inputs = n_inputs;
    r->id = atomic_fetch_add(&g_next_id, 1) + 1;
    r->created = (long long)time(NULL);

    if (k.v[K_HANG] > 0)
        return; /* in flight until the client leaves */
    int status = k.v[K_STATUS];
    int retry_after = k.v[K_RETRY_AFTER];
    tg_buf_t *dst = k.v[K_DELAY_MS] > 0 ? &c->held : &c->out;
    c->held.len = 0;
    r->whole = 1;
    if (spent_until && !err_status) {
        /* The credential's window is spent: its provider's 429 until the reset. */
        render_spent(c, q_style, spent_until);
        put_response(c, dst, 429, (int)((spent_until - (int64_t)tg_wall_ms() + 999) / 1000), r->keepalive);
    } else if (err_status || (status >= 100 && status <= 599 && status != 200)) {
        if (!err_status) {
            err_status = status;
            err_msg = "mock: injected error status (knob status)";
            if ((status == 429 || status == 529) && retry_after < 0)
                retry_after = 1;
        } else
            retry_after = -1;
        render_error(c, api_for_errors, err_status, err_msg);
        put_response(c, dst, err_status, retry_after, r->keepalive);
    } else if (c->has_script) {
        /* The scripted body as it is: an event stream when the request streams. */
        tg_buf_printf(dst, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\n",
                      r->stream ? "text/event-stream" : "application/json");
        if (!r->keepalive)
            BUF_LIT(dst, "Connection: close\r\n");
        if (r->raw) {
            BUF_LIT(dst, "\r\n");
            tg_buf_append(dst, c->script.data, c->script.len);
        } else if (r->stream) {
            tg_buf_printf(dst, "Transfer-Encoding: chunked\r\n\r\n%zx\r\n", c->script.len);
            tg_buf_append(dst, c->script.data, c->script.len);
            BUF_LIT(dst, "\r\n0\r\n\r\n");
        } else {
            tg_buf_printf(dst, "Content-Length: %zu\r\n\r\n", c->script.len);
            tg_buf_append(dst, c->script.data, c->script.len);
        }
    } else if (!r->stream) {
        switch (api) {
        case API_CHAT: render_chat(c); break;
        case API_MESSAGES: render_message(c); break;
        case API_RESPONSES: render_response_obj(c, &c->scratch, 1); break;
        case API_EMBEDDINGS: render_embeddings(c); break;
        case API_GEMINI: render_gemini(c); break;
        default: render_models(c); break;
        }
        put_response(c, dst, 200, -1, r->keepalive);
    } else
        r->whole = 0;
    if (k.v[K_DELAY_MS] > 0)
        uv_timer_start(&c->timer, delay_cb, (uint64_t)k.v[K_DELAY_MS], 0);
    else
        resp_begin(c);
}

/* The request is answered: let the next pipelined one through, or close. */
static void resp_finished(conn_t *c) {
    req_done(c, 0);
    if (!c->r.keepalive)
        c->want_close = 1;
    if (!c->busy || c->closing)
        return; /* answered inside on_message_complete; the read path continues */
    c->busy = 0;
    if (c->want_close) {
        conn_after_io(c);
        return;
    }
    llhttp_resume(&c->parser);
    if (c->pending.len) {
        tg_buf_t t = c->spare;
        c->spare = c->pending;
        c->pending = t;
        conn_feed(c, c->spare.data, c->spare.len);
        c->spare.len = 0;
    }
    conn_after_io(c);
    if (c->read_stopped && !c->closing && !c->busy) {
        c->read_stopped = 0;
        if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) < 0)
            conn_close(c);
    }
}

/* ---- llhttp callbacks ----------------------------------------------------------- */

static int on_message_begin(llhttp_t *p) {
    conn_t *c = p->data;
    c->url.len = c->hdrs.len = c->body.len = 0;
    c->hname_off = c->hval_off = 0;
    c->auth_len = c->key_len = 0;
    c->err_status = c->expect_continue = 0;
    knobs_clear(&c->hk);
    return 0;
}

static int head_append(conn_t *c, tg_buf_t *b, const char *at, size_t n, int lower) {
    if (c->url.len + c->hdrs.len + n > MOCK_MAX_HEAD) {
        c->err_status = 431;
        return -1;
    }
    size_t off = b->len;
    tg_buf_append(b, at, n);
    if (lower)
        for (size_t i = off; i < b->len; i++)
            if (b->data[i] >= 'A' && b->data[i] <= 'Z')
                b->data[i] |= 0x20;
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    return head_append(c, &c->url, at, n, 0);
}

static int on_header_field(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    return head_append(c, &c->hdrs, at, n, 1);
}

static int on_header_value(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    return head_append(c, &c->hdrs, at, n, 0);
}

static int on_header_field_complete(llhttp_t *p) {
    conn_t *c = p->data;
    tg_buf_append(&c->hdrs, "", 1);
    c->hval_off = c->hdrs.len;
    return 0;
}

static int on_header_value_complete(llhttp_t *p) {
    conn_t *c = p->data;
    tg_buf_t *h = &c->hdrs;
    while (h->len > c->hval_off && (h->data[h->len - 1] == ' ' || h->data[h->len - 1] == '\t'))
        h->len--;
    tg_buf_append(h, "", 1);
    const char *name = h->data + c->hname_off, *val = h->data + c->hval_off;
    size_t nlen = c->hval_off - c->hname_off - 1, vlen = h->len - 1 - c->hval_off;
    if (nlen == 13 && memcmp(name, "authorization", 13) == 0)
        c->auth_off = c->hval_off, c->auth_len = vlen;
    else if (nlen == 9 && memcmp(name, "x-api-key", 9) == 0)
        c->key_off = c->hval_off, c->key_len = vlen;
    else if (nlen == 6 && memcmp(name, "expect", 6) == 0 && vlen == 12 && strncasecmp(val, "100-continue", 12) == 0)
        c->expect_continue = 1;
    else if (nlen > 7 && memcmp(name, "x-mock-", 7) == 0)
        knob_set(&c->hk, name + 7, nlen - 7, val, vlen);
    c->hname_off = h->len;
    return 0;
}

static int on_headers_complete(llhttp_t *p) {
    conn_t *c = p->data;
    c->method = llhttp_get_method(p);
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > MOCK_MAX_BODY) {
        c->err_status = 413;
        return -1;
    }
    if (c->expect_continue) {
        BUF_LIT(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
        conn_flush(c);
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n) {
    conn_t *c = p->data;
    if (c->body.len + n > MOCK_MAX_BODY) {
        c->err_status = 413;
        return -1;
    }
    tg_buf_append(&c->body, at, n);
    return 0;
}

static int on_message_complete(llhttp_t *p) {
    conn_t *c = p->data;
    c->r.keepalive = llhttp_should_keep_alive(p);
    handle_request(c);
    if (c->r.active)
        c->busy = 1;
    return c->busy || c->want_close || c->closing ? HPE_PAUSED : 0;
}

/* ---- reading -------------------------------------------------------------------- */

static void conn_feed(conn_t *c, const char *data, size_t len) {
    if (c->want_close || c->closing)
        return;
    llhttp_errno_t e = llhttp_execute(&c->parser, data, len);
    if (e == HPE_OK)
        return;
    if (e == HPE_PAUSED) {
        if (c->busy && !c->want_close && !c->closing) {
            const char *pos = llhttp_get_error_pos(&c->parser);
            tg_buf_append(&c->pending, pos, (size_t)(data + len - pos));
        }
        return;
    }
    if (c->closing)
        return;
    /* A malformed request or a limit hit: answer and close. */
    int status = c->err_status ? c->err_status : 400;
    render_error(c, API_NONE, status,
                 status == 413   ? "mock: request body larger than 8 MiB"
                 : status == 431 ? "mock: request head too large"
                                 : llhttp_get_error_reason(&c->parser));
    put_response(c, &c->out, status, -1, 0);
    c->want_close = 1;
    c->draining = 1; /* keep reading until the client closes, so it sees the answer */
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    conn_t *c = h->data;
    *buf = uv_buf_init(c->w->rbuf, sizeof(c->w->rbuf));
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    conn_t *c = s->data;
    if (nread < 0) {
        conn_close(c); /* EOF or error: the client is gone */
        return;
    }
    if (nread == 0 || c->closing || c->want_close)
        return;
    if (c->busy) {
        tg_buf_append(&c->pending, buf->base, (size_t)nread);
        if (c->pending.len > MOCK_MAX_PENDING) {
            uv_read_stop(s);
            c->read_stopped = 1;
        }
        return;
    }
    conn_feed(c, buf->base, (size_t)nread);
    conn_after_io(c);
}

static const llhttp_settings_t g_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_field_complete = on_header_field_complete,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static void on_connection(uv_stream_t *server, int status) {
    worker_t *w = server->data;
    if (status < 0)
        return;
    conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        abort();
    c->w = w;
    uv_tcp_init(&w->loop, &c->tcp);
    uv_timer_init(&w->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    llhttp_init(&c->parser, HTTP_REQUEST, &g_settings);
    c->parser.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) < 0)
        conn_close(c);
}

/* ---- process -------------------------------------------------------------------- */

static worker_t *g_workers;
static int g_nworkers;

static void stop_cb(uv_async_t *a) {
    worker_t *w = a->data;
    if (w->stopping)
        return;
    w->stopping = 1;
    uv_close((uv_handle_t *)&w->listener, NULL);
    uv_close((uv_handle_t *)&w->stop, NULL);
    if (w->has_signals) {
        uv_close((uv_handle_t *)&w->sigterm, NULL);
        uv_close((uv_handle_t *)&w->sigint, NULL);
    }
    for (conn_t *c = w->conns; c; c = c->next)
        conn_close(c);
}

static void signal_cb(uv_signal_t *s, int signum) {
    for (int i = 0; i < g_nworkers; i++)
        uv_async_send(&g_workers[i].stop);
}

static void *worker_run(void *arg) {
    worker_t *w = arg;
    uv_run(&w->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* Binds a listening socket of worker w (SO_REUSEPORT when there are several). */
static int worker_listen(worker_t *w, const struct sockaddr *sa, socklen_t salen, int reuseport) {
    int one = 1, fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if ((reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0) ||
        bind(fd, sa, salen) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    int err = uv_tcp_open(&w->listener, fd);
    if (err) {
        close(fd); /* not owned by the handle yet */
        return err;
    }
    return uv_listen((uv_stream_t *)&w->listener, 4096, on_connection);
}

/* Closes every handle of the first n workers, runs their loops dry and frees them. */
static int workers_close(int n, int rc) {
    for (int i = 0; i < n; i++) {
        stop_cb(&g_workers[i].stop);
        uv_run(&g_workers[i].loop, UV_RUN_DEFAULT);
        uv_loop_close(&g_workers[i].loop);
    }
    free(g_workers);
    g_workers = NULL;
    pthread_mutex_lock(&g_st.mu);
    state_clear_locked();
    tg_buf_free(&g_st.last_url);
    tg_buf_free(&g_st.last_hdrs);
    tg_buf_free(&g_st.last_body);
    pthread_mutex_unlock(&g_st.mu);
    return rc;
}

static int usage_error(const char *msg) {
    fprintf(stderr, "mock-upstream: %s\nusage: tollgate mock-upstream --listen HOST:PORT [--threads N] "
                    "[--models id,id,...] [--aws-key ID:SECRET[:TOKEN]]\n",
            msg);
    return 2;
}

int tg_mock_main(int argc, char **argv) {
    const char *listen_arg = NULL;
    int threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage_error("a fast, deterministic fake OpenAI/Anthropic provider (knobs: see tg_mock.c)");
            return 0;
        }
        if (i + 1 >= argc)
            return usage_error("missing value after an option");
        if (strcmp(a, "--listen") == 0)
            listen_arg = argv[++i];
        else if (strcmp(a, "--threads") == 0) {
            threads = atoi(argv[++i]);
            if (threads < 1 || threads > MOCK_MAX_THREADS)
                return usage_error("--threads must be 1..64");
        } else if (strcmp(a, "--models") == 0)
            g_models = argv[++i];
        else if (strcmp(a, "--aws-key") == 0) {
            /* ID:SECRET[:SESSION_TOKEN], the key pair Bedrock requests are verified with */
            char *v = argv[++i], *c1 = strchr(v, ':');
            if (!c1 || c1 == v || !c1[1])
                return usage_error("--aws-key wants ACCESS_KEY_ID:SECRET[:SESSION_TOKEN]");
            *c1 = '\0';
            char *c2 = strchr(c1 + 1, ':');
            if (c2) {
                *c2 = '\0';
                g_aws_token = c2 + 1;
            }
            g_aws_id = v;
            g_aws_secret = c1 + 1;
        }
        else
            return usage_error("unknown option");
    }
    if (!listen_arg)
        return usage_error("--listen HOST:PORT is required");
    const char *colon = strrchr(listen_arg, ':');
    int hlen = colon ? (int)(colon - listen_arg) : 0;
    char host[256];
    if (hlen <= 0 || hlen >= (int)sizeof(host) || !colon[1])
        return usage_error("--listen wants HOST:PORT");
    if (listen_arg[0] == '[' && listen_arg[hlen - 1] == ']') /* [::1]:8080 */
        snprintf(host, sizeof(host), "%.*s", hlen - 2, listen_arg + 1);
    else
        snprintf(host, sizeof(host), "%.*s", hlen, listen_arg);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, colon + 1, &hints, &ai);
    if (gai != 0) {
        fprintf(stderr, "mock-upstream: cannot resolve %s: %s\n", listen_arg, gai_strerror(gai));
        return 2;
    }
    struct sockaddr_storage ss;
    socklen_t sslen = ai->ai_addrlen;
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);

    signal(SIGPIPE, SIG_IGN);
    json_object_seed(0);
    g_workers = calloc((size_t)threads, sizeof(worker_t));
    if (!g_workers)
        abort();
    g_nworkers = threads;
    int port = 0;
    for (int i = 0; i < threads; i++) {
        worker_t *w = &g_workers[i];
        w->index = i;
        uv_loop_init(&w->loop);
        uv_tcp_init(&w->loop, &w->listener);
        uv_async_init(&w->loop, &w->stop, stop_cb);
        w->listener.data = w->stop.data = w;
        int err = worker_listen(w, (struct sockaddr *)&ss, sslen, threads > 1);
        if (err) {
            fprintf(stderr, "mock-upstream: cannot listen on %s: %s\n", listen_arg, uv_strerror(err));
            return workers_close(i + 1, 1);
        }
        if (i == 0) { /* port 0: every thread takes the port the kernel gave the first */
            struct sockaddr_storage got;
            int glen = sizeof(got);
            uv_tcp_getsockname(&w->listener, (struct sockaddr *)&got, &glen);
            in_port_t *pp = got.ss_family == AF_INET6 ? &((struct sockaddr_in6 *)&got)->sin6_port
                                                      : &((struct sockaddr_in *)&got)->sin_port;
            port = ntohs(*pp);
            *(ss.ss_family == AF_INET6 ? &((struct sockaddr_in6 *)&ss)->sin6_port
                                       : &((struct sockaddr_in *)&ss)->sin_port) = *pp;
        }
    }
    worker_t *w0 = &g_workers[0];
    uv_signal_init(&w0->loop, &w0->sigterm);
    uv_signal_init(&w0->loop, &w0->sigint);
    uv_signal_start(&w0->sigterm, signal_cb, SIGTERM);
    uv_signal_start(&w0->sigint, signal_cb, SIGINT);
    w0->has_signals = 1;

    fprintf(stderr, "mock-upstream listening on %.*s:%d\n", hlen, listen_arg, port);
    for (int i = 1; i < threads; i++)
        if (pthread_create(&g_workers[i].thread, NULL, worker_run, &g_workers[i]) != 0)
            abort();
    worker_run(w0);
    for (int i = 1; i < threads; i++)
        pthread_join(g_workers[i].thread, NULL);
    return workers_close(threads, 0);
}
