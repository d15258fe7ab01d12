#!/usr/bin/env bash
# The gateway's settlement path without HTTP (issue 7, item 8: "sustained settlements per
# second, at least 5,000/s on this two-core machine with grouping"). billing_settle_bench.c
# links the gateway's own billing (tg_billing*.c in libtollgate_core.a) and drives it as the pipeline (app/tg_proxy*.c)
# does — reserve, then settle with the usage — for N distinct requests as fast as the API
# accepts them, with 1 and with 2 billing instances (threads, like gateway workers),
# against a private Postgres 15 (fsync and synchronous_commit ON: durable) and Redis 7.
# For each run: settlements committed per second (wall time from the first reservation
# until every settlement is committed, and usage rows counted in Postgres), batch sizes
# (usage rows per transaction, from usage.created_at = the transaction's start), CPU, and
# `tollgate ledger verify` afterwards. Prints Markdown (spec/bench/RESULTS-billing.md).
#
# Usage: flock /tmp/tg-bench.lock spec/bench/billing_settle_bench.sh [--quick] [--keep]
# Environment: TG_BENCH_BIN (build/tollgate; its directory holds libtollgate_core.a and
#   libllhttp.a), TG_BENCH_N (100000 requests per run), TG_BENCH_WINDOW (256 reservations
#   in flight per worker), TG_BENCH_BACKLOG (8000 settled-but-uncommitted requests per
#   worker before the driver waits; below the queue's spill point of 20,000 elements),
#   TG_BENCH_TENANTS (4), TG_BENCH_ROLLUPS (on; off: without the hourly rollups; 0016: as
#   before sql/0020).
# Everything started here is stopped by PID (or by spec/lib/services.sh's stop functions)
# on exit; each run is bounded by `timeout`. Shared helpers: spec/bench/lib.sh.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
N=${TG_BENCH_N:-100000}
WINDOW=${TG_BENCH_WINDOW:-256}
BACKLOG=${TG_BENCH_BACKLOG:-8000}
TENANTS=${TG_BENCH_TENANTS:-4}
for a in "$@"; do
    case $a in
    --quick) N=6000 ;;
    --keep) KEEP=1 ;;
    *) echo "usage: $0 [--quick] [--keep]" >&2; exit 2 ;;
    esac
done
need cc psql redis-server redis-cli pkg-config timeout
need_bin
BUILD=$(cd "$(dirname "$BIN")" && pwd)
need_core_libs

bench_workdir tg-settle-bench
snapshot_bin tollgate # a rebuild during the run cannot change what is measured
build_core_bench billing_settle_bench -I"$(pg_config --includedir)"

bench_services # private Postgres and Redis in $T: TOLLGATE_PG, PID_REDIS
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$TOLLGATE_PG" "$@"; }
# Durable: every commit waits for its WAL flush (services.sh starts Postgres for tests,
# with both off).
psql -X -q -v ON_ERROR_STOP=1 -d "${TOLLGATE_PG/dbname=tollgate/dbname=postgres}" \
    -c "ALTER SYSTEM SET fsync = on" -c "ALTER SYSTEM SET synchronous_commit = on" -c "SELECT pg_reload_conf()" >/dev/null
sleep 0.3
echo "return { upstream = { url = \"http://127.0.0.1:9/v1\" } }" >"$T/tool.lua" # not contacted
"$T/tollgate" migrate -c "$T/tool.lua" >/dev/null
# TG_BENCH_ROLLUPS=off: the settlement batch without its hourly rollups (usage #18,
# sql/0010): tg_usage_rollup made a no-op, to compare against (spec/bench/usage_bench.sh).
# TG_BENCH_ROLLUPS=0016: every batch rolled up as before sql/0020 (0016's function, which
# 0020 keeps for late batches as tg_usage_rollup_late), for a before/after in one binary.
case "${TG_BENCH_ROLLUPS:-on}" in
on) ;;
off) sql -c "CREATE OR REPLACE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS 'BEGIN END'" ;;
0016) sql -c "CREATE OR REPLACE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql
              AS 'BEGIN PERFORM tg_usage_rollup_late(won); END'" ;;
