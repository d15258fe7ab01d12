/*
 * AWS wire formats for Bedrock accounts (issue #19), pure functions over bytes:
 *
 *   - Signature Version 4 (HMAC-SHA256 with OpenSSL): the canonical request, the string
 *     to sign, the derived signing key and the Authorization header, as AWS's
 *     "Create a signed AWS API request" documents them;
 *   - the AWS event-stream binary framing (application/vnd.amazon.eventstream), decoded
 *     incrementally: prelude (total length, headers length, prelude CRC32), headers,
 *     payload, message CRC32; both CRCs verified; only the message being read is kept;
 *   - Bedrock's InvokeModel / InvokeModelWithResponseStream for Anthropic models: the
 *     request's path and body (the Messages body without model and stream, with
 *     anthropic_version "bedrock-2023-05-31"), the stream's `chunk` events turned back
 *     into Anthropic stream events (each payload {"bytes": base64 of one event}) and its
 *     exception messages into Anthropic `error` events.
 */
#ifndef TOLLGATE_TG_AWS_H
#define TOLLGATE_TG_AWS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_usage.h"

/** CRC-32 (IEEE 802.3, reflected, the one zlib's crc32 computes): crc of the bytes so
 *  far (0 to start). */
uint32_t tg_crc32(uint32_t crc, const void *data, size_t n);

/* ---- Signature Version 4 ------------------------------------------------------------ */

/** The lowercase hex SHA-256 of the bytes (a payload hash), with SHA-256 fetched once. */
void tg_aws_sha256_hex(const void *data, size_t n, char out[65]);

/** Appends s URI-encoded as SigV4 wants it: A-Z a-z 0-9 - _ . ~ as they are, every other
 *  byte %XX (uppercase hex); '/' kept when keep_slash. */
void tg_aws_uri_encode(tg_buf_t *b, const char *s, size_t n, int keep_slash);

/** One header of the canonical request: its name lowercase, its value trimmed. */
typedef struct {
    const char *name;
    const char *value;
} tg_aws_header_t;

/** What a signature covers. headers are sorted by name (the caller's order is used). */
typedef struct {
    const char *method;
    const char *canon_uri;   /* already canonical (see tg_aws_canonical_uri) */
    const char *canon_query; /* already canonical ("" none) */
    const tg_aws_header_t *headers;
    size_t nheaders;
    const char *payload_hash; /* hex SHA-256 of the body */
    const char *amz_date;     /* YYYYMMDD'T'HHMMSS'Z' */
    const char *region;
    const char *service;
    const char *secret;       /* the secret access key */
} tg_sigv4_t;

/** The canonical URI of a request path for every service but S3: each segment
 *  URI-encoded once more (so a %3A the path carries becomes %253A). */
void tg_aws_canonical_uri(tg_buf_t *b, const char *path, size_t n);

/** The signature (64 hex digits and a NUL). When canonical / to_sign are given, the
 *  canonical request and the string to sign are appended to them (tests, the mock's
 *  403 message). */
void tg_sigv4_signature(const tg_sigv4_t *r, char sig[65], tg_buf_t *canonical, tg_buf_t *to_sign);

/** Appends the Authorization header's value for this signature. */
void tg_sigv4_authorization(tg_buf_t *b, const tg_sigv4_t *r, const char *access_key, const char *sig);

/** x-amz-date of a time (16 characters and a NUL). */
void tg_aws_amz_date(time_t t, char out[17]);

/* ---- the event-stream framing ------------------------------------------------------- */

/** One decoded message: the headers the gateway reads (spans into the message, length 0
 *  when absent) and the payload. */
typedef struct {
    const char *event_type, *message_type, *exception_type, *error_code, *error_message;
    size_t event_type_len, message_type_len, exception_type_len, error_code_len, error_message_len;
    const char *payload;
    size_t payload_len;
} tg_es_msg_t;

typedef void (*tg_es_cb)(void *ud, const tg_es_msg_t *m);

typedef struct {
    tg_buf_t buf; /* the message being read, when it came in pieces */
    size_t max;   /* the largest message accepted */
    int failed;   /* a CRC or a length was wrong: nothing after it is decoded */
    char why[96];
    tg_es_cb cb;
    void *ud;
} tg_es_decoder_t;

