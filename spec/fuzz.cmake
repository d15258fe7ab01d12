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
endif()
