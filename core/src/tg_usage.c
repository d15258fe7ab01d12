/*
 * Token usage extraction: turns whatever a provider reports (a non-stream body, or the
 * data of one streamed event) into the normalised tg_usage_t that pricing and the ledger
 * use.
 *
 * Where each protocol puts its usage:
 *   OpenAI chat   body / final stream chunk: "usage": {prompt_tokens, completion_tokens,
 *                 prompt_tokens_details.cached_tokens,
 *                 completion_tokens_details.reasoning_tokens}; other chunks carry
 *                 "usage": null or nothing.
 *   Anthropic     body: "usage"; stream: message_start's "message"."usage" (input and
 *                 cache counts) and message_delta's top-level "usage" (output so far,
 *                 sometimes the input counts again). Later values overwrite earlier.
 *   Responses     body: "usage" {input_tokens, output_tokens,
 *                 input_tokens_details.cached_tokens,
 *                 output_tokens_details.reasoning_tokens}; stream: the terminal events
 *                 (response.completed, response.incomplete, response.failed) carry it in
 *                 "response"."usage".
 *   Embeddings    "usage": {prompt_tokens}; there is no output.
 *
 * OpenAI counts cached tokens inside prompt/input tokens; they are moved to cache_read
 * here so that `input` means the same thing (uncached input) for every provider, as it
 * does in Anthropic's reports. A count that is absent, null, negative or not an integer
 * is unknown and leaves the field alone: unknown is not zero.
 *
 * Streams send hundreds of events and only one or two carry usage, so a document that
 * does not contain the bytes "usage" is answered without parsing it (and so without
 * noticing if it is malformed).
 */
#include "tollgate/tg_usage.h"

#include <inttypes.h>
#include <jansson.h>
#include <string.h> /* memmem: the build defines _GNU_SOURCE */

/* Reads a non-negative integer member; returns 1 and sets *out, or 0 when unknown. */
static int usage_int(const json_t *obj, const char *key, int64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        return 0;
    json_int_t n = json_integer_value(v);
    if (n < 0)
        return 0;
    *out = (int64_t)n;
    return 1;
}

/* The same, for obj.key1.key2 (an absent or null middle object means unknown). */
static int usage_int2(const json_t *obj, const char *key1, const char *key2, int64_t *out) {
    json_t *inner = json_object_get(obj, key1);
    return json_is_object(inner) ? usage_int(inner, key2, out) : 0;
}

static void usage_set(tg_usage_t *u, unsigned bit, int64_t v) {
    switch (bit) {
    case TG_USAGE_INPUT: u->input = v; break;
    case TG_USAGE_OUTPUT: u->output = v; break;
    case TG_USAGE_CACHE_READ: u->cache_read = v; break;
    case TG_USAGE_CACHE_WRITE: u->cache_write = v; break;
    case TG_USAGE_REASONING: u->reasoning = v; break;
    }
    u->known |= bit;
}

/* The usage object at doc.usage, or else at doc.<outer>.usage (outer may be NULL). */
static json_t *usage_find(json_t *doc, const char *outer) {
    json_t *us = json_object_get(doc, "usage");
    if (json_is_object(us))
        return us;
    if (outer) {
        json_t *o = json_object_get(doc, outer);
        if (json_is_object(o)) {
            us = json_object_get(o, "usage");
            if (json_is_object(us))
                return us;
        }
    }
    return NULL;
}

/*
 * OpenAI chat and Responses share a shape: total input including cache hits, cache hits
 * in a details object, output including reasoning, reasoning in another details object.
 */
