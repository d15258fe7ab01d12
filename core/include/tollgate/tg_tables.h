/*
 * The tables an operator writes — tenants, users, groups, keys, accounts, prices — each
 * described once: its columns, their types, which are writable and when, which are
 * secret, what `tollgate apply` reads from a state file and what an absent field there
 * means. The admin API (tg_admin.c) and `tollgate apply` (tg_db.c) both take their
 * columns from here and check a value with tg_column_check, so both refuse the same
 * values with the same message.
 */
#ifndef TOLLGATE_TG_TABLES_H
#define TOLLGATE_TG_TABLES_H

#include <jansson.h>
#include <stddef.h>

#include "tollgate/tg_config.h"

typedef enum {
    TG_COL_ID,       /* the row's bigint id */
    TG_COL_REF,      /* a bigint id of another row */
    TG_COL_TEXT,     /* 1 to 4096 bytes, no control character; maybe one of `enums` */
    TG_COL_URL,      /* an http(s) URL with a host (an account's base_url) */
    TG_COL_SECRET,   /* text that is written, never read back (sealed) */
    TG_COL_INT,      /* 0 to 2^31 - 1 (counts, limits) */
    TG_COL_SINT,     /* -2^31 to 2^31 - 1 (an account's priority) */
    TG_COL_NUMERIC,  /* a non-negative decimal (multipliers) */
    TG_COL_MONEY,    /* 0 to TG_MONEY_BALANCE_MAX in whole nano-USD (balance, budget) */
    TG_COL_PRICE,    /* 0 to TG_MONEY_BALANCE_MAX, finer than nano-USD allowed (per million tokens) */
    TG_COL_TEXTARR,  /* a list of model names */
    TG_COL_CIDRARR,  /* a list of networks (checked as TG_COL_TEXTARR, stored as cidr[]) */
    TG_COL_JSONOBJ,  /* an object */
    TG_COL_MODEL_MAP, /* an object of model names to model names */
    TG_COL_PLUGINS,  /* a group's plugins: an object checked against the plugins' schemas */
    TG_COL_TIME,     /* a timestamp string */
    TG_COL_TZ,       /* an IANA time zone this system's database has (tg_valid_timezone) */
    TG_COL_PCTARR,   /* 1 to 10 percentages, integers 1 to 100 (a budget's alert thresholds) */
} tg_col_type_t;

/* Who may write a column: nobody (read-only), always, on create only, or write-only
 * (a secret: set, never shown). */
typedef enum { TG_COL_RO, TG_COL_RW, TG_COL_CREATE_ONLY, TG_COL_WO } tg_col_access_t;

typedef struct {
    const char *name;       /* the column, the admin API's member and the state file's field */
    tg_col_type_t type;
    tg_col_access_t access;
    int required;           /* on create */
    int nullable;
    const char *const *enums;
    int in_file;            /* read by `tollgate apply` from the state file */
    const char *file_default; /* apply: what an absent field means (the column's default), or NULL */
    const char *also;       /* on create the value is written to this column too */
} tg_column_t;

typedef struct {
    const char *name;       /* "keys": the admin API's path and the state file's section */
    const char *table;      /* "api_keys" */
    const char *id_col;     /* "id", or "model" for prices */
    int text_id;
    const tg_column_t *cols; /* ends with a NULL name */
    const char *extra_json; /* more json_build_object pairs of a row, may reference t.<col> */
} tg_table_t;

/** Every table, ending with a NULL name. */
extern const tg_table_t tg_tables[];

/** The table named `name` ("tenants", "keys", ...), or NULL. */
const tg_table_t *tg_table_find(const char *name);

/** The column `name` of t, or NULL. */
const tg_column_t *tg_table_column(const tg_table_t *t, const char *name);

/**
 * Checks value v of column c: null where the column allows it, its type and range, no
 * control character where it reaches a request or a log line, a URL or model names
 * where the column holds them, a group's plugins against their schemas (plugins may be
 * NULL to skip that). Returns 0, or -1 with one line in msg naming the field.
 */
int tg_column_check(const tg_column_t *c, const json_t *v, const tg_plugins_config_t *plugins, char *msg,
                    size_t msglen);

/** The message for a required column that is missing. */
void tg_column_missing(const tg_column_t *c, char *msg, size_t msglen);

/** Whether s is a plain decimal: an optional '-', digits, at most one '.'. */
int tg_decimal_plain(const char *s);

/** Whether decimal s has a non-zero digit past the 9th after the point: less than one
 *  nano-USD, which the live balance (integer nano-USD) cannot hold, so Postgres and
 *  Redis would disagree from then on. */
int tg_decimal_sub_nano(const char *s);

#endif
