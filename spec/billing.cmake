# Integration tests of the billing issue: spec/integration/billing_*.test.mjs, the real
# binary against real Postgres and Redis and the mock upstream (helpers in
# spec/integration/lib/billing.mjs). Included by spec/CMakeLists.txt.
#
# Each file is one ctest test, `integration.<file>`, labelled `billing;integration`.
# spec/run.sh exports TOLLGATE_PG and TOLLGATE_REDIS; without them the tests are skipped
# (exit 77). Each file makes its own database on that Postgres; billing_crash and
# billing_pg_restart also start a private Redis (and billing_pg_restart a private
# Postgres, which it stops and starts). They measure money moving between Redis and
# Postgres while requests run, so they hold RESOURCE_LOCK redis like the state and
# limits tests and run one at a time even under ctest -j.

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: billing integration tests not registered")
  return()
endif()

file(GLOB TG_BILLING_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/billing_*.test.mjs)
foreach(file ${TG_BILLING_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})

  tg_services_test(${name} ${file} "billing;integration" 240)
endforeach()

# A billing defect the hostile issue's chaos run found: also labelled `hostile`.
if(TEST integration.billing_crash_settled)
  set_tests_properties(integration.billing_crash_settled PROPERTIES LABELS "hostile;billing;integration")
endif()

# Money in flight and rows per request (issue 17, goal 3): also labelled `pipeline`.
foreach(name billing_inflight billing_rows)
  if(TEST integration.${name})
    set_tests_properties(integration.${name} PROPERTIES LABELS "pipeline;billing;integration")
  endif()
endforeach()
