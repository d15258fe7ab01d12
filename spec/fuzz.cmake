# libFuzzer targets, built only with -DTG_FUZZ=ON (clang, and TG_SANITIZE=ON so the
# fuzzers run under ASan + UBSan):
#
#   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DTG_SANITIZE=ON -DTG_FUZZ=ON
#   cmake --build build-fuzz -j && spec/fuzz/run-fuzzers.sh build-fuzz 60
#
# The pattern, one line per parser: spec/fuzz/fuzz_<name>.c defines
# LLVMFuzzerTestOneInput; tg_fuzz_target(fuzz_<name>) builds build-fuzz/fuzz_<name>
# and registers ctest `fuzz.<name>`, which replays the seed corpus in
# spec/fuzz/corpus/fuzz_<name>/ (crash regressions go there too). An optional
# spec/fuzz/fuzz_<name>.dict is passed as -dict. run-fuzzers.sh then fuzzes every
# fuzz_* binary it finds for a given time.
if(TG_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "TG_FUZZ=ON needs clang: -DCMAKE_C_COMPILER=clang")
  endif()
  if(NOT TG_SANITIZE)
    message(FATAL_ERROR "TG_FUZZ=ON needs TG_SANITIZE=ON (fuzzing without ASan misses most bugs)")
  endif()

  # Coverage instrumentation for the code under test, so libFuzzer sees its branches.
  # The ASan runtime supplies the coverage callbacks for the other binaries (tollgate,
  # tg_unit) that link the same library.
  target_compile_options(tollgate_core PRIVATE -fsanitize=fuzzer-no-link)

  set(TG_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR}/fuzz)

  # tg_fuzz_target(NAME): the libFuzzer binary NAME from spec/fuzz/NAME.c.
  function(tg_fuzz_target name)
    add_executable(${name} ${TG_FUZZ_DIR}/${name}.c)
    target_compile_options(${name} PRIVATE ${TG_WARN} -fsanitize=fuzzer)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(${name} PRIVATE tollgate_core)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
    # Replays every seed once (-runs=0 fuzzes nothing and writes nothing back).
    string(REGEX REPLACE "^fuzz_" "" short ${name})
    add_test(NAME fuzz.${short} COMMAND ${name} -runs=0 ${TG_FUZZ_DIR}/corpus/${name})
    set_tests_properties(fuzz.${short} PROPERTIES LABELS "core;fuzz" TIMEOUT 120)
  endfunction()

  tg_fuzz_target(fuzz_sse)
  tg_fuzz_target(fuzz_usage)
  tg_fuzz_target(fuzz_http)
  tg_fuzz_target(fuzz_translate_request)
  tg_fuzz_target(fuzz_translate_stream)
  tg_fuzz_target(fuzz_json_members)
  tg_fuzz_target(fuzz_log_safe)
  tg_fuzz_target(fuzz_json_numbers)
  tg_fuzz_target(fuzz_json_scan)
  tg_fuzz_target(fuzz_quota)
  tg_fuzz_target(fuzz_gemini_stream)
  tg_fuzz_target(fuzz_aws_eventstream)
  tg_fuzz_target(fuzz_redis_cluster)
  tg_fuzz_target(fuzz_traceparent)
  tg_fuzz_target(fuzz_models_list)
endif()

# In the release build (the one spec/run.sh runs ctest in), the fuzz and sanitizer
# binaries of the ASan build are run from here: `fuzz.run` fuzzes every target briefly
# (TG_FUZZ_SECONDS, default 15 s each: 15 targets, about 4.5 minutes with their corpus
# loads; the timeout leaves room for more) and `unit-asan` runs the unit tests under
# ASan + UBSan. Both skip (77) when there is no ASan build.
if(NOT TG_FUZZ AND NOT TG_SANITIZE)
  set(TG_ASAN_DIR "$ENV{TG_ASAN_BUILD}")
  if(NOT TG_ASAN_DIR)
    set(TG_ASAN_DIR ${CMAKE_SOURCE_DIR}/build-asan)
  endif()
  add_test(NAME fuzz.run
    COMMAND sh -c "ls \"$0\"/fuzz_* >/dev/null 2>&1 || { echo \"skipped: no fuzz build in $0\"; exit 77; }; exec \"$1\" \"$0\" \"\${TG_FUZZ_SECONDS:-15}\""
            ${TG_ASAN_DIR} ${CMAKE_CURRENT_LIST_DIR}/fuzz/run-fuzzers.sh)
  set_tests_properties(fuzz.run PROPERTIES LABELS "core;fuzz" SKIP_RETURN_CODE 77 TIMEOUT 600)
  foreach(m buf sse usage http config json)
    add_test(NAME unit-asan.${m}
      COMMAND sh -c "[ -x \"$0/tg_unit\" ] || { echo \"skipped: no asan build\"; exit 77; }; exec \"$0/tg_unit\" \"$1\""
              ${TG_ASAN_DIR} ${m})
    set_tests_properties(unit-asan.${m} PROPERTIES LABELS "core;unit;asan" SKIP_RETURN_CODE 77 TIMEOUT 120)
  endforeach()
endif()
