# Integration tests of issue 16 "house", item 2 (one mechanism, one place):
# spec/integration/house_*.test.mjs, the real binary against real Postgres and Redis.
# Included by spec/CMakeLists.txt.
#
#   integration.house_tables              the admin API and apply share each table's checks
#   integration.house_ledger_redis_auth   `tollgate ledger` against a password-protected
#                                         Redis on database 3 (a private redis-server on
#                                         127.0.0.1 started by the test)
#
# Labelled `house;billing;integration` (house_tables: `house;state;integration`); skipped (exit 77) without TOLLGATE_PG and
# TOLLGATE_REDIS (run spec/run.sh).

find_program(TG_NODE node)
if(NOT TG_NODE)
  message(WARNING "node not found: house integration tests not registered")
  return()
endif()

tg_services_test(house_ledger_redis_auth ${CMAKE_CURRENT_SOURCE_DIR}/integration/house_ledger_redis_auth.test.mjs
  "house;billing;integration" 240)

# integration.house_tables: one description of each table (item 2e): the admin API and
# `tollgate apply` refuse the same bad values with the same message and write a value
# both accept the same. Labelled `house;state;integration`.
tg_services_test(house_tables ${CMAKE_CURRENT_SOURCE_DIR}/integration/house_tables.test.mjs
  "house;state;integration" 120)