void tg_es_init(tg_es_decoder_t *d, size_t max, tg_es_cb cb, void *ud);
/** Decodes what it can; a whole message is given to the callback as soon as its last
 *  byte arrives. Returns TG_OK, or TG_ERROR once the stream is corrupt (d->why). */
int tg_es_feed(tg_es_decoder_t *d, const void *data, size_t n);
/** 1 if a message was started and not finished. */
int tg_es_partial(const tg_es_decoder_t *d);
void tg_es_free(tg_es_decoder_t *d);

/** Appends one message with string headers (names[i] = values[i]) and the payload. */
void tg_es_encode(tg_buf_t *out, const char *const *names, const char *const *values, size_t nh, const void *payload,
                  size_t n);

/* ---- Bedrock ------------------------------------------------------------------------ */

#define TG_BEDROCK_ANTHROPIC_VERSION "bedrock-2023-05-31"

/** Appends /model/<modelId URI-encoded>/invoke, or /invoke-with-response-stream. */
void tg_bedrock_path(tg_buf_t *b, const char *model_id, int stream);

/** The InvokeModel body of an Anthropic Messages body: without model and stream, with
 *  anthropic_version (bedrock-2023-05-31 unless it names one). A malloc'd string. */
char *tg_bedrock_body(json_t *messages_body);

/** Why a bedrock account's settings cannot sign (region and access_key_id are
 *  required, plain), or NULL. */
const char *tg_bedrock_check(const json_t *settings);

/** An account's credential: "<secret access key>" or "<secret>:<session token>". */
typedef struct {
    const char *region, *access_key;
    const char *secret;
    size_t secret_len;
    const char *token; /* NULL: none */
} tg_aws_creds_t;
void tg_aws_creds_split(const char *credential, tg_aws_creds_t *c);

/** Appends the signed header lines of a Bedrock runtime call ("\r\nX-Amz-Date: ...",
 *  "\r\nX-Amz-Security-Token: ..." with a session token, "\r\nAuthorization: ...") to
 *  head, signing POST path (as sent, its query-less target), host, content-type
 *  application/json, x-amz-date and the token, and the body's hash. */
void tg_bedrock_sign(tg_buf_t *head, const tg_aws_creds_t *c, const char *host, const char *path, const void *body,
                     size_t len, time_t now);

/** The same for a GET (Bedrock's control plane: ListFoundationModels, service
 *  `bedrock`): signs GET path, its query (already canonical: sorted, encoded; "" none),
 *  host, x-amz-date and the token, and the empty body's hash. */
void tg_aws_sign_get(tg_buf_t *head, const tg_aws_creds_t *c, const char *service, const char *host, const char *path,
                     const char *query, time_t now);

/** The Anthropic stream events of a Bedrock event stream, one callback per event (the
 *  event's type and its JSON, as an SSE parser would give them). An exception message
 *  and a corrupt stream become an Anthropic `error` event; nothing follows an error
 *  event (one the upstream's chunk carried too). */
typedef void (*tg_bedrock_event_cb)(void *ud, const char *event, size_t elen, const char *data, size_t dlen);
typedef struct {
    tg_es_decoder_t es;
    tg_buf_t json; /* the event being decoded */
    tg_buf_t b64;  /* a chunk's base64 when it came with escaped slashes */
    tg_bedrock_event_cb cb;
    void *ud;
    int ended; /* an error event was given: the rest is ignored */
} tg_bedrock_stream_t;

void tg_bedrock_stream_init(tg_bedrock_stream_t *s, size_t max, tg_bedrock_event_cb cb, void *ud);
void tg_bedrock_stream_feed(tg_bedrock_stream_t *s, const void *data, size_t n);
void tg_bedrock_stream_free(tg_bedrock_stream_t *s);

/** Fills what `u` does not know yet from an event's amazon-bedrock-invocationMetrics
 *  (inputTokenCount, outputTokenCount, cacheRead/WriteInputTokenCount): the Anthropic
 *  events' own usage wins. Returns 1 if anything was filled. */
int tg_bedrock_metrics_usage(tg_usage_t *u, const char *data, size_t len);

#endif
