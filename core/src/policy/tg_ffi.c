/*
 * The C half of the plugin API (tollgate/tg_ffi.h): the functions plugins call through
 * LuaJIT's FFI. Each one checks that it is allowed in the hook running now and returns
 * TG_FFI_EPHASE otherwise, so a plugin that calls set_model from the price hook gets
 * "API disabled in the context of price" rather than a silent no-op.
 *
 * These functions are exported from the tollgate executable (ENABLE_EXPORTS) so that
 * ffi.C resolves them; nothing here allocates or blocks.
 */
#include "tollgate/tg_ffi.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tollgate/tg_common.h"
#include "tollgate/tg_server.h"

/* The request's headers are handed to plugins without copying: same layout. */
_Static_assert(sizeof(tg_ffi_header_t) == sizeof(tg_header_t), "header layout");
_Static_assert(offsetof(tg_ffi_header_t, value) == offsetof(tg_header_t, value), "header layout");

#define HOOK_BIT(h) (1u << (h))
#define IN(ctx, mask) ((ctx)->hook >= 0 && (ctx)->hook < TG_HOOK__COUNT && (HOOK_BIT((ctx)->hook) & (mask)))

static const char *const hook_names[TG_HOOK__COUNT] = {
    "on_request", "map_model", "select_account", "on_upstream_error", "on_limiter_down", "price", "on_log",
};

const char *tg_ffi_hook_name(int hook) {
    return hook >= 0 && hook < TG_HOOK__COUNT ? hook_names[hook] : "?";
}

const char *tg_ffi_strerror(int rc) {
    switch (rc) {
    case TG_FFI_OK:
        return "ok";
    case TG_FFI_EPHASE:
        return "API disabled in this context";
    case TG_FFI_EARG:
        return "bad argument";
    case TG_FFI_ENOTFOUND:
        return "not found";
    case TG_FFI_ETOOLONG:
        return "value too long";
    case TG_FFI_EDECIDED:
        return "already decided";
    default:
        return "unknown error";
    }
}

static int ieq(const char *a, size_t alen, const char *b, size_t blen) {
    if (alen != blen)
        return 0;
    for (size_t i = 0; i < alen; i++) {
        unsigned char x = (unsigned char)a[i], y = (unsigned char)b[i];
        if (x >= 'A' && x <= 'Z')
            x = (unsigned char)(x + 32);
        if (y >= 'A' && y <= 'Z')
            y = (unsigned char)(y + 32);
        if (x != y)
            return 0;
    }
    return 1;
}

int tg_ffi_header(const tg_hookctx_t *ctx, const char *name, size_t name_len, const char **value,
                  size_t *value_len) {
    for (int i = 0; i < ctx->nheaders; i++) {
        const tg_ffi_header_t *h = &ctx->headers[i];
        if (ieq(h->name, h->name_len, name, name_len)) {
            *value = h->value;
            *value_len = h->value_len;
            return TG_FFI_OK;
        }
    }
    return TG_FFI_ENOTFOUND;
}

static int set_buf(char *dst, size_t cap, size_t *dst_len, const char *p, size_t len) {
    if (len >= cap)
        return TG_FFI_ETOOLONG;
    memcpy(dst, p, len);
    dst[len] = '\0';
    *dst_len = len;
    return TG_FFI_OK;
}

int tg_ffi_set_model(tg_hookctx_t *ctx, const char *model, size_t len) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_ON_REQUEST) | HOOK_BIT(TG_HOOK_MAP_MODEL)))
        return TG_FFI_EPHASE;
    if (len == 0 || memchr(model, '\0', len))
        return TG_FFI_EARG;
    return set_buf(ctx->model, sizeof(ctx->model), &ctx->model_len, model, len);
}

int tg_ffi_set_group(tg_hookctx_t *ctx, const char *group, size_t len) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_ON_REQUEST) | HOOK_BIT(TG_HOOK_MAP_MODEL)))
        return TG_FFI_EPHASE;
    if (memchr(group, '\0', len))
        return TG_FFI_EARG;
    return set_buf(ctx->group, sizeof(ctx->group), &ctx->group_len, group, len);
}

