/*
 * The admin API of the policy workbench (tg_admin_policies.c): /admin/api/v1/policies
 * (list, read, upload, replay against a capture, shadow, promote, roll back) and
 * /admin/api/v1/policy-audit. Changes go to Postgres (sql/0013_policies.sql) and reach
 * every instance through the store (tg_policy_store.h).
 */
#ifndef TOLLGATE_TG_ADMIN_POLICIES_H
#define TOLLGATE_TG_ADMIN_POLICIES_H

#include "tollgate/tg_server.h"

typedef struct tg_polreq_s tg_polreq_t;

/**
 * Answers one request whose path's segments are seg[0..nseg) (seg[0] "policies" or
 * "policy-audit"), method m (HEAD as GET). What it keeps while it waits is in *slot,
 * for tg_admin_policies_abort.
 */
void tg_admin_policies_handle(tg_request_t *req, int m, char (*seg)[256], int nseg, const char *query,
                              tg_polreq_t **slot);
/** The request went away (or ended): stops what it waits for and frees it. NULL: nothing. */
void tg_admin_policies_abort(tg_polreq_t *p);

#endif
