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
sql <<'SQL'
INSERT INTO tenants (name, balance, opening_balance) SELECT 'cpu-' || i, 1000000000, 1000000000 FROM generate_series(1, 4) i;
INSERT INTO api_keys (tenant_id, name, key_hash, prefix)
SELECT id, 'k' || id, sha256(convert_to('tg-settle-cpu-' || id, 'UTF8')), 'tg-cpu' FROM tenants;
CREATE TABLE bench_batch (id int PRIMARY KEY, b text);
CREATE SEQUENCE bench_seq;
-- batch i: n requests started now (request ids of the gateway's form), round robin over the keys
CREATE FUNCTION bench_batch_make(i int, n int) RETURNS jsonb LANGUAGE sql AS $$
  WITH r AS (
    SELECT g, lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '-' ||
              lpad(to_hex(i), 8, '0') || lpad(to_hex(g), 10, '0') AS rid, k.tenant_id AS t, k.id AS k
    FROM generate_series(1, n) g
    JOIN LATERAL (SELECT id, tenant_id FROM api_keys ORDER BY id OFFSET (g + i) % 4 LIMIT 1) k ON true)
  SELECT jsonb_agg(e ORDER BY o) FROM (
    SELECT g * 2 AS o, jsonb_build_object('op', 'reserve', 'request_id', rid, 'attempt', 1, 'tenant_id', t,
           'api_key_id', k, 'amount', '0.0016', 'model', 'gpt-4o-mini', 'instance', 'bench') AS e FROM r
    UNION ALL
    SELECT g * 2 + 1, jsonb_build_object('request_id', rid, 'fingerprint', md5(rid), 'tenant_id', t, 'api_key_id', k,
           'group_id', null, 'account_id', null, 'model', 'gpt-4o-mini', 'attempts', 1, 'input', 200 + g % 300,
           'output', 50 + g % 150, 'cost', '0.0001000000', 'estimated', false, 'status', 200, 'ttft_ms', 120,
           'total_ms', 480.5) FROM r) x
$$;
SQL
sql -c "INSERT INTO bench_batch SELECT i, bench_batch_make(i, $B)::text FROM generate_series(1, $((ROUNDS * 4 * (N + 2)))) i"
sql -c "SELECT pg_get_functiondef('tg_usage_rollup(tg_settle_element[])'::regprocedure) || ';'" >"$T/rollup_on.sql"
echo "CREATE OR REPLACE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS 'BEGIN END';" \
    >"$T/rollup_off.sql"
echo "CREATE OR REPLACE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql
      AS 'BEGIN PERFORM tg_usage_rollup_late(won); END';" >"$T/rollup_0016.sql"
sed -n '/^DO \$gen\$/,$p' "$ROOT/sql/0020_rollup_cheap.sql" |
    sed 's/CREATE FUNCTION tg_usage_rollup(/CREATE OR REPLACE FUNCTION tg_usage_rollup(/' >"$T/rollup_0020.sql"

# One session: 2 batches to warm its caches, then N, each its own transaction; prints the
# backend's CPU ms per batch.
one() {
    sql -f "$T/rollup_$1.sql" >/dev/null
    local call ticks
    call="SELECT count(*) FROM tg_settle_batch((SELECT b FROM bench_batch WHERE id = (SELECT nextval('bench_seq')))::jsonb);"
    ticks="SELECT 'T', (string_to_array(pg_read_file('/proc/self/stat'), ' '))[14]::int
                       + (string_to_array(pg_read_file('/proc/self/stat'), ' '))[15]::int;"
    {
        echo "$call"
        echo "$call"
        echo "$ticks"
        for _ in $(seq "$N"); do echo "$call"; done
        echo "$ticks"
    } | sql | awk -F'|' -v n="$N" -v hz="$HZ" '/^T/ { if (c == "") c = $2; else printf "%.2f\n", ($2 - c) * 1000 / hz / n }'
}
med() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

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
on=$(med "${all[on]}") off=$(med "${all[off]}") old=$(med "${all[0016]}") o20=$(med "${all[0020]}")
echo "| **median** | **$on** | **$off** | **$o20** | **$old** |"
echo ""
echo "Backend CPU ms per batch. Throughput of a CPU-bound settlement, rollups on vs off:"
echo "**$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.2f", b / a }')x** (0020's rollup: $(awk -v a="$o20" -v b="$off" 'BEGIN { printf "%.2f", b / a }')x, 0016's: $(awk -v a="$old" -v b="$off" 'BEGIN { printf "%.2f", b / a }')x);"
echo "the rollup's cost per batch $(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.2f", a - b }') ms (0020's: $(awk -v a="$o20" -v b="$off" 'BEGIN { printf "%.2f", a - b }') ms, 0016's: $(awk -v a="$old" -v b="$off" 'BEGIN { printf "%.2f", a - b }') ms). Load after: $(load_now)."
