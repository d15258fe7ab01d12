# Integration tests of issue 16 "house", item 2 (one mechanism, one place):
# spec/integration/house_*.test.mjs, the real binary against real Postgres and Redis.
# Included by spec/CMakeLists.txt.
#
#   integration.house_ledger_redis_auth   `tollgate ledger` against a password-protected
#                                         Redis on database 3 (a private redis-server on
#                                         127.0.0.1 started by the test)
#
# Labelled `house;billing;integration`; skipped (exit 77) without TOLLGATE_PG and
# TOLLGATE_REDIS (run spec/run.sh).

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: house integration tests not registered")
  return()
endif()

tg_services_test(house_ledger_redis_auth ${CMAKE_CURRENT_SOURCE_DIR}/integration/house_ledger_redis_auth.test.mjs
  "house;billing;integration" 240)
