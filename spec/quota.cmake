# Tests of the quota issue (#20): what providers say about an account's remaining quota
# and reset windows, and routing by it. Integration tests are
# spec/integration/quota_*.test.mjs, each `integration.<file>`, labelled
# `quota;routing;integration`, against spec/run.sh's Postgres and Redis (skipped, exit
# 77, without them). Included by spec/CMakeLists.txt.

if(NOT TG_NODE)
  return()
endif()

file(GLOB TG_QUOTA_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/quota_*.test.mjs)
foreach(file ${TG_QUOTA_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
  tg_services_test(${name} ${file} "quota;routing;integration" 120)
endforeach()
