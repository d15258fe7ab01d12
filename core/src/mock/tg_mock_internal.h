/*
 * The mock upstream's parts (tg_mock.c is the server; tg_mock_identity.c the token
 * endpoints and the access tokens they issue). Not a public API.
 */
#ifndef TOLLGATE_TG_MOCK_INTERNAL_H
#define TOLLGATE_TG_MOCK_INTERNAL_H

#include <stddef.h>

#include "tollgate/tg_common.h"

/** 1 if the path is a token endpoint (".../token": Entra's /<tenant>/oauth2/v2.0/token,
 *  Google's /token, any OAuth server's). */
int tg_mock_id_is_token_path(const char *path, size_t n);
/** Answers a token request (a form body): the status, and the JSON body in out. */
int tg_mock_id_token(const char *path, size_t plen, const char *body, size_t blen, tg_buf_t *out);
/** POST /_mock/identity: the issuer's configuration; NULL or why not. */
const char *tg_mock_id_config(const char *body, size_t len);
/** GET /_mock/identity: its counts. */
void tg_mock_id_stats(tg_buf_t *out);
/** POST /_mock/reset: forgets the configuration, the tokens and the counts. */
void tg_mock_id_reset(void);
/** An access token presented to an API route: NULL if it may pass (a token this mock
 *  did not issue is not its business: "mt-" tokens only), else why it is refused. */
const char *tg_mock_id_check(const char *tok, size_t n);

#endif
