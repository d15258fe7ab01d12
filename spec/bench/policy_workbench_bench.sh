#!/usr/bin/env bash
# The cost of a policy generation change across two instances (issue #22, item 4): a
# private Postgres and Redis, two gateways (2 workers each, the router and retry-budget
# enabled, their own plugins.store) and TG_BENCH_N (20) uploads of a new source of a
# stored policy live for a group, alternately on each; spec/bench/policy_workbench_bench.mjs
# measures the PUT's answer and the time until the other instance serves the new
# generation (see there). Results: spec/bench/RESULTS.md, "Policy (#22): workbench".
#
# Usage: flock /tmp/tg-bench.lock spec/bench/policy_workbench_bench.sh
# Everything started here is stopped by PID on exit. Shared helpers: spec/bench/lib.sh.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"

need node psql redis-server
BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
need_bin
bench_workdir policy-workbench-bench
bench_services
cp "$BIN" "$T/tollgate" # a rebuild meanwhile cannot change what is measured
say "binary $(sha256sum "$T/tollgate" | cut -c1-12), load average before: $(load_now)"
TG_BIN="$T/tollgate" TOLLGATE_PG="$TOLLGATE_PG" TOLLGATE_REDIS="$TOLLGATE_REDIS" \
    NODE_PATH="$ROOT/spec/node_modules" node "$BENCH/policy_workbench_bench.mjs" | tee -a "$SUMMARY"
say "load average after: $(load_now)"
