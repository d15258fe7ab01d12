/*
 * The admin API's account extras (tg_admin.c routes to them): each account's "problem"
 * (why this gateway cannot use it, from the live account snapshot), and
 * POST /admin/api/v1/accounts/{id}/test, which sends one small request through one
 * account and reports its timing, the upstream's status and its error.
 */
#ifndef TOLLGATE_TG_ADMIN_ACCOUNTS_H
#define TOLLGATE_TG_ADMIN_ACCOUNTS_H

#include "tollgate/tg_server.h"

typedef struct tg_acctest_s tg_acctest_t;

/**
 * Starts a test of account `id` for req (its body: {} or {"model": "..."}). The test
 * answers req itself, now or later; while it runs, *slot holds it (for
 * tg_acctest_abort), and it sets *slot to NULL before it answers.
 */
void tg_acctest_start(tg_request_t *req, int64_t id, tg_acctest_t **slot);
/** The client went away: stops the test at once; nothing is answered. */
void tg_acctest_abort(tg_acctest_t *t);

/**
 * Adds "problem" (a sentence, or null) to each account of an admin answer: `json` is
 * one account object, or a list {"data": [accounts...], ...}. Returns a new string
 * (free it), or NULL when json is not one of those or there is no account snapshot.
 */
char *tg_admin_accounts_annotate(tg_request_t *req, const char *json, size_t n);

#endif
