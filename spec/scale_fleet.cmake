# scale (#21), the fleet's half: readiness and draining, Postgres failover (a streaming
# replication pair made once per run by the fixture scale.pg_pair), the systemd unit,
# and a rolling restart behind HAProxy. Each test is labelled `scale` (and
# `integration`); those that move money share spec/run.sh's Redis (RESOURCE_LOCK redis).
# Included by spec/CMakeLists.txt.

if(NOT TG_NODE)
  return()
endif()

tg_services_test(scale_readyz ${CMAKE_CURRENT_SOURCE_DIR}/integration/scale_readyz.test.mjs "scale;integration" 60)
