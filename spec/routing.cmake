# Integration tests of the routing issue: spec/integration/routing_*.test.mjs, the real
# binary against real Postgres and Redis with several mock-upstream accounts (one
# credential each, so the mock's per-credential counters show where requests went).
# Included by spec/CMakeLists.txt.
#
# Each file is one ctest test, `integration.<file>`, labelled `routing;integration`.
# spec/run.sh exports TOLLGATE_PG and TOLLGATE_REDIS for its private servers; without
# them the tests are skipped (exit 77). Each file makes its own database (see
# spec/integration/lib/db.mjs). They measure timing (cooldowns, slot leases) and share
# one Redis with the state and limits tests, so they hold RESOURCE_LOCK redis.

# The in-process selection benchmark (spec/bench/select_bench.sh runs it).
add_executable(tg_select_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/select_bench.c)
target_compile_options(tg_select_bench PRIVATE ${TG_WARN})
target_link_libraries(tg_select_bench PRIVATE tollgate_core)
set_target_properties(tg_select_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: routing integration tests not registered")
  return()
endif()

file(GLOB TG_ROUTING_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/routing_*.test.mjs)
foreach(file ${TG_ROUTING_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
  add_test(NAME integration.${name}
    COMMAND sh -c "if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
            ${TG_NODE} ${file})
  set_tests_properties(integration.${name} PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
    LABELS "routing;integration"
    TIMEOUT 240
    SKIP_RETURN_CODE 77
    RESOURCE_LOCK redis)
endforeach()