static void copy_trunc(char *dst, size_t cap, const char *p, size_t len) {
    size_t n = TG_MIN(len, cap - 1);
    memcpy(dst, p, n);
    dst[n] = '\0';
}

int tg_ffi_reject(tg_hookctx_t *ctx, int status, const char *code, size_t code_len, const char *message,
                  size_t message_len) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_ON_REQUEST) | HOOK_BIT(TG_HOOK_MAP_MODEL) | HOOK_BIT(TG_HOOK_SELECT_ACCOUNT)))
        return TG_FFI_EPHASE;
    if (status < 400 || status > 599 || code_len == 0)
        return TG_FFI_EARG;
    ctx->reject_status = status;
    copy_trunc(ctx->reject_code, sizeof(ctx->reject_code), code, code_len);
    copy_trunc(ctx->reject_message, sizeof(ctx->reject_message), message, message_len);
    ctx->decided = 1;
    return TG_FFI_OK;
}

int tg_ffi_exclude(tg_hookctx_t *ctx, int index) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_SELECT_ACCOUNT)))
        return TG_FFI_EPHASE;
    if (index < 0 || index >= ctx->naccounts)
        return TG_FFI_EARG;
    ctx->accounts[index].excluded = 1;
    if (ctx->selected == index)
        ctx->selected = -1;
    return TG_FFI_OK;
}

int tg_ffi_set_score(tg_hookctx_t *ctx, int index, double score) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_SELECT_ACCOUNT)))
        return TG_FFI_EPHASE;
    if (index < 0 || index >= ctx->naccounts || isnan(score))
        return TG_FFI_EARG;
    ctx->accounts[index].score = score;
    return TG_FFI_OK;
}

int tg_ffi_select(tg_hookctx_t *ctx, int index) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_SELECT_ACCOUNT)))
        return TG_FFI_EPHASE;
    if (index < 0 || index >= ctx->naccounts || ctx->accounts[index].excluded)
        return TG_FFI_EARG;
    ctx->selected = index;
    ctx->decided = 1;
    return TG_FFI_OK;
}

int tg_ffi_retry(tg_hookctx_t *ctx, int action, int64_t delay_ms) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_ON_UPSTREAM_ERROR)))
        return TG_FFI_EPHASE;
    if (action < TG_RETRY_GIVE_UP || action > TG_RETRY_OTHER || delay_ms < 0)
        return TG_FFI_EARG;
    /* Never retry once the client has bytes: the answer would be spliced. */
    if (ctx->bytes_sent && action != TG_RETRY_GIVE_UP)
        return TG_FFI_EARG;
    ctx->retry_action = action;
    ctx->retry_delay_ms = action == TG_RETRY_GIVE_UP ? 0 : delay_ms;
    ctx->decided = 1;
    return TG_FFI_OK;
}

/* Decides `limits` (TG_LIMIT_* bits; 0 = every limit the request has). Money is closed
 * or open only: a local bucket of money would be a per-instance balance, so N instances
 * could each spend the whole balance, and the spend would not reach the shared one.
 * "local" for every limit (0) therefore leaves money as it was. */
int tg_ffi_limiter(tg_hookctx_t *ctx, int limits, int decision) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_ON_LIMITER_DOWN)))
        return TG_FFI_EPHASE;
    if (decision != TG_LIMITER_CLOSED && decision != TG_LIMITER_OPEN && decision != TG_LIMITER_LOCAL)
        return TG_FFI_EARG;
    if (limits & ~(TG_LIMIT_RATE | TG_LIMIT_TOKENS | TG_LIMIT_CONCURRENCY | TG_LIMIT_MONEY))
        return TG_FFI_EARG;
    if (decision == TG_LIMITER_LOCAL && (limits & TG_LIMIT_MONEY))
        return TG_FFI_EARG;
    if (!limits)
        limits = ctx->limits & (decision == TG_LIMITER_LOCAL ? ~TG_LIMIT_MONEY : ~0);
    for (int i = 0; i < 4; i++)
        if (limits & (1 << i))
            ctx->limiter_decision[i] = decision;
    ctx->decided = 1;
    return TG_FFI_OK;
}

