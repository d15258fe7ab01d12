# Tests of the HTTP-server and logging items of the hostile issue (#14), label `hostile`
# (and `core`). Included by spec/CMakeLists.txt. Each spec/integration/hostile_http*.test.mjs
# is one ctest test, `integration.<file>`, against this build's binary:
#
#   hostile_http_backpressure  slow readers get every response kind whole
#   hostile_http_early         early answers (413, 401, 431) are read, not reset
#   hostile_http_head          HEAD answers carry no body (keep-alive stays in step)
#   hostile_http_log           refused requests are logged; access-log lines stay JSON
#   hostile_http_log_billed    stderr escapes a CR/LF model; unpriced warnings are rate
#                              limited (billing on: Postgres and Redis from spec/run.sh)

find_program(TG_NODE node)
if(NOT TG_NODE)
  return()
endif()

file(GLOB TG_HOSTILE_HTTP_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/hostile_http*.test.mjs)
foreach(file ${TG_HOSTILE_HTTP_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
  if(name MATCHES "_billed$")
    # Billing on: needs spec/run.sh's Postgres and Redis (skipped without them).
    tg_services_test(${name} ${file} "hostile;integration" 180)
  else()
    add_test(NAME integration.${name} COMMAND ${TG_NODE} --test ${file})
    set_tests_properties(integration.${name} PROPERTIES
      ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
      LABELS "hostile;core;integration" TIMEOUT 180)
  endif()
endforeach()
