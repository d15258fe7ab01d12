/*
 * The providers' models lists (issue #19, item 7), a pure function over an answer's
 * bytes: each provider's list read in its own shape into one normalised form, for
 * GET /v1/models (core/src/app/tg_proxy_models.c) to merge and answer in the client's.
 *
 *   openai     GET /models                 {"data":[{id,object,created,owned_by}]}
 *   anthropic  GET /models?limit&after_id  {"data":[{type,id,display_name,created_at}],
 *                                           "has_more","first_id","last_id"}
 *   gemini     GET /models?pageSize&pageToken  {"models":[{name:"models/<id>",
 *                                           displayName,...}],"nextPageToken"}
 *   azure      GET /models?api-version     {"data":[{id,created_at,status,capabilities,
 *                                           deprecation,...}],"object":"list"}: the
 *                                           models the resource can serve (inference
 *                                           capable, not retired for inference)
 *   bedrock    GET /foundation-models      {"modelSummaries":[{modelId,modelName,
 *              (the control plane)          providerName,inferenceTypesSupported,...}]}:
 *                                           the Anthropic ones callable on demand
 *   bedrock    GET /inference-profiles?maxResults&nextToken
 *   profiles                               {"inferenceProfileSummaries":[{
 *                                           inferenceProfileId,inferenceProfileName,
 *                                           status,...}],"nextToken"}: the Anthropic ones
 *   vertex     GET /v1beta1/publishers/<p>/models?pageSize&pageToken
 *                                          {"publisherModels":[{name:"publishers/<p>/
 *                                           models/<id>",...}],"nextPageToken"}
 *
 * An entry: {"id","created" (seconds, 0 unknown),"display_name","owned_by"} and, when
 * read in OpenAI's or Anthropic's own shape, the provider's object as it was ("oa" /
 * "an"), so a client of that protocol gets it back unchanged.
 */
#ifndef TOLLGATE_TG_MODELS_H
#define TOLLGATE_TG_MODELS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    TG_MODELS_OPENAI,
    TG_MODELS_ANTHROPIC,
    TG_MODELS_GEMINI,
    TG_MODELS_AZURE,
    TG_MODELS_BEDROCK,
    TG_MODELS_VERTEX,
    TG_MODELS_BEDROCK_PROFILES,
} tg_models_shape_t;

/** The largest page cursor followed (a longer one makes the page unreadable). */
#define TG_MODELS_CURSOR_MAX 1024
/** The most entries one page contributes (the rest are left out). */
#define TG_MODELS_PAGE_ENTRIES_MAX 10000

/** A normalised entry (display NULL: the id). */
json_t *tg_models_entry(const char *id, int64_t created, const char *display, const char *owner);

/**
 * Reads one page of a provider's list (the answer's body) and appends its entries to
 * `entries`. Returns 1 if the body is one such page, 0 if not (not JSON, the list not
 * an array, a cursor too long). `next` gets the next page's cursor (Anthropic's
 * last_id when has_more, Google's nextPageToken, Bedrock's nextToken), "" when this is the last page.
 * `now_s` is the time an Azure model's retirement is compared with.
 */
int tg_models_page(tg_models_shape_t shape, const char *body, size_t len, int64_t now_s, json_t *entries,
                   char next[TG_MODELS_CURSOR_MAX]);

#endif
