/*
 * The admin API's errors in words an operator can act on: a database refusal (unique,
 * foreign key, check, numeric overflow, unreadable input) becomes a sentence that says
 * what to do, with the field it concerns, instead of a constraint name.
 */
#ifndef TOLLGATE_TG_ADMIN_ERRORS_H
#define TOLLGATE_TG_ADMIN_ERRORS_H

#include <libpq-fe.h>

#include "tollgate/tg_server.h"

typedef struct {
    int status;        /* 400 or 409 */
    const char *code;  /* conflict, in_use, invalid_reference, invalid_value */
    const char *param; /* the request field it concerns, or NULL */
    char message[512];
} tg_admin_err_t;

/**
 * Maps a database error of an admin call on `resource` ("tenants", ...; NULL for other
 * routes) to a client error. `deleting`: the call was a DELETE. Returns 1 with *out
 * filled when the client can fix it, 0 when it is not the client's fault (the caller
 * answers 503 / 504).
 */
int tg_admin_pg_error(const PGresult *res, const char *resource, int deleting, tg_admin_err_t *out);

/**
 * Answers an admin error: {"error": {"message", "type", "code", "param"}} (the OpenAI
 * shape; "param" is the request field, or null). When param is NULL and the message
 * starts with `field "X"`, X is the param. Ends the request.
 */
void tg_admin_reply_error(tg_request_t *req, int status, const char *code, const char *param, const char *message);

#endif
