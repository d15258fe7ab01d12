# Tests of the operator's console (label `admin-ui`). Included by spec/CMakeLists.txt.
#
#   unit.console_logic        spec/browser/console_logic.test.mjs: the console's
#                             arithmetic (metrics rates and quantiles, the usage
#                             reports' ranges and queries) under node:test
#   integration.console_http  spec/browser/console_http.test.mjs: the real binary serving
#                             the console (headers, CSP, caching, gzip, SPA fallback) and
#                             the login session (cookie, CSRF, logout) before the admin API
#   browser.console           spec/browser/console.test.mjs: headless Chromium driven by
#                             playwright-core against the real gateway with Postgres and
#                             Redis; screenshots of every page go to
#                             <build>/admin-ui-screenshots
#
# The http and browser tests skip (exit 77) when the console was not built into the
# binary (no npm at configure time); the browser test also skips without
# /usr/bin/chromium or without spec/run.sh's TOLLGATE_PG and TOLLGATE_REDIS.

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: admin-ui tests not registered")
  return()
endif()

if(TG_ADMIN_UI_BUILT)
  set(tg_ui_built 1)
else()
  set(tg_ui_built 0)
endif()
set(tg_ui_dir ${CMAKE_CURRENT_SOURCE_DIR}/browser)
set(tg_ui_skip_unbuilt "if [ \"$TG_UI_BUILT\" != 1 ]; then echo 'skipped: the admin console is not built into this binary (npm missing at configure time)'; exit 77; fi")

add_test(NAME unit.console_logic COMMAND ${TG_NODE} --test ${tg_ui_dir}/console_logic.test.mjs)
set_tests_properties(unit.console_logic PROPERTIES LABELS "admin-ui;unit" TIMEOUT 60)

add_test(NAME integration.console_http
  COMMAND sh -c "${tg_ui_skip_unbuilt}; exec \"$0\" --test \"$1\"" ${TG_NODE} ${tg_ui_dir}/console_http.test.mjs)
set_tests_properties(integration.console_http PROPERTIES
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate;TG_UI_BUILT=${tg_ui_built}"
  LABELS "admin-ui;integration" TIMEOUT 120 SKIP_RETURN_CODE 77)

add_test(NAME browser.console
  COMMAND sh -c "${tg_ui_skip_unbuilt}; if [ ! -x /usr/bin/chromium ]; then echo 'skipped: no /usr/bin/chromium (spec/install-deps.sh installs it)'; exit 77; fi; if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
          ${TG_NODE} ${tg_ui_dir}/console.test.mjs)
set_tests_properties(browser.console PROPERTIES
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate;TG_UI_BUILT=${tg_ui_built};TG_SCREENSHOT_DIR=${CMAKE_BINARY_DIR}/admin-ui-screenshots"
  LABELS "admin-ui;console;browser" TIMEOUT 300 SKIP_RETURN_CODE 77 RESOURCE_LOCK redis)

# Issue "console" (label `console`): the admin API behind the console's account work
# (validation on write, an account's "problem", POST accounts/{id}/test, hostile bodies).
tg_services_test(console_admin ${CMAKE_CURRENT_SOURCE_DIR}/integration/console_admin.test.mjs "console;admin-ui;integration" 120)

# Issue "budgets" (#24, items 4 and 5): spec/browser/budgets_console.test.mjs — the Budgets
# page (create with a field error, spend after a billed request, detail with alerts, edit,
# delete) and a key's budgets, in Chromium against a billed gateway.
add_test(NAME browser.budgets_console
  COMMAND sh -c "${tg_ui_skip_unbuilt}; if [ ! -x /usr/bin/chromium ]; then echo 'skipped: no /usr/bin/chromium (spec/install-deps.sh installs it)'; exit 77; fi; if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
          ${TG_NODE} ${tg_ui_dir}/budgets_console.test.mjs)
set_tests_properties(browser.budgets_console PROPERTIES
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate;TG_UI_BUILT=${tg_ui_built}"
  LABELS "budgets;admin-ui;browser" TIMEOUT 120 SKIP_RETURN_CODE 77 RESOURCE_LOCK redis)

# Issue "policy" (#22, items 4 and 5): spec/browser/policy_workbench.test.mjs — the Plugins
# page's policy workbench walked from a blank policy to upload, replay diff, shadow,
# promote and rollback under a background load through the OpenAI SDK (none may fail).
add_test(NAME browser.policy_workbench
  COMMAND sh -c "${tg_ui_skip_unbuilt}; if [ ! -x /usr/bin/chromium ]; then echo 'skipped: no /usr/bin/chromium (spec/install-deps.sh installs it)'; exit 77; fi; if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
          ${TG_NODE} ${tg_ui_dir}/policy_workbench.test.mjs)
set_tests_properties(browser.policy_workbench PROPERTIES
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate;TG_UI_BUILT=${tg_ui_built}"
  LABELS "policy;admin-ui;browser" TIMEOUT 300 SKIP_RETURN_CODE 77 RESOURCE_LOCK redis)

# Issue "providers" (#19, item 8): spec/browser/providers_console.test.mjs — accounts with an
# identity in the console (a Vertex service account key pasted as JSON, refused when it is
# not one; the account test obtaining a token; its expiry and renewal shown; a refused
# refresh shown with its reason).
add_test(NAME browser.providers_console
  COMMAND sh -c "${tg_ui_skip_unbuilt}; if [ ! -x /usr/bin/chromium ]; then echo 'skipped: no /usr/bin/chromium (spec/install-deps.sh installs it)'; exit 77; fi; if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
          ${TG_NODE} ${tg_ui_dir}/providers_console.test.mjs)
set_tests_properties(browser.providers_console PROPERTIES
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate;TG_UI_BUILT=${tg_ui_built}"
  LABELS "providers;admin-ui;browser" TIMEOUT 180 SKIP_RETURN_CODE 77 RESOURCE_LOCK redis)

# Issue "usage" (#18, item 3): spec/browser/usage_console.test.mjs — the Usage page
# (totals, charts, grouped rows a page at a time, the server's CSV export) and the
# Capacity page (per account and per group, with the rule of the recommendation) show the
# admin API's reports of the usage rows the test created; no usage row is downloaded.
add_test(NAME browser.usage_console
  COMMAND sh -c "${tg_ui_skip_unbuilt}; if [ ! -x /usr/bin/chromium ]; then echo 'skipped: no /usr/bin/chromium (spec/install-deps.sh installs it)'; exit 77; fi; if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
          ${TG_NODE} ${tg_ui_dir}/usage_console.test.mjs)
set_tests_properties(browser.usage_console PROPERTIES
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate;TG_UI_BUILT=${tg_ui_built}"
  LABELS "usage;admin-ui;browser" TIMEOUT 180 SKIP_RETURN_CODE 77 RESOURCE_LOCK redis)
