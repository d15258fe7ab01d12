# Tests of #22 "policy": the capture of live decisions, their replay with a verdict
# (`tollgate policy test --compare`), shadow plugins. Label `policy` (and `plugins`).
# Included by spec/CMakeLists.txt.
# unit.plugin_jit: plugin code compiled where it cannot loop (spec/unit/test_plugin.c).
tg_unit_test(plugin_jit "policy;plugins")
if(TG_NODE)
  file(GLOB TG_POLICY_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/policy_*.test.mjs)
  foreach(file ${TG_POLICY_IT})
    get_filename_component(name ${file} NAME)
    string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
    tg_services_test(${name} ${file} "policy;plugins;integration" 180)
  endforeach()
endif()
