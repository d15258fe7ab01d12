#!/usr/bin/env bash
# Usage reports at scale (issue #18, item 6), one command:
#   1. a private Postgres, migrated; 20 tenants, 200 keys, 5 groups of 8 accounts, 6 models;
#   2. TG_BENCH_ROWS usage rows (default 3,000,000) over the last 30 days (and today up to
#      now: its hours are not compacted yet, as on a live gateway), generated in SQL
#      (generate_series into a table per day, indexed and attached as its partition after,
#      TG_BENCH_GEN_JOBS days at a time (nproc); request ids that carry their start),
#      each key on 1-2 models and its group's accounts: about 3,500 combinations per hour,
#      what a busy gateway has; then the rollups rebuilt from them (`tollgate usage
#      rebuild`) and the finished days compacted (tg_usage_compact);
#   3. the admin API's report queries over the last 14 days, each 20 times on a new
#      connection and 20 times on one (warm), p50/p95 (ms), and the mean CPU time of the
#      warm runs' backend (ms: the query's cost whatever the load):
#      summary by model, by account, by tenant, by day, by day+account, and the capacity
#      report by account and by group;
#   4. the settlement throughput with the rollups on and off (billing_settle_bench.sh,
#      TG_BENCH_SETTLE_N requests a run (20,000), TG_BENCH_ROLLUPS=on|off),
#      TG_BENCH_SETTLE_ROUNDS rounds (3) interleaved, the order alternating by round, and
#      the medians' ratio per worker count (not with TG_BENCH_SETTLE=0).
# The report queries read only the rollups, so their cost follows the number of
# combinations per hour, not the number of usage rows: once every combination appears in
# every hour (it does at 3M rows over 30 days here), more rows make the same rollups.
# Prints Markdown (spec/bench/RESULTS.md, "Usage (#18)").
#
# Usage: flock /tmp/tg-bench.lock spec/bench/usage_bench.sh [--quick] [--keep] [--generate-only] [--reuse DIR]
#   --quick: 300,000 rows, 5 repetitions, no settlement runs.
#   --keep: keep the work directory (and its Postgres data) at the end.
#   --generate-only: stop after the rows are generated, rolled up and compacted (kept;
#       time the queries later with --reuse).
#   TG_BENCH_FROM / TG_BENCH_TO (YYYY-MM-DDTHH:00:00Z): the queries' range instead of the
#       last 14 days up to the current hour (say, the 14 days a partial run generated).
#   --reuse DIR: the work directory of an earlier --keep run: its Postgres is started
#       again and migrated by this binary (so changed report SQL is what is measured),
#       the generation and rebuild are skipped when its usage rows are there, and the
#       rollups are compacted (a new day may have ended). Kept at the end.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
ROWS=${TG_BENCH_ROWS:-3000000}
SETTLE_N=${TG_BENCH_SETTLE_N:-20000}
REPS=20
SETTLE=${TG_BENCH_SETTLE:-1}
for a in "$@"; do
    case $a in
    --quick) ROWS=300000 REPS=5 SETTLE=0 ;;
    --keep) KEEP=1 ;;
    --generate-only) GENONLY=1 KEEP=1 ;;
    --reuse) REUSE=next ;;
    *)
        if [ "${REUSE:-}" = next ]; then REUSE=$a; continue; fi
        echo "usage: $0 [--quick] [--keep] [--generate-only] [--reuse DIR]" >&2; exit 2 ;;
    esac
done
[ "${REUSE:-}" != next ] || { echo "--reuse needs a directory" >&2; exit 2; }
need psql timeout
need_bin
bench_workdir tg-usage-bench
if [ -n "${REUSE:-}" ]; then
    rm -rf "$T"
    T=$REUSE KEEP=1
    [ -d "$T/pg/pgdata" ] || { log "$T/pg/pgdata is missing (a --keep run's directory)"; exit 2; }
