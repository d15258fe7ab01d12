# Unit tests of the state substrates against real servers: the Postgres pool (tg_pg)
# and the Redis client (tg_redis). Included by spec/CMakeLists.txt.
#
# spec/run.sh starts a private Postgres and Redis and sets TOLLGATE_PG (a libpq
# conninfo) and TOLLGATE_REDIS (unix:///path/to.sock); without them `tg_unit pg` /
# `tg_unit redis` exit 77 and ctest reports the test as skipped.

add_test(NAME unit.pg COMMAND tg_unit pg)
set_tests_properties(unit.pg PROPERTIES LABELS "state;unit" TIMEOUT 120 SKIP_RETURN_CODE 77)

# Redis is the substrate of the limits issue (leases, buckets, budgets).
add_test(NAME unit.redis COMMAND tg_unit redis)
set_tests_properties(unit.redis PROPERTIES LABELS "limits;unit" TIMEOUT 120 SKIP_RETURN_CODE 77)

# The admission lifecycle (tg_limits.c) against the same Redis: the same request id is
# charged once, renewal re-acquires lost leases and keeps the request's marker.
add_test(NAME unit.limits_redis COMMAND tg_unit limits_redis)
set_tests_properties(unit.limits_redis PROPERTIES LABELS "limits;unit" TIMEOUT 120 SKIP_RETURN_CODE 77)
if(NOT TG_SANITIZE AND TG_ASAN_BUILD)
  add_test(NAME unit-asan.limits_redis
    COMMAND sh -c "[ -x \"$0/tg_unit\" ] || { echo \"skipped: no asan build\"; exit 77; }; exec \"$0/tg_unit\" limits_redis"
            ${TG_ASAN_BUILD})
  set_tests_properties(unit-asan.limits_redis PROPERTIES LABELS "limits;unit;asan" SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()

# settle.lua, the holds of a settlement batch given back in one call per tenant
# (tg_billing_settle.c): once each, exact, idempotent.
add_test(NAME unit.settle_redis COMMAND tg_unit settle_redis)
set_tests_properties(unit.settle_redis PROPERTIES LABELS "pipeline;billing;unit" TIMEOUT 60 SKIP_RETURN_CODE 77)