*) log "TG_BENCH_ROLLUPS: on, off or 0016"; exit 2 ;;
esac
for i in $(seq "$TENANTS"); do
    sql -c "INSERT INTO tenants (name, balance, opening_balance) VALUES ('bench-$i', 1000000000, 1000000000)"
    sql -c "INSERT INTO api_keys (tenant_id, name, key_hash, prefix)
            SELECT id, 'k$i', sha256(convert_to('tg-settle-bench-$i', 'UTF8')), 'tg-settl' FROM tenants WHERE name = 'bench-$i'"
done
DURABLE=$(sql -c "SELECT current_setting('fsync') || '/' || current_setting('synchronous_commit')")
# Postgres' CPU: the postmaster's own and its reaped children's (backends that exited),
# plus every live child's (backends, WAL writer, checkpointer), in clock ticks.
pg_ticks() {
    local pm
    pm=$(head -1 "$T/pg/pgdata/postmaster.pid")
    { awk '{print $14 + $15 + $16 + $17}' "/proc/$pm/stat"
      for p in $(pgrep -P "$pm" || true); do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || true; done
    } | awk '{ s += $1 } END { print s + 0 }'
}
# Rows written in user tables (inserted + updated + deleted; the statistics collector's
# counters, flushed by each backend within a second of its transaction).
pg_rows() { sleep 1.2; sql -c "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"; }
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }

