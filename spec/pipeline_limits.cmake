# Tests of issue 17 "pipeline", goal 4 (Redis script executions at the end of a request),
# on the limiter's side. Included by spec/CMakeLists.txt after state_limits.cmake.
#
#   integration.pipeline_end   spec/integration/pipeline_end.test.mjs: per billed request
#                              no script at the end: a ZREM per lease and for the account
#                              slot, the TPM correction carried by the next admission (or
#                              correct.lua); counted with MONITOR on a private redis-server
#   integration.pipeline_onerow spec/integration/pipeline_onerow.test.mjs: goal 3, one
#                              Postgres row per billed request on the normal path (no
#                              reservation row for a request settled in the batch of its
#                              reservation, sql/0017), every other shape keeps its rows
#   integration.pipeline_lean  spec/integration/pipeline_lean.test.mjs: goal 3, a leaner
#                              batch (sql/0023): a request's reservation inside its
#                              settlement's element, usage's foreign keys checked once a
#                              batch and on delete (races both ways), the gateway's pairs
#   integration.pipeline_functions spec/integration/pipeline_functions.test.mjs: goal 3,
#                              the batch in sql/functions/ (migrate applies a changed file
#                              again, a failing one is rolled back and named), a large
#                              mixed batch's outcomes and books without the n x n join
#   integration.pipeline_slot  spec/integration/pipeline_slot.test.mjs: goal 2, the
#                              admission and the account's slot in one round trip (Redis
#                              behind a delaying proxy), a refused or queued admission
#                              holds no slot
#
# The limiter's guarantees the end of a request keeps are the `limits` tests below, also
# labelled `pipeline`: concurrency never exceeded across instances (limits_concurrency),
# a client that goes away releases at once (limits_lease), a release that got no answer
# is sent again (limits_lease_recovery), TPM corrected to the real usage (limits_tpm).

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: pipeline limits tests not registered")
  return()
endif()

tg_services_test(pipeline_end ${CMAKE_CURRENT_SOURCE_DIR}/integration/pipeline_end.test.mjs
  "pipeline;limits;integration" 120)
tg_services_test(pipeline_slot ${CMAKE_CURRENT_SOURCE_DIR}/integration/pipeline_slot.test.mjs
  "pipeline;limits;routing;integration" 120)
tg_services_test(pipeline_onerow ${CMAKE_CURRENT_SOURCE_DIR}/integration/pipeline_onerow.test.mjs
  "pipeline;billing;integration" 120)
tg_services_test(pipeline_lean ${CMAKE_CURRENT_SOURCE_DIR}/integration/pipeline_lean.test.mjs
  "pipeline;billing;integration" 180)
tg_services_test(pipeline_functions ${CMAKE_CURRENT_SOURCE_DIR}/integration/pipeline_functions.test.mjs
  "pipeline;billing;state;integration" 180)
foreach(name limits_concurrency limits_lease limits_lease_recovery limits_tpm)
  if(TEST integration.${name})
    set_property(TEST integration.${name} APPEND PROPERTY LABELS pipeline)
  endif()
endforeach()

# integration.pipeline_scan: admission, the bound and sticky routing read the body's
# scan, not a tree; what the upstream receives is unchanged (default cap in the client's
# bytes, in a tree built later, the tree's way for limits the scan cannot read).
tg_services_test(pipeline_scan ${CMAKE_CURRENT_SOURCE_DIR}/integration/pipeline_scan.test.mjs
  "pipeline;billing;integration" 120)
