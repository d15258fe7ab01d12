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
    sql lean_$v <<SQL
INSERT INTO tenants (name, balance, opening_balance) SELECT 'cpu-' || i, 1000000000, 1000000000 FROM generate_series(1, 4) i;
INSERT INTO api_keys (tenant_id, name, key_hash, prefix)
SELECT id, 'k' || id, sha256(convert_to('tg-settle-lean-' || id, 'UTF8')), 'tg-cpu' FROM tenants;
CREATE TABLE bench_batch (id int PRIMARY KEY, b text);
CREATE SEQUENCE bench_seq;
-- batch i: n requests started now (request ids of the gateway's form), round robin over the keys
CREATE FUNCTION bench_batch_make(i int, n int, merged boolean) RETURNS jsonb LANGUAGE sql AS \$\$
  WITH r AS (
    SELECT g, lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '-' ||
              lpad(to_hex(i), 8, '0') || lpad(to_hex(g), 10, '0') AS rid, k.tenant_id AS t, k.id AS k
    FROM generate_series(1, n) g
    JOIN LATERAL (SELECT id, tenant_id FROM api_keys ORDER BY id OFFSET (g + i) % 4 LIMIT 1) k ON true)
  SELECT jsonb_agg(e ORDER BY o) FROM (
    SELECT g * 2 AS o, jsonb_build_object('op', 'reserve', 'request_id', rid, 'attempt', 1, 'tenant_id', t,
           'api_key_id', k, 'amount', '0.0016', 'model', 'gpt-4o-mini', 'instance', 'bench') AS e FROM r
    WHERE NOT merged
    UNION ALL
    SELECT g * 2 + 1, jsonb_build_object('request_id', rid, 'fingerprint', md5(rid), 'tenant_id', t, 'api_key_id', k,
           'group_id', null, 'account_id', null, 'model', 'gpt-4o-mini', 'attempts', 1, 'input', 200 + g % 300,
           'output', 50 + g % 150, 'cost', '0.0001000000', 'estimated', false, 'status', 200, 'ttft_ms', 120,
           'total_ms', 480.5)
           || CASE WHEN merged THEN jsonb_build_object('amount', '0.0016', 'instance', 'bench') ELSE '{}' END
    FROM r) x
\$\$;
INSERT INTO bench_batch SELECT i, bench_batch_make(i, $B, '$v' LIKE '%merged')::text FROM generate_series(1, $((ROUNDS * (N + 2)))) i;
SQL
done

# One session: 2 batches to warm its caches, then N, each its own transaction; prints the
# backend's CPU ms per batch.
one() {
    local v=$1 cast=jsonb call ticks
    case $v in *merged) cast=json ;; esac
    call="SELECT count(*) FROM tg_settle_batch((SELECT b FROM bench_batch WHERE id = (SELECT nextval('bench_seq')))::$cast);"
    ticks="SELECT 'T', (string_to_array(pg_read_file('/proc/self/stat'), ' '))[14]::int
                       + (string_to_array(pg_read_file('/proc/self/stat'), ' '))[15]::int;"
    {
        echo "$call"
        echo "$call"
        echo "$ticks"
        for _ in $(seq "$N"); do echo "$call"; done
        echo "$ticks"
    } | sql "lean_$v" | awk -F'|' -v n="$N" -v hz="$HZ" '/^T/ { if (c == "") c = $2; else printf "%.2f\n", ($2 - c) * 1000 / hz / n }'
}
med() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
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
b=$(med "${all[before]}") p=$(med "${all[pairs]}") m=$(med "${all[merged]}") bm=$(med "${all[before_merged]:-}")
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
