#!/usr/bin/env bash
# Where tg_settle_batch spends its time: a private, durable Postgres (fsync and
# synchronous_commit on) with pg_stat_statements tracking the statements inside the
# function, the migrations of sql/, 4 tenants and keys, 100,000 earlier settlements; then
# pgbench runs the gateway's batch shape (N reservation elements + the N settlements of
# the same requests, sql/0003_billing.sql) from one connection, and the time of each
# statement per call is printed (Markdown), with the plan of one call (auto_explain).
#
# Usage: spec/bench/billing_profile.sh [N] [SECONDS]     (defaults 200, 6)
# Everything listens on a unix socket only and is stopped by PID on exit (spec/bench/lib.sh).
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${1:-200}
SECS=${2:-6}

bench_workdir billing-profile
bench_services pg
PG=$TOLLGATE_PG
q() { psql -X -q -v ON_ERROR_STOP=1 "$PG" "$@"; }
for s in "shared_preload_libraries = 'pg_stat_statements'" "fsync = on" "synchronous_commit = on"; do
    q -c "ALTER SYSTEM SET $s"
done
tg_pg_stop "$T/pg"
tg_pg_start "$T/pg" >/dev/null
# Statements inside functions too (a setting of the library, so once it is loaded).
q -c "ALTER SYSTEM SET pg_stat_statements.track = 'all'"
q -c 'SELECT pg_reload_conf()' >/dev/null
for f in "$ROOT"/sql/[0-9]*.sql; do q -f "$f"; done
q <<'EOF'
CREATE EXTENSION pg_stat_statements;
INSERT INTO tenants (name, balance, opening_balance) SELECT 't' || g, 1000000, 1000000 FROM generate_series(0, 3) g;
INSERT INTO groups (name) VALUES ('g');
INSERT INTO accounts (name, provider, base_url) VALUES ('up', 'openai', 'http://127.0.0.1/v1');
INSERT INTO api_keys (tenant_id, group_id, name, key_hash, prefix)
    SELECT t.id, (SELECT id FROM groups), 'k' || t.id, sha256(t.name::bytea), 'x' FROM tenants t;
INSERT INTO reservations (request_id, attempt, tenant_id, api_key_id, amount, model, state, settled_cost)
    SELECT 'h-' || g, 1, (SELECT min(id) FROM tenants), (SELECT min(id) FROM api_keys), 0.0002, 'mock-gpt', 'reconciled', 0.00005
    FROM generate_series(1, 100000) g;
INSERT INTO usage (request_id, tenant_id, api_key_id, model, cost, fingerprint)
    SELECT 'h-' || g, (SELECT min(id) FROM tenants), (SELECT min(id) FROM api_keys), 'mock-gpt', 0.00005, md5(g::text)
    FROM generate_series(1, 100000) g;
CREATE SEQUENCE bench_blk;
VACUUM ANALYZE;
EOF

batch() { # $1: request id prefix; the batch as a SQL expression
    cat <<EOF
(WITH t AS (SELECT t.id AS tid, (SELECT k.id FROM api_keys k WHERE k.tenant_id = t.id ORDER BY k.id LIMIT 1) AS kid
            FROM tenants t ORDER BY t.id LIMIT 1)
  SELECT jsonb_agg(e ORDER BY o, g) FROM (
    SELECT 0 AS o, g, jsonb_build_object('op', 'reserve', 'request_id', $1 || g, 'attempt', 1,
      'tenant_id', t.tid, 'api_key_id', t.kid, 'amount', '0.000200000', 'model', 'mock-gpt', 'instance', 'i0') AS e
    FROM t, generate_series(1, $N) g
    UNION ALL
    SELECT 1 AS o, g, jsonb_build_object('request_id', $1 || g, 'fingerprint', md5(g::text), 'tenant_id', t.tid,
      'api_key_id', t.kid, 'group_id', 1, 'account_id', 1, 'model', 'mock-gpt', 'attempts', 1,
      'input', 10, 'output', 20, 'cost', '0.000050000', 'estimated', false, 'status', 200, 'ttft_ms', 12.5,
      'total_ms', 40.25) AS e
    FROM t, generate_series(1, $N) g) q)
EOF
}
{
    echo 'SELECT nextval('"'"'bench_blk'"'"') AS b \gset'
    echo "SELECT count(*) FROM tg_settle_batch($(batch "'r' || :b || '-'"));"
} >"$T/settle.sql"

q -c 'SELECT pg_stat_statements_reset()' >/dev/null
echo "### tg_settle_batch profile: N = $N requests per call ($((2 * N)) elements), 1 connection, ${SECS} s, durable"
echo
echo "Load average before: $(load_now)"
pgbench -n -f "$T/settle.sql" -c 1 -j 1 -T "$SECS" "$PG" 2>&1 | grep -E '^(tps|latency average)' | sed 's/^/    /'
echo
echo '| statement (inside tg_settle_batch) | calls | ms per call | µs per request |'
echo '|---|---:|---:|---:|'
psql -X -qAt -F '|' "$PG" -c "
  SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 70), calls, round((total_exec_time / calls)::numeric, 3),
         round((total_exec_time / calls * 1000 / $N)::numeric, 1)
  FROM pg_stat_statements WHERE calls > 0 AND query !~* '^(select nextval|select pg_stat)'
  ORDER BY total_exec_time DESC LIMIT 14" | sed 's/|/ | /g; s/^/| /; s/$/ |/'
echo
echo "Load average after: $(load_now)"
echo
echo '<details><summary>plan of one call (auto_explain, nested statements)</summary>'
echo
echo '```'
psql -X -q "$PG" 2>&1 <<EOF | grep -E 'Query Text: (WITH|INSERT|UPDATE|SELECT e|SELECT 1 FROM tenants|SELECT 1 FROM api)|^ *(Insert|Update|->|Conflict|Tuples|Execution)' | grep -v -E 'Scan on (tenants|api_keys|groups) x ' | cut -c1-160
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_analyze = on;
SET auto_explain.log_nested_statements = on;
SET auto_explain.log_level = notice;
BEGIN;
SELECT count(*) FROM tg_settle_batch($(batch "'plan-'"));
ROLLBACK;
EOF
echo '```'
echo '</details>'
