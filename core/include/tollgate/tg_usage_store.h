/*
 * The usage store's upkeep (issue #18): `tollgate usage partitions|drop|rebuild`, a
 * one-shot command over the time partitions of the usage and ledger rows
 * (sql/0009_partitions.sql) and the hourly rollups (sql/0010_rollups.sql).
 */
#ifndef TOLLGATE_TG_USAGE_STORE_H
#define TOLLGATE_TG_USAGE_STORE_H

typedef struct {
    const char *pg_conninfo;
    int usage_retention_days;  /* 0: every usage day is kept */
    int ledger_retention_days; /* 0: every ledger month is kept */
    int dry_run;               /* drop: say what would go, drop nothing */
    int exact;                 /* partitions: count(*) each partition instead of the planner's estimate */
    const char *from, *to;     /* rebuild: the UTC days [from, to) (NULL: every day still in the partitions) */
} tg_usage_cmd_t;

/** `tollgate usage partitions`: the partitions of usage and ledger (made ahead first),
 *  each with its range, rows, size and what retention says of it. Exit 0/1. */
int tg_usage_partitions_main(const tg_usage_cmd_t *c);
/** `tollgate usage drop`: drops every partition retention allows, oldest first, each in
 *  its own transaction, its totals carried forward first. Exit 0/1. */
int tg_usage_drop_main(const tg_usage_cmd_t *c);
/** `tollgate usage rebuild`: recomputes the hourly rollups of [from, to) from the usage
 *  rows, one day per transaction. Exit 0/1. */
int tg_usage_rebuild_main(const tg_usage_cmd_t *c);

#endif
