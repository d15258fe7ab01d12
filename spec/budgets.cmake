# Integration tests of the budgets issue (#24): spec/integration/budgets_*.test.mjs, the
# real binary against real Postgres and Redis and the mock upstream (helpers in
# spec/integration/lib/billing.mjs). Included by spec/CMakeLists.txt.
#
# Each file is one ctest test, `integration.<file>`, labelled `budgets;billing;integration`
# (periodic budgets are money: the billing label runs them too).

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: budgets integration tests not registered")
  return()
endif()

file(GLOB TG_BUDGETS_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/budgets_*.test.mjs)
foreach(file ${TG_BUDGETS_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
  tg_services_test(${name} ${file} "budgets;billing;integration" 240)
endforeach()
