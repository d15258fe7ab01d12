/*
 * libFuzzer target for the providers' models lists (tg_models_page in
 * core/src/proto/tg_models.c): what GET /v1/models reads from an upstream.
 *
 * Input: byte 0 picks the shape (OpenAI, Anthropic, Gemini, Azure, Bedrock, Vertex,
 * Bedrock's inference profiles); the
 * rest is the answer's body. Beyond ASan/UBSan, the target checks that a page is read
 * or refused whole (a refused page adds no entry), that every entry has a non-empty
 * string id and the fields the answer converts (created an integer, display_name and
 * owned_by strings), that a page brings at most TG_MODELS_PAGE_ENTRIES_MAX entries,
 * and that the next page's cursor is a NUL-terminated string within its bound.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_models.h"

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_models_list: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    tg_models_shape_t shape = (tg_models_shape_t)(data[0] % 7);
    char next[TG_MODELS_CURSOR_MAX];
    memset(next, 'x', sizeof(next));
    json_t *e = json_array();
    int ok = tg_models_page(shape, (const char *)data + 1, size - 1, 1750000000, e, next);
    check(memchr(next, '\0', sizeof(next)) != NULL, "the cursor is not terminated");
    if (!ok) {
        check(json_array_size(e) == 0, "a refused page added entries");
        check(next[0] == '\0', "a refused page has a cursor");
    }
    check(json_array_size(e) <= TG_MODELS_PAGE_ENTRIES_MAX, "too many entries from one page");
    json_t *m;
    size_t i;
    json_array_foreach(e, i, m) {
        const char *id = json_string_value(json_object_get(m, "id"));
        check(id && *id, "an entry without an id");
        check(json_is_integer(json_object_get(m, "created")), "an entry's created is not an integer");
        check(json_is_string(json_object_get(m, "display_name")) && json_is_string(json_object_get(m, "owned_by")),
              "an entry's display_name or owned_by is not a string");
    }
    json_decref(e);
    return 0;
}