fi
snapshot_bin tollgate
bench_services pg
sql() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$TOLLGATE_PG" "$@"; }
echo "return { upstream = { url = \"http://127.0.0.1:9/v1\" } }" >"$T/tool.lua"
tm0=$(date +%s.%N)
"$T/tollgate" migrate -c "$T/tool.lua" >"$T/migrate.out"
tm1=$(date +%s.%N)
FRESH=1
[ -z "${REUSE:-}" ] || [ "$(sql -c "SELECT count(*) > 0 FROM usage_hourly")" != t ] || FRESH=0

[ "$FRESH" = 0 ] || sql <<'SQL'
INSERT INTO groups (name) SELECT 'g' || g FROM generate_series(1, 5) g;
INSERT INTO tenants (name, balance, opening_balance) SELECT 't' || t, 1000000, 1000000 FROM generate_series(1, 20) t;
INSERT INTO api_keys (tenant_id, group_id, name, key_hash, prefix, concurrency)
SELECT (k - 1) / 10 + 1, ((k - 1) / 10) % 5 + 1, 'k' || k, sha256(convert_to('bench-' || k, 'UTF8')), 'tg-bench', 8
FROM generate_series(1, 200) k;
INSERT INTO accounts (name, provider, base_url, concurrency, kind)
SELECT 'a' || a, 'openai', 'http://127.0.0.1:9/v1', 16, CASE WHEN a % 4 = 0 THEN 'subscription' ELSE 'metered' END
FROM generate_series(1, 40) a;
INSERT INTO account_groups SELECT a, (a - 1) / 8 + 1 FROM generate_series(1, 40) a;
INSERT INTO model_prices (model, input, output, cache_read)
SELECT 'model-' || m, m * 0.5, m * 2, m * 0.05 FROM generate_series(1, 6) m;
SQL

# The day partitions of the last 30 days are made by the generator, each day a table of
# its own: the migration's empty partitions of those days (yesterday and today) go first.
[ "$FRESH" = 0 ] || sql -c "DO \$\$
DECLARE p record; n boolean;
BEGIN
    FOR p IN SELECT name FROM detail_partitions WHERE parent = 'usage' AND NOT legacy AND dropped_at IS NULL
             AND lo >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - interval '30 days'
             AND lo <= now() LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I)', p.name) INTO n;
        IF n THEN RAISE EXCEPTION 'partition % is not empty', p.name; END IF;
        EXECUTE format('DROP TABLE %I', p.name);
    END LOOP;
END \$\$" >/dev/null

echo "### Usage (#18): reports from the rollups at scale (spec/bench/usage_bench.sh)"
echo ""
echo "Commit $(git_head), $(date -u '+%Y-%m-%d %H:%M UTC'); $(bench_machine)."
echo ""
t0=$(date +%s.%N)
# One day per transaction, GEN_JOBS days at a time: the day's rows go into a table of its
# own without indexes, foreign keys or triggers (INSERT … SELECT from generate_series),
# which is then indexed as a partition is and attached to `usage` (its foreign keys
# checked by one join, its range by a CHECK made first: no scan). Row i of the day: key k
# (1..200, from i mod 200), its tenant and group, one of its group's 8 accounts (from
# i / 200 mod 8), one of its 2 models (from i / 1,600 mod 2): 3,200 combinations, each
# every 3,200 rows; status 200 mostly, 429 2%, 500 1%, 499 1%; ttft 80-2000 ms; tokens and
# a cost. The id is given (d·10⁹ + i, the sequence set past them after: a nextval per row
# was 4 µs of the ~19 µs a row cost), started_at computed from the same milliseconds as
# the request id (the table's CHECK still holds it equal to tg_request_started of the id,
# row by row), and the indexes built with 512 MB of maintenance_work_mem (not spilled).
PER_DAY=$((ROWS / 30))
GEN_JOBS=${TG_BENCH_GEN_JOBS:-$(nproc)}
[ "$FRESH" = 1 ] || log "reusing $T: $(sql -c "SELECT count(*) FROM usage") usage rows, generation and rebuild skipped"
gen_day() {
    sql -c "DO \$gen\$
DECLARE
    lo timestamptz := (date_trunc('day', now() AT TIME ZONE 'UTC') - $1 * interval '1 day') AT TIME ZONE 'UTC';
    hi timestamptz := lo + interval '1 day';
    t text := 'usage_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD');
