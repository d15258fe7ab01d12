/*
 * Normalised token usage, extracted from any provider's response: the non-stream JSON
 * body or the streamed events (OpenAI chat's final usage chunk, Anthropic's
 * message_start and message_delta, Responses' response.completed/incomplete, Gemini's
 * usageMetadata of every generateContent answer or streamed chunk).
 *
 * A field that the upstream did not report stays unknown (its bit in `known` is clear),
 * never zero: billing treats unknown and zero differently.
 */
#ifndef TOLLGATE_TG_USAGE_H
#define TOLLGATE_TG_USAGE_H

#include "tollgate/tg_common.h"

enum {
    TG_USAGE_INPUT = 1 << 0,
    TG_USAGE_OUTPUT = 1 << 1,
    TG_USAGE_CACHE_READ = 1 << 2,
    TG_USAGE_CACHE_WRITE = 1 << 3,
    TG_USAGE_REASONING = 1 << 4,
};

typedef struct {
    int64_t input;       /* prompt tokens, excluding cache reads/writes for Anthropic */
    int64_t output;      /* completion tokens, including reasoning tokens */
    int64_t cache_read;
    int64_t cache_write;
    int64_t reasoning;
    unsigned known;      /* TG_USAGE_* bits of the fields reported */
} tg_usage_t;

typedef enum {
    TG_PROTO_OPENAI_CHAT = 0,
    TG_PROTO_ANTHROPIC = 1,
    TG_PROTO_RESPONSES = 2,
    TG_PROTO_EMBEDDINGS = 3,
    TG_PROTO_GEMINI = 4, /* Google's generateContent: an upstream protocol only */
} tg_proto_t;

/**
 * Merges the usage found in one JSON document (a whole non-stream response body, or
 * the data of one streamed event) into `u`. Fields present in the document overwrite
 * those in `u`; absent ones are left alone (so Anthropic's message_start and
 * message_delta combine). Returns 1 if any usage was found, 0 if none, TG_ERROR if the
 * JSON is malformed.
 */
int tg_usage_merge_json(tg_usage_t *u, tg_proto_t proto, const char *json, size_t len);

/**
 * The same result from a full jansson parse of the document. tg_usage_merge_json
 * locates the usage object with a structural scan and parses only that object; this is
 * the reference it must agree with on every valid document (the fuzz target checks it),
 * and its fallback for documents the scan does not handle.
 */
int tg_usage_merge_json_full(tg_usage_t *u, tg_proto_t proto, const char *json, size_t len);

/** Appends `u` as a JSON object to `b`, with null for unknown fields. */
void tg_usage_append_json(const tg_usage_t *u, tg_buf_t *b);

#endif
