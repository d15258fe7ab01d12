/*
 * Translation between the LLM APIs tollgate speaks: OpenAI Chat Completions, Anthropic
 * Messages and OpenAI Responses, so that a client of one protocol can be served by an
 * upstream account of another. Embeddings only pass through (same protocol both sides).
 * Google Gemini's generateContent is an upstream protocol only: a client of any of the
 * three is served by it (tg_translate_gemini.c says what is carried and how).
 *
 * A pure library: no I/O, no loop, no globals; every call is thread-safe on its own
 * arguments. The gateway uses it in four places of a proxied call:
 *
 *   request      tg_translate_request   client body (parsed)   -> upstream body (json_t)
 *   response     tg_translate_response  upstream body (bytes)  -> client body (bytes)
 *   error        tg_translate_error     upstream error (bytes) -> client error (bytes)
 *   stream       tg_xlate_*             upstream SSE events    -> client SSE bytes
 *
 * Requests go through one neutral form (system text, user/assistant turns of text,
 * image, document, tool_use and tool_result blocks, tool definitions, sampling
 * parameters), so every pair of the three protocols is supported, in both directions,
 * including Anthropic <-> Responses. When `from == to` the request is copied with only
 * the model replaced, and responses and streams pass through unchanged.
 *
 * What is translated (every direction):
 *   - text; system prompts (OpenAI system/developer messages anywhere in the list,
 *     Responses `instructions` <-> Anthropic top-level `system`, joined with "\n\n");
 *   - images: OpenAI `image_url` (https URL or data:...;base64) and Responses
 *     `input_image` <-> Anthropic image source `url` / `base64`; PDF documents
 *     (OpenAI `file.file_data`, Responses `input_file`, Anthropic `document`);
 *   - tools: OpenAI `tools[].function{name,description,parameters}`, Responses'
 *     flat function tools <-> Anthropic `tools[]{name,description,input_schema}`;
 *     tool_choice auto/none/required(any)/named; parallel_tool_calls <->
 *     tool_choice.disable_parallel_tool_use;
 *   - tool calls and results: assistant `tool_calls` / Responses `function_call` items
 *     <-> `tool_use` blocks; `role: tool` messages / `function_call_output` items <->
 *     `tool_result` blocks in the next user turn (consecutive results are merged into
 *     one user turn, as Anthropic requires). Tool-call ids are kept; for an Anthropic
 *     upstream characters outside [A-Za-z0-9_-] are replaced by '_' (consistently in
 *     calls and results). Images inside tool results go to a chat upstream as a user
 *     message right after the tool messages (chat tool messages hold text only). An
 *     Anthropic tool_result with is_error: true reaches an OpenAI upstream (which has no
 *     such flag) as content starting with "Error: ". A call without arguments reaches
 *     chat and Responses clients as "{}" in streams too (Anthropic streams input {} and
 *     an empty delta). An assistant turn holding only a refusal (chat `refusal`,
 *     Responses refusal part) is carried as its text;
 *   - max_tokens / max_completion_tokens / max_output_tokens (Anthropic requires one:
 *     TG_TRANSLATE_DEFAULT_MAX_TOKENS when the client sent none; a chat upstream gets
 *     max_completion_tokens, which the gateway respells max_tokens for the models of
 *     its max_tokens_models setting), temperature (clamped to 1 for Anthropic), top_p,
 *     stop / stop_sequences (at most 4 for a chat upstream, as OpenAI allows; more is
 *     refused), user <-> metadata.user_id, response_format <-> text.format
 *     (chat <-> Responses), reasoning_effort <-> reasoning.effort (chat <-> Responses);
 *   - stream: a chat upstream is always asked for `stream_options.include_usage` and a
 *     Responses upstream gets `store: false`;
 *   - stop reasons: stop / length / tool_calls / content_filter <-> end_turn /
 *     max_tokens / tool_use / refusal (stop_sequence and pause_turn map to stop);
 *     Responses `completed` / `incomplete` (max_output_tokens, content_filter);
 *     a response that contains tool calls reports tool_calls / tool_use; refusal text
 *     from an OpenAI upstream (chat `refusal`, Responses refusal parts) ends as
 *     refusal / content_filter, stream or not;
 *   - usage: see "Usage" below.
 * Parameters the upstream protocol cannot express but that only tune sampling or
 * latency (seed, penalties, top_k, logit_bias, service_tier, thinking, cache_control
 * outside text parts, store, include, chat `prediction` (a latency hint), Anthropic
 * `container` (only server tools, which are refused, run in it), Responses
 * `max_tool_calls` (a cap on built-in tool calls, which are refused), ...) are dropped.
 * Input whose meaning would be lost is refused with a 400 message naming the field:
 * audio parts and outputs, n > 1, logprobs, legacy `functions`, non-function tools (web
 * search, computer use, custom tools) and chat `web_search_options`, file ids,
 * previous_response_id, background, Responses `truncation` other than "disabled", JSON
 * output formats for an Anthropic upstream, stop sequences for a Responses upstream,
 * unknown roles and part types.
 * Numbers: bodies are parsed with tg_json_loadb and written with tg_json_dumps, so an
 * integer beyond int64 (a schema's maximum, a tool argument) keeps its digits and reals
 * are written in shortest round-trip form; tool arguments that an Anthropic client
 * receives as `input` are the upstream's own bytes.
 * Thinking / reasoning blocks in the history are dropped when the upstream is another
 * protocol (their signatures are only valid for the provider that made them), and so
 * is thinking / reasoning output on its way to a client of another protocol (the text,
 * tool calls, stop reason and usage, reasoning tokens included, are carried).
 *
 * Usage. Billing never reads the translated bytes: the gateway extracts usage from the
 * upstream's own events with tg_usage (upstream protocol). The translator renders the
 * same numbers in the client's shape: prompt/input tokens = uncached input + cache
 * reads + cache writes for OpenAI shapes (cached_tokens = cache reads), and uncached
 * input + cache_read_input_tokens + cache_creation_input_tokens for Anthropic. A count
 * the upstream did not report is rendered as 0 (the client protocols require the
 * fields; an Anthropic client always gets both cache counts). A chat stream from an Anthropic or Responses upstream ends with a usage chunk
 * ("choices": []) unless tg_xlate_set_usage_chunk(x, 0); an Anthropic stream from an
 * OpenAI upstream reports input_tokens 0 in message_start (OpenAI sends input counts
 * only at the end) and the real input and output counts in message_delta.usage.
 *
 * Streams are translated event by event as they arrive: each upstream event produces
 * its client events at once, nothing is held back for later. State is bounded (the
 * current content block, its kind and index, counters, ids) for chat and Anthropic
 * clients. A Responses client is the one exception: that protocol repeats the whole
 * output in its closing events (response.output_text.done, response.output_item.done,
 * response.completed), so for that target the translator keeps the text and tool
 * arguments of the response it has emitted.
 */