int tg_ffi_set_cost(tg_hookctx_t *ctx, double nanousd) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_PRICE)))
        return TG_FFI_EPHASE;
    if (!(nanousd >= 0) || nanousd > 9.0e15)
        return TG_FFI_EARG;
    ctx->cost_nanousd = (int64_t)llround(nanousd);
    ctx->decided = 1;
    return TG_FFI_OK;
}

static int token_ok(const char *p, size_t n) {
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!(c == '-' || c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            return 0;
    }
    return 1;
}

int tg_ffi_add_header(tg_hookctx_t *ctx, const char *name, size_t name_len, const char *value, size_t value_len) {
    if (!IN(ctx, HOOK_BIT(TG_HOOK_ON_REQUEST) | HOOK_BIT(TG_HOOK_MAP_MODEL) | HOOK_BIT(TG_HOOK_SELECT_ACCOUNT)))
        return TG_FFI_EPHASE;
    if (!token_ok(name, name_len))
        return TG_FFI_EARG;
    for (size_t i = 0; i < value_len; i++) {
        unsigned char c = (unsigned char)value[i];
        if (c < 0x20 || c == 0x7f)
            return TG_FFI_EARG; /* no header injection */
    }
    size_t need = name_len + 2 + value_len + 2;
    if (ctx->resp_headers_len + need >= sizeof(ctx->resp_headers))
        return TG_FFI_ETOOLONG;
    char *d = ctx->resp_headers + ctx->resp_headers_len;
    memcpy(d, name, name_len);
    memcpy(d + name_len, ": ", 2);
    memcpy(d + name_len + 2, value, value_len);
    memcpy(d + name_len + 2 + value_len, "\r\n", 2);
    ctx->resp_headers_len += need;
    ctx->resp_headers[ctx->resp_headers_len] = '\0';
    return TG_FFI_OK;
}

int tg_ffi_log_field(tg_hookctx_t *ctx, const char *key, size_t key_len, const char *value, size_t value_len) {
    if (!IN(ctx, ~0u))
        return TG_FFI_EPHASE;
    if (!token_ok(key, key_len))
        return TG_FFI_EARG;
    /* ,"key":"value" written in place; the value escaped for JSON. */
    char *d = ctx->log_fields + ctx->log_fields_len;
    size_t room = sizeof(ctx->log_fields) - ctx->log_fields_len - 1, n = 0;
    if (key_len + 6 > room)
        return TG_FFI_ETOOLONG;
    d[n++] = ',';
    d[n++] = '"';
    memcpy(d + n, key, key_len);
    n += key_len;
    memcpy(d + n, "\":\"", 3);
    n += 3;
    static const char hex[] = "0123456789abcdef";
    size_t i = 0;
    while (i < value_len) {
        /* A run of bytes that need no escaping goes in with one copy. */
        size_t run = i;
        while (run < value_len && (unsigned char)value[run] >= 0x20 && value[run] != '"' && value[run] != '\\')
            run++;
        if (run > i) {
            if (n + (run - i) + 1 > room)
                return TG_FFI_ETOOLONG;
            memcpy(d + n, value + i, run - i);
            n += run - i;
            i = run;
            continue;
        }
        unsigned char c = (unsigned char)value[i++];
        char esc[6];
        size_t m = 0;
        if (c == '"' || c == '\\') {
            esc[m++] = '\\';
            esc[m++] = (char)c;
        } else {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            m = 6;
        }
        if (n + m + 1 > room)
            return TG_FFI_ETOOLONG;
        memcpy(d + n, esc, m);
        n += m;
    }
    d[n++] = '"';
    ctx->log_fields_len += n;
    ctx->log_fields[ctx->log_fields_len] = '\0';
    return TG_FFI_OK;
}

int tg_ffi_log(const tg_hookctx_t *ctx, int level, const char *msg, size_t len) {
    if (level < TG_LOG_ERROR || level > TG_LOG_DEBUG)
        return TG_FFI_EARG;
    if (level > tg_log_level)
        return TG_FFI_OK;
    tg_log_write(level, "request %.*s: plugin (%s): %.*s", (int)ctx->request_id_len,
                 ctx->request_id ? ctx->request_id : "", tg_ffi_hook_name(ctx->hook), (int)TG_MIN(len, 2048), msg);
    return TG_FFI_OK;
}

double tg_ffi_monotonic_ms(void) { return (double)tg_now_ns() / 1e6; }
