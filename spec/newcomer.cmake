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
