/*
 * Internals shared by the translation files (not a public API):
 *
 *   tg_translate.c            public entry points, the neutral request form, shared
 *                             helpers, the stream translator's core (sequencing)
 *   tg_translate_chat.c       OpenAI Chat Completions: decode and encode requests,
 *                             responses and stream events
 *   tg_translate_anthropic.c  Anthropic Messages: the same
 *   tg_translate_responses.c  OpenAI Responses: the same
 *   tg_translate_gemini.c     Google Gemini generateContent: an upstream protocol only
 *                             (request encoder, answer and stream decoders)
 *
 * Every protocol file provides a decoder (its wire format -> neutral) and an encoder
 * (neutral -> its wire format) for each of the three things that are translated, so a
 * pair of protocols is a decoder of one and an encoder of the other.
 */
#ifndef TOLLGATE_TG_TRANSLATE_INTERNAL_H
#define TOLLGATE_TG_TRANSLATE_INTERNAL_H

#include "tollgate/tg_json.h"
#include "tollgate/tg_translate.h"

/* ---- the neutral request ------------------------------------------------------------
 *
 * A request in neutral form. The json_t members marked owned are new references that
 * tg__ir_free releases; borrowed ones point into the client's body, which outlives the
 * translation.
 *
 * `messages` holds {"role":"user"|"assistant","content":[block, ...]} turns, where a
 * block is one of (all JSON objects):
 *   {"type":"text","text":S[,"cache_control":O]}
 *   {"type":"image","url":S[,"detail":S]} or {"type":"image","media_type":S,"data":S}
 *   {"type":"document","media_type":S,"data":S[,"filename":S]} or
 *   {"type":"document","url":S[,"filename":S]}
 *   {"type":"tool_use","id":S,"name":S,"arguments":S}   arguments: JSON text
 *   {"type":"tool_result","tool_use_id":S,"content":[text|image|document block, ...]
 *    [,"is_error":true]}
 * Consecutive turns may share a role; encoders merge them when the protocol needs it.
 * `tools` holds {"name":S,"description":S?,"parameters":O}.
 */
enum { TG__TC_UNSET = 0, TG__TC_AUTO, TG__TC_NONE, TG__TC_REQUIRED, TG__TC_NAMED };

typedef struct {
    json_t *system;          /* owned: array of strings */
    json_t *messages;        /* owned: array of turns (see above) */
    json_t *tools;           /* owned: array, or NULL when none were given */
    int tool_choice;         /* TG__TC_* */
    const char *tool_name;   /* borrowed: TG__TC_NAMED */
    int parallel;            /* parallel tool calls: -1 unset, 0, 1 */
    int64_t max_tokens;      /* -1 unset */
    json_t *temperature;     /* borrowed number or NULL */
    json_t *top_p;           /* borrowed number or NULL */
    json_t *stop;            /* owned: array of strings, or NULL */
    int stream;
    const char *user;        /* borrowed: end-user id, or NULL */
    json_t *format;          /* owned: {"type":"json_object"} or {"type":"json_schema",
                                "name","schema","strict"?,"description"?}, or NULL */
    const char *effort;      /* borrowed: reasoning effort, or NULL */
} tg__ir_t;

void tg__ir_init(tg__ir_t *ir);
void tg__ir_free(tg__ir_t *ir);
/* Appends a block to the last turn if it has `role`, else to a new turn. */
void tg__ir_add(tg__ir_t *ir, const char *role, json_t *block /* stolen */);

/* Decoders fill `ir` from a client body; encoders build an upstream body from `ir`.
 * Both return TG_OK, or TG_ERROR with a message in err. */
int tg__chat_req_decode(const json_t *body, tg__ir_t *ir, char *err, size_t errlen);
int tg__anthropic_req_decode(const json_t *body, tg__ir_t *ir, char *err, size_t errlen);
int tg__responses_req_decode(const json_t *body, tg__ir_t *ir, char *err, size_t errlen);
int tg__chat_req_encode(const tg__ir_t *ir, json_t *out, char *err, size_t errlen);
int tg__anthropic_req_encode(const tg__ir_t *ir, json_t *out, char *err, size_t errlen);
int tg__responses_req_encode(const tg__ir_t *ir, json_t *out, char *err, size_t errlen);
int tg__gemini_req_encode(const tg__ir_t *ir, json_t *out, char *err, size_t errlen);

