# Integration tests of issue #14's money defects: spec/integration/money_hostile*.test.mjs,
# the real binary against real Postgres and Redis and the mock upstream (helpers in
# spec/integration/lib/billing.mjs). Included by spec/CMakeLists.txt.
#
# Each file is one ctest test, `integration.<file>`, labelled `hostile;billing;integration`.
# Without TOLLGATE_PG and TOLLGATE_REDIS (spec/run.sh exports them) they skip (exit 77).
# They move money between Redis and Postgres, so they hold RESOURCE_LOCK redis like the
# billing tests.

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: money hostile integration tests not registered")
  return()
endif()

file(GLOB TG_MONEY_HOSTILE_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/money_hostile*.test.mjs)
foreach(file ${TG_MONEY_HOSTILE_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})

  tg_services_test(${name} ${file} "hostile;billing;integration" 240)
endforeach()
