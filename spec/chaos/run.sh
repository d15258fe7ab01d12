#!/usr/bin/env bash
# The chaos run: three gateway instances on one private Postgres and one private Redis
# under a mixed load, while instances are killed (-9) and restarted, Redis and Postgres
# are restarted, the mock upstream injects 429/5xx/resets/hangs and clients leave
# mid-stream. Prints its figures and fails unless `tollgate ledger verify` is clean
# (after the reconciler's pass) and every bound of the README's Limits and Billing
# sections holds. Everything it starts is stopped by PID at the end.
#
#   spec/chaos/run.sh                       60 s of load (ctest chaos.short runs 30 s)
#   TG_CHAOS_SECONDS=600 spec/chaos/run.sh  the long form, for humans
#   TG_CHAOS_CLIENTS=N                      concurrent clients (default 24)
#   TG_BIN=path                             the binary (default build/tollgate)
#
# It needs postgres (initdb), redis-server and node (spec/install-deps.sh); it does not
# use spec/run.sh's services, since it restarts its own.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
root=$(cd "$here/../.." && pwd -P)
export TG_BIN="${TG_BIN:-$root/build/tollgate}"
[ -x "$TG_BIN" ] || { echo "no tollgate binary at $TG_BIN (build it first)" >&2; exit 2; }
exec node "$here/chaos.mjs"
