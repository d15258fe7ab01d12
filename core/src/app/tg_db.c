/*
 * `tollgate migrate` and `tollgate apply` (see tg_db.h).
 *
 * apply reads a Lua file returning { tenants, groups, accounts, keys, prices } and
 * upserts each row by its natural key (a name; keys by tenant + name; prices by model)
 * in one transaction. The fields of an item and their checks are the columns of
 * tg_tables.c, which the admin API uses too: a value is refused by both with one message. Differences are found by Postgres itself (`col IS DISTINCT FROM
 * $n::type`), so "unchanged" means unchanged in the database's own types. Plain API
 * keys in the file are stored as SHA-256 only; account credentials are sealed with
 * AES-256-GCM. Applying the same file twice changes nothing and prints nothing but
 * the summary.
 */
#include "tollgate/tg_db.h"

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>

#include "tollgate/tg_crypto.h"
#include "tollgate/tg_redis.h"
#include "tollgate/tg_identity.h"
#include "tollgate/tg_embed.h"
#include "tollgate/tg_tables.h"

#define MIGRATION_LOCK 71770001

static int pg_fail(PGconn *c, PGresult *r, char *err, size_t errlen, const char *what) {
    snprintf(err, errlen, "%s: %s", what, r ? PQresultErrorMessage(r) : PQerrorMessage(c));
    size_t n = strlen(err);
    while (n && (err[n - 1] == '\n' || err[n - 1] == ' '))
        err[--n] = '\0';
    if (r)
        PQclear(r);
    return TG_ERROR;
}

static int exec_ok(PGconn *c, const char *sql, char *err, size_t errlen) {
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        return pg_fail(c, r, err, errlen, sql);
    PQclear(r);
    return TG_OK;
}

/* ---- migrate ------------------------------------------------------------------------ */

/* One embedded file in its own transaction, then `record` (with its parameters) in the same
 * one: a migration and its schema_migrations row, a function file and its checksum. */
static int apply_file(PGconn *c, const tg_embed_file_t *f, const char *what, const char *record, int nparams,
                      const char *const *params, char *err, size_t errlen) {
    tg_buf_t sql;
    tg_buf_init(&sql);
    tg_buf_appends(&sql, "BEGIN;\n");
    tg_buf_append(&sql, f->data, f->len);
    tg_buf_appends(&sql, "\n;");
    PGresult *r = PQexec(c, sql.data);
    tg_buf_free(&sql);
    if (PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK) {
        PQclear(r);
        r = PQexecParams(c, record, nparams, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(r) == PGRES_COMMAND_OK) {
            PQclear(r);
            return exec_ok(c, "COMMIT", err, errlen);
        }
    }
    pg_fail(c, r, err, errlen, what);
    PQclear(PQexec(c, "ROLLBACK"));
    return TG_ERROR;
}

/*
 * sql/functions/NAME.sql, after the numbered migrations: the functions that change
 * often (the settlement batch), each file CREATE OR REPLACE statements kept whole in
 * one place and edited in place. A file is applied again whenever its SHA-256 differs
 * from the one recorded in schema_functions, so a change is one diff of the function,
 * not a new migration restating all of it.
 */
