# Integration tests (spec/integration/*.test.mjs): the real binary driven by the
# official SDK clients under node's test runner. Included by spec/CMakeLists.txt.
#
# Each core_*.test.mjs file is one ctest test, `integration.<file>`, run against this
# build's binary. The same files are registered again as `integration-asan.<file>`
# against the sanitizer build ($TG_ASAN_BUILD at configure time, default
# <repo>/build-asan); those are skipped (exit 77) when that binary does not exist when
# the test runs. A build that is itself sanitized registers only the first set.

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: integration tests not registered")
  return()
endif()

set(TG_ASAN_BUILD "$ENV{TG_ASAN_BUILD}")
if(NOT TG_ASAN_BUILD)
  set(TG_ASAN_BUILD ${CMAKE_SOURCE_DIR}/build-asan)
endif()

file(GLOB TG_CORE_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/core_*.test.mjs)
foreach(file ${TG_CORE_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})

  add_test(NAME integration.${name} COMMAND ${TG_NODE} --test ${file})
  set_tests_properties(integration.${name} PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
    LABELS "core;integration" TIMEOUT 120)

  if(NOT TG_SANITIZE)
    add_test(NAME integration-asan.${name}
      COMMAND sh -c "if [ ! -x \"$TG_BIN\" ]; then echo \"skipped: no asan build at $TG_BIN\"; exit 77; fi; exec \"$0\" --test \"$1\""
              ${TG_NODE} ${file})
    set_tests_properties(integration-asan.${name} PROPERTIES
      ENVIRONMENT "TG_BIN=${TG_ASAN_BUILD}/tollgate"
      SKIP_RETURN_CODE 77
      LABELS "core;integration;asan" TIMEOUT 180)
  endif()
endforeach()

# Issue 17 (pipeline): the request body validated in one pass, its tree built on demand.
add_test(NAME integration.pipeline_parse COMMAND ${TG_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/integration/pipeline_parse.test.mjs)
set_tests_properties(integration.pipeline_parse PROPERTIES
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
  LABELS "pipeline;core;integration" TIMEOUT 120)