#ifndef TOLLGATE_TG_TRANSLATE_H
#define TOLLGATE_TG_TRANSLATE_H

#include <jansson.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_usage.h"

/** max_tokens sent to an Anthropic upstream when the client gave no output limit. */
#define TG_TRANSLATE_DEFAULT_MAX_TOKENS 4096

/**
 * 1 when bodies and streams can be translated from `from` to `to`: any pair of chat,
 * Anthropic and Responses, and each protocol to itself (embeddings included); 0 else.
 */
int tg_translate_supported(tg_proto_t from, tg_proto_t to);

/**
 * The upstream path suffix of a protocol, to append to an account's base URL
 * (".../v1"): "/chat/completions", "/messages", "/responses" or "/embeddings".
 */
const char *tg_translate_path(tg_proto_t proto);

/**
 * Gemini's path for `model` (percent-encoded), to append to the account's base URL
 * (".../v1beta"): "/models/<model>:generateContent", or
 * ":streamGenerateContent?alt=sse" for a stream.
 */
void tg_translate_gemini_path(const char *model, int stream, tg_buf_t *out);

/** A short name for logs: "openai_chat", "anthropic", "responses", "embeddings". */
const char *tg_translate_proto_name(tg_proto_t proto);

/**
 * Translates a client request body (`from`, already parsed; not modified) into a new
 * body for an upstream that speaks `to`, with `model` (the upstream's model name; NULL
 * keeps the body's) in it. On success returns TG_OK and stores a new reference in *out
 * that the caller json_decref's. On refusal returns TG_ERROR, leaves *out NULL and
 * writes an OpenAI-style message for a 400 invalid_request_error into err (always
 * NUL-terminated when errlen > 0), e.g.
 * "messages[1].content[0]: content part type \"input_audio\" cannot be sent to an
 * Anthropic upstream".
 */
int tg_translate_request(tg_proto_t from, tg_proto_t to, const json_t *body, const char *model,
                         json_t **out, char *err, size_t errlen);

/**
 * Translates a non-stream 2xx response body of the upstream (`from_upstream`) into the
 * client's protocol and appends it to `out`; `client_model` (NULL: the upstream's) is the
 * model name the client sees. Returns TG_OK, or TG_ERROR when the body is not a JSON
 * object of the upstream's protocol (nothing is appended; the gateway answers 502).
 * With from == to the body is appended unchanged.
 */
