# Tests of issue 16 "house", items 1 and 4 (the layers of core/src). Included by
# spec/CMakeLists.txt.
#
#   house.layers   spec/house/layers.test.mjs: every #include under core/src/<layer>/ and
#                  core/include/tollgate/ follows the rule written in core/src/README.md
#                  (read from its table), and a planted violation of each kind is caught.
#
# Labelled `house` and `core` (it takes a second, and guards every change to core/).

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: house layout tests not registered")
  return()
endif()

add_test(NAME house.layers COMMAND ${TG_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/house/layers.test.mjs)
set_tests_properties(house.layers PROPERTIES LABELS "house;core" TIMEOUT 60)
