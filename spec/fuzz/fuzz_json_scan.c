/*
 * libFuzzer target for the one-pass request-body validator (core/src/proto/tg_json_scan.c).
 *
 * Input: one document. tg_json_scan's verdict is held to the gateway's parse,
 * tg_json_loadb(JSON_REJECT_DUPLICATES): TG_JSON_VALID only where it accepts,
 * TG_JSON_INVALID only where it refuses (TG_JSON_UNSURE leaves it to jansson). For a
 * valid object, each top-level member the scan reads has the kind of the parsed member
 * and, for a string without escapes, its bytes; a container's span starts and ends with
 * its brackets, and an array member's element count is the parsed array's size.
 */
#include "tollgate/tg_json.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_json_scan invariant failed: %s\n", what);
        abort();
    }
}

static int kind_of(const json_t *v) {
    if (!v)
        return 0;
    if (tg_json_is_big(v, NULL, NULL))
        return -1; /* never VALID for the scan */
    switch (json_typeof(v)) {
    case JSON_OBJECT: return TG_JV_OBJECT;
    case JSON_ARRAY: return TG_JV_ARRAY;
    case JSON_STRING: return TG_JV_STRING;
    case JSON_INTEGER: return TG_JV_INT;
    case JSON_REAL: return TG_JV_REAL;
    case JSON_TRUE: return TG_JV_TRUE;
    case JSON_FALSE: return TG_JV_FALSE;
    default: return TG_JV_NULL;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const names[TG_JTOP__COUNT] = {
        "model",      "stream",           "messages",             "input",   "max_completion_tokens",
        "max_tokens", "max_output_tokens", "prompt_cache_key", "previous_response_id", "metadata"};
    const char *s = (const char *)data;
    tg_json_scan_top_t top;
    int verdict = tg_json_scan(s, size, &top);
    json_error_t err;
    json_t *doc = tg_json_loadb(s, size, JSON_REJECT_DUPLICATES, &err);
    if (verdict == TG_JSON_VALID)
        check(doc != NULL, "valid for the scan, refused by jansson");
    if (verdict == TG_JSON_INVALID)
        check(doc == NULL, "refused by the scan, valid for jansson");
    if (verdict == TG_JSON_VALID) {
        check(top.object == json_is_object(doc), "object");
        for (int m = 0; m < TG_JTOP__COUNT; m++) {
            json_t *v = json_is_object(doc) ? json_object_get(doc, names[m]) : NULL;
            check(top.m[m].kind == kind_of(v), "a member's kind");
            if (top.m[m].kind == TG_JV_STRING && !top.m[m].escaped)
                check(top.m[m].len == json_string_length(v) && !memcmp(s + top.m[m].start, json_string_value(v), top.m[m].len),
                      "a string member's bytes");
            if (top.m[m].kind == TG_JV_INT)
                check(strtoll(s + top.m[m].start, NULL, 10) == json_integer_value(v) &&
                          top.m[m].len == strspn(s + top.m[m].start, "-0123456789"),
                      "an integer member's span");
            if (top.m[m].kind == TG_JV_OBJECT || top.m[m].kind == TG_JV_ARRAY) {
                check(s[top.m[m].start + top.m[m].len - 1] == (top.m[m].kind == TG_JV_OBJECT ? '}' : ']'), "a container's span");
            }
            if (top.m[m].kind == TG_JV_ARRAY)
                check(top.m[m].count == json_array_size(v), "an array's element count");
        }
    }
    json_decref(doc);
    return 0;
}
