# Tests of the providers issue (#19, label `providers`): the models list per provider,
# the provider kinds' translation, signing and identities. Included by
# spec/CMakeLists.txt; node tests share spec/run.sh's Postgres and Redis.

tg_services_test(providers_models ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_models.test.mjs
  "providers;integration" 120)
tg_services_test(providers_models_kinds ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_models_kinds.test.mjs
  "providers;integration" 120)
tg_unit_test(providers providers)
tg_services_test(providers_gemini ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_gemini.test.mjs
  "providers;integration" 120)
tg_services_test(providers_azure ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_azure.test.mjs
  "providers;integration" 120)
tg_services_test(providers_bedrock ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_bedrock.test.mjs
  "providers;integration" 120)

# The provider translation benchmark (spec/bench/providers_bench.sh runs it).
add_executable(tg_providers_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/providers_bench.c)
target_compile_options(tg_providers_bench PRIVATE ${TG_WARN})
target_link_libraries(tg_providers_bench PRIVATE tollgate_core)
set_target_properties(tg_providers_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
tg_services_test(providers_identity ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_identity.test.mjs
  "providers;integration" 120)
tg_services_test(providers_identity_fleet ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_identity_fleet.test.mjs
  "providers;integration" 120)
