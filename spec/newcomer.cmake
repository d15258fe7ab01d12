# newcomer (#23): what a new user meets first — the quickstart in a clean checkout (its
# own Postgres, Redis, mock and gateway on 127.0.0.1, stopped by PID), the configuration
# example against the loader, the CLI's help, version and errors, the admin API against
# spec/openapi.yaml, the README's links, and the console's first screen.
# Included by spec/CMakeLists.txt.

# tg_newcomer_test(NAME FILE TIMEOUT): a node test that needs no suite services.
function(tg_newcomer_test name file timeout)
  add_test(NAME ${name} COMMAND ${TG_NODE} --test ${file})
  set_tests_properties(${name} PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
    LABELS "newcomer;integration" TIMEOUT ${timeout})
endfunction()

tg_newcomer_test(integration.newcomer_quickstart ${CMAKE_CURRENT_SOURCE_DIR}/integration/newcomer_quickstart.test.mjs 300)
tg_newcomer_test(integration.newcomer_config ${CMAKE_CURRENT_SOURCE_DIR}/integration/newcomer_config.test.mjs 60)
tg_newcomer_test(integration.newcomer_cli ${CMAKE_CURRENT_SOURCE_DIR}/integration/newcomer_cli.test.mjs 60)

# The console's first screen, from the quickstart's console URL (headless Chromium).
# Its empty-database half uses spec/run.sh's Postgres and Redis (skipped without them).
if(TG_ADMIN_UI_BUILT)
  add_test(NAME browser.newcomer_console
    COMMAND sh -c "if [ ! -x /usr/bin/chromium ]; then echo 'skipped: no /usr/bin/chromium (spec/install-deps.sh installs it)'; exit 77; fi; exec \"$0\" --test \"$1\""
            ${TG_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/browser/newcomer_console.test.mjs)
  set_tests_properties(browser.newcomer_console PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
    LABELS "newcomer;admin-ui;browser" TIMEOUT 240 SKIP_RETURN_CODE 77 RESOURCE_LOCK redis)
endif()

# spec/openapi.yaml: Redocly's lint, and the live admin API validated against it.
tg_services_test(newcomer_openapi ${CMAKE_CURRENT_SOURCE_DIR}/integration/newcomer_openapi.test.mjs "newcomer;integration" 120)

# Every relative link of the Markdown files, and the README front door's shape.
tg_newcomer_test(integration.newcomer_links ${CMAKE_CURRENT_SOURCE_DIR}/integration/newcomer_links.test.mjs 60)
