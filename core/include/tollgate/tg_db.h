/*
 * The command-line side of the database: `tollgate migrate` and `tollgate apply`. Both
 * use a plain blocking libpq connection (they are one-shot commands, not the gateway's
 * hot path, which uses tg_pg.c).
 */
#ifndef TOLLGATE_TG_DB_H
#define TOLLGATE_TG_DB_H

#include <libpq-fe.h>

#include "tollgate/tg_config.h"

/**
 * Applies the embedded sql/ migrations in order, each in its own transaction, recording
 * version, name and SHA-256 in schema_migrations. An applied migration whose file changed
 * is refused. Prints one line per applied migration to stdout. Returns 0, or TG_ERROR
 * with one line in err.
 */
int tg_db_migrate(PGconn *conn, char *err, size_t errlen);

/**
 * Upserts the tenants, groups, accounts, keys and prices described by the Lua file at
 * state_path, in one transaction, printing what changes ("+ create", "~ update: fields",
 * nothing for unchanged rows). With dry_run the transaction is rolled back. Returns 0 or
 * TG_ERROR with one line in err.
 */
int tg_db_apply(PGconn *conn, const tg_config_t *cfg, const char *state_path, int dry_run,
                char *err, size_t errlen);

/** `tollgate migrate|apply ...`: connects with cfg->pg_conninfo and runs the command. */
int tg_db_main(const char *cmd, const tg_config_t *cfg, int argc, char **argv);

#endif
