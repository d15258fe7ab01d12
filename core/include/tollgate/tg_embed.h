/*
 * Files embedded in the binary at build time (core/embed.cmake): the Lua half of the
 * plugin runtime, the SQL migrations and the Redis scripts. Each table ends with an entry whose name is NULL
 * and is sorted by name.
 */
#ifndef TOLLGATE_TG_EMBED_H
#define TOLLGATE_TG_EMBED_H
#include <stddef.h>

typedef struct {
    const char *name; /* file name without directory or ".lua" */
    const char *data;
    size_t len;
} tg_embed_file_t;

extern const tg_embed_file_t tg_embedded_lua[]; /* core/lua/NAME.lua, name without .lua */
extern const tg_embed_file_t tg_embedded_sql[]; /* sql/NNNN_name.sql, name with .sql */
extern const tg_embed_file_t tg_embedded_sql_functions[]; /* sql/functions/NAME.sql, name with .sql */
extern const tg_embed_file_t tg_embedded_redis[]; /* core/redis/NAME.lua (tg_scripts.h) */

#endif
