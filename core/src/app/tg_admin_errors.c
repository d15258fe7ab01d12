/*
 * Database refusals of admin calls in plain words (see tg_admin_errors.h). The
 * constraints are those of the sql/ migrations, by the names Postgres gives them
 * (<table>_<column>_key / _fkey / _check, <table>_pkey).
 */
#include "tollgate/tg_admin_errors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_money.h"

typedef struct {
    const char *constraint;
    int status;
    const char *code;
    const char *param;
    const char *message;
} known_t;

static const known_t known[] = {
    {"tenants_name_key", 409, "conflict", "name", "A tenant with this name already exists: pick another name."},
    {"groups_name_key", 409, "conflict", "name", "A group with this name already exists: pick another name."},
    {"accounts_name_key", 409, "conflict", "name", "An account with this name already exists: pick another name."},
    {"model_prices_pkey", 409, "conflict", "model", "This model already has a price: edit that one instead."},
    {"users_tenant_id_email_key", 409, "conflict", "email", "This tenant already has a user with this email."},
    {"tenants_name_check", 400, "invalid_value", "name", "A name is 1 to 200 characters."},
    {"groups_name_check", 400, "invalid_value", "name", "A name is 1 to 200 characters."},
    {"accounts_name_check", 400, "invalid_value", "name", "A name is 1 to 200 characters."},
    {"model_prices_model_check", 400, "invalid_value", "model", "A model name is 1 to 200 characters."},
    {"users_email_check", 400, "invalid_value", "email", "An email is 3 to 320 characters."},
    {"api_keys_tenant_id_fkey", 400, "invalid_reference", "tenant_id",
     "No tenant has this id (any more): pick an existing tenant."},
    {"users_tenant_id_fkey", 400, "invalid_reference", "tenant_id",
     "No tenant has this id (any more): pick an existing tenant."},
    {"api_keys_group_id_fkey", 400, "invalid_reference", "group_id",
     "No group has this id (any more): pick an existing group, or none."},
    {"api_keys_user_id_fkey", 400, "invalid_reference", "user_id", "No user has this id (any more)."},
    {"account_groups_group_id_fkey", 400, "invalid_reference", "groups",
     "One of the groups does not exist (any more): reload and tick existing groups."},
    {"budgets_name_key", 409, "conflict", "name", "A budget with this name already exists: pick another name."},
    {"budgets_name_check", 400, "invalid_value", "name", "A name is 1 to 200 characters."},
    {"budgets_owner_check", 400, "invalid_value", "tenant_id",
     "A budget belongs to a tenant (tenant_id), a key (api_key_id) or a user (user_id): give one."},
    {"budgets_tenant_check", 400, "invalid_value", "tenant_id",
     "The key or user belongs to another tenant: leave tenant_id out, or give theirs."},
    {"budgets_scope_check", 400, "invalid_value", "api_key_id",
     "A budget is a key's (api_key_id) or a user's (user_id), not both."},
    {"budgets_period_hours_check", 400, "invalid_value", "period_hours",
     "period_hours is from 1 to 8784 (a year)."},
    {"budgets_period_hours_check2", 400, "invalid_value", "period_hours",
     "period \"hours\" needs period_hours (the window, 1 to 8784); day, week and month take none."},
    {"budgets_amount_check", 400, "invalid_value", "amount",
     "An amount is from 0 to " TG_MONEY_BALANCE_MAX_TEXT " USD."},
    {"budgets_tenant_id_fkey", 400, "invalid_reference", "tenant_id", "No tenant has this id (any more)."},
    {"budgets_api_key_id_fkey", 400, "invalid_reference", "api_key_id", "No key has this id (any more)."},
    {"budgets_user_id_fkey", 400, "invalid_reference", "user_id", "No user has this id (any more)."},
    {NULL, 0, NULL, NULL, NULL},
};

/* The numeric column of a resource that Postgres' "numeric field overflow" is about (the
 * money columns are range-checked before they reach the database). */