/* ---- stop reasons ------------------------------------------------------------------ */

enum {
    TG__FIN_NONE = 0,
    TG__FIN_STOP,          /* natural end (end_turn, stop, completed, pause_turn) */
    TG__FIN_STOP_SEQUENCE, /* a stop sequence matched */
    TG__FIN_LENGTH,        /* the output limit or the context window was reached */
    TG__FIN_TOOL_USE,      /* the model called tools */
    TG__FIN_FILTER,        /* content filter / refusal */
};

int tg__fin_from_chat(const char *s);
int tg__fin_from_anthropic(const char *s);
const char *tg__fin_chat(int fin);
const char *tg__fin_anthropic(int fin);

/* ---- the neutral response ---------------------------------------------------------- */

typedef struct {
    const char *id;      /* borrowed from the parsed upstream body, may be NULL */
    const char *model;   /* the same */
    int64_t created;     /* unix seconds, 0 unknown */
    json_t *content;     /* owned: text and tool_use blocks (tool_use with "arguments") */
    int fin;             /* TG__FIN_* */
    tg_usage_t usage;
} tg__resp_t;

int tg__chat_resp_decode(const json_t *doc, tg__resp_t *r);
int tg__anthropic_resp_decode(const json_t *doc, tg__resp_t *r);
int tg__responses_resp_decode(const json_t *doc, tg__resp_t *r);
int tg__gemini_resp_decode(const json_t *doc, tg__resp_t *r);
void tg__chat_resp_encode(const tg__resp_t *r, const char *model, tg_buf_t *out);
void tg__anthropic_resp_encode(const tg__resp_t *r, const char *model, tg_buf_t *out);
void tg__responses_resp_encode(const tg__resp_t *r, const char *model, tg_buf_t *out);

/* ---- the stream translator --------------------------------------------------------
 *
 * Upstream events are decoded into neutral calls (start, text, tool_start, tool_args,
 * block_end, stop, end, error); the x_* functions below sequence them (start once, one
 * open block at a time, nothing after the end) and hand them to the client's encoder.
 */
enum { TG__BLK_NONE = 0, TG__BLK_TEXT, TG__BLK_TOOL, TG__BLK_SKIP };

typedef struct tg__enc_s tg__enc_t;

struct tg_xlate_s {
    tg_proto_t from, to;
    const tg__enc_t *enc;  /* NULL: passthrough */
    tg_buf_t id;           /* message / response id shown to the client */
    tg_buf_t model;        /* model shown to the client (NUL-terminated) */
    char req_id[64];
    int64_t created;       /* unix seconds */
    tg_usage_t usage;      /* the fold over the events, unless `billed` is set */
    const tg_usage_t *billed; /* the caller's fold of the same events (tg_xlate_use_usage) */
    int fin;               /* the stop reason, TG__FIN_NONE until known */
    int started, stopped, ended;
    int tools;             /* tool calls started */
    int usage_chunk;       /* chat clients: end with the usage chunk */
    int model_fixed;       /* the client model was given: ignore the upstream's */
    /* decoder (upstream side) */
    int d_kind;            /* TG__BLK_* of the upstream's current block */
    int64_t d_index;       /* its index (chat tool index, Anthropic block, output index) */
    int d_refusal;         /* the upstream sent refusal text: the stop reason is a refusal */
    /* encoder (client side) */
    int e_kind;            /* TG__BLK_* of the client's open block */
    int e_index;           /* its index (Anthropic block, Responses output index) */
    int e_count;           /* blocks / output items opened so far */
    int e_args;            /* the open tool call got argument bytes */
    int64_t seq;           /* Responses: sequence_number */
    tg_buf_t e_text;       /* Responses: the open item's text or arguments */
    tg_buf_t e_call;       /* Responses: the open function call's call_id */
    tg_buf_t e_name;       /* Responses: its name */
    tg_buf_t e_items;      /* Responses: finished output items, comma-separated */
};