static int apply_functions(PGconn *c, int *replaced, char *err, size_t errlen) {
    if (exec_ok(c,
                "CREATE TABLE IF NOT EXISTS schema_functions (name text PRIMARY KEY, checksum text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())",
                err, errlen))
        return TG_ERROR;
    for (const tg_embed_file_t *f = tg_embedded_sql_functions; f->name; f++) {
        char sum[65];
        tg_sha256_hex(f->data, f->len, sum);
        const char *p[2] = {f->name, sum};
        PGresult *r = PQexecParams(c, "SELECT 1 FROM schema_functions WHERE name = $1 AND checksum = $2", 2, NULL,
                                   p, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            return pg_fail(c, r, err, errlen, "migrate: functions");
        int current = PQntuples(r) == 1;
        PQclear(r);
        if (current)
            continue;
        char what[160];
        snprintf(what, sizeof(what), "migrate: functions/%s", f->name);
        if (apply_file(c, f, what,
                       "INSERT INTO schema_functions (name, checksum) VALUES ($1, $2) ON CONFLICT (name) "
                       "DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()",
                       2, p, err, errlen))
            return TG_ERROR;
        printf("applied functions/%s\n", f->name);
        (*replaced)++;
    }
    return TG_OK;
}

int tg_db_migrate(PGconn *c, char *err, size_t errlen) {
    if (exec_ok(c, "SET client_min_messages = warning", err, errlen) ||
        exec_ok(c, "SELECT pg_advisory_lock(71770001)", err, errlen) ||
        exec_ok(c,
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
                "name text NOT NULL, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
                err, errlen))
        return TG_ERROR;
    int rc = TG_OK, applied = 0;
    for (const tg_embed_file_t *f = tg_embedded_sql; f->name; f++) {
        int version = atoi(f->name);
        if (version <= 0) {
            snprintf(err, errlen, "migrate: %s: name must start with a number (NNNN_name.sql)", f->name);
            rc = TG_ERROR;
            break;
        }
        char sum[65], ver[16];
        tg_sha256_hex(f->data, f->len, sum);
        snprintf(ver, sizeof(ver), "%d", version);
        const char *p[1] = {ver};
        PGresult *r = PQexecParams(c, "SELECT checksum, name FROM schema_migrations WHERE version = $1", 1,
                                   NULL, p, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            rc = pg_fail(c, r, err, errlen, "migrate");
            break;
        }
        if (PQntuples(r) == 1) {
            if (strcmp(PQgetvalue(r, 0, 0), sum) != 0) {
                snprintf(err, errlen,
                         "migrate: %s was changed after it was applied (recorded checksum %.12s…, file %.12s…); "
                         "never edit a landed migration, add a new one",
                         f->name, PQgetvalue(r, 0, 0), sum);
                PQclear(r);
                rc = TG_ERROR;
                break;
            }
            PQclear(r);
            continue;
        }
        PQclear(r);
        char what[128];
        snprintf(what, sizeof(what), "migrate: %s", f->name);
        const char *ins[3] = {ver, f->name, sum};
        if (apply_file(c, f, what, "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)", 3,
                       ins, err, errlen)) {
            rc = TG_ERROR;
            break;
        }
        printf("applied %s\n", f->name);
        applied++;
    }
    int replaced = 0;
    if (rc == TG_OK)
        rc = apply_functions(c, &replaced, err, errlen);
    PQclear(PQexec(c, "SELECT pg_advisory_unlock(71770001)"));
    if (rc == TG_OK)
        printf("migrations up to date (%d applied now, %d of sql/functions/ replaced)\n", applied, replaced);
    return rc;
}

/* ---- apply: Lua values to SQL text ---------------------------------------------------- */

typedef struct {
    PGconn *c;
    lua_State *L;
    const tg_config_t *cfg;
    uint8_t key[32];
    int have_key;
    char *err;
    size_t errlen;
    int created, updated, unchanged;
    char where[160]; /* "tenants[2]" for messages */
} apply_t;

static int afail(apply_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int afail(apply_t *a, const char *fmt, ...) {
    int n = snprintf(a->err, a->errlen, "apply: %s: ", a->where);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < a->errlen)
        vsnprintf(a->err + n, a->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return TG_ERROR;
}

/* Converts the Lua value at the top of the stack to JSON (tables with 1..n keys become arrays). */
static json_t *lua_to_json(lua_State *L, int depth) {
    if (depth > 20)
        return NULL;
    switch (lua_type(L, -1)) {
    case LUA_TNIL:
        return json_null();
    case LUA_TBOOLEAN:
        return json_boolean(lua_toboolean(L, -1));
    case LUA_TNUMBER: {
        double d = lua_tonumber(L, -1);
        if (d == (double)(long long)d)
            return json_integer((long long)d);
        return json_real(d);
    }
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, -1, &n);
        return json_stringn(s, n);
    }
    case LUA_TTABLE: {
        size_t n = lua_objlen(L, -1);
        if (n > 0) {
            json_t *arr = json_array();
            for (size_t i = 1; i <= n; i++) {
                lua_rawgeti(L, -1, (int)i);
                json_t *v = lua_to_json(L, depth + 1);
                lua_pop(L, 1);
                if (!v) {
                    json_decref(arr);
                    return NULL;
                }
                json_array_append_new(arr, v);
            }
            return arr;
        }
        json_t *obj = json_object();
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            if (lua_type(L, -2) != LUA_TSTRING) {
                lua_pop(L, 2);
                json_decref(obj);
                return NULL;
            }
            json_t *v = lua_to_json(L, depth + 1);
            if (!v) {
                lua_pop(L, 2);
                json_decref(obj);
                return NULL;
            }
            json_object_set_new(obj, lua_tostring(L, -2), v);
            lua_pop(L, 1);
        }
        return obj;
    }
    default:
        return NULL;
    }
}

/* A Postgres array literal from a JSON array of strings. */
static void json_to_pgarray(const json_t *arr, tg_buf_t *out) {
    tg_buf_appends(out, "{");
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        if (json_is_integer(e)) { /* a budget's thresholds */
            tg_buf_printf(out, "%s%" JSON_INTEGER_FORMAT, i ? "," : "", json_integer_value(e));
            continue;
        }
        const char *s = json_string_value(e);
        size_t len = json_string_length(e);
        tg_buf_appends(out, i ? ",\"" : "\"");
        for (size_t k = 0; k < len; k++) {
            if (s[k] == '"' || s[k] == '\\')
                tg_buf_append(out, "\\", 1);
            tg_buf_append(out, &s[k], 1);
        }
        tg_buf_appends(out, "\"");
    }
    tg_buf_appends(out, "}");
}

/* The Postgres type a column's value is cast to. */
static const char *pgtype(tg_col_type_t t) {
    switch (t) {
    case TG_COL_INT:
    case TG_COL_SINT: return "integer";
    case TG_COL_ID:
    case TG_COL_REF: return "bigint";
    case TG_COL_NUMERIC:
    case TG_COL_MONEY:
    case TG_COL_PRICE: return "numeric";
    case TG_COL_TEXTARR: return "text[]";
    case TG_COL_CIDRARR: return "cidr[]";
    case TG_COL_JSONOBJ:
    case TG_COL_MODEL_MAP:
    case TG_COL_PLUGINS: return "jsonb";
    case TG_COL_TIME: return "timestamptz";
    case TG_COL_PCTARR: return "integer[]";
    default: return "text";
    }
}

/* The Lua value at the stack top as the JSON value of column c, checked as the admin
 * API checks it (tg_column_check): the same values are refused with the same message. */