static void overflow(const char *resource, tg_admin_err_t *out) {
    out->status = 400;
    out->code = "invalid_value";
    if (resource && !strcmp(resource, "groups")) {
        out->param = "rate_multiplier";
        snprintf(out->message, sizeof(out->message),
                 "The rate multiplier must be below 1000000, with at most 6 decimal places.");
    } else if (resource && !strcmp(resource, "accounts")) {
        out->param = "cost_multiplier";
        snprintf(out->message, sizeof(out->message),
                 "The cost multiplier must be below 1000000, with at most 6 decimal places.");
    } else {
        snprintf(out->message, sizeof(out->message),
                 "A number is larger than the database holds: amounts are at most " TG_MONEY_BALANCE_MAX_TEXT
                 " USD, prices below 10000000000 USD per million tokens.");
    }
}

int tg_admin_pg_error(const PGresult *res, const char *resource, int deleting, tg_admin_err_t *out) {
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *constraint = res ? PQresultErrorField(res, PG_DIAG_CONSTRAINT_NAME) : NULL;
    const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    memset(out, 0, sizeof(*out));
    if (!state || (strncmp(state, "22", 2) && strncmp(state, "23", 2)))
        return 0;
    if (!strcmp(state, "23503") && deleting) {
        /* Something still refers to the row: for a tenant, its billing history. */
        out->status = 409;
        out->code = "in_use";
        if (resource && !strcmp(resource, "tenants"))
            snprintf(out->message, sizeof(out->message),
                     "This tenant has billed usage or ledger entries, which must stay complete, so it cannot be "
                     "deleted: suspend it instead (status \"suspended\"); its keys then stop working.");
        else
            snprintf(out->message, sizeof(out->message),
                     "It is still referred to by billing history, so it cannot be deleted: disable or revoke it "
                     "instead.");
        return 1;
    }
    for (const known_t *k = known; constraint && k->constraint; k++)
        if (!strcmp(k->constraint, constraint)) {
            out->status = k->status;
            out->code = k->code;
            out->param = k->param;
            snprintf(out->message, sizeof(out->message), "%s", k->message);
            return 1;
        }
    if (!strcmp(state, "22003")) {
        overflow(resource, out);
        return 1;
    }
    out->status = !strcmp(state, "23505") ? 409 : 400;
    out->code = !strcmp(state, "23505") ? "conflict" : !strcmp(state, "23503") ? "invalid_reference" : "invalid_value";
    if (!strncmp(state, "22", 2) && primary && strstr(primary, "time")) {
        out->param = resource && !strcmp(resource, "keys") ? "expires_at" : NULL;
        snprintf(out->message, sizeof(out->message),
                 "A date is not in a form the database reads: use ISO 8601, e.g. 2026-12-31T23:59:00Z.");
    } else if (!strncmp(state, "22", 2) && primary && (strstr(primary, "cidr") || strstr(primary, "inet"))) {
        out->param = "ip_allow";
        snprintf(out->message, sizeof(out->message),
                 "Each allowed IP is an address or a CIDR range, e.g. 203.0.113.7 or 10.0.0.0/8.");
    } else {
        /* A refusal this table does not know yet: Postgres' own words, still a 4xx. */
        snprintf(out->message, sizeof(out->message), "The database refused the values: %s.",
                 primary ? primary : "no reason given");
    }
    return 1;
}

void tg_admin_reply_error(tg_request_t *req, int status, const char *code, const char *param, const char *message) {
    char field[64] = "";
    if (!param && !strncmp(message, "field \"", 7)) {
        const char *end = strchr(message + 7, '"');
        if (end && (size_t)(end - message - 7) < sizeof(field)) {
            memcpy(field, message + 7, (size_t)(end - message - 7));
            field[end - message - 7] = '\0';
            param = field;
        }
    }
    json_t *e = json_pack("{s:s, s:s, s:s, s:o}", "message", message, "type",
                          status >= 500 ? "server_error" : "invalid_request_error", "code", code, "param",
                          param ? json_string(param) : json_null());
    json_t *j = json_pack("{s:o}", "error", e);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (s)
        tg_response_send(req, status, "application/json", "Cache-Control: no-store\r\n", s, strlen(s));
    else
        tg_response_error(req, status, status >= 500 ? "server_error" : "invalid_request_error", code, message);
    free(s);
}