struct tg__enc_s {
    void (*start)(tg_xlate_t *x, tg_buf_t *out);
    void (*text)(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out);
    void (*tool_start)(tg_xlate_t *x, const char *id, size_t idn, const char *name, size_t nn,
                       tg_buf_t *out);
    void (*tool_args)(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out);
    void (*block_end)(tg_xlate_t *x, tg_buf_t *out);
    void (*stop)(tg_xlate_t *x, tg_buf_t *out);
    void (*end)(tg_xlate_t *x, tg_buf_t *out);
    /* type: an Anthropic error type ("api_error", "overloaded_error", ...) */
    void (*error)(tg_xlate_t *x, const char *type, const char *msg, size_t n, tg_buf_t *out);
};

extern const tg__enc_t tg__chat_enc, tg__anthropic_enc, tg__responses_enc;

void tg__chat_dec(tg_xlate_t *x, const json_t *doc, tg_buf_t *out);
void tg__anthropic_dec(tg_xlate_t *x, const json_t *doc, tg_buf_t *out);
void tg__responses_dec(tg_xlate_t *x, const json_t *doc, tg_buf_t *out);
void tg__gemini_dec(tg_xlate_t *x, const json_t *doc, tg_buf_t *out);

/* The usage the client is shown: the caller's fold when it shares it, else this one's. */
static inline const tg_usage_t *tg__x_u(const tg_xlate_t *x) { return x->billed ? x->billed : &x->usage; }

/* Sequencing (tg_translate.c); decoders call only these. */
void tg__x_meta(tg_xlate_t *x, const char *id, const char *model, int64_t created);
void tg__x_start(tg_xlate_t *x, tg_buf_t *out);
void tg__x_text(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out);
void tg__x_tool_start(tg_xlate_t *x, const char *id, size_t idn, const char *name, size_t nn,
                      tg_buf_t *out);
void tg__x_tool_args(tg_xlate_t *x, const char *s, size_t n, tg_buf_t *out);
void tg__x_block_end(tg_xlate_t *x, tg_buf_t *out);
void tg__x_stop(tg_xlate_t *x, int fin, tg_buf_t *out);
void tg__x_end(tg_xlate_t *x, tg_buf_t *out);
/* type: an Anthropic error type, NULL = api_error; msg: NUL-terminated, NULL = generic. */
void tg__x_error(tg_xlate_t *x, const char *type, const char *msg, tg_buf_t *out);

/* ---- helpers ----------------------------------------------------------------------- */

/* What an OpenAI upstream reads at the start of a tool result that had is_error: true
 * (chat tool messages and function_call_output items have no error flag). */
#define TG__TOOL_ERROR_PREFIX "Error: "

/* Formats into err and returns TG_ERROR. */
int tg__fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The string member, or NULL. */
const char *tg__str(const json_t *obj, const char *key);
/* The integer member, or 0. */
int64_t tg__int(const json_t *obj, const char *key);
/* A tool's parameters, or the empty object schema when it has none (new reference). */
json_t *tg__schema(const json_t *params);
/* Appends "\"" + escaped s + "\"". */
void tg__put_str(tg_buf_t *b, const char *s, size_t n);
void tg__put_cstr(tg_buf_t *b, const char *s);
/* Splits a data: URL "data:<media>;base64,<data>"; returns 1 and fills the parts. */
int tg__data_url(const char *url, tg_str_t *media, tg_str_t *data);
/* Text of a tool result / message content given as a string or an array of strings and
 * text parts ({"type":"text"|"input_text"|"output_text","text":S}), joined with sep; a
 * new reference, or NULL if there is anything else. */
json_t *tg__join_text(const json_t *content, const char *sep);
/* A text part {"type":"text","text":...} as the IR's text block, its cache_control
 * kept; NULL with err set ("WHERE: text must be a string") when text is no string. */
json_t *tg__text_block(const json_t *part, const char *where, char *err, size_t errlen);
/* The usage numbers in each client shape (unknown = 0). */
void tg__usage_chat(const tg_usage_t *u, tg_buf_t *b);
void tg__usage_anthropic(const tg_usage_t *u, tg_buf_t *b);
void tg__usage_responses(const tg_usage_t *u, tg_buf_t *b);
/* Appends "event: NAME\ndata: " (Anthropic / Responses framing). */
void tg__sse_begin(tg_buf_t *b, const char *event);

#endif