static int read_value(apply_t *a, const tg_column_t *c, json_t **out) {
    json_t *v = lua_to_json(a->L, 0);
    *out = NULL;
    if (!v)
        return afail(a, "field \"%s\" must be a string, a number or a table of them", c->name);
    if ((c->type == TG_COL_TEXTARR || c->type == TG_COL_CIDRARR) && json_is_object(v) && !json_object_size(v)) {
        json_decref(v); /* {} in Lua is an empty list as well */
        v = json_array();
    }
    char msg[768];
    if (tg_column_check(c, v, &a->cfg->plugins, msg, sizeof(msg)) != 0) {
        /* As printable text: it may quote the very control character refused. */
        for (char *m = msg; *m; m++)
            if ((unsigned char)*m < 0x20 || *m == 0x7f)
                *m = '?';
        json_decref(v);
        return afail(a, "%s", msg);
    }
    *out = v;
    return TG_OK;
}

/* Reads column c of the item table at the stack top into *out as SQL text (NULL when
 * absent and without a default). */
static int read_field(apply_t *a, const tg_column_t *c, char **out) {
    lua_State *L = a->L;
    lua_getfield(L, -1, c->name);
    *out = NULL;
    json_t *v = NULL;
    int rc = TG_OK;
    if (lua_isnil(L, -1)) {
        if (c->file_default)
            *out = strdup(c->file_default);
    } else if ((rc = read_value(a, c, &v)) == TG_OK) {
        char tmp[400];
        tg_buf_t b;
        if (json_is_string(v)) {
            *out = strdup(json_string_value(v)); /* money as exact decimal text, e.g. "12.50" */
        } else if (json_is_integer(v)) {
            snprintf(tmp, sizeof(tmp), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
            *out = strdup(tmp);
        } else if (json_is_real(v)) {
            /* Money in plain decimals (not 1e+12). */
            snprintf(tmp, sizeof(tmp), c->type == TG_COL_MONEY || c->type == TG_COL_PRICE ? "%.10f" : "%.10g",
                     json_real_value(v));
            *out = strdup(tmp);
        } else if (json_is_array(v)) {
            tg_buf_init(&b);
            json_to_pgarray(v, &b);
            *out = b.data;
        } else {
            *out = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
        }
        json_decref(v);
    }
    lua_pop(L, 1);
    return rc;
}

/*
 * Upserts one row. cols[0..nkey) identify the row; the rest are compared and updated.
 * vals are text (NULL = SQL NULL). Returns the row id via *id_out.
 */
static int upsert(apply_t *a, const char *table, const char *label, const char *const *cols,
                  const char *const *types, const int *create_only, char *const *vals, int nkey, int ncols,
                  long long *id_out) {
    tg_buf_t q;
    tg_buf_init(&q);
    const char *params[64];
    int np = 0;
    tg_buf_appends(&q, "SELECT id");
    for (int i = nkey; i < ncols; i++) {
        if (create_only[i])
            continue;
        params[np++] = vals[i];
        tg_buf_printf(&q, ", (%s IS DISTINCT FROM $%d::%s)", cols[i], np, types[i]);
    }
    tg_buf_printf(&q, " FROM %s WHERE ", table);
    for (int i = 0; i < nkey; i++) {
        params[np++] = vals[i];
        tg_buf_printf(&q, "%s%s = $%d::%s", i ? " AND " : "", cols[i], np, types[i]);
    }
    PGresult *r = PQexecParams(a->c, q.data, np, NULL, params, NULL, NULL, 0);
    tg_buf_free(&q);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        return pg_fail(a->c, r, a->err, a->errlen, label);
    if (PQntuples(r) == 0) {
        PQclear(r);
        tg_buf_init(&q);
        tg_buf_printf(&q, "INSERT INTO %s (", table);
        for (int i = 0; i < ncols; i++)
            tg_buf_printf(&q, "%s%s", i ? ", " : "", cols[i]);
        tg_buf_appends(&q, ") VALUES (");
        np = 0;
        for (int i = 0; i < ncols; i++) {
            params[np++] = vals[i];
            /* Absent optional fields take the column default. */
            if (vals[i])
                tg_buf_printf(&q, "%s$%d::%s", i ? ", " : "", np, types[i]);
            else
                tg_buf_printf(&q, "%sDEFAULT", i ? ", " : "");
        }
        tg_buf_appends(&q, ") RETURNING id");
        /* Renumber: DEFAULT slots take no parameter. */
        const char *dense[64];
        int nd = 0;
        tg_buf_t q2;
        tg_buf_init(&q2);
        const char *s = q.data;
        while (*s) {
            if (*s == '$') {
                int idx = atoi(s + 1);
                dense[nd++] = params[idx - 1];
                tg_buf_printf(&q2, "$%d", nd);
                s++;
                while (*s >= '0' && *s <= '9')
                    s++;
            } else {
                tg_buf_append(&q2, s++, 1);
            }
        }
        r = PQexecParams(a->c, q2.data, nd, NULL, dense, NULL, NULL, 0);
        tg_buf_free(&q);
        tg_buf_free(&q2);
        if (PQresultStatus(r) != PGRES_TUPLES_OK)
            return pg_fail(a->c, r, a->err, a->errlen, label);
        *id_out = atoll(PQgetvalue(r, 0, 0));
        PQclear(r);
        printf("+ %s\n", label);
        a->created++;
        return 1;
    }
    *id_out = atoll(PQgetvalue(r, 0, 0));
    tg_buf_t changed, upd;
    tg_buf_init(&changed);
    tg_buf_init(&upd);
    tg_buf_printf(&upd, "UPDATE %s SET ", table);
    np = 0;
    int col = 1;
    for (int i = nkey; i < ncols; i++) {
        if (create_only[i])
            continue;
        if (PQgetvalue(r, 0, col++)[0] == 't') {
            params[np++] = vals[i];
            tg_buf_printf(&upd, "%s = $%d::%s, ", cols[i], np, types[i]);
            tg_buf_printf(&changed, "%s%s", changed.len ? ", " : "", cols[i]);
        }
    }
    PQclear(r);
    int rc = 0;
    if (changed.len) {
        char idbuf[32];
        snprintf(idbuf, sizeof(idbuf), "%lld", *id_out);
        params[np++] = idbuf;
        tg_buf_printf(&upd, "updated_at = now() WHERE id = $%d", np);
        r = PQexecParams(a->c, upd.data, np, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
            rc = pg_fail(a->c, r, a->err, a->errlen, label);
        } else {
            PQclear(r);
            printf("~ %s: %s\n", label, changed.data);
            a->updated++;
            rc = 2;
        }
    } else {
        a->unchanged++;
    }
    tg_buf_free(&changed);
    tg_buf_free(&upd);
    return rc;
}

/* Upserts every item of the state file's section of table t with the columns it reads
 * (tg_tables.c); `extra` adds or overrides columns per item (foreign keys, hashes, sealed
 * values), `extra_keys` are the other fields an item may have. */
typedef int (*extra_fn)(apply_t *a, const char **cols, const char **types, int *create_only, char **vals,
                        int *n, char *label, size_t labellen);

static int apply_section(apply_t *a, const char *section, int nkey, const char *const *extra_keys, extra_fn extra,
                         int (*after)(apply_t *a, long long id, int created)) {
    const tg_table_t *t = tg_table_find(section);
    lua_State *L = a->L;
    lua_getfield(L, -1, t->name);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return TG_OK;
    }
    snprintf(a->where, sizeof(a->where), "%s", t->name);
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        return afail(a, "must be a list of tables");
    }
    int rc = TG_OK;
    size_t count = lua_objlen(L, -1);
    for (size_t i = 1; i <= count && rc == TG_OK; i++) {
        lua_rawgeti(L, -1, (int)i);
        snprintf(a->where, sizeof(a->where), "%s[%zu]", t->name, i);
        if (!lua_istable(L, -1)) {
            rc = afail(a, "must be a table");
            lua_pop(L, 1);
            break;
        }
        /* Every field of the item must be known: a typo is refused, naming it. */
        lua_pushnil(L);
        while (rc == TG_OK && lua_next(L, -2)) {
            lua_pop(L, 1);
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            const tg_column_t *c = k ? tg_table_column(t, k) : NULL;
            int known = c && c->in_file;
            for (const char *const *e = extra_keys; k && e && *e && !known; e++)
                known = !strcmp(*e, k);
            if (!known) {
                rc = afail(a, "unknown field \"%s\"", k ? k : "?");
                lua_pop(L, 1);
                break;
            }
        }
        if (rc != TG_OK) {
            lua_pop(L, 1);
            break;
        }
        const char *cols[32];
        const char *types[32];
        int create_only[32];
        char *vals[32];
        int n = 0;
        for (const tg_column_t *c = t->cols; c->name && rc == TG_OK; c++) {
            if (!c->in_file)
                continue;
            cols[n] = c->name;
            types[n] = pgtype(c->type);
            create_only[n] = c->access == TG_COL_CREATE_ONLY;
            rc = read_field(a, c, &vals[n]);
            n++;
            if (rc == TG_OK && !vals[n - 1] && (n == 1 || c->required)) {
                char msg[128];
                tg_column_missing(c, msg, sizeof(msg));
                rc = afail(a, "%s", msg);
            }
            if (c->also) { /* a tenant's opening_balance */
                cols[n] = c->also;
                types[n] = types[n - 1];
                create_only[n] = 1;
                vals[n] = vals[n - 1] ? strdup(vals[n - 1]) : NULL;
                n++;
            }
        }
        char label[256];
        if (rc == TG_OK)
            snprintf(label, sizeof(label), "%s %s", t->table, vals[0]);
        if (rc == TG_OK && extra)
            rc = extra(a, cols, types, create_only, vals, &n, label, sizeof(label));
        long long id = 0;
        int res = 0;
        if (rc == TG_OK) {
            res = upsert(a, t->table, label, cols, types, create_only, vals, nkey, n, &id);
            if (res < 0)
                rc = TG_ERROR;
        }
        if (rc == TG_OK && after)
            rc = after(a, id, res == 1);
        for (int k = 0; k < n; k++)
            free(vals[k]);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return rc;
}