static unsigned usage_openai(tg_usage_t *u, const json_t *us, const char *in_key,
                             const char *out_key, const char *in_details,
                             const char *out_details) {
    unsigned found = 0;
    int64_t in = 0, cached = 0, out = 0, reasoning = 0;
    int has_in = usage_int(us, in_key, &in);
    int has_cached = usage_int2(us, in_details, "cached_tokens", &cached);
    if (has_cached) {
        usage_set(u, TG_USAGE_CACHE_READ, cached);
        found |= TG_USAGE_CACHE_READ;
    }
    if (has_in) {
        usage_set(u, TG_USAGE_INPUT, has_cached ? (in > cached ? in - cached : 0) : in);
        found |= TG_USAGE_INPUT;
    }
    if (usage_int(us, out_key, &out)) {
        usage_set(u, TG_USAGE_OUTPUT, out);
        found |= TG_USAGE_OUTPUT;
    }
    if (usage_int2(us, out_details, "reasoning_tokens", &reasoning)) {
        usage_set(u, TG_USAGE_REASONING, reasoning);
        found |= TG_USAGE_REASONING;
    }
    return found;
}

static unsigned usage_anthropic(tg_usage_t *u, const json_t *us) {
    static const struct {
        const char *key;
        unsigned bit;
    } fields[] = {
        {"input_tokens", TG_USAGE_INPUT},
        {"output_tokens", TG_USAGE_OUTPUT},
        {"cache_read_input_tokens", TG_USAGE_CACHE_READ},
        {"cache_creation_input_tokens", TG_USAGE_CACHE_WRITE},
    };
    unsigned found = 0;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        int64_t v;
        if (usage_int(us, fields[i].key, &v)) {
            usage_set(u, fields[i].bit, v);
            found |= fields[i].bit;
        }
    }
    return found;
}

static unsigned usage_embeddings(tg_usage_t *u, const json_t *us) {
    int64_t in;
    if (!usage_int(us, "prompt_tokens", &in))
        return 0;
    usage_set(u, TG_USAGE_INPUT, in);
    usage_set(u, TG_USAGE_OUTPUT, 0);
    return TG_USAGE_INPUT | TG_USAGE_OUTPUT;
}

int tg_usage_merge_json(tg_usage_t *u, tg_proto_t proto, const char *json, size_t len) {
    if (!json || !memmem(json, len, "usage", 5))
        return 0;
    json_error_t err;
    json_t *doc = json_loadb(json, len, 0, &err);
    if (!doc)
        return TG_ERROR;
    unsigned found = 0;
    json_t *us;
    switch (proto) {
    case TG_PROTO_OPENAI_CHAT:
        if ((us = usage_find(doc, NULL)))
            found = usage_openai(u, us, "prompt_tokens", "completion_tokens",
                                 "prompt_tokens_details", "completion_tokens_details");
        break;
    case TG_PROTO_ANTHROPIC:
        if ((us = usage_find(doc, "message")))
            found = usage_anthropic(u, us);
        break;
    case TG_PROTO_RESPONSES:
        if ((us = usage_find(doc, "response")))
            found = usage_openai(u, us, "input_tokens", "output_tokens", "input_tokens_details",
                                 "output_tokens_details");
        break;
    case TG_PROTO_EMBEDDINGS:
        if ((us = usage_find(doc, NULL)))
            found = usage_embeddings(u, us);
        break;
    }
    json_decref(doc);
    return found ? 1 : 0;
}

void tg_usage_append_json(const tg_usage_t *u, tg_buf_t *b) {
    const struct {
        const char *key;
        unsigned bit;
        int64_t v;
    } fields[] = {
        {"input", TG_USAGE_INPUT, u->input},
        {"output", TG_USAGE_OUTPUT, u->output},
        {"cache_read", TG_USAGE_CACHE_READ, u->cache_read},
        {"cache_write", TG_USAGE_CACHE_WRITE, u->cache_write},
        {"reasoning", TG_USAGE_REASONING, u->reasoning},
    };
    tg_buf_append(b, "{", 1);
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (i)
            tg_buf_append(b, ",", 1);
        if (u->known & fields[i].bit)
            tg_buf_printf(b, "\"%s\":%" PRId64, fields[i].key, fields[i].v);
        else
            tg_buf_printf(b, "\"%s\":null", fields[i].key);
    }
    tg_buf_append(b, "}", 1);
}
