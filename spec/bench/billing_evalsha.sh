#!/usr/bin/env bash
# Redis script calls per billed request (issue 6: "one atomic Redis script per
# admission, one round trip"): a private Postgres and Redis, a billed deployment on the
# mock upstream, and for each binary given (default build/tollgate) 200 requests of a
# key with limits (key and tenant: rpm, concurrency) and 200 of a key without limits.
# Reads Redis's INFO commandstats around each batch (CONFIG RESETSTAT first): EVALSHA
# and EVAL calls (EVAL: a NOSCRIPT retry) per request, and the microseconds Redis spent
# in them per request. The account has no concurrency cap, so no account-slot script is
# counted. Prints Markdown. About a minute per binary.
#
# With --callgrind, Redis runs under valgrind --tool=callgrind instead (its counters
# zeroed after the warm-up and dumped after each batch), and the last column is Redis's
# whole-process instructions per request (scripts, commands, event loop, I/O, and the
# gateway's background work: heartbeats, the reconciler's SCAN) and the scripts' own
# (EVALSHA/EVAL inclusive): instruction counts do not move with the box's load, unlike
# the µs column. Slower (about a minute per binary).
#
# Usage: spec/bench/billing_evalsha.sh [--callgrind] [BINARY ...]
# Run under the bench lock: flock /tmp/tg-bench.lock spec/bench/billing_evalsha.sh ...
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=$ROOT/spec/bench
CALLGRIND=0
if [ "${1:-}" = --callgrind ]; then
    CALLGRIND=1
    shift
fi
[ $# -gt 0 ] || set -- "$ROOT/build/tollgate"

# shellcheck source=spec/lib/services.sh
. "$ROOT/spec/lib/services.sh"

T=$(mktemp -d /tmp/billing-evalsha.XXXXXX)
chmod 755 "$T"
VG=
cleanup() {
    set +e
    [ -z "$VG" ] || { kill "$VG"; wait "$VG" 2>/dev/null; }
    tg_redis_stop "$T/redis"
    tg_pg_stop "$T/pg"
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

tg_pg_start "$T/pg" >/dev/null
# A fresh Redis for each binary: the keyspace (which the reconciler's SCAN walks) and the
# script cache start the same for both.
start_redis() {
    if [ $CALLGRIND = 1 ]; then
        rm -rf "$T/cg"
        mkdir -p "$T/cg"
        valgrind --tool=callgrind --callgrind-out-file="$T/cg/redis.out" redis-server --port 0 --unixsocket "$T/cg/r.sock" \
            --save '' --appendonly no >"$T/cg/redis.log" 2>"$T/cg/vg.err" &
        VG=$!
        for _ in $(seq 150); do redis-cli -s "$T/cg/r.sock" PING >/dev/null 2>&1 && break; sleep 0.2; done
        export TOLLGATE_REDIS="unix://$T/cg/r.sock" TG_CG_PID=$VG TG_CG_DIR=$T/cg
    else
        tg_redis_start "$T/redis" >/dev/null
    fi
}
stop_redis() {
    if [ -n "$VG" ]; then
        kill "$VG"
        wait "$VG" 2>/dev/null || true
        VG=
    else
        tg_redis_stop "$T/redis"
    fi
}

if [ $CALLGRIND = 1 ]; then
    echo "| binary | key | requests | EVALSHA+EVAL per request | Redis µs in scripts per request | other Redis commands per request | Redis instructions per request | of which in scripts |"
    echo "|---|---|---|---|---|---|---:|---:|"
else
    echo "| binary | key | requests | EVALSHA+EVAL per request | Redis µs in scripts per request | other Redis commands per request |"
    echo "|---|---|---|---|---|---|"
fi
i=0
for bin in "$@"; do
    i=$((i + 1))
    cp "$bin" "$T/tollgate-$i" # a rebuild meanwhile cannot change what is measured
    start_redis
    TG_BIN="$T/tollgate-$i" TOLLGATE_PG="$TOLLGATE_PG" TOLLGATE_REDIS="$TOLLGATE_REDIS" \
        NODE_PATH="$ROOT/spec/node_modules" node "$BENCH/billing_evalsha.mjs" "$(basename "$bin")"
    stop_redis
done
