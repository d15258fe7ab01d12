/*
 * libFuzzer target for byte-level member edits (core/src/proto/tg_json.c).
 *
 * Input: one document. When jansson accepts it as an object (JSON_REJECT_DUPLICATES, as
 * the gateway parses request bodies), the members the gateway rewrites (model, the
 * output cap, stream_options) are set in the bytes, in a subset chosen by the first
 * byte, and the target checks that
 *   - the edit succeeds unless the document has a backslash (an escaped key may spell
 *     one of the keys differently, and the caller re-serialises instead);
 *   - jansson accepts the result, each set member has its new value, every other
 *     member is unchanged, and no member was added or lost.
 */
#include "tollgate/tg_json.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_json_members invariant failed: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const all_keys[] = {"model", "max_tokens", "stream_options"};
    static const char *const all_vals[] = {"\"mapped-model\"", "4096", "{\"include_usage\":true}"};
    if (size == 0)
        return 0;
    json_t *in = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(in)) {
        json_decref(in);
        return 0;
    }
    /* The first byte picks which members are set (it is '{' or whitespace in a valid
     * document, so its low bits vary with the input). */
    const char *keys[3], *vals[3];
    int n = 0;
    for (int k = 0; k < 3; k++)
        if (data[0] >> k & 1) {
            keys[n] = all_keys[k];
            vals[n++] = all_vals[k];
        }
    tg_buf_t out;
    tg_buf_init(&out);
    int rc = tg_json_set_members((const char *)data, size, keys, vals, n, &out);
    if (rc != TG_OK) {
        check(memchr(data, '\\', size) != NULL, "refused a document without an escape");
        tg_buf_free(&out);
        json_decref(in);
        return 0;
    }
    json_error_t err;
    json_t *res = json_loadb(out.data, out.len, JSON_REJECT_DUPLICATES, &err);
    check(json_is_object(res), "the result is not a JSON object jansson accepts");
    size_t expect = json_object_size(in);
    for (int k = 0; k < n; k++) {
        json_t *want = json_loads(vals[k], JSON_DECODE_ANY, NULL);
        check(json_equal(json_object_get(res, keys[k]), want), "a set member lacks its new value");
        json_decref(want);
        if (!json_object_get(in, keys[k]))
            expect++;
    }
    check(json_object_size(res) == expect, "members were added or lost");
    const char *key;
    json_t *v;
    json_object_foreach(in, key, v) {
        int set = 0;
        for (int k = 0; k < n; k++)
            set |= !strcmp(key, keys[k]);
        if (!set)
            check(json_equal(json_object_get(res, key), v), "a member that was not set changed");
    }
    json_decref(res);
    json_decref(in);
    tg_buf_free(&out);
    return 0;
}
