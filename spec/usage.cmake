# Integration tests of the usage issue (#18): spec/integration/usage_*.test.mjs, the real
# binary against real Postgres and Redis and the mock upstream (helpers in
# spec/integration/lib/billing.mjs). Included by spec/CMakeLists.txt.
#
# Each file is one ctest test, `integration.<file>`, labelled `usage;billing;integration`
# (partitions, retention and rollups are written by the settlement path: money).

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: usage integration tests not registered")
  return()
endif()

file(GLOB TG_USAGE_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/usage_*.test.mjs)
foreach(file ${TG_USAGE_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
  tg_services_test(${name} ${file} "usage;billing;integration" 120)
endforeach()
