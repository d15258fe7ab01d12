/*
 * The admin REST API under /admin/api/v1/ (documented in spec/openapi.yaml): CRUD for
 * tenants, users, keys, groups, accounts and prices, tenant top-ups, usage queries, and
 * the plugin status and reload. Every call needs `Authorization: Bearer <admin token>`
 * (compared in constant time), or the console's session cookie plus its x-csrf-token
 * header on writes (tg_ui.h). Writes publish an invalidation so every gateway instance
 * drops what it cached.
 */
#ifndef TOLLGATE_TG_ADMIN_H
#define TOLLGATE_TG_ADMIN_H

#include "tollgate/tg_server.h"

/** Takes the request over (sets its callbacks); answers it now or later. `path` starts
 *  with "/admin/api/v1", `query` is the text after '?' or NULL. */
void tg_admin_handle(tg_request_t *req, const char *path, const char *query);

/** Every route the admin API serves, "METHOD /path/{param}", NULL-terminated; a test
 *  checks that each one is documented in spec/openapi.yaml. */
extern const char *const tg_admin_routes[];

#endif
