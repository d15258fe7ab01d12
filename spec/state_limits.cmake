# Integration tests of the state and limits issues: spec/integration/state_*.test.mjs and
# limits_*.test.mjs, the real binary against real Postgres and Redis. Included by
# spec/CMakeLists.txt.
#
# Each file is one ctest test, `integration.<file>`, labelled with its issue (state or
# limits) and `integration`. spec/run.sh exports TOLLGATE_PG and TOLLGATE_REDIS for its
# private servers; without them the tests are skipped (exit 77). Each file makes its own
# database on that Postgres (see spec/integration/lib/db.mjs). They share one Redis and
# several measure timing (token buckets, lease TTLs, one database lookup per cold key),
# so they hold RESOURCE_LOCK redis and run one at a time even under ctest -j.

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: state/limits integration tests not registered")
  return()
endif()

file(GLOB TG_STATE_LIMITS_IT CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/integration/state_*.test.mjs
  ${CMAKE_CURRENT_SOURCE_DIR}/integration/limits_*.test.mjs)
foreach(file ${TG_STATE_LIMITS_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
  string(REGEX REPLACE "_.*$" "" issue ${name})

  add_test(NAME integration.${name}
    COMMAND sh -c "if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ]; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
            ${TG_NODE} ${file})
  set_tests_properties(integration.${name} PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
    LABELS "${issue};integration"
    TIMEOUT 180
    SKIP_RETURN_CODE 77
    RESOURCE_LOCK redis)
  # The Redis-failure files again against the sanitizer build, when there is one (see
  # spec/tests.cmake): their fallback paths free and reuse request state.
  if(name MATCHES "^limits_(no_redis|redis_down|down_hook)$" AND NOT TG_SANITIZE AND TG_ASAN_BUILD)
    add_test(NAME integration-asan.${name}
      COMMAND sh -c "if [ -z \"$TOLLGATE_PG\" ] || [ -z \"$TOLLGATE_REDIS\" ] || [ ! -x \"$TG_BIN\" ]; then echo 'skipped: needs spec/run.sh and an asan build'; exit 77; fi; exec \"$0\" --test \"$1\""
              ${TG_NODE} ${file})
    set_tests_properties(integration-asan.${name} PROPERTIES
      ENVIRONMENT "TG_BIN=${TG_ASAN_BUILD}/tollgate"
      LABELS "${issue};integration;asan"
      TIMEOUT 400
      SKIP_RETURN_CODE 77
      RESOURCE_LOCK redis)
  endif()
endforeach()

# The limiter's unit tests (spec/unit/test_limits.c) again from the sanitizer build.
if(NOT TG_SANITIZE AND TG_ASAN_BUILD)
  add_test(NAME unit-asan.limits
    COMMAND sh -c "[ -x \"$0/tg_unit\" ] || { echo \"skipped: no asan build\"; exit 77; }; exec \"$0/tg_unit\" limits"
            ${TG_ASAN_BUILD})
  set_tests_properties(unit-asan.limits PROPERTIES LABELS "limits;unit;asan" SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