/* ---- apply: the sections ------------------------------------------------------------- */

static int tenant_after(apply_t *a, long long id, int created) {
    if (!created)
        return TG_OK;
    char idbuf[32];
    snprintf(idbuf, sizeof(idbuf), "%lld", id);
    const char *p[1] = {idbuf};
    PGresult *r = PQexecParams(a->c,
                               "INSERT INTO ledger (tenant_id, kind, amount, note) "
                               "SELECT id, 'opening', balance, 'tollgate apply' FROM tenants WHERE id = $1",
                               1, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        return pg_fail(a->c, r, a->err, a->errlen, "ledger");
    PQclear(r);
    return TG_OK;
}

static char *hex_bytea(const uint8_t *p, size_t n) {
    static const char hex[] = "0123456789abcdef";
    char *s = malloc(2 * n + 3);
    s[0] = '\\';
    s[1] = 'x';
    for (size_t i = 0; i < n; i++) {
        s[2 + 2 * i] = hex[p[i] >> 4];
        s[3 + 2 * i] = hex[p[i] & 15];
    }
    s[2 * n + 2] = '\0';
    return s;
}

/* The credential: compared by opening the stored value, written sealed. */
static int account_credential(apply_t *a, long long id_known, const char *name, char **sealed_out, int *changed) {
    lua_getfield(a->L, -1, "credential");
    *sealed_out = NULL;
    *changed = 0;
    if (lua_isnil(a->L, -1)) {
        lua_pop(a->L, 1);
        return TG_OK;
    }
    json_t *v;
    int rc = read_value(a, tg_table_column(tg_table_find("accounts"), "credential"), &v);
    lua_pop(a->L, 1);
    if (rc != TG_OK)
        return rc;
    {
        /* The identity, as the admin API checks it (tg_identity_check). */
        json_t *settings = NULL;
        lua_getfield(a->L, -1, "settings");
        if (!lua_isnil(a->L, -1) && read_value(a, tg_table_column(tg_table_find("accounts"), "settings"), &settings) != TG_OK) {
            lua_pop(a->L, 1);
            json_decref(v);
            return TG_ERROR;
        }
        lua_pop(a->L, 1);
        lua_getfield(a->L, -1, "provider");
        lua_getfield(a->L, -2, "auth");
        char pbuf[64], abuf[64], msg[512];
        snprintf(pbuf, sizeof(pbuf), "%s", lua_isstring(a->L, -2) ? lua_tostring(a->L, -2) : "");
        snprintf(abuf, sizeof(abuf), "%s", lua_isstring(a->L, -1) ? lua_tostring(a->L, -1) : "key");
        lua_pop(a->L, 2);
        json_t *none = json_object();
        const char *why = tg_identity_check(pbuf, abuf, json_string_value(v), json_string_length(v),
                                            settings ? settings : none, msg, sizeof(msg));
        json_decref(none);
        json_decref(settings);
        if (why) {
            json_decref(v);
            return afail(a, "%s", why);
        }
    }
    if (!a->have_key) {
        json_decref(v);
        return afail(a, "credential needs TOLLGATE_SECRET_KEY (or secret_key in the config) to be sealed");
    }
    size_t plen = json_string_length(v);
    const char *plain = json_string_value(v);
    const char *p[1] = {name};
    PGresult *r = PQexecParams(a->c, "SELECT credential FROM accounts WHERE name = $1", 1, NULL, p, NULL, NULL, 1);
    int same = 0;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
        tg_buf_t opened;
        tg_buf_init(&opened);
        if (tg_crypto_open(a->key, (const uint8_t *)PQgetvalue(r, 0, 0), (size_t)PQgetlength(r, 0, 0), &opened) == 0)
            same = opened.len == plen && memcmp(opened.data, plain, plen) == 0;
        tg_buf_free(&opened);
    }
    PQclear(r);
    TG_UNUSED(id_known);
    if (!same) {
        tg_buf_t sealed;
        tg_buf_init(&sealed);
        tg_crypto_seal(a->key, plain, plen, &sealed);
        *sealed_out = hex_bytea((const uint8_t *)sealed.data, sealed.len);
        tg_buf_free(&sealed);
        *changed = 1;
    }
    json_decref(v);
    return TG_OK;
}

