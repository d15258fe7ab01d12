/*
 * libFuzzer target for numbers kept as written (tg_json_loadb / tg_json_dumps in
 * core/src/proto/tg_json.c).
 *
 * Input: one document. When tg_json_loadb accepts it, the target checks that
 *   - plain jansson, when it accepts the document too, parses the same value (the
 *     rewrite of integers beyond int64 only ever runs on documents jansson refused);
 *   - tg_json_dumps writes it, the result parses again to an equal value (big numbers
 *     and reals read back exactly), and writing that again gives the same bytes;
 *   - a big number's marker never reaches the written text (a client string cannot
 *     hold its NUL, so the marker cannot be forged).
 */
#include "tollgate/tg_json.h"

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_json_numbers invariant failed: %s\n", what);
        abort();
    }
}

/* Whether the written text holds the escape \u0000tgbig: itself, not a client string's
 * escaped backslash followed by "u0000tgbig:" (written as \\u0000tgbig:, which is text,
 * not a NUL): the escape counts when an even number of backslashes stands before it. */
static int marker_in_text(const char *s) {
    for (const char *p = s; (p = strstr(p, "\\u0000tgbig:")) != NULL; p++) {
        size_t before = 0;
        while (p - before > s && p[-(ptrdiff_t)before - 1] == '\\')
            before++;
        if (before % 2 == 0)
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const size_t flags = JSON_DECODE_ANY | JSON_REJECT_DUPLICATES;
    json_error_t err;
    json_t *v = tg_json_loadb((const char *)data, size, flags, &err);
    if (!v)
        return 0;
    json_t *plain = json_loadb((const char *)data, size, flags, &err);
    check(!plain || json_equal(plain, v), "tg_json_loadb differs from jansson on a document both accept");
    json_decref(plain);
    char *s = tg_json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    check(s != NULL, "a parsed value cannot be written");
    check(!marker_in_text(s), "a big-number marker reached the text");
    json_t *w = tg_json_loadb(s, strlen(s), flags, &err);
    check(w != NULL, "the written text does not parse");
    check(json_equal(v, w), "the written text parses to another value");
    char *s2 = tg_json_dumps(w, JSON_COMPACT | JSON_ENCODE_ANY);
    check(s2 && !strcmp(s, s2), "writing again changes the bytes");
    free(s);
    free(s2);
    json_decref(v);
    json_decref(w);
    return 0;
}
