/*
 * Files embedded in the binary at build time (core/embed.cmake): the Lua half of the
 * plugin runtime. The table ends with an entry whose name is NULL.
 */
#ifndef TOLLGATE_TG_EMBED_H
#define TOLLGATE_TG_EMBED_H
#include <stddef.h>

typedef struct {
    const char *name; /* file name without directory or ".lua" */
    const char *data;
    size_t len;
} tg_embed_file_t;

extern const tg_embed_file_t tg_embedded_lua[];

#endif
