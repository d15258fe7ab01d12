#!/usr/bin/env bash
# tollgate's billing benchmark: how many settlements per second Postgres sustains with
# grouping (tg_settle_batch with batches of 1, 10, 100, 200 from pgbench), how many
# usage rows per second the gateway writes end to end under wrk, and what billing adds
# to the client's latency (billing on vs off, side by side, open loop). The driver is
# billing_bench.mjs (it documents each measurement); this script provides what it
# needs: a private Postgres and Redis in a temporary directory, a snapshot of the
# binary, and tg_loadgen (spec/bench/tg_loadgen.c) built with cc. Prints Markdown
# (spec/bench/RESULTS-billing.md is written from it). A full run takes about 8 minutes.
#
# Usage: spec/bench/billing_bench.sh [--quick]
#   --quick   short cells, to check the script itself
# Environment: TG_BENCH_BIN (default build/tollgate).
#
# Everything listens on 127.0.0.1 or unix sockets only, is started by this script (or
# its driver) and stopped by PID on exit. Postgres runs as spec/run.sh runs it (fsync
# off) and, for the "durable" columns, with fsync and synchronous_commit switched on.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
# As in core_bench.sh: in a session of our own whose autogroup gets nice -19, so that
# other work on the machine takes as little of its CPU as possible.
bench_session "$@"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
QUICK=()
for a in "$@"; do
    case $a in
    --quick) QUICK=(--quick) ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
    esac
done

need wrk pgbench psql node cc
need_bin

bench_workdir billing-bench
snapshot_bin tollgate # a rebuild of build/ during the run cannot change what is measured
build_loadgen
bench_services # private Postgres and Redis in $T: TOLLGATE_PG, TOLLGATE_REDIS

TG_BIN="$BIN" TOLLGATE_PG="$TOLLGATE_PG" TOLLGATE_REDIS="$TOLLGATE_REDIS" \
    NODE_PATH="$ROOT/spec/node_modules" node "$BENCH/billing_bench.mjs" --loadgen "$LOADGEN" "${QUICK[@]}"
