/*
 * AWS for Bedrock accounts (issue #19, item 3; `tg_unit providers`): Signature Version 4
 * against AWS's published examples (the IAM ListUsers request of "Create a signed AWS
 * API request", and get-vanilla / post-vanilla of the SigV4 test suite), a Bedrock
 * runtime request signed as an independent implementation signs it, the event-stream
 * framing (CRC32, a message encoded by an independent encoder, both CRCs checked, any
 * split of the input), and the Bedrock stream's events.
 */
#include "tollgate/tg_aws.h"

#include <string.h>

#include "tg_test.h"

static const char SECRET[] = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
static const char EMPTY_HASH[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

TG_TEST(providers, sigv4_aws_examples) {
    /* "Create a signed AWS API request": GET iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08. */
    tg_aws_header_t h[3] = {{"content-type", "application/x-www-form-urlencoded; charset=utf-8"},
                            {"host", "iam.amazonaws.com"},
                            {"x-amz-date", "20150830T123600Z"}};
    tg_sigv4_t r = {"GET", "/", "Action=ListUsers&Version=2010-05-08", h, 3, EMPTY_HASH, "20150830T123600Z",
                    "us-east-1", "iam", SECRET};
    char sig[65];
    tg_buf_t cr, sts;
    tg_buf_init(&cr);
    tg_buf_init(&sts);
    tg_sigv4_signature(&r, sig, &cr, &sts);
    ASSERT_MEM(sts.data, sts.len,
               "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/iam/aws4_request\n"
               "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59");
    ASSERT_EQ_STR(sig, "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7");
    tg_buf_t auth;
    tg_buf_init(&auth);
    tg_sigv4_authorization(&auth, &r, "AKIDEXAMPLE", sig);
    ASSERT_EQ_STR(auth.data, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, "
                             "SignedHeaders=content-type;host;x-amz-date, "
                             "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7");
    tg_buf_free(&auth);
    tg_buf_free(&cr);
    tg_buf_free(&sts);

    /* The SigV4 test suite's get-vanilla and post-vanilla (service "service"). */
    tg_aws_header_t v[2] = {{"host", "example.amazonaws.com"}, {"x-amz-date", "20150830T123600Z"}};
    tg_sigv4_t g = {"GET", "/", "", v, 2, EMPTY_HASH, "20150830T123600Z", "us-east-1", "service", SECRET};
    tg_sigv4_signature(&g, sig, NULL, NULL);
    ASSERT_EQ_STR(sig, "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
    g.method = "POST";
    tg_sigv4_signature(&g, sig, NULL, NULL);
    ASSERT_EQ_STR(sig, "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
}

TG_TEST(providers, bedrock_request_signed) {
    tg_buf_t b;
    tg_buf_init(&b);
    tg_bedrock_path(&b, "anthropic.claude-3-haiku-20240307-v1:0", 0);
    ASSERT_EQ_STR(b.data, "/model/anthropic.claude-3-haiku-20240307-v1%3A0/invoke");
    tg_buf_t uri;
    tg_buf_init(&uri);
    tg_aws_canonical_uri(&uri, b.data, b.len); /* encoded once more, as every service but S3 */
    ASSERT_EQ_STR(uri.data, "/model/anthropic.claude-3-haiku-20240307-v1%253A0/invoke");
    tg_buf_reset(&b);
    tg_bedrock_path(&b, "arn:aws:bedrock:us-east-1:1:inference-profile/x y", 1);
    ASSERT_EQ_STR(b.data, "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fx%20y/"
                          "invoke-with-response-stream");

    /* Signed as an independent implementation (Python's hmac/hashlib) signs it. */
    const char body[] = "{\"anthropic_version\":\"bedrock-2023-05-31\",\"max_tokens\":10,\"messages\":[{\"role\":"
                        "\"user\",\"content\":\"hi\"}]}";
    tg_aws_creds_t c;
    tg_aws_creds_split("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY:TOKEN/abc+=", &c);
    ASSERT_EQ_INT(c.secret_len, 40);
    ASSERT_EQ_STR(c.token, "TOKEN/abc+=");
    c.region = "us-east-1";
    c.access_key = "AKIDEXAMPLE";
    tg_buf_t head;
    tg_buf_init(&head);
    tg_bedrock_sign(&head, &c, "bedrock-runtime.us-east-1.amazonaws.com",
                    "/model/anthropic.claude-3-haiku-20240307-v1%3A0/invoke", body, sizeof(body) - 1, 1440938160);
    ASSERT_EQ_STR(head.data, "\r\nX-Amz-Date: 20150830T123600Z\r\nX-Amz-Security-Token: TOKEN/abc+=\r\n"
                             "Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/bedrock/"
                             "aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, "
                             "Signature=16f11861ddcd9776cfce255b3c0b46efe3b293e06091e9fd5851be317c3079ab");
    tg_aws_creds_split("justsecret", &c);
    ASSERT(c.token == NULL);
    ASSERT_EQ_INT(c.secret_len, 10);
    tg_buf_free(&head);
    tg_buf_free(&uri);
    tg_buf_free(&b);

    /* The InvokeModel body: no model, no stream, the Bedrock anthropic_version. */
    json_t *doc = json_loads("{\"model\":\"m\",\"stream\":true,\"max_tokens\":5,\"messages\":[]}", 0, NULL);
    char *out = tg_bedrock_body(doc);
    ASSERT_EQ_STR(out, "{\"max_tokens\":5,\"messages\":[],\"anthropic_version\":\"bedrock-2023-05-31\"}");
    ASSERT(json_object_get(doc, "model") != NULL); /* the client's tree is left alone */
    free(out);
    json_decref(doc);

    json_t *s = json_loads("{\"region\":\"us-east-1\",\"access_key_id\":\"AKIDEXAMPLE\"}", 0, NULL);
    ASSERT(tg_bedrock_check(s) == NULL);
    json_object_set_new(s, "region", json_string("us east"));
    ASSERT(tg_bedrock_check(s) != NULL);
    json_object_set_new(s, "region", json_string("eu-west-1"));
    json_object_del(s, "access_key_id");
    ASSERT(strstr(tg_bedrock_check(s), "access_key_id"));
    json_decref(s);
}

/* A chunk message encoded by an independent encoder (Python's zlib.crc32 and struct):
 * :event-type chunk, :content-type application/json, :message-type event, payload
 * {"bytes":"<base64 of {"type":"ping"}>"}. */
static const unsigned char PING[] =
    "\x00\x00\x00\x7b\x00\x00\x00\x4b\x0a\x2e\x96\xaf\x0b\x3a\x65\x76\x65\x6e\x74\x2d\x74\x79\x70\x65\x07\x00\x05"
    "\x63\x68\x75\x6e\x6b\x0d\x3a\x63\x6f\x6e\x74\x65\x6e\x74\x2d\x74\x79\x70\x65\x07\x00\x10\x61\x70\x70\x6c\x69"
    "\x63\x61\x74\x69\x6f\x6e\x2f\x6a\x73\x6f\x6e\x0d\x3a\x6d\x65\x73\x73\x61\x67\x65\x2d\x74\x79\x70\x65\x07\x00"
    "\x05\x65\x76\x65\x6e\x74\x7b\x22\x62\x79\x74\x65\x73\x22\x3a\x22\x65\x79\x4a\x30\x65\x58\x42\x6c\x49\x6a\x6f"
    "\x69\x63\x47\x6c\x75\x5a\x79\x4a\x39\x22\x7d\xa0\x1f\x56\xc4";

typedef struct {
    tg_buf_t out;
    int n;
} events_t;

static void collect(void *ud, const char *event, size_t elen, const char *data, size_t dlen) {
    events_t *e = ud;
    e->n++;
    tg_buf_appends(&e->out, "event: ");
    tg_buf_append(&e->out, event, elen);
    tg_buf_appends(&e->out, "\ndata: ");
    tg_buf_append(&e->out, data, dlen);
    tg_buf_appends(&e->out, "\n\n");
}

static events_t run(const void *data, size_t n, size_t cut_every) {
    events_t e = {{0}, 0};
    tg_buf_init(&e.out);
    tg_bedrock_stream_t s;
    tg_bedrock_stream_init(&s, 1 << 16, collect, &e);
    const char *p = data;
    for (size_t at = 0; at < n; at += cut_every)
        tg_bedrock_stream_feed(&s, p + at, TG_MIN(cut_every, n - at));
    tg_bedrock_stream_free(&s);
    return e;
}

TG_TEST(providers, aws_eventstream) {
    ASSERT_EQ_INT(tg_crc32(0, "123456789", 9), 0xCBF43926u);
    size_t n = sizeof(PING) - 1;
    /* Our encoder writes exactly the independent encoder's bytes. */
    const char *names[] = {":event-type", ":content-type", ":message-type"};
    const char *values[] = {"chunk", "application/json", "event"};
    const char payload[] = "{\"bytes\":\"eyJ0eXBlIjoicGluZyJ9\"}";
    tg_buf_t enc;
    tg_buf_init(&enc);
    tg_es_encode(&enc, names, values, 3, payload, sizeof(payload) - 1);
    ASSERT(enc.len == n && !memcmp(enc.data, PING, n));

    /* Three messages in one input, and the same input cut at every size. */
    tg_buf_t three;
    tg_buf_init(&three);
    for (int i = 0; i < 3; i++)
        tg_buf_append(&three, PING, n);
    for (size_t every = 1; every <= three.len; every++) {
        events_t e = run(three.data, three.len, every);
        ASSERT_EQ_INT(e.n, 3);
        ASSERT_EQ_STR(e.out.data, "event: ping\ndata: {\"type\":\"ping\"}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n"
                                  "event: ping\ndata: {\"type\":\"ping\"}\n\n");
        tg_buf_free(&e.out);
    }

    /* A flipped bit in the prelude, the headers or the payload, or the message CRC: an
     * Anthropic error event, and nothing after it. */
    size_t flips[] = {2, 9, 20, 100, n - 1};
    for (size_t f = 0; f < sizeof(flips) / sizeof(flips[0]); f++) {
        tg_buf_t bad;
        tg_buf_init(&bad);
        tg_buf_append(&bad, three.data, three.len);
        bad.data[n + flips[f]] ^= 0x10;
        events_t e = run(bad.data, bad.len, 7);
        ASSERT_EQ_INT(e.n, 2);
        ASSERT(strstr(e.out.data, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\","
                                  "\"message\":\"Bedrock: the event stream is corrupt: "));
        ASSERT(strstr(e.out.data, flips[f] < 12 ? "prelude CRC mismatch" : "message CRC mismatch"));
        tg_buf_free(&e.out);
        tg_buf_free(&bad);
    }

    /* A message longer than allowed is refused from its prelude, before it is read. */
    tg_buf_t big;
    tg_buf_init(&big);
    tg_buf_t pay;
    tg_buf_init(&pay);
    for (int i = 0; i < 70000; i++)
        tg_buf_append(&pay, "x", 1);
    tg_es_encode(&big, names, values, 3, pay.data, pay.len);
    events_t e = run(big.data, 12, 12);
    ASSERT_EQ_INT(e.n, 1);
    ASSERT(strstr(e.out.data, "longer than allowed"));
    tg_buf_free(&e.out);
    tg_buf_free(&big);
    tg_buf_free(&pay);

    /* An exception message: an Anthropic error of the matching type, with AWS's words. */
    const char *xn[] = {":exception-type", ":content-type", ":message-type"};
    const char *xv[] = {"throttlingException", "application/json", "exception"};
    tg_buf_t x;
    tg_buf_init(&x);
    tg_buf_append(&x, PING, n);
    const char msg[] = "{\"message\":\"Too many requests, please wait before trying again.\"}";
    tg_es_encode(&x, xn, xv, 3, msg, sizeof(msg) - 1);
    tg_buf_append(&x, PING, n); /* nothing after the error */
    e = run(x.data, x.len, 5);
    ASSERT_EQ_INT(e.n, 2);
    ASSERT(strstr(e.out.data, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\","
                              "\"message\":\"Bedrock: throttlingException: Too many requests, please wait before "
                              "trying again.\"}}\n\n"));
    tg_buf_free(&e.out);
    tg_buf_free(&x);

    /* Base64 with its slashes escaped as JSON allows ("\/"), and a chunk that is not
     * base64 of an event. */
    tg_buf_t sl;
    tg_buf_init(&sl);
    const char esc[] = "{\"bytes\":\"eyJ0eXBlIjoicGluZyIsInEiOiI\\/Pz8ifQ==\"}";
    tg_es_encode(&sl, names, values, 3, esc, sizeof(esc) - 1);
    const char junk[] = "{\"bytes\":\"!!!!\"}";
    tg_es_encode(&sl, names, values, 3, junk, sizeof(junk) - 1);
    e = run(sl.data, sl.len, 3);
    ASSERT_EQ_INT(e.n, 2);
    ASSERT(strstr(e.out.data, "event: ping\ndata: {\"type\":\"ping\",\"q\":\"???\"}\n\n"));
    ASSERT(strstr(e.out.data, "not an Anthropic stream event"));
    tg_buf_free(&e.out);
    tg_buf_free(&sl);

    /* An Anthropic error event the upstream's chunk carries ends the stream too. */
    tg_buf_t ae;
    tg_buf_init(&ae);
    const char aerr[] = "{\"bytes\":\"eyJ0eXBlIjoiZXJyb3IiLCJlcnJvciI6eyJ0eXBlIjoib3ZlcmxvYWRlZF9lcnJvciIsIm1lc3NhZ2UiOiJP"
                        "dmVybG9hZGVkIn19\"}";
    tg_es_encode(&ae, names, values, 3, aerr, sizeof(aerr) - 1);
    tg_buf_append(&ae, PING, n);
    e = run(ae.data, ae.len, 9);
    ASSERT_EQ_INT(e.n, 1);
    ASSERT(strstr(e.out.data, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\""));
    tg_buf_free(&e.out);
    tg_buf_free(&ae);
    tg_buf_free(&three);
    tg_buf_free(&enc);
}

TG_TEST(providers, bedrock_metrics_usage) {
    const char stop[] = "{\"type\":\"message_stop\",\"amazon-bedrock-invocationMetrics\":{\"inputTokenCount\":12,"
                        "\"outputTokenCount\":7,\"invocationLatency\":100,\"firstByteLatency\":20}}";
    /* The events said nothing: the metrics are the usage. */
    tg_usage_t u = {0};
    ASSERT_EQ_INT(tg_bedrock_metrics_usage(&u, stop, sizeof(stop) - 1), 1);
    ASSERT_EQ_INT(u.input, 12);
    ASSERT_EQ_INT(u.output, 7);
    ASSERT_EQ_INT(u.known, TG_USAGE_INPUT | TG_USAGE_OUTPUT);
    /* The events' own counts win. */
    tg_usage_t w = {0};
    w.input = 10;
    w.output = 5;
    w.known = TG_USAGE_INPUT | TG_USAGE_OUTPUT;
    ASSERT_EQ_INT(tg_bedrock_metrics_usage(&w, stop, sizeof(stop) - 1), 0);
    ASSERT_EQ_INT(w.input, 10);
    ASSERT_EQ_INT(w.output, 5);
    ASSERT_EQ_INT(tg_bedrock_metrics_usage(&w, "{\"type\":\"ping\"}", 15), 0);
}

TG_TEST(providers, sigv4_get_signed) {
    /* tg_aws_sign_get: the SigV4 test suite's get-vanilla (its published signature), and
     * Bedrock's ListInferenceProfiles with a query and a session token as an independent
     * implementation (Python's hmac/hashlib) signs it. */
    tg_aws_creds_t c;
    tg_aws_creds_split(SECRET, &c);
    c.region = "us-east-1";
    c.access_key = "AKIDEXAMPLE";
    tg_buf_t head;
    tg_buf_init(&head);
    tg_aws_sign_get(&head, &c, "service", "example.amazonaws.com", "/", "", 1440938160);
    ASSERT_EQ_STR(head.data, "\r\nX-Amz-Date: 20150830T123600Z\r\nAuthorization: AWS4-HMAC-SHA256 "
                             "Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
                             "SignedHeaders=host;x-amz-date, "
                             "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
    tg_buf_reset(&head);
    tg_aws_creds_split("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY:TOKEN/abc+=", &c);
    c.region = "us-east-1";
    c.access_key = "AKIDEXAMPLE";
    tg_aws_sign_get(&head, &c, "bedrock", "bedrock.us-east-1.amazonaws.com",
                    "/inference-profiles?maxResults=1000&nextToken=pt%2F5%3D", "maxResults=1000&nextToken=pt%2F5%3D",
                    1440938160);
    ASSERT_EQ_STR(head.data, "\r\nX-Amz-Date: 20150830T123600Z\r\nX-Amz-Security-Token: TOKEN/abc+=\r\nAuthorization: "
                             "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/bedrock/aws4_request, "
                             "SignedHeaders=host;x-amz-date;x-amz-security-token, "
                             "Signature=cd5baba5ea07f19bb968970d11b29b040c43aadc2039f68cd3862d438f1af71a");
    tg_buf_free(&head);
}
