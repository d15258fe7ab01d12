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

# As in core_bench.sh: the kernel groups CPU time by session (autogroup), so run in a
# session of our own and give it nice -19 as a whole (CAP_SYS_NICE; it ends with the
# benchmark), so that other work on the machine takes as little of its CPU as possible.
if [ -z "${TG_BENCH_IN_SESSION:-}" ] && command -v setsid >/dev/null; then
    TG_BENCH_IN_SESSION=1 setsid "$0" "$@" &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM
    rc=0
    wait "$child" || rc=$?
    while kill -0 "$child" 2>/dev/null; do wait "$child" || rc=$?; done
    exit $rc
fi
(echo -19 >/proc/self/autogroup) 2>/dev/null || true

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/spec/bench
BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
QUICK=()
for a in "$@"; do
    case $a in
    --quick) QUICK=(--quick) ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
    esac
done

for tool in wrk pgbench psql node cc; do
    command -v $tool >/dev/null || { echo "billing_bench: $tool is not installed (spec/install-deps.sh)" >&2; exit 2; }
done
[ -x "$BIN" ] || { echo "billing_bench: no binary at $BIN (build first, or set TG_BENCH_BIN)" >&2; exit 2; }

# shellcheck source=spec/lib/services.sh
. "$ROOT/spec/lib/services.sh"

T=$(mktemp -d /tmp/billing-bench.XXXXXX)
chmod 755 "$T"
cleanup() {
    set +e
    tg_redis_stop "$T/redis"
    tg_pg_stop "$T/pg"
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A snapshot of the binary: a rebuild of build/ during the run cannot change what is measured.
cp "$BIN" "$T/tollgate"

cc -O2 -w -std=gnu11 -I/usr/share/include/llhttp "$BENCH/tg_loadgen.c" /usr/share/llhttp/{llhttp,api,http}.c -luv \
    -o "$T/tg_loadgen"

tg_pg_start "$T/pg" >/dev/null
tg_redis_start "$T/redis" >/dev/null

TG_BIN="$T/tollgate" TOLLGATE_PG="$TOLLGATE_PG" TOLLGATE_REDIS="$TOLLGATE_REDIS" \
    NODE_PATH="$ROOT/spec/node_modules" node "$BENCH/billing_bench.mjs" --loadgen "$T/tg_loadgen" "${QUICK[@]}"
