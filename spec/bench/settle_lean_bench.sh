#!/usr/bin/env bash
# Postgres CPU per billed request of one tg_settle_batch call, this checkout against a
# parent (issue #17 goal 3: <= 30 us per settled request). Like settle_cpu_bench.sh it
# counts only the backend's own CPU time (utime + stime of /proc/self/stat, read by the
# backend itself) over N batches per variant, interleaved in rounds, so other load on
# this shared box changes little. Three variants, each in a database of its own on one
# private Postgres, fed the same requests:
#
#   before   the parent's schema (its `migrate`), each request a `reserve` element and
#            its settlement, as jsonb (what the parent's gateway sent)
#   pairs    this schema, the same two elements a request, through the jsonb form (a
#            spool replay, the reconciler, a request whose settlement came in a later batch)
#   merged   this schema, one element a request (the settlement carrying its
#            reservation's bound and instance), as json: what this gateway sends under load
#   before_merged  the parent's schema fed the merged batches, when it has the json form
#            (0023 on): what a change to the batch's statements alone gives
#
# Each batch: B requests (4 tenants, one key each, one model, status 200).
#
# Usage: spec/bench/settle_lean_bench.sh --before BIN [ROUNDS [N [B]]]   (defaults 5, 60, 200)
# Environment: TG_BENCH_BIN (build/tollgate). Prints Markdown; stops what it started.
set -euo pipefail
# shellcheck shell=bash
. "$(dirname "$0")/lib.sh"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
[ "${1:-}" = --before ] || { log "usage: $0 --before BIN [ROUNDS [N [B]]]"; exit 2; }
BEFORE=$2
shift 2
ROUNDS=${1:-5} N=${2:-60} B=${3:-200}
need psql
need_bin
[ -x "$BEFORE" ] || { log "$BEFORE is not executable"; exit 2; }
bench_workdir tg-settle-lean
snapshot_bin tollgate
cp "$BEFORE" "$T/before"
bench_services pg
db() { sed "s/dbname=[^ ]*/dbname=$1/" <<<"$TOLLGATE_PG"; }
sql() { local d=$1; shift; psql -X -q -At -v ON_ERROR_STOP=1 -d "$(db "$d")" "$@"; }
echo "return { upstream = { url = \"http://127.0.0.1:9/v1\" } }" >"$T/tool.lua" # not contacted
VARIANTS="before pairs merged before_merged"
for v in $VARIANTS; do sql postgres -c "CREATE DATABASE lean_$v"; done
for v in $VARIANTS; do
    bin=$BIN
    case $v in before*) bin=$T/before ;; esac
    TOLLGATE_PG=$(db lean_$v) "$bin" migrate -c "$T/tool.lua" >/dev/null
    settle_bench_sql | sql lean_$v
    sql lean_$v -c "INSERT INTO bench_batch SELECT i, bench_batch_make(i, $B, '$v' LIKE '%merged')::text FROM generate_series(1, $((ROUNDS * (N + 2)))) i"
done

# One session of variant $1: settle_cpu_one (lib.sh) with the cast its gateway sends.
one() {
    local cast=jsonb
    case $1 in *merged) cast=json ;; esac
    settle_cpu_one "$cast" "$N" sql "lean_$1"
}
us() { awk -v a="$1" -v b="$B" 'BEGIN { printf "%.1f", a * 1000 / b }'; }

echo "### tg_settle_batch's backend CPU per billed request (spec/bench/settle_lean_bench.sh)"
echo ""
echo "Commit $(git_head) against $BEFORE, $(date -u '+%Y-%m-%d %H:%M UTC'), load before $(load_now); $ROUNDS rounds"
echo "of $N batches per variant, interleaved; $B requests a batch (4 tenants and keys, one model)."
echo ""
# the parent's schema without the json form cannot take the merged batches
if [ "$(sql lean_before_merged -c "SELECT to_regprocedure('tg_settle_batch(json)') IS NOT NULL")" != t ]; then
    VARIANTS="before pairs merged"
fi
echo "| round | before (2 elements a request, jsonb) | pairs (this schema, 2 elements) | merged (this schema, 1 element, json) |$([[ $VARIANTS == *before_merged* ]] && echo " before, merged (the parent's schema, 1 element, json) |")"
echo "|---:|---:|---:|---:|$([[ $VARIANTS == *before_merged* ]] && echo "---:|")"
declare -A all=()
for r in $(seq "$ROUNDS"); do
    line="| $r"
    for v in $VARIANTS; do
        x=$(one "$v")
        all[$v]+="$x "
        line+=" | $x"
    done
    echo "$line |"
done
b=$(median "${all[before]}") p=$(median "${all[pairs]}") m=$(median "${all[merged]}") bm=$(median "${all[before_merged]:-}")
if [ -n "$bm" ]; then
    echo "| **median ms / batch** | **$b** | **$p** | **$m** | **$bm** |"
    echo "| **µs / request** | **$(us "$b")** | **$(us "$p")** | **$(us "$m")** | **$(us "$bm")** |"
else
    echo "| **median ms / batch** | **$b** | **$p** | **$m** |"
    echo "| **µs / request** | **$(us "$b")** | **$(us "$p")** | **$(us "$m")** |"
fi
echo ""
echo "Throughput of a CPU-bound settlement vs before: pairs $(awk -v a="$p" -v b="$b" 'BEGIN { printf "%.2f", b / a }')x,"
echo "merged $(awk -v a="$m" -v b="$b" 'BEGIN { printf "%.2f", b / a }')x$([ -n "$bm" ] && awk -v a="$m" -v b="$bm" 'BEGIN { printf "; merged vs the parent fed the same merged batches %.2fx", b / a }'). Load after: $(load_now)."
for v in $VARIANTS; do
    echo ""
    echo "$v: $(sql lean_$v -c "SELECT count(*) || ' usage rows, ' || (SELECT count(*) FROM reservations) || ' reservation rows, '
        || (SELECT count(*) FROM ledger) || ' ledger rows' FROM usage")"
done
