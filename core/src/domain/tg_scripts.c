/*
 * The Redis scripts (see tg_scripts.h): each one assembled from its embedded file and
 * the fragments it includes, the first time it is asked for, then kept.
 */
#include "tollgate/tg_scripts.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_embed.h"

typedef struct script_s {
    const char *name;
    char *source;
    struct script_s *next;
} script_t;

static pthread_mutex_t scripts_mu = PTHREAD_MUTEX_INITIALIZER;
static script_t *scripts;

static const tg_embed_file_t *embedded(const char *name, size_t len) {
    for (const tg_embed_file_t *f = tg_embedded_redis; f->name; f++)
        if (strlen(f->name) == len && !memcmp(f->name, name, len))
            return f;
    fprintf(stderr, "tollgate: no Redis script core/redis/%.*s.lua in this build\n", (int)len, name);
    abort();
}

/* The file's text with each line "--@<fragment>", and for `variant` (NULL: none) each line
 * "--+<variant> <fragment>", replaced by that fragment's text. */
static char *assemble(const tg_embed_file_t *f, const char *variant) {
    size_t vlen = variant ? strlen(variant) : 0;
    tg_buf_t b;
    tg_buf_init(&b);
    const char *p = f->data, *end = f->data + f->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        if (eol - p > 3 && !memcmp(p, "--@", 3)) {
            const tg_embed_file_t *frag = embedded(p + 3, (size_t)(eol - p - 3));
            tg_buf_append(&b, frag->data, frag->len);
        } else if (vlen && (size_t)(eol - p) > 4 + vlen && !memcmp(p, "--+", 3) && !memcmp(p + 3, variant, vlen) &&
                   p[3 + vlen] == ' ') {
            const char *name = p + 4 + vlen;
            const tg_embed_file_t *frag = embedded(name, (size_t)(eol - name));
            tg_buf_append(&b, frag->data, frag->len);
        } else {
            tg_buf_append(&b, p, (size_t)(eol - p));
            tg_buf_appends(&b, "\n");
        }
        p = nl ? nl + 1 : end;
    }
    char *s = strndup(b.data ? b.data : "", b.len);
    tg_buf_free(&b);
    if (!s)
        abort();
    return s;
}

const char *tg_scripts_source(const char *name) {
    pthread_mutex_lock(&scripts_mu);
    script_t *s = scripts;
    while (s && strcmp(s->name, name))
        s = s->next;
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s)
            abort();
        const char *plus = strchr(name, '+');
        const tg_embed_file_t *f = embedded(name, plus ? (size_t)(plus - name) : strlen(name));
        if (!(s->name = strdup(name)))
            abort();
        s->source = assemble(f, plus ? plus + 1 : NULL);
        s->next = scripts;
        scripts = s;
    }
    pthread_mutex_unlock(&scripts_mu);
    return s->source;
}
