#!/usr/bin/env bash
# The admission cost of periodic budgets (issue #24, item 7): a private Postgres and Redis,
# a billed deployment on the mock upstream (one worker), and for each binary given
# (default build/tollgate) TG_BENCH_N (400) sequential requests of a key under no periodic
# budget, then of a key under two (its own daily budget in a time zone, its tenant's
# monthly one). Reads Redis's INFO commandstats around each batch (CONFIG RESETSTAT
# first): script executions per request and the microseconds Redis spent in them, and
# the client's latency per request (p50, p90, µs: the gateway and the mock upstream,
# one request at a time on a keep-alive connection). A fresh Redis for each binary.
#
# With --callgrind, Redis runs under valgrind --tool=callgrind (counters zeroed before
# and dumped after each batch): Redis's instructions per request, whole process and in
# scripts (EVALSHA/EVAL inclusive) — load-independent, unlike the µs columns.
#
# Usage: flock /tmp/tg-bench.lock spec/bench/budgets_bench.sh [--callgrind] [--keep] [BINARY ...]
# Everything started here is stopped by PID on exit. Shared helpers: spec/bench/lib.sh.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"

CALLGRIND=0
BINS=()
for a in "$@"; do
    case $a in
    --callgrind) CALLGRIND=1 ;;
    --keep) KEEP=1 ;;
    -*) echo "usage: $0 [--callgrind] [--keep] [BINARY ...]" >&2; exit 2 ;;
    *) BINS+=("$a") ;;
    esac
done
[ ${#BINS[@]} -gt 0 ] || BINS=("$ROOT/build/tollgate")
need node psql redis-server redis-cli
[ $CALLGRIND = 0 ] || need valgrind callgrind_control callgrind_annotate
for b in "${BINS[@]}"; do [ -x "$b" ] || { log "$b is missing (build first)"; exit 2; }; done

bench_workdir budgets-bench
bench_services pg

# The Redis of one binary's run: spec/lib/services.sh's, or one under callgrind.
start_redis() {
    if [ $CALLGRIND = 1 ]; then
        rm -rf "$T/cg"
        mkdir -p "$T/cg"
        start redis-cg "" valgrind --tool=callgrind --callgrind-out-file="$T/cg/redis.out" redis-server --port 0 \
            --unixsocket "$T/cg/r.sock" --save '' --appendonly no
        PID_CG=$LAST_PID
        for _ in $(seq 150); do redis-cli -s "$T/cg/r.sock" PING >/dev/null 2>&1 && break; sleep 0.2; done
        export TOLLGATE_REDIS="unix://$T/cg/r.sock" TG_CG_PID=$PID_CG TG_CG_DIR=$T/cg
    else
        tg_redis_start "$T/redis" >/dev/null
    fi
}
stop_redis() {
    if [ $CALLGRIND = 1 ]; then stop_pid "$PID_CG"; else tg_redis_stop "$T/redis"; fi
}
bench_on_exit() { [ $CALLGRIND = 1 ] || tg_redis_stop "$T/redis"; }

say "load average before: $(load_now)"
say ""
if [ $CALLGRIND = 1 ]; then
    say "| binary | key | requests | scripts per request | Redis µs in scripts per request | client p50 µs | client p90 µs | Redis instructions per request | of which in scripts |"
    say "|---|---|---|---|---|---|---|---:|---:|"
else
    say "| binary | key | requests | scripts per request | Redis µs in scripts per request | client p50 µs | client p90 µs |"
    say "|---|---|---|---|---|---|---|"
fi
i=0
for b in "${BINS[@]}"; do
    i=$((i + 1))
    cp "$b" "$T/tollgate-$i" # a rebuild meanwhile cannot change what is measured
    start_redis
    TG_BIN="$T/tollgate-$i" TOLLGATE_PG="$TOLLGATE_PG" TOLLGATE_REDIS="$TOLLGATE_REDIS" \
        NODE_PATH="$ROOT/spec/node_modules" node "$BENCH/budgets_bench.mjs" "$(basename "$b")" | tee -a "$SUMMARY"
    stop_redis
done
say ""
say "load average after: $(load_now)"