int tg_translate_response(tg_proto_t from_upstream, tg_proto_t to_client, const char *body,
                          size_t len, const char *client_model, tg_buf_t *out);

/**
 * Appends the client protocol's error body for an upstream error response (`status` and
 * its body of any shape: OpenAI {"error":{...}}, Anthropic {"type":"error","error":
 * {...}}, plain text, empty). The message and, when the shape has them, the type and
 * code are kept; what is missing is derived from the status, which the caller sends
 * unchanged. OpenAI shape: {"error":{"message","type","param":null,"code"}}; Anthropic:
 * {"type":"error","error":{"type","message"}}. Also usable to re-shape the gateway's own
 * OpenAI-shaped errors for an Anthropic client.
 */
void tg_translate_error(tg_proto_t to_client, int status, const char *body, size_t len,
                        tg_buf_t *out);

/**
 * A stream translator: one per streamed response, owned by the caller
 * (tg_xlate_destroy). Feed it every event the SSE parser dispatches for the upstream's
 * 2xx event stream, in order; each call appends the client-protocol bytes for that event
 * to `out` ("event: NAME\ndata: JSON\n\n" for Anthropic and Responses clients,
 * "data: JSON\n\n" for chat clients, whose stream ends with "data: [DONE]\n\n"). Output
 * never depends on how the upstream's bytes were split into reads.
 */
typedef struct tg_xlate_s tg_xlate_t;

/**
 * Creates a translator from `from_upstream` events to `to_client` events. `client_model`
 * is the model name the client sees (NULL: the upstream's); `request_id` seeds the ids
 * the upstream does not supply (Responses item ids, a missing message id). Returns NULL
 * when the pair is not supported (tg_translate_supported) or for embeddings, which do
 * not stream. With from == to every event is passed through unchanged.
 */
tg_xlate_t *tg_xlate_create(tg_proto_t from_upstream, tg_proto_t to_client,
                            const char *client_model, const char *request_id);

/**
 * Chat clients only: whether the stream ends with the usage chunk ("choices": [] and
 * "usage"); on by default. Turn it off when the client did not ask for it with
 * stream_options.include_usage (some clients break on a chunk without choices).
 */
void tg_xlate_set_usage_chunk(tg_xlate_t *x, int on);

/**
 * Translates one upstream event (the `event:` field, possibly empty, and the joined
 * `data:` lines, as tg_sse delivers them) and appends the client's bytes to `out`
 * (possibly none, e.g. for pings). Events whose data is not JSON of the upstream's
 * protocol are skipped. An upstream error event becomes the client protocol's error
 * event and ends the stream: later events are ignored.
 */
void tg_xlate_event(tg_xlate_t *x, const char *event, size_t elen, const char *data,
                    size_t dlen, tg_buf_t *out);

/**
 * Call once when the upstream's stream ended cleanly (not on a connection error: then
 * the client must see a truncated stream). Appends whatever closing events are still
 * owed: nothing if the upstream finished properly; the closing events (chat
 * finish/usage/[DONE], Anthropic message_delta/message_stop, Responses
 * response.completed) if the upstream gave a stop reason but not its own end marker;
 * and an error event if the upstream ended before any stop reason (a cut answer is
 * never turned into a success). Later events are ignored.
 */
void tg_xlate_finish(tg_xlate_t *x, tg_buf_t *out);

/** Usage seen so far in the upstream events: tg_usage_merge_json folded over every
 *  event (an error event's and one after the end included), as the proxy bills them. */
const tg_usage_t *tg_xlate_usage(const tg_xlate_t *x);

/**
 * The caller folds tg_usage_merge_json over the same events before handing each to
 * tg_xlate_event (the proxy does, to bill them): the translator shows the client that
 * usage (*u, read when a usage chunk is written; it must outlive x) instead of folding
 * every event a second time.
 */
void tg_xlate_use_usage(tg_xlate_t *x, const tg_usage_t *u);

/** Frees the translator; NULL is ignored. */
void tg_xlate_destroy(tg_xlate_t *x);

/**
 * A local estimate of a request's input tokens, for Anthropic's
 * POST /v1/messages/count_tokens and for admission: ceil(bytes / 4) over every text the
 * model reads (system / instructions, message and part texts, tool-call arguments, tool
 * results, tool names, descriptions and schemas), plus 3 per message or item and 1600
 * per image or document (an image at Anthropic's maximum size). Works on a request body
 * of any protocol, embeddings `input` included. Returns >= 1, or TG_ERROR when `body` is
 * not a JSON object.
 */
int64_t tg_estimate_tokens(tg_proto_t proto, const json_t *body);

#endif
