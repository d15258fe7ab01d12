/*
 * libFuzzer target for request translation (core/src/proto/tg_translate*.c).
 *
 * Input: one JSON document, taken as a client request of every protocol and translated
 * to every protocol (embeddings included). Beyond ASan/UBSan, the target checks that
 *   - the result is TG_OK with a JSON object whose "model" is the one asked for, or
 *     TG_ERROR with no output and a non-empty message;
 *   - the client's body is never modified (the gateway keeps using it);
 *   - a translated body can itself be translated back and estimated without harm;
 *   - tg_estimate_tokens is >= 1 for an object and TG_ERROR otherwise.
 */
#include "tollgate/tg_translate.h"

#include <stdio.h>
#include <stdlib.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_translate_request invariant failed: %s\n", what);
        abort();
    }
}

static void translate(tg_proto_t from, tg_proto_t to, const json_t *body, int depth) {
    json_t *out = NULL;
    char err[256];
    err[0] = 'x';
    int rc = tg_translate_request(from, to, body, "fuzz-model", &out, err, sizeof(err));
    check(rc == TG_OK || rc == TG_ERROR, "result out of range");
    if (rc == TG_ERROR) {
        check(out == NULL, "output on error");
        check(err[0] != '\0' && memchr(err, '\0', sizeof(err)) != NULL, "empty or unterminated message");
        return;
    }
    check(json_is_object(out), "output not an object");
    const char *m = json_string_value(json_object_get(out, "model"));
    check(m && !strcmp(m, "fuzz-model"), "model not set");
    char *s = json_dumps(out, JSON_COMPACT);
    check(s != NULL, "output does not serialize");
    free(s);
    check(tg_estimate_tokens(to, out) >= 1, "estimate of the output < 1");
    if (depth == 0 && from != to) {
        json_t *copy = json_deep_copy(out);
        translate(to, from, out, 1);
        check(json_equal(copy, out), "the translated body was modified by translating it back");
        json_decref(copy);
    }
    json_decref(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t jerr;
    json_t *body = json_loadb((const char *)data, size, JSON_DECODE_ANY, &jerr);
    if (!body)
        return 0;
    json_t *before = json_deep_copy(body);
    int64_t est = tg_estimate_tokens(TG_PROTO_OPENAI_CHAT, body);
    check(json_is_object(body) ? est >= 1 : est == TG_ERROR, "estimate out of range");
    for (int from = 0; from < 4; from++)
        for (int to = 0; to < 4; to++)
            translate((tg_proto_t)from, (tg_proto_t)to, body, 0);
    check(json_equal(before, body), "the client body was modified");
    json_decref(before);
    json_decref(body);
    return 0;
}
