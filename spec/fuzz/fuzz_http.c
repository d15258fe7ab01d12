/*
 * libFuzzer target for the client-facing HTTP/1.1 request path (core/src/http/tg_server.c):
 * llhttp in strict mode plus our header collection, size limits, pipelining and the
 * pause/resume across requests. The input is fed in two pieces (the split chosen by its
 * first byte) and parsed with small limits so the 431/413 paths are reached often.
 * Invariants: no crash or sanitizer report, and the result is one of the documented
 * codes (a request count >= 0, or -1/-2/-3).
 */
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int r = tg_http_parse_for_fuzz((const char *)data, size, 2048, 4096);
    if (r < -3 || r > (int)size) {
        fprintf(stderr, "fuzz_http: impossible result %d\n", r);
        abort();
    }
    return 0;
}
