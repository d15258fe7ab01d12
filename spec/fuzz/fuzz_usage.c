/*
 * libFuzzer target for usage extraction (core/src/proto/tg_usage.c).
 *
 * Input: one JSON document (a response body or one event's data), read as every
 * protocol in turn. Beyond ASan/UBSan, the target checks that
 *   - the result is 1, 0 or TG_ERROR, and 0 or TG_ERROR leave the usage untouched;
 *   - a result of 1 sets at least one known bit, and every known count is >= 0;
 *   - merging the same document again changes nothing (fields overwrite, never add);
 *   - tg_usage_append_json renders valid JSON with the five keys;
 *   - on every document jansson accepts, the fast path (a structural scan, then only the
 *     usage object parsed) gives exactly what the full parse gives.
 */
#include "tollgate/tg_usage.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_usage invariant failed: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data;
    static const char *keys[] = {"input", "output", "cache_read", "cache_write", "reasoning"};
    for (int proto = TG_PROTO_OPENAI_CHAT; proto <= TG_PROTO_EMBEDDINGS; proto++) {
        tg_usage_t u = {.input = 11, .output = 22, .cache_read = 33, .cache_write = 44,
                        .reasoning = 55, .known = 0};
        tg_usage_t before = u;
        int rc = tg_usage_merge_json(&u, (tg_proto_t)proto, json, size);
        check(rc == 1 || rc == 0 || rc == TG_ERROR, "result out of range");
        if (rc != 1)
            check(memcmp(&u, &before, sizeof(u)) == 0, "usage changed without usage found");
        else
            check(u.known != 0, "usage found but nothing known");
        const int64_t *vals[] = {&u.input, &u.output, &u.cache_read, &u.cache_write,
                                 &u.reasoning};
        for (int i = 0; i < 5; i++)
            if (u.known & (1u << i))
                check(*vals[i] >= 0, "negative count");

        json_error_t jerr;
        json_t *whole = json_loadb(json, size, 0, &jerr);
        if (whole) {
            json_decref(whole);
            tg_usage_t ref = before;
            int ref_rc = tg_usage_merge_json_full(&ref, (tg_proto_t)proto, json, size);
            check(ref_rc == rc, "fast path and full parse disagree on the result");
            check(memcmp(&ref, &u, sizeof(u)) == 0, "fast path and full parse disagree on the usage");
        }

        tg_usage_t again = u;
        check(tg_usage_merge_json(&again, (tg_proto_t)proto, json, size) == rc,
              "second merge gave another result");
        check(memcmp(&again, &u, sizeof(u)) == 0, "second merge changed the usage");

        tg_buf_t b;
        tg_buf_init(&b);
        tg_usage_append_json(&u, &b);
        json_error_t err;
        json_t *doc = json_loadb(b.data, b.len, 0, &err);
        check(json_is_object(doc) && json_object_size(doc) == 5, "append_json not an object of 5");
        for (int i = 0; i < 5; i++) {
            json_t *v = json_object_get(doc, keys[i]);
            check((u.known & (1u << i)) ? json_is_integer(v) : json_is_null(v),
                  "append_json field does not match known bits");
        }
        json_decref(doc);
        tg_buf_free(&b);
    }
    return 0;
}