static int account_after(apply_t *a, long long id, int created) {
    TG_UNUSED(created);
    char idbuf[32];
    snprintf(idbuf, sizeof(idbuf), "%lld", id);
    lua_getfield(a->L, -1, "name");
    char name[256];
    snprintf(name, sizeof(name), "%s", lua_tostring(a->L, -1));
    lua_pop(a->L, 1);
    char *sealed = NULL;
    int changed = 0;
    if (account_credential(a, id, name, &sealed, &changed) != TG_OK)
        return TG_ERROR;
    if (changed) {
        const char *p[2] = {sealed, idbuf};
        PGresult *r = PQexecParams(a->c, "UPDATE accounts SET credential = $1::bytea, updated_at = now() WHERE id = $2",
                                   2, NULL, p, NULL, NULL, 0);
        free(sealed);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            return pg_fail(a->c, r, a->err, a->errlen, "credential");
        PQclear(r);
        if (!created) {
            printf("~ accounts %s: credential\n", name);
            a->updated++;
        }
    }
    /* Group membership is replaced by the listed set. */
    lua_getfield(a->L, -1, "groups");
    if (lua_isnil(a->L, -1)) {
        lua_pop(a->L, 1);
        return TG_OK;
    }
    /* Group names, checked as the model lists are. */
    static const tg_column_t groups_col = {"groups", TG_COL_TEXTARR, TG_COL_RW, 0, 0, NULL, 1, NULL, NULL};
    json_t *names;
    int rc = read_value(a, &groups_col, &names);
    lua_pop(a->L, 1);
    if (rc != TG_OK)
        return rc;
    tg_buf_t arr;
    tg_buf_init(&arr);
    json_to_pgarray(names, &arr);
    json_decref(names);
    const char *p[2] = {idbuf, arr.data};
    PGresult *r = PQexecParams(a->c,
                               "SELECT count(*) FROM unnest($1::text[]) g(name) WHERE NOT EXISTS "
                               "(SELECT 1 FROM groups WHERE groups.name = g.name)",
                               1, NULL, p + 1, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        tg_buf_free(&arr);
        return pg_fail(a->c, r, a->err, a->errlen, "groups");
    }
    if (atoi(PQgetvalue(r, 0, 0)) > 0) {
        PQclear(r);
        tg_buf_free(&arr);
        return afail(a, "groups names a group that does not exist (define it under groups)");
    }
    PQclear(r);
    r = PQexecParams(a->c,
                     "WITH want AS (SELECT id FROM groups WHERE name = ANY($2::text[])), "
                     "del AS (DELETE FROM account_groups WHERE account_id = $1::bigint AND group_id NOT IN (SELECT id FROM want) RETURNING 1), "
                     "ins AS (INSERT INTO account_groups (account_id, group_id) SELECT $1::bigint, id FROM want "
                     "ON CONFLICT DO NOTHING RETURNING 1) "
                     "SELECT (SELECT count(*) FROM del) + (SELECT count(*) FROM ins)",
                     2, NULL, p, NULL, NULL, 0);
    tg_buf_free(&arr);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        return pg_fail(a->c, r, a->err, a->errlen, "account_groups");
    if (atoi(PQgetvalue(r, 0, 0)) > 0 && !created)
        printf("~ accounts %s: groups\n", name);
    PQclear(r);
    return TG_OK;
}

