# Tests of the house issue's (#16) proxy items, label `house`. Included by
# spec/CMakeLists.txt.
#
#   unit.metrics             /metrics collectors (spec/unit/test_metrics.c, in spec/CMakeLists.txt)
#   house_access_log         one access-log writer: data plane, admin API, console and the
#                            server's own answers carry the same members

find_program(TG_NODE node)
if(NOT TG_NODE)
  return()
endif()

foreach(name house_access_log)
  add_test(NAME integration.${name} COMMAND ${TG_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/integration/${name}.test.mjs)
  set_tests_properties(integration.${name} PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
    LABELS "house;core;integration" TIMEOUT 180)
endforeach()
