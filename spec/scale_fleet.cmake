# scale (#21), the fleet's half: readiness and draining, Postgres failover (a streaming
# replication pair made once per run by the fixture scale.pg_pair), the systemd unit,
# and a rolling restart behind HAProxy. Each test is labelled `scale` (and
# `integration`); those that move money share spec/run.sh's Redis (RESOURCE_LOCK redis).
# Included by spec/CMakeLists.txt.

if(NOT TG_NODE)
  return()
endif()

tg_services_test(scale_readyz ${CMAKE_CURRENT_SOURCE_DIR}/integration/scale_readyz.test.mjs "scale;integration" 60)

# TLS to Redis (rediss://, redis_tls): a private TLS-only redis-server with a throwaway CA.
tg_services_test(scale_redis_tls ${CMAKE_CURRENT_SOURCE_DIR}/integration/scale_redis_tls.test.mjs "scale;limits;integration" 60)

# The Postgres pair (spec/lib/pg_pair.sh), made once for the tests that need it and
# removed after them, in spec/run.sh's scratch directory (skipped without one).
add_test(NAME scale.pg_pair_start
  COMMAND sh -c "if [ -z \"$TG_TEST_TMP\" ]; then echo 'skipped: needs TG_TEST_TMP (run spec/run.sh)'; exit 77; fi; exec \"$0\" start \"$TG_TEST_TMP/pgpair\""
          ${CMAKE_CURRENT_SOURCE_DIR}/lib/pg_pair.sh)
set_tests_properties(scale.pg_pair_start PROPERTIES FIXTURES_SETUP scale_pg_pair LABELS "scale" TIMEOUT 120 SKIP_RETURN_CODE 77)
add_test(NAME scale.pg_pair_stop
  COMMAND sh -c "if [ -z \"$TG_TEST_TMP\" ]; then exit 77; fi; exec \"$0\" stop \"$TG_TEST_TMP/pgpair\""
          ${CMAKE_CURRENT_SOURCE_DIR}/lib/pg_pair.sh)
set_tests_properties(scale.pg_pair_stop PROPERTIES FIXTURES_CLEANUP scale_pg_pair LABELS "scale" TIMEOUT 60 SKIP_RETURN_CODE 77)

tg_services_test(scale_pg_failover ${CMAKE_CURRENT_SOURCE_DIR}/integration/scale_pg_failover.test.mjs "scale;billing;integration" 120)
set_tests_properties(integration.scale_pg_failover PROPERTIES FIXTURES_REQUIRED scale_pg_pair)

# The systemd unit (examples/systemd/tollgate.service); needs nothing but systemd-analyze.
add_test(NAME integration.scale_systemd COMMAND ${TG_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/integration/scale_systemd.test.mjs)
set_tests_properties(integration.scale_systemd PROPERTIES
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate" LABELS "scale;integration" TIMEOUT 60 SKIP_RETURN_CODE 77)

# A rolling restart of three instances behind HAProxy (examples/fleet/); needs haproxy.
add_test(NAME integration.scale_rolling COMMAND ${TG_NODE} --test ${CMAKE_CURRENT_SOURCE_DIR}/integration/scale_rolling.test.mjs)
set_tests_properties(integration.scale_rolling PROPERTIES
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate" LABELS "scale;integration" TIMEOUT 90 SKIP_RETURN_CODE 77)