static int lookup_id(apply_t *a, const char *table, const char *name, char out[32]) {
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT id FROM %s WHERE name = $1", table);
    const char *p[1] = {name};
    PGresult *r = PQexecParams(a->c, sql, 1, NULL, p, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        return pg_fail(a->c, r, a->err, a->errlen, table);
    if (PQntuples(r) != 1) {
        PQclear(r);
        return afail(a, "%s \"%s\" does not exist", table, name);
    }
    snprintf(out, 32, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return TG_OK;
}

static int key_extra(apply_t *a, const char **cols, const char **types, int *create_only, char **vals, int *n,
                     char *label, size_t labellen) {
    lua_State *L = a->L;
    lua_getfield(L, -1, "tenant");
    if (lua_type(L, -1) != LUA_TSTRING) {
        lua_pop(L, 1);
        return afail(a, "tenant (a tenant name) is required");
    }
    char tenant_id[32], group_id[32];
    int rc = lookup_id(a, "tenants", lua_tostring(L, -1), tenant_id);
    snprintf(label, labellen, "api_keys %s/%s", lua_tostring(L, -1), vals[0]);
    lua_pop(L, 1);
    if (rc)
        return rc;
    /* The natural key is (tenant_id, name): move name after tenant_id. */
    memmove(cols + 1, cols, sizeof(*cols) * (size_t)*n);
    memmove(types + 1, types, sizeof(*types) * (size_t)*n);
    memmove(create_only + 1, create_only, sizeof(*create_only) * (size_t)*n);
    memmove(vals + 1, vals, sizeof(*vals) * (size_t)*n);
    cols[0] = "tenant_id";
    types[0] = "bigint";
    create_only[0] = 0;
    vals[0] = strdup(tenant_id);
    (*n)++;
    lua_getfield(L, -1, "group");
    if (lua_type(L, -1) == LUA_TSTRING) {
        rc = lookup_id(a, "groups", lua_tostring(L, -1), group_id);
        if (rc) {
            lua_pop(L, 1);
            return rc;
        }
        cols[*n] = "group_id";
        types[*n] = "bigint";
        create_only[*n] = 0;
        vals[(*n)++] = strdup(group_id);
    }
    lua_pop(L, 1);
    /* The key itself: a plain key (hashed here) or its SHA-256; set on creation only. */
    uint8_t digest[32];
    int have = 0;
    char prefix[16] = "";
    lua_getfield(L, -1, "key");
    if (lua_type(L, -1) == LUA_TSTRING) {
        size_t klen;
        const char *k = lua_tolstring(L, -1, &klen);
        if (klen < 16) {
            lua_pop(L, 1);
            return afail(a, "key must be at least 16 characters");
        }
        SHA256((const unsigned char *)k, klen, digest);
        snprintf(prefix, sizeof(prefix), "%.8s", k);
        have = 1;
    }
    lua_pop(L, 1);
    lua_getfield(L, -1, "key_sha256");
    if (!have && lua_type(L, -1) == LUA_TSTRING && lua_objlen(L, -1) == 64) {
        const char *h = lua_tostring(L, -1);
        for (int i = 0; i < 32; i++) {
            unsigned v;
            sscanf(h + 2 * i, "%2x", &v);
            digest[i] = (uint8_t)v;
        }
        snprintf(prefix, sizeof(prefix), "sha256:");
        have = 1;
    }
    lua_pop(L, 1);
    if (!have) {
        /* No key in the file: generate one when the key is created, never again. */
        const char *q[2] = {vals[0], vals[1]};
        PGresult *r = PQexecParams(a->c, "SELECT 1 FROM api_keys WHERE tenant_id = $1::bigint AND name = $2", 2,
                                   NULL, q, NULL, NULL, 0);
        int exists = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
        PQclear(r);
        if (exists) {
            memset(digest, 0, sizeof(digest));
            have = 1;
        }
    }
    if (!have) {
        char fresh[64];
        tg_crypto_new_api_key(fresh);
        SHA256((const unsigned char *)fresh, strlen(fresh), digest);
        snprintf(prefix, sizeof(prefix), "%.8s", fresh);
        printf("  new key for %s (shown once): %s\n", label, fresh);
    }
    cols[*n] = "key_hash";
    types[*n] = "bytea";
    create_only[*n] = 1;
    vals[(*n)++] = hex_bytea(digest, 32);
    cols[*n] = "prefix";
    types[*n] = "text";
    create_only[*n] = 1;
    vals[(*n)++] = strdup(prefix);
    return TG_OK;
}

/* A budget names its tenant ("tenant", required) and, for a key's or a user's budget,
 * "key" (a key name of that tenant) or "user" (a user's email in that tenant). */
static int budget_extra(apply_t *a, const char **cols, const char **types, int *create_only, char **vals, int *n,
                        char *label, size_t labellen) {
    lua_State *L = a->L;
    lua_getfield(L, -1, "tenant");
    if (lua_type(L, -1) != LUA_TSTRING) {
        lua_pop(L, 1);
        return afail(a, "tenant (a tenant name) is required");
    }
    char tenant_id[32], id[32];
    int rc = lookup_id(a, "tenants", lua_tostring(L, -1), tenant_id);
    lua_pop(L, 1);
    if (rc)
        return rc;
    cols[*n] = "tenant_id";
    types[*n] = "bigint";
    create_only[*n] = 1;
    vals[(*n)++] = strdup(tenant_id);
    static const char *const owners[][3] = {{"key", "api_keys", "name"}, {"user", "users", "email"}};
    for (int i = 0; i < 2; i++) {
        lua_getfield(L, -1, owners[i][0]);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            continue;
        }
        if (lua_type(L, -1) != LUA_TSTRING) {
            lua_pop(L, 1);
            return afail(a, "%s must be a %s of the tenant", owners[i][0], owners[i][2]);
        }
        char sql[128];
        snprintf(sql, sizeof(sql), "SELECT id FROM %s WHERE tenant_id = $1::bigint AND %s = $2", owners[i][1],
                 owners[i][2]);
        const char *q[2] = {tenant_id, lua_tostring(L, -1)};
        PGresult *r = PQexecParams(a->c, sql, 2, NULL, q, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            lua_pop(L, 1);
            return pg_fail(a->c, r, a->err, a->errlen, "budgets");
        }
        if (PQntuples(r) != 1) {
            PQclear(r);
            rc = afail(a, "%s \"%s\" does not exist in the tenant", owners[i][0], lua_tostring(L, -1));
            lua_pop(L, 1);
            return rc;
        }
        snprintf(id, sizeof(id), "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        lua_pop(L, 1);
        cols[*n] = i ? "user_id" : "api_key_id";
        types[*n] = "bigint";
        create_only[*n] = 1;
        vals[(*n)++] = strdup(id);
    }
    TG_UNUSED(label);
    TG_UNUSED(labellen);
    return TG_OK;
}

/* model_prices is keyed by model and has no id column: a thin wrapper. */
static int price_section(apply_t *a) {
    const tg_table_t *prices = tg_table_find("prices");
    lua_State *L = a->L;
    lua_getfield(L, -1, "prices");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return TG_OK;
    }
    size_t count = lua_istable(L, -1) ? lua_objlen(L, -1) : 0;
    int rc = TG_OK;
    for (size_t i = 1; i <= count && rc == TG_OK; i++) {
        lua_rawgeti(L, -1, (int)i);
        snprintf(a->where, sizeof(a->where), "prices[%zu]", i);
        /* model, input, output, cache_read, cache_write, reasoning */
        const tg_column_t *c = prices->cols;
        char *vals[6] = {0};
        for (int k = 0; k < 6 && rc == TG_OK; k++)
            rc = read_field(a, &c[k], &vals[k]);
        if (rc == TG_OK && !vals[0]) {
            char msg[128];
            tg_column_missing(&c[0], msg, sizeof(msg));
            rc = afail(a, "%s", msg);
        }
        if (rc == TG_OK) {
            const char *p[6];
            for (int k = 0; k < 6; k++)
                p[k] = vals[k];
            PGresult *r = PQexecParams(
                a->c,
                "WITH old AS (SELECT * FROM model_prices WHERE model = $1), "
                "up AS (INSERT INTO model_prices (model, input, output, cache_read, cache_write, reasoning) "
                "VALUES ($1, $2::numeric, $3::numeric, $4::numeric, $5::numeric, $6::numeric) "
                "ON CONFLICT (model) DO UPDATE SET input = EXCLUDED.input, output = EXCLUDED.output, "
                "cache_read = EXCLUDED.cache_read, cache_write = EXCLUDED.cache_write, reasoning = EXCLUDED.reasoning, "
                "updated_at = now() WHERE (model_prices.input, model_prices.output, model_prices.cache_read, "
                "model_prices.cache_write, model_prices.reasoning) IS DISTINCT FROM (EXCLUDED.input, EXCLUDED.output, "
                "EXCLUDED.cache_read, EXCLUDED.cache_write, EXCLUDED.reasoning) RETURNING 1) "
                "SELECT (SELECT count(*) FROM old), (SELECT count(*) FROM up)",
                6, NULL, p, NULL, NULL, 0);
            if (PQresultStatus(r) != PGRES_TUPLES_OK) {
                rc = pg_fail(a->c, r, a->err, a->errlen, "prices");
            } else {
                int existed = atoi(PQgetvalue(r, 0, 0)), wrote = atoi(PQgetvalue(r, 0, 1));
                if (!existed) {
                    printf("+ model_prices %s\n", vals[0]);
                    a->created++;
                } else if (wrote) {
                    printf("~ model_prices %s: prices\n", vals[0]);
                    a->updated++;
                } else {
                    a->unchanged++;
                }
                PQclear(r);
            }
        }
        for (int k = 0; k < 6; k++)
            free(vals[k]);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return rc;
}

static void publish_invalidation(const tg_config_t *cfg) {
    if (!cfg->redis_url)
        return;
    /* The workers' own setup (password, ACL user); on a cluster any node will do:
     * PUBLISH reaches every node's subscribers. */
    char err[400];
    redisContext *rc = tg_redis_connect_sync(cfg->redis_url, 1000, err, sizeof(err));
    if (rc && !rc->err) {
        redisReply *r = redisCommand(rc, "PUBLISH tollgate:invalidate *");
        if (r)
            freeReplyObject(r);
    } else {
        fprintf(stderr, "apply: warning: could not reach Redis to tell gateways to reload; they refresh within their cache TTL\n");
    }
    if (rc)
        redisFree(rc);
}

int tg_db_apply(PGconn *c, const tg_config_t *cfg, const char *state_path, int dry_run, char *err, size_t errlen) {
    apply_t a = {.c = c, .cfg = cfg, .err = err, .errlen = errlen};
    a.have_key = tg_crypto_key(cfg->secret_key, a.key) == TG_OK;
    a.L = luaL_newstate();
    luaL_openlibs(a.L);
    if (luaL_loadfile(a.L, state_path) != 0 || lua_pcall(a.L, 0, 1, 0) != 0) {
        snprintf(err, errlen, "apply: %s", lua_tostring(a.L, -1));
        lua_close(a.L);
        return TG_ERROR;
    }
    if (!lua_istable(a.L, -1)) {
        snprintf(err, errlen, "apply: %s must return a table", state_path);
        lua_close(a.L);
        return TG_ERROR;
    }
    static const char *const sections[] = {"tenants", "groups", "accounts", "keys", "prices", "budgets", NULL};
    lua_pushnil(a.L);
    while (lua_next(a.L, -2)) {
        lua_pop(a.L, 1);
        int ok = 0;
        for (const char *const *s = sections; *s; s++)
            ok |= lua_type(a.L, -1) == LUA_TSTRING && strcmp(*s, lua_tostring(a.L, -1)) == 0;
        if (!ok) {
            snprintf(err, errlen, "apply: unknown section \"%s\" (expected tenants, groups, accounts, keys, prices, budgets)",
                     lua_type(a.L, -1) == LUA_TSTRING ? lua_tostring(a.L, -1) : "?");
            lua_close(a.L);
            return TG_ERROR;
        }
    }
    int rc = exec_ok(c, "BEGIN", err, errlen);
    static const char *const account_keys[] = {"credential", "groups", NULL};
    static const char *const key_keys[] = {"tenant", "group", "key", "key_sha256", NULL};
    rc = rc ?: apply_section(&a, "tenants", 1, NULL, NULL, tenant_after);
    rc = rc ?: apply_section(&a, "groups", 1, NULL, NULL, NULL);
    rc = rc ?: apply_section(&a, "accounts", 1, account_keys, NULL, account_after);
    rc = rc ?: apply_section(&a, "keys", 2, key_keys, key_extra, NULL);
    rc = rc ?: price_section(&a);
    static const char *const budget_keys[] = {"tenant", "key", "user", NULL};
    rc = rc ?: apply_section(&a, "budgets", 1, budget_keys, budget_extra, NULL);
    if (rc != TG_OK || dry_run) {
        PQclear(PQexec(c, "ROLLBACK"));
    } else if (exec_ok(c, "COMMIT", err, errlen) != TG_OK) {
        rc = TG_ERROR;
    }
    lua_close(a.L);
    if (rc == TG_OK) {
        printf("%s: %d created, %d updated, %d unchanged\n", dry_run ? "dry run (nothing written)" : "applied",
               a.created, a.updated, a.unchanged);
        if (!dry_run && (a.created || a.updated))
            publish_invalidation(cfg);
    }
    return rc;
}

int tg_db_main(const char *cmd, const tg_config_t *cfg, int argc, char **argv) {
    if (!cfg->pg_conninfo) {
        fprintf(stderr,
                "%s: no database: set postgres in the config or TOLLGATE_PG (a libpq conninfo, e.g. "
                "\"host=/run/postgresql dbname=tollgate\")\n",
                cmd);
        return 2;
    }
    PGconn *c = PQconnectdb(cfg->pg_conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "%s: cannot connect to Postgres: %s", cmd, PQerrorMessage(c));
        PQfinish(c);
        return 1;
    }
    char err[1024];
    int rc;
    if (!strcmp(cmd, "migrate")) {
        rc = tg_db_migrate(c, err, sizeof(err));
    } else {
        const char *state = NULL;
        int dry = 0;
        for (int i = 2; i < argc; i++) {
            if (!strcmp(argv[i], "--dry-run"))
                dry = 1;
            else if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config"))
                i++;
            else
                state = argv[i];
        }
        if (!state) {
            fprintf(stderr, "apply: usage: tollgate apply -c CONFIG STATE.lua [--dry-run]\n");
            PQfinish(c);
            return 2;
        }
        rc = tg_db_apply(c, cfg, state, dry, err, sizeof(err));
    }
    PQfinish(c);
    if (rc != TG_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    return 0;
}