BEGIN
    PERFORM set_config('maintenance_work_mem', '512MB', true);
    EXECUTE format('CREATE TABLE %I (LIKE usage INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', t);
    EXECUTE format(\$q\$
        INSERT INTO %I (id, request_id, started_at, tenant_id, api_key_id, group_id, account_id, model, input_tokens,
                        output_tokens, cache_read_tokens, cost, status, ttft_ms, total_ms, fingerprint, created_at)
        SELECT $1 * 1000000000::bigint + i, rid, to_timestamp(ms / 1000.0), (k - 1) / 10 + 1, k, ((k - 1) / 10) %% 5 + 1,
               (((k - 1) / 10) %% 5) * 8 + 1 + (i / 200 * 3) %% 8, 'model-' || (1 + (k + i / 1600 %% 2) %% 6), 100 + i %% 900,
               50 + i %% 400, i %% 3 * 100, ((100 + i %% 900) * 0.000001 + (50 + i %% 400) * 0.000004)::numeric(24, 10),
               CASE WHEN i %% 100 < 2 THEN 429 WHEN i %% 100 = 2 THEN 500 WHEN i %% 100 = 3 THEN 499 ELSE 200 END,
               CASE WHEN i %% 100 >= 2 THEN 80 + (i * 37) %% 1920 END, 200 + (i * 53) %% 8000, 'bench',
               to_timestamp(ms / 1000.0)
        FROM (SELECT i, 1 + (i * 7919) %% 200 AS k,
                     (extract(epoch FROM %L::timestamptz) * 1000)::bigint + (i::bigint * 86400000 / $PER_DAY) AS ms
              FROM generate_series(0::bigint, $PER_DAY - 1) i) s,
             LATERAL (SELECT lpad(to_hex(ms), 12, '0') || '-' || lpad(to_hex(i), 18, '0') AS rid) r
        WHERE ms < extract(epoch FROM now()) * 1000\$q\$, t, lo);
    EXECUTE format('ALTER TABLE %I ADD PRIMARY KEY (request_id, started_at)', t);
    EXECUTE format('CREATE INDEX ON %I (tenant_id, created_at)', t);
    EXECUTE format('CREATE INDEX ON %I (api_key_id, created_at)', t);
    EXECUTE format('CREATE INDEX ON %I (id)', t);
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (started_at >= %L AND started_at < %L)', t, t || '_range', lo, hi);
    EXECUTE format('ALTER TABLE usage ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', t, lo, hi);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', t, t || '_range');
    INSERT INTO detail_partitions (name, parent, lo, hi) VALUES (t, 'usage', lo, hi)
    ON CONFLICT (name) DO UPDATE SET lo = EXCLUDED.lo, hi = EXCLUDED.hi, dropped_at = NULL, dropped_rows = NULL;
END \$gen\$" >/dev/null
}
running=0
for d in $( [ "$FRESH" = 0 ] || seq 30 -1 0); do
    gen_day "$d" &
    running=$((running + 1))
    if [ "$running" -ge "$GEN_JOBS" ]; then wait -n; running=$((running - 1)); fi
done
while [ "$running" -gt 0 ]; do wait -n; running=$((running - 1)); done
# the ids were given by the generator (day d: d·10⁹ + i): the sequence goes past them
[ "$FRESH" = 0 ] || sql -c "SELECT setval('usage_id_seq', (SELECT max(id) FROM usage))" >/dev/null
t1=$(date +%s.%N)
NROWS=$(sql -c "SELECT count(*) FROM usage")
SIZE=$(sql -c "SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid))) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'usage'::regclass")
[ "$FRESH" = 0 ] || "$T/tollgate" usage rebuild -c "$T/tool.lua" >"$T/rebuild.out"
t2=$(date +%s.%N)
if [ "$FRESH" = 1 ]; then echo "$t0 $t1 $t2 $GEN_JOBS" >"$T/gen.times"; else read -r t0 t1 t2 GEN_JOBS <"$T/gen.times"; fi
t2c=$(date +%s.%N)
sql -c "SELECT tg_usage_compact()" >/dev/null
t3=$(date +%s.%N)
sql -c "VACUUM ANALYZE usage_hourly, usage_daily, usage_capacity_hourly, usage_days_compacted, usage_hourly_acct,
        usage_daily_acct, usage_hourly_key, usage_daily_key, usage_hourly_tenant, usage_daily_tenant, usage_hourly_model,
        usage_daily_model, usage_hourly_account_group, usage_daily_account_group" >/dev/null
