# Integration tests of issue 16 "house", item 2 (one mechanism, one place):
# spec/integration/house_*.test.mjs, the real binary against real Postgres and Redis.
# Included by spec/CMakeLists.txt.
#
#   integration.house_ledger_redis_auth   `tollgate ledger` against a password-protected
#                                         Redis on database 3 (a private redis-server on
#                                         127.0.0.1 started by the test)
#
# Labelled `house;billing;integration`; skipped (exit 77) without TOLLGATE_PG and
# TOLLGATE_REDIS (run spec/run.sh).

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: house integration tests not registered")
  return()
endif()

foreach(name house_ledger_redis_auth)
  add_test(NAME integration.${name}
    COMMAND sh -c "if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
            ${TG_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/integration/${name}.test.mjs)
  set_tests_properties(integration.${name} PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
    LABELS "house;billing;integration"
    TIMEOUT 240
    SKIP_RETURN_CODE 77)
endforeach()
