# Tests of the quota issue (#20): what providers say about an account's remaining quota
# and reset windows, and routing by it. Integration tests are
# spec/integration/quota_*.test.mjs, each `integration.<file>`, labelled
# `quota;routing;integration`, against spec/run.sh's Postgres and Redis (skipped, exit
# 77, without them). Included by spec/CMakeLists.txt.

# The quota headers' cost per request (spec/bench/quota_bench.sh runs it).
add_executable(tg_quota_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/quota_bench.c)
target_compile_options(tg_quota_bench PRIVATE ${TG_WARN})
target_link_libraries(tg_quota_bench PRIVATE tollgate_core)
set_target_properties(tg_quota_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

if(NOT TG_NODE)
  return()
endif()

file(GLOB TG_QUOTA_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/quota_*.test.mjs)
foreach(file ${TG_QUOTA_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
  tg_services_test(${name} ${file} "quota;routing;integration" 120)
endforeach()
