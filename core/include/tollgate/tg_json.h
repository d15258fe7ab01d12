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
 * numbers instead of failing. Returns a new reference, or NULL with err filled (a real
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

#endif