echo "### In-process settlement path (billing_settle_bench.c): tg_billing against Postgres + Redis, no HTTP"
echo ""
echo "Commit $(git_head), $(date -u '+%Y-%m-%d %H:%M UTC'); Postgres fsync/synchronous_commit = $DURABLE;"
echo "$TENANTS tenants (one key each, no budget), requests round robin over them; $N requests per run; window $WINDOW"
echo "reservations in flight per worker; backlog cap $BACKLOG settled-but-uncommitted requests per worker (0 = none)."
echo ""
echo "| run | workers | committed | wall s | **committed / s** | accepted / s (reserve + settle calls) | tg_settle_batch calls | elements / call | usage rows / txn p50 / p90 / max | spooled | reservations failed (503) | worker loop: longest stall ms / stalls > 10 ms | of which the loop's own CPU: longest ms / > 10 ms | bench CPU µs / req | Redis CPU µs / req | **Postgres CPU µs / req** | **rows written / req** | rest of the box (Postgres …) CPU µs / req | both cores busy | load before → after | ledger verify |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|"
run() { # NAME WORKERS BACKLOG
    local name=$1 workers=$2 cap=$3 since out rc l0 l1 r0 r1 p0 p1 w0 w1 b0 b1 rows dist verify
    since=$(sql -c "SELECT now()")
    l0=$(load_now)
    w0=$(pg_rows)
    r0=$(cpu_ticks "$PID_REDIS")
    p0=$(pg_ticks)
    read -r b0 t0 <<<"$(busy)"
    rc=0
    out=$(timeout 300 "$T/billing_settle_bench" "$N" "$workers" "$WINDOW" "$cap" "$T/spool-$name" 2>"$T/$name.err") || rc=$?
    read -r b1 t1 <<<"$(busy)"
    p1=$(pg_ticks)
    r1=$(cpu_ticks "$PID_REDIS")
    w1=$(pg_rows)
    l1=$(load_now)
    [ -n "$out" ] || { log "run $name failed (rc $rc):"; tail -5 "$T/$name.err" >&2; exit 1; }
    echo "$out" >>"$T/results.txt"
    log "$name: $out (load $l1)"
    rows=$(sql -c "SELECT count(*) FROM usage WHERE created_at >= '$since'")
    dist=$(sql -c "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY c) || ' / ' || percentile_disc(0.9) WITHIN GROUP (ORDER BY c) || ' / ' || max(c)
                   FROM (SELECT count(*) AS c FROM usage WHERE created_at >= '$since' GROUP BY created_at) x")
    verify=$("$T/tollgate" ledger verify -c "$T/tool.lua" >"$T/verify-$name.txt" 2>&1 && echo "exit 0" || echo "exit $? (see below)")
    echo "| $name | $workers | $(kv committed "$out") ($rows usage rows) | $(kv wall_s "$out") | **$(kv committed_per_s "$out")** | $(kv accepted_per_s "$out") | $(kv batches "$out") | $(kv elements_per_batch "$out") | $dist | $(kv spooled "$out") | $(kv failed "$out") | $(kv loop_max_stall_ms "$out") / $(kv loop_stalls_over_10ms "$out") | $(kv loop_max_busy_ms "$out") / $(kv loop_busy_over_10ms "$out") | $(kv cpu_us_per_req "$out") | $(per_req $((r1 - r0)) "$(kv committed "$out")") | **$(per_req $((p1 - p0)) "$(kv committed "$out")")** | **$(awk -v w=$((w1 - w0)) -v n="$(kv committed "$out")" 'BEGIN { printf "%.2f", w / n }')** | $(awk -v a="$b0" -v b="$b1" -v hz="$HZ" -v n="$(kv committed "$out")" -v own="$(kv cpu_us_per_req "$out")" -v r=$((r1 - r0)) \
        'BEGIN { printf "%.1f", (b - a - r) / hz * 1e6 / n - own }') | $(awk -v a="$b0" -v b="$b1" -v c="$t0" -v d="$t1" 'BEGIN { printf "%.0f%%", (b - a) / (d - c) * 100 }') | $l0 → $l1 | $verify |"
    [ "$verify" = "exit 0" ] || sed 's/^/    /' "$T/verify-$name.txt" >>"$T/verify-problems.txt"
    [ $rc = 0 ] || log "run $name: the bench exited $rc (conflicts, failures or a mismatch): see $T/$name.err"
}
N_ALL=$N N=$((N / 10))
run warm 1 "$BACKLOG" >/dev/null # first reservations load the balances into Redis; plans and caches warm
N=$N_ALL
sql -c "ANALYZE" # as a deployment with history would have: fresh statistics
run 1w 1 "$BACKLOG"
run 2w 2 "$BACKLOG"
run 1w-b 1 "$BACKLOG"
run 2w-b 2 "$BACKLOG"
run 2w-nocap 2 0
echo ""
echo "- committed / s: settlements tg_settle_batch returned as \`settled\` (durably committed) / wall time from the"
echo "  first reservation until the last settlement committed; usage rows counted in Postgres over the same run."
echo "- accepted / s: how fast the driver could reserve and settle (Redis round trip + queueing), capped by the backlog."
echo "- usage rows / txn: usage rows grouped by created_at (now() = the transaction's start), i.e. settlements per"
echo "  tg_settle_batch call; elements / call also counts the \`reserve\` elements (one per request)."
echo "- worker loop: a 1 ms timer on each billing instance's loop; a late tick is time the loop was blocked (every"
echo "  request of that gateway worker would have waited as long), e.g. by the spool's write + fsync when the queue spills."
echo "  A stall mixes the loop's own work with waiting for a CPU on a busy box; \"the loop's own CPU\" is the thread's CPU"
echo "  time (CLOCK_THREAD_CPUTIME_ID) between the same two ticks, i.e. what the settlement path itself held the loop for."
echo "- Postgres CPU: the postmaster's and its children's CPU time over the run (backends, WAL writer, checkpointer;"
echo "  /proc/<pid>/stat), per committed settlement. rows written: n_tup_ins + n_tup_upd + n_tup_del of every user"
echo "  table (pg_stat_user_tables) over the run, per committed settlement (tenant and key balance updates included)."
echo "- both cores busy: (user + nice + system + irq + softirq) / all ticks of the machine over the run (this bench,"
echo "  Postgres, Redis, and anything else on the box). rest of the box = all busy CPU over the run − this bench − Redis,"
echo "  per request: mostly Postgres (its backends, WAL writer), plus whatever else ran on the shared machine."
[ -s "$T/verify-problems.txt" ] && { echo ""; echo "ledger verify problems:"; echo ""; cat "$T/verify-problems.txt"; }
echo ""
echo "Load average at the end: $(load_now)"
