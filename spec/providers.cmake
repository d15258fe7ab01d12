# Tests of the providers issue (#19, label `providers`): the models list per provider,
# the provider kinds' translation, signing and identities. Included by
# spec/CMakeLists.txt; node tests share spec/run.sh's Postgres and Redis.

tg_services_test(providers_models ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_models.test.mjs
  "providers;integration" 120)
tg_unit_test(providers providers)
tg_services_test(providers_gemini ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_gemini.test.mjs
  "providers;integration" 120)
tg_services_test(providers_azure ${CMAKE_CURRENT_SOURCE_DIR}/integration/providers_azure.test.mjs
  "providers;integration" 120)