HOURLY=$(sql -c "SELECT count(*) FROM usage_hourly")
DAILY=$(sql -c "SELECT count(*) FROM usage_daily")
PERHOUR=$(sql -c "SELECT round(avg(n)) FROM (SELECT count(*) n FROM usage_hourly GROUP BY hour) x")
AHOURLY=$(sql -c "SELECT count(*) FROM usage_hourly_acct")
ADAILY=$(sql -c "SELECT count(*) FROM usage_daily_acct")
APERHOUR=$(sql -c "SELECT round(avg(n)) FROM (SELECT count(*) n FROM usage_hourly_acct GROUP BY hour) x")
echo "- $NROWS usage rows over 30 days ($SIZE with indexes), generated in SQL in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.0f", b-a}') s"
echo "  ($(awk -v a="$t0" -v b="$t1" -v n="$NROWS" 'BEGIN{printf "%.0f", n/(b-a)}') rows/s, ${GEN_JOBS:-1} day(s) at a time);"
echo "  rollups rebuilt from them in $(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.0f", b-a}') s ($(awk -v a="$t1" -v b="$t2" -v n="$NROWS" 'BEGIN{printf "%.0f", n/(b-a)}') rows/s), compacted in $(awk -v a="$t2c" -v b="$t3" 'BEGIN{printf "%.1f", b-a}') s:"
echo "  $HOURLY hourly rows ($PERHOUR combinations per hour), $DAILY daily rows; coarse (sql/0014):"
echo "  $AHOURLY hourly rows ($APERHOUR per hour), $ADAILY daily rows; the other cubes (sql/0016), hourly rows per hour:"
CUBES=""
for c in model account_group tenant key; do
    CUBES="$CUBES$c $(sql -c "SELECT round(count(*)::numeric / greatest(1, count(DISTINCT hour))) FROM usage_hourly_$c"), "
done
echo "  ${CUBES%, }."
[ "$FRESH" = 1 ] || echo "  Reused: migrated by this commit's binary in $(awk -v a="$tm0" -v b="$tm1" 'BEGIN{printf "%.0f", b-a}') s ($(grep -c '^applied' "$T/migrate.out") migration(s) applied: $(grep '^applied' "$T/migrate.out" | cut -d' ' -f2 | tr '\n' ' ')), then compacted."
echo ""
[ -z "${GENONLY:-}" ] || exit 0

