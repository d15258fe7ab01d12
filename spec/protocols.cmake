# Tests and tools of the protocols issue (label `protocols`). Included by
# spec/CMakeLists.txt.
#
#   unit.translate        the translation layer's unit and golden-file tests
#                         (spec/unit/test_translate.c, spec/golden/translate/<case>/)
#   unit-asan.translate   the same under ASan + UBSan, from the release build, when the
#                         sanitizer build exists (skipped otherwise)
#   unit.translate_sdk    the translated golden streams and bodies replayed through the
#                         official openai and @anthropic-ai/sdk clients (node, no server)
#   tg_translate_bench    translation cost per request and per streamed chunk against
#                         passthrough (spec/bench/translate_bench.sh runs it)
# The libFuzzer targets fuzz_translate_request and fuzz_translate_stream are registered
# in spec/fuzz.cmake with the other fuzzers.

tg_unit_test(translate protocols)
# Issue #15 (label fidelity): spec/golden/fidelity/<case>, the golden format above.
tg_unit_test(fidelity "fidelity;protocols")

if(NOT TG_FUZZ AND NOT TG_SANITIZE)
  set(TG_PROTO_ASAN_DIR "$ENV{TG_ASAN_BUILD}")
  if(NOT TG_PROTO_ASAN_DIR)
    set(TG_PROTO_ASAN_DIR ${CMAKE_SOURCE_DIR}/build-asan)
  endif()
  add_test(NAME unit-asan.translate
    COMMAND sh -c "[ -x \"$0/tg_unit\" ] || { echo \"skipped: no asan build\"; exit 77; }; exec \"$0/tg_unit\" translate"
            ${TG_PROTO_ASAN_DIR})
  set_tests_properties(unit-asan.translate PROPERTIES LABELS "protocols;unit;asan" SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()

find_program(TG_NODE node)
if(TG_NODE)
  add_test(NAME unit.translate_sdk
    COMMAND sh -c "[ -d \"$1/node_modules/openai\" ] || { echo \"skipped: no spec/node_modules\"; exit 77; }; exec \"$0\" --test \"$1/golden/translate/check_sdk.mjs\""
            ${TG_NODE} ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(unit.translate_sdk PROPERTIES LABELS "protocols;unit" SKIP_RETURN_CODE 77 TIMEOUT 120)
  add_test(NAME unit.fidelity_sdk
    COMMAND sh -c "[ -d \"$1/node_modules/openai\" ] || { echo \"skipped: no spec/node_modules\"; exit 77; }; exec \"$0\" --test \"$1/golden/translate/check_sdk.mjs\""
            ${TG_NODE} ${CMAKE_CURRENT_SOURCE_DIR})
  set_tests_properties(unit.fidelity_sdk PROPERTIES LABELS "fidelity;protocols;unit" SKIP_RETURN_CODE 77 TIMEOUT 120
    ENVIRONMENT "TG_GOLDEN_DIR=${CMAKE_CURRENT_SOURCE_DIR}/golden/fidelity")
endif()

add_executable(tg_translate_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/translate_bench.c)
target_compile_options(tg_translate_bench PRIVATE ${TG_WARN})
target_link_libraries(tg_translate_bench PRIVATE tollgate_core)
set_target_properties(tg_translate_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

# The official SDKs against the real gateway with upstreams of both kinds.
if(TG_NODE)
  add_test(NAME integration.protocols_sdk COMMAND ${TG_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/integration/protocols_sdk.test.mjs)
  set_tests_properties(integration.protocols_sdk PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate" LABELS "protocols;integration" TIMEOUT 120)
  add_test(NAME integration.fidelity_sdk COMMAND ${TG_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/integration/fidelity_sdk.test.mjs)
  set_tests_properties(integration.fidelity_sdk PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate" LABELS "fidelity;protocols;integration" TIMEOUT 180)
  add_test(NAME integration.fidelity_billing
    COMMAND sh -c "if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
            ${TG_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/integration/fidelity_billing.test.mjs)
  set_tests_properties(integration.fidelity_billing PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate" LABELS "fidelity;protocols;billing;integration" TIMEOUT 240
    SKIP_RETURN_CODE 77 RESOURCE_LOCK redis)
  add_test(NAME integration.protocols_errors COMMAND ${TG_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/integration/protocols_errors.test.mjs)
  set_tests_properties(integration.protocols_errors PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate" LABELS "protocols;integration" TIMEOUT 120)
endif()
