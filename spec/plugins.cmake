# Tests of the plugin runtime and the shipped plugins (label `plugins`). Included by
# spec/CMakeLists.txt.
#
#   unit.plugin                 C unit tests (spec/unit/test_plugin.c) in tg_unit
#   lua.<spec>                  spec/lua/test_*.lua under luajit, with a fake context
#   integration.plugins_*       the real binary with plugins (node:test)

# LuaJIT's ffi.C resolves tg_ffi_* from the running executable: export them.
set_target_properties(tg_unit PROPERTIES ENABLE_EXPORTS ON)
target_compile_definitions(tg_unit PRIVATE TG_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
tg_unit_test(plugin plugins)

find_program(TG_LUAJIT luajit)
if(TG_LUAJIT)
  file(GLOB TG_LUA_SPECS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/lua/test_*.lua)
  foreach(spec ${TG_LUA_SPECS})
    get_filename_component(name ${spec} NAME_WE)
    add_test(NAME lua.${name} COMMAND ${TG_LUAJIT} ${CMAKE_CURRENT_SOURCE_DIR}/lua/run.lua ${spec}
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(lua.${name} PROPERTIES LABELS "plugins;lua" TIMEOUT 60)
  endforeach()
  # Every Lua file of the repo compiles (the lint when luacheck is not installed).
  add_test(NAME lua.compile_all COMMAND ${TG_LUAJIT} ${CMAKE_CURRENT_SOURCE_DIR}/lua/compile_all.lua
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(lua.compile_all PROPERTIES LABELS "plugins;lua" TIMEOUT 60)
else()
  message(WARNING "luajit not found: spec/lua tests not registered")
endif()

if(TG_NODE)
  file(GLOB TG_PLUGINS_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/plugins_*.test.mjs)
  foreach(file ${TG_PLUGINS_IT})
    get_filename_component(name ${file} NAME)
    string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
    add_test(NAME integration.${name} COMMAND ${TG_NODE} --test ${file})
    set_tests_properties(integration.${name} PROPERTIES
      ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
      LABELS "plugins;integration" TIMEOUT 300)
    # Again against the sanitizer build, when there is one (see spec/tests.cmake).
    if(NOT TG_SANITIZE AND TG_ASAN_BUILD)
      add_test(NAME integration-asan.${name}
        COMMAND sh -c "if [ ! -x \"$TG_BIN\" ]; then echo \"skipped: no asan build at $TG_BIN\"; exit 77; fi; exec \"$0\" --test \"$1\""
                ${TG_NODE} ${file})
      set_tests_properties(integration-asan.${name} PROPERTIES
        ENVIRONMENT "TG_BIN=${TG_ASAN_BUILD}/tollgate"
        SKIP_RETURN_CODE 77
        LABELS "plugins;integration;asan" TIMEOUT 400)
    endif()
  endforeach()
endif()

# The in-process hook benchmark (spec/bench/plugins_bench.sh runs it).
add_executable(tg_plugins_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/plugins_bench.c)
target_compile_options(tg_plugins_bench PRIVATE ${TG_WARN})
target_link_libraries(tg_plugins_bench PRIVATE tollgate_core)
set_target_properties(tg_plugins_bench PROPERTIES ENABLE_EXPORTS ON RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