FROM=${TG_BENCH_FROM:-$(sql -c "SELECT to_char(date_trunc('hour', now() AT TIME ZONE 'UTC') - interval '14 days', 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"')")}
TO=${TG_BENCH_TO:-$(sql -c "SELECT to_char(date_trunc('hour', now() AT TIME ZONE 'UTC') + interval '1 hour', 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"')")}
# p50 and p95 (ms) of $REPS runs of one query, each in its own psql (a new connection: the
# backend's caches and the PL/pgSQL function compiled anew each time), then of $REPS runs in
# one session after one more (warm: what the gateway's pooled connections see).
pcts() { sort -n "$1" | awk '{ a[NR] = $1 } END { printf "%.1f | %.1f", a[int((NR + 1) / 2)], a[int(NR * 0.95 + 0.999)] }'; }
timeit() {
    local name=$1 q=$2 f="$T/times.$RANDOM" w="$T/warm.$RANDOM"
    for _ in $(seq "$REPS"); do
        psql -X -q -At -d "$TOLLGATE_PG" -c '\timing on' -c "$q" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' >>"$f"
    done
    # the warm runs, and the CPU time their backend used (utime + stime in /proc: what the
    # query costs whatever else the machine runs)
    # shellcheck disable=SC2016,SC2028 # psql meta-commands: $TG_PID is for the shell psql starts
    { echo "$q;"; echo 'SELECT pg_backend_pid() AS pid \gset'; echo '\setenv TG_PID :pid'
      echo '\! awk "{ print \"cpu\", \$14 + \$15 }" /proc/$TG_PID/stat'; echo '\timing on'
      for _ in $(seq "$REPS"); do echo "$q;"; done
      echo '\! awk "{ print \"cpu\", \$14 + \$15 }" /proc/$TG_PID/stat'; } |
        psql -X -q -At -d "$TOLLGATE_PG" >"$w.out"
    sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' "$w.out" >"$w"
    cpu=$(awk -v n="$REPS" -v hz="$HZ" '/^cpu / { c[++k] = $2 } END { printf "%.1f", (c[2] - c[1]) * 1000 / hz / n }' "$w.out")
    echo "| $name | $(pcts "$f") | $(pcts "$w") | $cpu |"
}
echo "Queries over 14 days (from $FROM to $TO, the admin API's SQL), $REPS runs each:"
echo ""
echo "| query | p50 ms | p95 ms | warm p50 ms | warm p95 ms | warm CPU ms |"
echo "|---|---:|---:|---:|---:|---:|"
rep() { echo "SELECT length(tg_usage_report('$FROM', '$TO', '$1', NULL, NULL, NULL, NULL, NULL, ${2:-100}, 0))"; }
timeit "report group_by=model" "$(rep '{model}')"
timeit "report group_by=account" "$(rep '{account}')"
timeit "report group_by=tenant" "$(rep '{tenant}')"
timeit "report group_by=day" "$(rep '{day}')"
timeit "report group_by=day,account (page of 1000)" "$(rep '{day,account}' 1000)"
timeit "report group_by=key,model (page of 100)" "$(rep '{key,model}')"
timeit "report group_by=hour (336 hourly groups)" "$(rep '{hour}' 1000)"
timeit "capacity by=account" "SELECT length(tg_usage_capacity('$FROM', '$TO', 'account'))"
timeit "capacity by=group" "SELECT length(tg_usage_capacity('$FROM', '$TO', 'group'))"
echo ""

if [ "$SETTLE" = 1 ]; then
    SR=${TG_BENCH_SETTLE_ROUNDS:-3}
    echo "Settlement throughput, rollups on vs off (billing_settle_bench.sh, $SETTLE_N requests a run, $SR rounds,"
    echo "interleaved, the order alternating by round; the build's tollgate and libtollgate_core.a, so the SQL"
    echo "measured is this commit's):"
    echo ""
    declare -A rates=()
    median() { [ $# -gt 0 ] || return 0; printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
    for round in $(seq "$SR"); do
        modes="on off"
        [ $((round % 2)) = 1 ] || modes="off on"
        for mode in $modes; do
            TG_BENCH_BIN=$BIN_SRC TG_BENCH_ROLLUPS=$mode TG_BENCH_N=$SETTLE_N "$ROOT/spec/bench/billing_settle_bench.sh" >"$T/settle.$mode.$round" 2>&1 || true
            # the committed / s of each run (1 and 2 workers)
            rate=$(grep '^| ' "$T/settle.$mode.$round" | grep -v '^| run' |
                awk -F'|' '{ gsub(/[ *]/, "", $3); gsub(/[ *]/, "", $6); printf "%s worker(s): %s/s; ", $3, $6 }' || true)
            echo "- round $round, rollups $mode: ${rate:-no result (see $T/settle.$mode.$round)}"
            for w in 1 2; do
                v=$(grep '^| ' "$T/settle.$mode.$round" | grep -v '^| run' |
                    awk -F'|' -v w="$w" '{ gsub(/[ *]/, "", $3); gsub(/[ *,]/, "", $6) } $3 == w { print $6 }' | head -1)
                [ -z "$v" ] || rates[$mode.$w]+="$v "
            done
        done
    done
    echo ""
    for w in 1 2; do
        on=$(median ${rates[on.$w]:-}) off=$(median ${rates[off.$w]:-})
        echo "- $w worker(s): median $on/s with the rollups on, $off/s off:" \
            "**$(awk -v a="$on" -v b="$off" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }')x**"
    done
fi
