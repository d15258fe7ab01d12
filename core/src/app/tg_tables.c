/*
 * The tables an operator writes, described once (see tg_tables.h): the admin API and
 * `tollgate apply` take their columns and their checks from here.
 */
#include "tollgate/tg_tables.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_money.h"
#include "tollgate/tg_plugin.h"
#include "tollgate/tg_valid.h"

static const char *const status_active_suspended[] = {"active", "suspended", NULL};
static const char *const status_active_revoked[] = {"active", "revoked", NULL};
static const char *const status_active_disabled[] = {"active", "disabled", NULL};
static const char *const roles[] = {"owner", "admin", "member", NULL};
static const char *const providers[] = {"openai", "anthropic", "gemini", "azure", "bedrock", "vertex", NULL};
static const char *const auths[] = {"key", "entra", "service_account", "oauth", NULL};
static const char *const kinds[] = {"metered", "subscription", NULL};

/* In the order of the admin API's answers; a state file's item is keyed by its first
 * in_file column. */
static const tg_column_t tenant_cols[] = {
    {"id", TG_COL_ID, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"name", TG_COL_TEXT, TG_COL_RW, 1, 0, NULL, 1, NULL, NULL},
    {"balance", TG_COL_MONEY, TG_COL_CREATE_ONLY, 0, 0, NULL, 1, NULL, "opening_balance"},
    {"budget", TG_COL_MONEY, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"spend", TG_COL_NUMERIC, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"status", TG_COL_TEXT, TG_COL_RW, 0, 0, status_active_suspended, 1, "active", NULL},
    {"rpm", TG_COL_INT, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"rpm_burst", TG_COL_INT, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"tpm", TG_COL_INT, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"concurrency", TG_COL_INT, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"created_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"updated_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, 0, NULL, NULL},
};

static const tg_column_t user_cols[] = {
    {"id", TG_COL_ID, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"tenant_id", TG_COL_REF, TG_COL_CREATE_ONLY, 1, 0, NULL, 0, NULL, NULL},
    {"email", TG_COL_TEXT, TG_COL_RW, 1, 0, NULL, 0, NULL, NULL},
    {"name", TG_COL_TEXT, TG_COL_RW, 0, 1, NULL, 0, NULL, NULL},
    {"role", TG_COL_TEXT, TG_COL_RW, 0, 0, roles, 0, NULL, NULL},
    {"created_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"updated_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, 0, NULL, NULL},
};

static const tg_column_t group_cols[] = {
    {"id", TG_COL_ID, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"name", TG_COL_TEXT, TG_COL_RW, 1, 0, NULL, 1, NULL, NULL},
    {"models", TG_COL_TEXTARR, TG_COL_RW, 0, 0, NULL, 1, "{}", NULL},
    {"rate_multiplier", TG_COL_NUMERIC, TG_COL_RW, 0, 0, NULL, 1, "1", NULL},
    {"plugins", TG_COL_PLUGINS, TG_COL_RW, 0, 0, NULL, 1, "{}", NULL},
    {"created_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"updated_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, 0, NULL, NULL},
};

/* A state file names a key's tenant and group ("tenant", "group") and gives the key
 * itself ("key", "key_sha256"): tg_db.c resolves those. */
static const tg_column_t key_cols[] = {
    {"id", TG_COL_ID, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"tenant_id", TG_COL_REF, TG_COL_CREATE_ONLY, 1, 0, NULL, 0, NULL, NULL},
    {"user_id", TG_COL_REF, TG_COL_RW, 0, 1, NULL, 0, NULL, NULL},
    {"group_id", TG_COL_REF, TG_COL_RW, 0, 1, NULL, 0, NULL, NULL},
    {"name", TG_COL_TEXT, TG_COL_RW, 0, 0, NULL, 1, NULL, NULL},
    {"prefix", TG_COL_TEXT, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"status", TG_COL_TEXT, TG_COL_RW, 0, 0, status_active_revoked, 1, "active", NULL},
    {"expires_at", TG_COL_TIME, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"allowed_models", TG_COL_TEXTARR, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"ip_allow", TG_COL_CIDRARR, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"rpm", TG_COL_INT, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"rpm_burst", TG_COL_INT, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"tpm", TG_COL_INT, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"concurrency", TG_COL_INT, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"budget", TG_COL_MONEY, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"spend", TG_COL_NUMERIC, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"created_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"updated_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, 0, NULL, NULL},
};

