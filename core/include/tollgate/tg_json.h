/*
 * Byte-level edits of a JSON request body that jansson has already parsed.
 *
 * The gateway changes a few top-level members of a client's request (the model after
 * mapping, the output-token cap, stream_options.include_usage) and used to re-serialise
 * the whole document with json_dumps to send it upstream: ~40 ns a byte, 4 ms for a
 * 100 KB conversation. These edits copy the client's bytes and replace only the values
 * of the members that changed.
 */
#ifndef TOLLGATE_TG_JSON_H
#define TOLLGATE_TG_JSON_H

#include <jansson.h>

#include "tollgate/tg_common.h"

/*
 * Numbers kept as the client wrote them. JSON numbers are not int64: a tool schema's
 * `maximum: 18446744073709551615` or a tool argument of 30 digits is valid JSON that
 * jansson refuses ("too big integer"), and jansson writes reals with 17 digits
 * (0.1 -> 0.10000000000000001). Bodies the gateway parses and writes again go through
 * these two functions instead: an integer beyond int64 is held as a "big number" (a
 * string value: a marker that starts with a NUL, which no client string can hold, then
 * the number's exact text; it is not a json_is_integer) and written back as that text, and reals are written in their
 * shortest form that reads back as the same double (0.1 stays 0.1).
 */

/**
 * json_loadb(buf, len, flags, err), except that integers beyond int64 are parsed as big
 * numbers instead of failing. Returns a new reference, or NULL with err (when given) filled (a real
 * number overflow such as 1e400 is still an error).
 */
json_t *tg_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err);

/** 1 when v is a big number made by tg_json_loadb; its text in *text / *len if given. */
int tg_json_is_big(const json_t *v, const char **text, size_t *len);

/**
 * Appends json_dumps(v, flags) to out, with big numbers written back as their text and
 * reals in shortest round-trip form. Returns TG_OK, or TG_ERROR (nothing appended) when
 * jansson cannot encode v.
 */
int tg_json_dump_buf(const json_t *v, size_t flags, tg_buf_t *out);

/** The same as a NUL-terminated malloc'd string (free() it), or NULL. */
char *tg_json_dumps(const json_t *v, size_t flags);

/**
 * out = doc with the value of each top-level member keys[i] replaced by values[i] (JSON
 * text); members the document lacks are added at its start. `doc` must be a JSON object
 * that jansson accepted with JSON_REJECT_DUPLICATES. Returns TG_OK, or TG_ERROR when the
 * document is not one this handles (a top-level key with an escape in it, which could
 * spell one of `keys` differently): the caller re-serialises instead. `out` is appended to.
 */
int tg_json_set_members(const char *doc, size_t len, const char *const *keys, const char *const *values, int n,
                        tg_buf_t *out);

/*
 * One pass over a request body that says whether tg_json_loadb(body, JSON_REJECT_DUPLICATES)
 * would accept it, without building the tree, and reads the top-level members the
 * pipeline checks on every request (tg_json_scan_top_t). Three answers: TG_JSON_VALID
 * and TG_JSON_INVALID are certain (the fuzz target fuzz_json_scan holds them to
 * jansson's verdict); TG_JSON_UNSURE is for what the scan leaves to jansson (an escaped
 * key, an object of more than 32 keys, nesting deeper than 64, a number token longer
 * than 64 bytes, an integer beyond int64): the caller parses then.
 */
enum { TG_JSON_VALID = 0, TG_JSON_INVALID = 1, TG_JSON_UNSURE = 2 };

/* The top-level members read, in this order in tg_json_scan_top_t.m[]. */
enum {
    TG_JTOP_MODEL,
    TG_JTOP_STREAM,
    TG_JTOP_MESSAGES,
    TG_JTOP_INPUT,
    TG_JTOP_MAX_COMPLETION_TOKENS,
    TG_JTOP_MAX_TOKENS,
    TG_JTOP_MAX_OUTPUT_TOKENS,
    TG_JTOP_PROMPT_CACHE_KEY,
    TG_JTOP_PREVIOUS_RESPONSE_ID,
    TG_JTOP_METADATA,
    TG_JTOP__COUNT
};

/* A value's kind: 0 absent, or one of these. */
enum {
    TG_JV_STRING = 1, /* start/len: the bytes between the quotes; escaped: holds a backslash */
    TG_JV_INT,        /* within int64 */
    TG_JV_REAL,
    TG_JV_TRUE,
    TG_JV_FALSE,
    TG_JV_NULL,
    TG_JV_OBJECT,
    TG_JV_ARRAY,
};

typedef struct {
    int kind;
    int escaped;
    size_t start, len;
    size_t count; /* an array's elements */
} tg_json_scan_val_t;

typedef struct {
    int object;      /* the document is an object (else an array) */
    tg_json_scan_val_t m[TG_JTOP__COUNT];
} tg_json_scan_top_t;

/** TG_JSON_VALID, TG_JSON_INVALID or TG_JSON_UNSURE; *top is filled for TG_JSON_VALID. */
int tg_json_scan(const char *buf, size_t len, tg_json_scan_top_t *top);

#endif
