#!/usr/bin/env bash
# Postgres CPU of one tg_settle_batch call, by variant of its rollup (usage #18 item 6:
# "settlement throughput with rollups on is at least 0.9x without"). The settlement
# bench (billing_settle_bench.sh) times the whole path — Redis, the gateway's batcher,
# fsync'd commits — on a shared 2-core box where one run moves by ±30%; this one counts
# only the backend's own CPU time (utime + stime of /proc/self/stat, read by the backend
# itself) over N batches per variant, interleaved in rounds, so other load changes little.
#
# Each batch is what the gateway sends under load: B requests, each a `reserve` element
# and its settlement (4 tenants, one key each, one model, status 200), as text cast to
# jsonb (the gateway's parameter is text). Variants (as TG_BENCH_ROLLUPS of
# billing_settle_bench.sh): on (this checkout's tg_usage_rollup), off (a no-op), 0020
# (sql/0020's function: the list value computed per row, before sql/0022), 0016 (every
# batch through tg_usage_rollup_late: the rollup before sql/0020).
#
# Usage: spec/bench/settle_cpu_bench.sh [ROUNDS [N [B]]]   (defaults 5, 60, 200)
# Environment: TG_BENCH_BIN (build/tollgate: its `migrate` makes the schema).
# Prints Markdown: CPU ms per batch per variant and round, medians, ratios. Everything
# started here (a private Postgres) is stopped on exit.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
ROUNDS=${1:-5} N=${2:-60} B=${3:-200}
need psql
need_bin
bench_workdir tg-settle-cpu
snapshot_bin tollgate
bench_services pg
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$TOLLGATE_PG" "$@"; }
echo "return { upstream = { url = \"http://127.0.0.1:9/v1\" } }" >"$T/tool.lua" # not contacted
"$BIN" migrate -c "$T/tool.lua" >/dev/null
settle_bench_sql | sql
sql -c "INSERT INTO bench_batch SELECT i, bench_batch_make(i, $B, false)::text FROM generate_series(1, $((ROUNDS * 4 * (N + 2)))) i"
sql -c "SELECT pg_get_functiondef('tg_usage_rollup(tg_settle_element[])'::regprocedure) || ';'" >"$T/rollup_on.sql"
echo "CREATE OR REPLACE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS 'BEGIN END';" \
    >"$T/rollup_off.sql"
echo "CREATE OR REPLACE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql
      AS 'BEGIN PERFORM tg_usage_rollup_late(won); END';" >"$T/rollup_0016.sql"
sed -n '/^DO \$gen\$/,$p' "$ROOT/sql/0020_rollup_cheap.sql" |
    sed 's/CREATE FUNCTION tg_usage_rollup(/CREATE OR REPLACE FUNCTION tg_usage_rollup(/' >"$T/rollup_0020.sql"

# One session per variant and round: its rollup in place, then settle_cpu_one (lib.sh).
one() {
    sql -f "$T/rollup_$1.sql" >/dev/null
    settle_cpu_one jsonb "$N" sql
}

echo "### tg_settle_batch's backend CPU by rollup variant (spec/bench/settle_cpu_bench.sh)"
echo ""
echo "Commit $(git_head), $(date -u '+%Y-%m-%d %H:%M UTC'), load before $(load_now); $ROUNDS rounds of $N batches"
echo "per variant, interleaved; $B requests a batch (a \`reserve\` and a settlement each, 4 tenants and keys, one model)."
echo ""
echo "| round | on | off | 0020 | 0016 |"
echo "|---:|---:|---:|---:|---:|"
declare -A all=()
for r in $(seq "$ROUNDS"); do
    line="| $r"
    for m in on off 0020 0016; do
        v=$(one "$m")
        all[$m]+="$v "
        line+=" | $v"
    done
    echo "$line |"
done
on=$(median "${all[on]}") off=$(median "${all[off]}") old=$(median "${all[0016]}") o20=$(median "${all[0020]}")
echo "| **median** | **$on** | **$off** | **$o20** | **$old** |"
echo ""
echo "Backend CPU ms per batch. Throughput of a CPU-bound settlement, rollups on vs off:"
echo "**$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.2f", b / a }')x** (0020's rollup: $(awk -v a="$o20" -v b="$off" 'BEGIN { printf "%.2f", b / a }')x, 0016's: $(awk -v a="$old" -v b="$off" 'BEGIN { printf "%.2f", b / a }')x);"
echo "the rollup's cost per batch $(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.2f", a - b }') ms (0020's: $(awk -v a="$o20" -v b="$off" 'BEGIN { printf "%.2f", a - b }') ms, 0016's: $(awk -v a="$old" -v b="$off" 'BEGIN { printf "%.2f", a - b }') ms). Load after: $(load_now)."
