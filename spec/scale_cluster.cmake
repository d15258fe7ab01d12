# Issue 21 (scale), Redis Cluster: a real cluster of 3 primaries + 3 replicas on
# 127.0.0.1 (spec/scale/cluster.sh), created once for the label by the fixture test
# scale.cluster_up and stopped by scale.cluster_down (ctest FIXTURES_SETUP / CLEANUP:
# `ctest -R scale_cluster` starts it too), and the tests that use it. Included by
# spec/CMakeLists.txt. The unit tests of slot hashing, redirections and the slot map are
# unit.redis_cluster (label scale).

tg_unit_test(redis_cluster "scale;limits")

find_program(TG_NODE node)
find_program(TG_REDIS_SERVER redis-server)
if(NOT TG_NODE OR NOT TG_REDIS_SERVER)
  message(WARNING "node or redis-server not found: the Redis Cluster tests are not registered")
  return()
endif()

set(TG_SCALE_CLUSTER_DIR ${CMAKE_BINARY_DIR}/scale-cluster)
set(TG_SCALE_CLUSTER_SH ${CMAKE_CURRENT_SOURCE_DIR}/scale/cluster.sh)

add_test(NAME scale.cluster_up
  COMMAND sh -c "\"$0\" stop \"$1\" >/dev/null 2>&1; rm -rf \"$1\"; exec \"$0\" start \"$1\""
          ${TG_SCALE_CLUSTER_SH} ${TG_SCALE_CLUSTER_DIR})
set_tests_properties(scale.cluster_up PROPERTIES FIXTURES_SETUP scale_cluster LABELS "scale" TIMEOUT 60
  RESOURCE_LOCK scale_cluster)
add_test(NAME scale.cluster_down COMMAND ${TG_SCALE_CLUSTER_SH} stop ${TG_SCALE_CLUSTER_DIR})
set_tests_properties(scale.cluster_down PROPERTIES FIXTURES_CLEANUP scale_cluster LABELS "scale" TIMEOUT 60
  RESOURCE_LOCK scale_cluster)

tg_services_test(scale_cluster ${CMAKE_CURRENT_SOURCE_DIR}/integration/scale_cluster.test.mjs "scale;integration" 180)
set_tests_properties(integration.scale_cluster PROPERTIES FIXTURES_REQUIRED scale_cluster RESOURCE_LOCK "redis;scale_cluster"
  ENVIRONMENT "TG_BIN=${CMAKE_BINARY_DIR}/tollgate;TG_SCALE_CLUSTER_DIR=${TG_SCALE_CLUSTER_DIR};TG_SCALE_CLUSTER_SH=${TG_SCALE_CLUSTER_SH}")
