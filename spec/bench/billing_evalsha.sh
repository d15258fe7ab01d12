#!/usr/bin/env bash
# Redis script calls per billed request (issue 6: "one atomic Redis script per
# admission, one round trip"): a private Postgres and Redis, a billed deployment on the
# mock upstream, and for each binary given (default build/tollgate) 200 requests of a
# key with limits (key and tenant: rpm, concurrency) and 200 of a key without limits.
# Reads Redis's INFO commandstats around each batch (CONFIG RESETSTAT first): EVALSHA
# and EVAL calls (EVAL: a NOSCRIPT retry, or the reconciler's lock) per request, and the
# microseconds Redis spent in them per request. The account has no concurrency cap, so no
# account-slot script is counted (TG_BENCH_ACCOUNT_CONCURRENCY=N gives it a cap of N: its
# slot is then taken and given back for every request). A fresh Redis for each binary: the keyspace (which the
# reconciler's SCAN walks) and the script cache start the same for all. Prints Markdown
# (spec/bench/RESULTS-billing.md, run 5). About 15 s per binary.
#
# With --callgrind, Redis runs under valgrind --tool=callgrind instead (its counters
# zeroed after the warm-up and dumped after each batch), and two more columns give Redis's
# instructions per request: the whole process (scripts, commands, event loop, I/O, and
# the gateway's background work: heartbeats, the reconciler's SCAN) and the scripts' own
# (EVALSHA/EVAL inclusive). Instruction counts do not move with the box's load, unlike
# the µs column. About a minute per binary.
#
# Usage: flock /tmp/tg-bench.lock spec/bench/billing_evalsha.sh [--callgrind] [--keep] [BINARY ...]
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

bench_workdir billing-evalsha
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
    say "| binary | key | requests | EVALSHA+EVAL per request | Redis µs in scripts per request | other Redis commands per request | Redis instructions per request | of which in scripts |"
    say "|---|---|---|---|---|---|---:|---:|"
else
    say "| binary | key | requests | EVALSHA+EVAL per request | Redis µs in scripts per request | other Redis commands per request |"
    say "|---|---|---|---|---|---|"
fi
i=0
for b in "${BINS[@]}"; do
    i=$((i + 1))
    cp "$b" "$T/tollgate-$i" # a rebuild meanwhile cannot change what is measured
    start_redis
    TG_BIN="$T/tollgate-$i" TOLLGATE_PG="$TOLLGATE_PG" TOLLGATE_REDIS="$TOLLGATE_REDIS" \
        NODE_PATH="$ROOT/spec/node_modules" node "$BENCH/billing_evalsha.mjs" "$(basename "$b")" | tee -a "$SUMMARY"
    stop_redis
done
say ""
say "load average after: $(load_now)"
