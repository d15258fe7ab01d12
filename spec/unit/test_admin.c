/*
 * Every route the admin API serves is documented in spec/openapi.yaml.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tg_test.h"
#include "tollgate/tg_admin.h"

#ifndef TG_SOURCE_DIR
#define TG_SOURCE_DIR "."
#endif

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    ASSERT(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ASSERT(fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

TG_TEST(admin, every_route_is_documented) {
    char *doc = slurp(TG_SOURCE_DIR "/spec/openapi.yaml");
    int n = 0;
    for (const char *const *r = tg_admin_routes; *r; r++, n++) {
        char method[16], path[256];
        ASSERT(sscanf(*r, "%15s %255s", method, path) == 2);
        const char *rel = path + strlen("/admin/api/v1");
        char key[300];
        snprintf(key, sizeof(key), "\n  %s:\n", rel);
        char *at = strstr(doc, key);
        if (!at) {
            fprintf(stderr, "route %s is not in spec/openapi.yaml\n", *r);
            ASSERT(at);
        }
        /* The method must appear under that path, before the next path. */
        char *next = strstr(at + strlen(key), "\n  /");
        for (char *m = method; *m; m++)
            *m = (char)(*m - 'A' + 'a');
        char mkey[32];
        snprintf(mkey, sizeof(mkey), "\n    %s:", method);
        char *found = strstr(at, mkey);
        if (!found || (next && found > next)) {
            fprintf(stderr, "method %s of %s is not in spec/openapi.yaml\n", method, path);
            ASSERT(0);
        }
    }
    ASSERT(n >= 30);
    free(doc);
}