/* The credential is sealed before it is written (tg_crypto_seal) and never shown; a
 * state file's account lists its groups by name ("groups"). cooldown_until and
 * reset_at are the gateway's own (account health): apply leaves them alone. */
static const tg_column_t account_cols[] = {
    {"id", TG_COL_ID, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"name", TG_COL_TEXT, TG_COL_RW, 1, 0, NULL, 1, NULL, NULL},
    {"provider", TG_COL_TEXT, TG_COL_RW, 1, 0, providers, 1, NULL, NULL},
    {"base_url", TG_COL_URL, TG_COL_RW, 1, 0, NULL, 1, NULL, NULL},
    {"credential", TG_COL_SECRET, TG_COL_WO, 0, 1, NULL, 0, NULL, NULL},
    {"auth", TG_COL_TEXT, TG_COL_RW, 0, 0, auths, 1, "key", NULL},
    {"kind", TG_COL_TEXT, TG_COL_RW, 0, 0, kinds, 1, "metered", NULL},
    {"concurrency", TG_COL_INT, TG_COL_RW, 0, 0, NULL, 1, "16", NULL},
    {"priority", TG_COL_SINT, TG_COL_RW, 0, 0, NULL, 1, "0", NULL},
    {"weight", TG_COL_INT, TG_COL_RW, 0, 0, NULL, 1, "100", NULL},
    {"models", TG_COL_TEXTARR, TG_COL_RW, 0, 0, NULL, 1, "{}", NULL},
    {"model_map", TG_COL_MODEL_MAP, TG_COL_RW, 0, 0, NULL, 1, "{}", NULL},
    {"settings", TG_COL_MODEL_MAP, TG_COL_RW, 0, 0, NULL, 1, "{}", NULL},
    {"cost_multiplier", TG_COL_NUMERIC, TG_COL_RW, 0, 0, NULL, 1, "1", NULL},
    {"status", TG_COL_TEXT, TG_COL_RW, 0, 0, status_active_disabled, 1, "active", NULL},
    {"cooldown_until", TG_COL_TIME, TG_COL_RW, 0, 1, NULL, 0, NULL, NULL},
    {"reset_at", TG_COL_TIME, TG_COL_RW, 0, 1, NULL, 0, NULL, NULL},
    {"token_expires_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"token_refreshed_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"auth_error", TG_COL_TEXT, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"auth_error_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"created_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"updated_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, 0, NULL, NULL},
};

static const tg_column_t price_cols[] = {
    {"model", TG_COL_TEXT, TG_COL_CREATE_ONLY, 1, 0, NULL, 1, NULL, NULL},
    {"input", TG_COL_PRICE, TG_COL_RW, 0, 0, NULL, 1, "0", NULL},
    {"output", TG_COL_PRICE, TG_COL_RW, 0, 0, NULL, 1, "0", NULL},
    {"cache_read", TG_COL_PRICE, TG_COL_RW, 0, 0, NULL, 1, "0", NULL},
    {"cache_write", TG_COL_PRICE, TG_COL_RW, 0, 0, NULL, 1, "0", NULL},
    {"reasoning", TG_COL_PRICE, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"updated_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, 0, NULL, NULL},
};

/* Periodic budgets (tg_budgets.h, 0008_budgets.sql). A budget is the tenant's, or with
 * api_key_id one key's, or with user_id every key of that user (the tenant is then
 * theirs: tenant_id may be left out). A state file names them: "tenant" (required),
 * "key" (a key name of that tenant), "user" (a user's email in that tenant). */
static const char *const budget_periods[] = {"day", "week", "month", "hours", NULL};
static const tg_column_t budget_cols[] = {
    {"id", TG_COL_ID, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"name", TG_COL_TEXT, TG_COL_RW, 1, 0, NULL, 1, NULL, NULL},
    {"tenant_id", TG_COL_REF, TG_COL_CREATE_ONLY, 0, 0, NULL, 0, NULL, NULL},
    {"api_key_id", TG_COL_REF, TG_COL_CREATE_ONLY, 0, 1, NULL, 0, NULL, NULL},
    {"user_id", TG_COL_REF, TG_COL_CREATE_ONLY, 0, 1, NULL, 0, NULL, NULL},
    {"amount", TG_COL_MONEY, TG_COL_RW, 1, 0, NULL, 1, NULL, NULL},
    {"period", TG_COL_TEXT, TG_COL_RW, 1, 0, budget_periods, 1, NULL, NULL},
    {"period_hours", TG_COL_INT, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"timezone", TG_COL_TZ, TG_COL_RW, 0, 0, NULL, 1, "UTC", NULL},
    {"thresholds", TG_COL_PCTARR, TG_COL_RW, 0, 0, NULL, 1, "{50,80,100}", NULL},
    {"webhook_url", TG_COL_URL, TG_COL_RW, 0, 1, NULL, 1, NULL, NULL},
    {"webhook_secret", TG_COL_SECRET, TG_COL_WO, 0, 1, NULL, 1, NULL, NULL},
    {"created_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {"updated_at", TG_COL_TIME, TG_COL_RO, 0, 0, NULL, 0, NULL, NULL},
    {NULL, 0, 0, 0, 0, NULL, 0, NULL, NULL},
};

const tg_table_t tg_tables[] = {
    {"tenants", "tenants", "id", 0, tenant_cols, NULL},
    {"users", "users", "id", 0, user_cols, NULL},
    {"groups", "groups", "id", 0, group_cols, NULL},
    {"keys", "api_keys", "id", 0, key_cols,
     "'budgets', (SELECT coalesce(json_agg(tg_budget_json(b) ORDER BY b.id), '[]') FROM budgets b WHERE b.tenant_id = "
     "t.tenant_id AND (b.api_key_id = t.id OR b.user_id = t.user_id OR (b.api_key_id IS NULL AND b.user_id IS NULL)))"},
    {"accounts", "accounts", "id", 0, account_cols,
     "'has_credential', t.credential IS NOT NULL, 'groups', (SELECT coalesce(json_agg(ag.group_id ORDER BY "
     "ag.group_id), '[]') FROM account_groups ag WHERE ag.account_id = t.id)"},
    {"prices", "model_prices", "model", 1, price_cols, NULL},
    {"budgets", "budgets", "id", 0, budget_cols,
     "'has_webhook_secret', t.webhook_secret IS NOT NULL, 'current', tg_budget_json(t) -> 'current', 'periods', "
     "(SELECT coalesce(json_agg(json_build_object('start', p.period_start, 'spend', p.spend) ORDER BY "
     "p.period_start DESC), '[]') FROM (SELECT * FROM budget_periods p WHERE p.budget_id = t.id ORDER BY "
     "p.period_start DESC LIMIT 12) p), 'alerts', (SELECT coalesce(json_agg(json_build_object('period_start', "
     "a.period_start, 'threshold', a.threshold, 'state', a.state, 'attempts', a.attempts, 'spend', a.spend, "
     "'last_error', a.last_error, 'raised_at', a.created_at, 'delivered_at', a.delivered_at) ORDER BY "
     "a.created_at DESC, a.threshold DESC), '[]') FROM (SELECT * FROM budget_alerts a WHERE a.budget_id = t.id "
     "ORDER BY a.created_at DESC LIMIT 20) a)"},
    {NULL, NULL, NULL, 0, NULL, NULL},
};

const tg_table_t *tg_table_find(const char *name) {
    for (const tg_table_t *t = tg_tables; t->name; t++)
        if (!strcmp(t->name, name))
            return t;
    return NULL;
}

const tg_column_t *tg_table_column(const tg_table_t *t, const char *name) {
    for (const tg_column_t *c = t->cols; c->name; c++)
        if (!strcmp(c->name, name))
            return c;
    return NULL;
}

void tg_column_missing(const tg_column_t *c, char *msg, size_t msglen) {
    snprintf(msg, msglen, "field \"%s\" is required", c->name);
}

int tg_decimal_plain(const char *s) {
    if (*s == '-')
        s++;
    int digits = 0, dot = 0;
    for (; *s; s++) {
        if (*s >= '0' && *s <= '9')
            digits++;
        else if (*s == '.' && !dot)
            dot = 1;
        else
            return 0;
    }
    return digits > 0;
}

int tg_decimal_sub_nano(const char *s) {
    const char *d = strchr(s, '.');
    if (!d)
        return 0;
    for (int i = 0; *++d; i++)
        if (i >= 9 && *d != '0')
            return 1;
    return 0;
}

/* What reaches an upstream request, a log line or a model lookup is checked before its
 * type: no control byte in any text (a CR/LF in a base_url or credential would be a
 * header of the upstream request), base_url a well-formed http(s) URL, model names and
 * model_map entries non-empty strings. Returns 0, or -1 with msg naming the field. */
static int check_text(const tg_column_t *c, const json_t *v, char *msg, size_t msglen) {
    const char *key = c->name;
    const char *why = NULL;
    const char *what = NULL;
    if (c->type == TG_COL_URL && json_is_string(v)) {
        why = tg_valid_base_url(json_string_value(v), json_string_length(v));
        what = "an http:// or https:// URL with a host";
    } else if (c->type == TG_COL_SECRET && json_is_string(v) && json_string_value(v)[strspn(json_string_value(v), " \t\r\n")] == '{') {
        /* A service account key file (JSON, newlines and all): it is never a header;
         * tg_identity_check reads it as the key. */
        json_t *j = json_loadb(json_string_value(v), json_string_length(v), 0, NULL);
        if (!json_is_object(j))
            why = "is not a JSON object (a service account key file's JSON)";
        json_decref(j);
    } else if ((c->type == TG_COL_TEXT || c->type == TG_COL_SECRET) && json_is_string(v)) {
        why = tg_valid_no_ctl(json_string_value(v), json_string_length(v));
    } else if ((c->type == TG_COL_TEXTARR || c->type == TG_COL_CIDRARR) && json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_string(e))
                continue; /* the type check says so */
            why = tg_valid_model(json_string_value(e), json_string_length(e));
            if (why) {
                snprintf(msg, msglen, "field \"%s\" item %zu %s", key, i, why);
                return -1;
            }
        }
    } else if (c->type == TG_COL_MODEL_MAP && json_is_object(v)) {
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            why = tg_valid_model(k, strlen(k));
            if (!why && !json_is_string(e))
                why = "must map to a string";
            if (!why)
                why = tg_valid_model(json_string_value(e), json_string_length(e));
            if (why) {
                tg_buf_t name;
                tg_buf_init(&name);
                tg_buf_append_json_escaped(&name, k, strnlen(k, 64));
                snprintf(msg, msglen, "field \"model_map\" entry \"%s\": %s (model names are 1 to 256 bytes without "
                         "control characters)", name.data ? name.data : "", why);
                tg_buf_free(&name);
                return -1;
            }
        }
    }
    if (!why)
        return 0;
    if (what)
        snprintf(msg, msglen, "field \"%s\" must be %s: it %s", key, what, why);
    else
        snprintf(msg, msglen, "field \"%s\" %s", key, why);
    return -1;
}

