# Tests of the admin, security and plugin defects of the "hostile" issue:
# spec/integration/hostile_admin*.test.mjs, the real binary (with Postgres and Redis
# where a file needs them: it skips, exit 77, without spec/run.sh's TOLLGATE_PG and
# TOLLGATE_REDIS). Included by spec/CMakeLists.txt. Each file is one ctest test,
# `integration.<file>`, labelled `hostile` and `integration`; the ones with a module
# label add it (state, plugins, admin-ui). They share the suite's Redis, so they hold
# RESOURCE_LOCK redis like the state and limits files.

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: hostile admin integration tests not registered")
  return()
endif()

file(GLOB TG_HOSTILE_ADMIN_IT CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/integration/hostile_admin*.test.mjs)
foreach(file ${TG_HOSTILE_ADMIN_IT})
  get_filename_component(name ${file} NAME)
  string(REGEX REPLACE "\\.test\\.mjs$" "" name ${name})
  set(labels "hostile;integration")
  if(name MATCHES "_plugins$")
    # Also issue 16 "house", item 6: its two faults (a worker without its plugin
    # runtime served with no policy; a plugin's reject on /v1/messages in OpenAI's shape).
    list(APPEND labels plugins house)
  elseif(name MATCHES "_console$")
    list(APPEND labels admin-ui)
  else()
    list(APPEND labels state)
  endif()
  # The files that use Postgres and Redis skip without spec/run.sh's services.
  set(need "true")
  if(name MATCHES "_validation$")
    set(need "{ [ -n \"$TOLLGATE_PG\" ] && [ -n \"$TOLLGATE_REDIS\" ]; }")
  endif()
  add_test(NAME integration.${name}
    COMMAND sh -c "if ! ${need}; then echo 'skipped: needs TOLLGATE_PG and TOLLGATE_REDIS (run spec/run.sh)'; exit 77; fi; exec \"$0\" --test \"$1\""
            ${TG_NODE} ${file})
  set_tests_properties(integration.${name} PROPERTIES
    ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate"
    LABELS "${labels}"
    TIMEOUT 180
    SKIP_RETURN_CODE 77
    RESOURCE_LOCK redis)
  # Again against the sanitizer build, when there is one (see spec/tests.cmake): the
  # refused startup undoes built workers, the lockout table and the checks are new C.
  if(NOT TG_SANITIZE AND TG_ASAN_BUILD)
    add_test(NAME integration-asan.${name}
      COMMAND sh -c "if [ ! -x \"$TG_BIN\" ] || ! ${need}; then echo \"skipped: needs an asan build at $TG_BIN (and spec/run.sh's services)\"; exit 77; fi; exec \"$0\" --test \"$1\""
              ${TG_NODE} ${file})
    set_tests_properties(integration-asan.${name} PROPERTIES
      ENVIRONMENT "TG_BIN=${TG_ASAN_BUILD}/tollgate"
      LABELS "${labels};asan"
      TIMEOUT 400
      SKIP_RETURN_CODE 77
      RESOURCE_LOCK redis)
  endif()
endforeach()
