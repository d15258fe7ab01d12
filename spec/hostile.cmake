# The hostile-input suite and the chaos run of the hostile issue (#14), labelled
# `hostile`. Included by spec/CMakeLists.txt.
#
#   hostile.<file>  spec/hostile/<file>.test.mjs: data-driven hostile requests against one
#                   real gateway (Postgres, Redis, billing, plugins) each; a case checks
#                   status, error shape, the access log, that the worker still serves,
#                   and each file ends with `tollgate ledger verify` (spec/hostile/lib.mjs).
#   chaos.short     spec/chaos/run.sh in its short form (30 s of load): three gateways
#                   under mixed load while instances, Redis and Postgres are killed and
#                   restarted; its own private Postgres and Redis.
#
# spec/run.sh exports TOLLGATE_PG and TOLLGATE_REDIS; without them hostile.* skip (77).
# They hold RESOURCE_LOCK redis like the other Redis-backed integration tests.

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: hostile tests not registered")
  return()
endif()

file(GLOB TG_HOSTILE_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/hostile/*.test.mjs)
foreach(file ${TG_HOSTILE_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
  add_test(NAME hostile.${name}
    COMMAND sh -c "if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
            ${TG_NODE} ${file})
  set_tests_properties(hostile.${name} PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
    LABELS "hostile;integration"
    TIMEOUT 180
    SKIP_RETURN_CODE 77
    RESOURCE_LOCK redis)
endforeach()

if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/chaos/run.sh)
  # It starts its own Postgres and Redis (it restarts them), not spec/run.sh's.
  add_test(NAME chaos.short COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/chaos/run.sh)
  set_tests_properties(chaos.short PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate;TG_CHAOS_SECONDS=30"
    LABELS "hostile;integration"
    TIMEOUT 240
    SKIP_RETURN_CODE 77
    RESOURCE_LOCK redis)
endif()