int tg_column_check(const tg_column_t *c, const json_t *v, const tg_plugins_config_t *plugins, char *msg,
                    size_t msglen) {
    const char *key = c->name;
    if (json_is_null(v)) {
        if (c->nullable)
            return 0;
        snprintf(msg, msglen, "field \"%s\" cannot be null", key);
        return -1;
    }
    if (check_text(c, v, msg, msglen) != 0)
        return -1;
    int ok = 1;
    switch (c->type) {
    case TG_COL_TEXT:
    case TG_COL_URL:
    case TG_COL_SECRET:
        ok = json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) <= 4096;
        if (ok && c->enums) {
            ok = 0;
            for (const char *const *e = c->enums; *e; e++)
                ok |= !strcmp(*e, json_string_value(v));
        }
        break;
    case TG_COL_INT: /* counts and limits: integer columns */
        ok = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 2147483647;
        break;
    case TG_COL_SINT: /* a signed integer column (account priority) */
        ok = json_is_integer(v) && json_integer_value(v) >= -2147483647 - 1 && json_integer_value(v) <= 2147483647;
        break;
    case TG_COL_REF: /* a bigint id of another row */
        ok = json_is_integer(v) && json_integer_value(v) >= 1;
        break;
    case TG_COL_NUMERIC:
        ok = json_is_number(v) ? json_number_value(v) >= 0
                               : json_is_string(v) && tg_decimal_plain(json_string_value(v)) && json_string_value(v)[0] != '-';
        break;
    case TG_COL_MONEY:
    case TG_COL_PRICE:
        /* Past TG_MONEY_BALANCE_MAX the gateway could not hold it (was: accepted, then
         * every request of the tenant 503). */
        ok = json_is_number(v) ? json_number_value(v) >= 0 && json_number_value(v) <= 1e9
                               : json_is_string(v) && tg_decimal_plain(json_string_value(v)) &&
                                     tg_money_check(json_string_value(v)) == TG_OK;
        /* A balance or budget is held in whole nano-USD (a price is per million tokens
         * and may be finer). */
        if (ok && c->type == TG_COL_MONEY) {
            double x = json_is_number(v) ? json_number_value(v) : 0;
            ok = json_is_number(v) ? fabs(x * 1e9 - nearbyint(x * 1e9)) < 1e-3 : !tg_decimal_sub_nano(json_string_value(v));
        }
        break;
    case TG_COL_TEXTARR:
    case TG_COL_CIDRARR: {
        ok = json_is_array(v) && json_array_size(v) <= 10000;
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) ok = ok && json_is_string(s);
        break;
    }
    case TG_COL_JSONOBJ:
    case TG_COL_MODEL_MAP:
        ok = json_is_object(v);
        break;
    case TG_COL_PLUGINS:
        ok = json_is_object(v);
        if (ok && plugins) {
            /* Each plugin's config against its schema, as a reload would check it. */
            char *text = json_dumps(v, JSON_COMPACT);
            int vrc = tg_plugins_validate_group(plugins, text, strlen(text), msg, msglen);
            free(text);
            if (vrc != TG_OK)
                return -1;
        }
        break;
    case TG_COL_TIME:
        ok = json_is_string(v);
        break;
    case TG_COL_TZ: {
        const char *why = json_is_string(v) ? tg_valid_timezone(json_string_value(v), json_string_length(v))
                                            : "must be a string";
        if (why) {
            snprintf(msg, msglen, "field \"%s\" %s", key, why);
            return -1;
        }
        break;
    }
    case TG_COL_PCTARR: {
        ok = json_is_array(v) && json_array_size(v) >= 1 && json_array_size(v) <= 10;
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) ok = ok && json_is_integer(e) && json_integer_value(e) >= 1 &&
                                         json_integer_value(e) <= 100;
        break;
    }
    case TG_COL_ID:
        ok = 0;
        break;
    }
    if (ok)
        return 0;
    if (c->enums) {
        char allowed[128] = "";
        for (const char *const *e = c->enums; *e; e++)
            snprintf(allowed + strlen(allowed), sizeof(allowed) - strlen(allowed), "%s%s", e == c->enums ? "" : ", ",
                     *e);
        snprintf(msg, msglen, "field \"%s\" must be one of: %s", key, allowed);
        return -1;
    }
    const char *want = c->type == TG_COL_INT       ? "a non-negative integer (at most 2147483647)"
                       : c->type == TG_COL_SINT    ? "an integer from -2147483648 to 2147483647"
                       : c->type == TG_COL_REF     ? "a positive integer id"
                       : c->type == TG_COL_NUMERIC ? "a non-negative decimal number (or string)"
                       : c->type == TG_COL_MONEY || c->type == TG_COL_PRICE
                           ? "a decimal amount from 0 to " TG_MONEY_BALANCE_MAX_TEXT
                             " (USD, the largest amount tollgate holds)"
                       : c->type == TG_COL_TEXTARR || c->type == TG_COL_CIDRARR ? "an array of strings"
                       : c->type == TG_COL_JSONOBJ || c->type == TG_COL_MODEL_MAP || c->type == TG_COL_PLUGINS
                           ? "an object"
                       : c->type == TG_COL_TIME ? "a timestamp string (ISO 8601)"
                       : c->type == TG_COL_PCTARR ? "a list of 1 to 10 percentages (integers from 1 to 100), e.g. [50, 80, 100]"
                                                : "a non-empty string";
    snprintf(msg, msglen, "field \"%s\" must be %s", key, want);
    return -1;
}
