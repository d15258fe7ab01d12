/*
 * The operator's web console: the built admin-ui/ application served from the binary,
 * and the browser login session that lets it call the admin API without ever holding
 * the admin token in JavaScript.
 *
 * Routes (all under /admin/, except /admin/api/ which is tg_admin's):
 *
 *   GET  /admin             308 to /admin/
 *   GET  /admin/            index.html
 *   GET  /admin/<file>      an embedded file of the build (admin-ui/embed.cmake)
 *   GET  /admin/<other>     index.html too (the console routes in the browser)
 *   POST /admin/login       {"token": "<admin token>"} -> 200 {"csrf": "..."} and
 *                           Set-Cookie: tg_session=<64 hex>; HttpOnly; SameSite=Strict;
 *                           Path=/admin; Max-Age=43200 (+ Secure over TLS)
 *                           401 invalid_admin_token, 403 admin_disabled, 400 invalid_json,
 *                           429 too_many_attempts + Retry-After while the client's
 *                           address is locked (five wrong tokens in a row lock it for
 *                           2 s, doubled per further failure up to 15 min; per address,
 *                           IPv6 per /64; see tg_ui.c)
 *   GET  /admin/session     200 {"csrf": "...", "expires_at_ms": N} for a valid session
 *                           cookie (how a reloaded page gets its CSRF token back), else 401
 *   POST /admin/logout      deletes the session (needs the x-csrf-token header) and
 *                           clears the cookie; 204
 *
 * Sessions live in this process's memory only (a mutex-protected table shared by every
 * worker thread; at most TG_UI_MAX_SESSIONS, the oldest evicted first), expire 12 hours
 * after login, and are lost when the process restarts; with several gateway instances
 * behind one balancer, a session is valid on the instance that made it. The table keeps
 * the SHA-256 of each session id, never the id itself.
 *
 * Static files carry Content-Type by extension, `Cache-Control: public, max-age=31536000,
 * immutable` for the content-hashed files under assets/ and `no-cache` (with an ETag)
 * for everything else, and on every answer of this module a strict
 * Content-Security-Policy, `X-Content-Type-Options: nosniff`, `Referrer-Policy:
 * no-referrer` and `X-Frame-Options: DENY`. Files are gzip-compressed at build time and
 * sent compressed to clients that accept gzip.
 *
 * Without npm at build time the asset table is empty: /admin/ then answers 503 with a
 * page saying the console was not built, and login still works.
 */
#ifndef TOLLGATE_TG_UI_H
#define TOLLGATE_TG_UI_H

#include <stddef.h>

#include "tollgate/tg_server.h"

#define TG_UI_MAX_SESSIONS 1024
#define TG_UI_SESSION_TTL_S 43200

/** One file of the built console, generated into the build tree by admin-ui/embed.cmake. */
typedef struct {
    const char *path;         /* relative to the dist root, e.g. "assets/index-3fa9c1.js" */
    const char *content_type; /* "text/javascript; charset=utf-8" */
    const unsigned char *data;
    size_t len;
    const unsigned char *gz;  /* gzip of data, or NULL when compressing does not pay */
    size_t gz_len;
    const char *etag;         /* W/"<16 hex of SHA-256>" (weak: shared by both encodings) */
    int immutable;            /* content-hashed name: cache for a year */
} tg_ui_asset_t;

/** The embedded files, sorted by path, ended by an entry whose path is NULL. */
extern const tg_ui_asset_t tg_ui_assets[];

/**
 * Answers a request for /admin or a path under /admin/ other than /admin/api/ (see the
 * routes above). `path` is the URL's path without the query string. Takes the request
 * over like tg_admin_handle: sets its finish_cb (the access-log line) and always answers
 * before returning.
 */
void tg_ui_handle(tg_request_t *req, const char *path);

/**
 * The admin API's second way in: returns 1 when the request carries a valid tg_session
 * cookie and, unless it is a GET or HEAD, an `x-csrf-token` header equal to the
 * session's token and no foreign `Origin`. Returns 0 otherwise (the caller then answers
 * 401 as for a wrong bearer token). Thread-safe; never writes to the request.
 */
int tg_ui_authorized(const tg_request_t *req);

#endif
