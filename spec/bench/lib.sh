# shellcheck shell=bash disable=SC2034 # variables set here are read by the scripts
# What the benchmark scripts of spec/bench share. Bash only; source it first thing:
#
#     . "$(dirname "$0")/lib.sh"
#
# Sourcing it defines the functions below, sources spec/lib/services.sh (tg_pg_start,
# tg_redis_start, ...), changes no shell option and sets:
#   ROOT        the checkout (two levels above this file)
#   BENCH       $ROOT/spec/bench
#   BENCH_NAME  the script's name without .sh, the prefix of its messages
#   HZ          clock ticks per second (the unit of cpu_ticks)
#   NICE        () until bench_session sets it to (nice -n -19); start puts it first
#   PIDS=() SERVICES=0 KEEP=0 BASE (the next port next_port tries; random in
#   20000-31999, below Linux's ephemeral range, so outgoing connections do not take it)
#
# Session and priority
#   bench_session "$@"  re-runs the script in a session of its own (setsid) and waits for
#       it, passing INT / TERM on. The kernel groups CPU time by session (autogroup), so
#       nice alone does not beat a build running in another session: in the new session
#       it gives the session's autogroup nice -19 (CAP_SYS_NICE; it ends with the
#       benchmark) and sets AUTOGROUP (what /proc/self/autogroup then says, or "autogroup
#       nice unchanged") and NICE=(nice -n -19). Call it before anything else; the inner
#       run has TG_BENCH_IN_SESSION=1.
#   need TOOL...        exits 2 with a message unless every TOOL is on PATH.
#   need_bin            exits 2 unless $BIN is executable.
#   need_core_libs      exits 2 unless $BUILD (the script sets it) holds
#       libtollgate_core.a and libllhttp.a (for build_core_bench).
#   log MSG...          "$BENCH_NAME: MSG" on stderr.
#
# Work directory, processes, cleanup
#   bench_workdir PREFIX  T=$(mktemp -d /tmp/PREFIX.XXXXXX), mode 755 (the postgres user
#       must reach it), SUMMARY=$T/summary.md; traps EXIT (bench_cleanup), INT (exit 130),
#       TERM (exit 143).
#   bench_cleanup       the EXIT trap: stops every PID in PIDS (TERM; KILL after 5 s),
#       calls bench_on_exit if the script defines one, stops the private Redis and
#       Postgres when SERVICES=1, then removes $T (kept, and named, when KEEP=1).
#   start NAME CPU CMD...  runs CMD in the background with "${NICE[@]}", pinned to CPU
#       by taskset (CPU "" = not pinned), output in $T/NAME.out and $T/NAME.err; sets
#       LAST_PID and adds it to PIDS.
#   start_mock CPU      next_port P_MOCK, then `$BIN mock-upstream` (one thread) on it
#       as start mock CPU would, waits for its port; sets PID_MOCK.
#   stop_pid PID        stops one process as bench_cleanup does, reaps it and drops it
#       from PIDS.
#   bench_services [pg] [redis]  (both by default) the private servers of
#       spec/lib/services.sh in $T/pg and $T/redis, unix sockets only; sets SERVICES=1,
#       TOLLGATE_PG / TOLLGATE_REDIS (exported by services.sh), and for Redis
#       REDIS_SOCK and PID_REDIS.
#   pin_services CPU    Redis and Postgres (postmaster and its backends) onto CPU and
#       their autogroups (sessions of their own) to nice -19 as well, or our -19 group
#       would leave them a sliver of a shared core; sets PG_PM (the postmaster's PID).
#   snapshot_bin [NAME]  copies $BIN to $T/NAME (default gw): a rebuild of build/
#       during the run cannot change what is measured, and a `pkill -f tollgate` by
#       someone else does not match it. Sets BIN_SRC (the original) and BIN (the copy).
#   build_loadgen       builds spec/bench/tg_loadgen.c (-Werror) with llhttp into
#       $T/tg_loadgen; sets LOADGEN.
#   build_core_bench NAME [CFLAGS...]  builds spec/bench/NAME.c against
#       $BUILD/libtollgate_core.a (the gateway's own code) into $T/NAME.
#
# Ports
#   port_free PORT      true if nothing accepts on 127.0.0.1:PORT.
#   next_port VAR       sets VAR to the next free port from BASE on.
#   wait_port PORT [SECONDS]  waits (10 s by default) until something accepts on PORT.
#
# Measuring
#   load_now            the three load averages.
#   cpu_ticks PID       utime + stime of PID, in clock ticks (HZ a second).
#   per_req TICKS N     TICKS as CPU µs per request over N requests (%.1f).
#   kv NAME LINE        the value of NAME=value in a line of key=value words.
#   to_us DURATION      a wrk duration (812.00us, 1.20ms, 2.00s) in whole µs.
#   pct FILE COLUMN PERCENT  nearest-rank percentile of a column of samples ("" if none).
#   wrk_result FILE     parses a wrk --latency report: sets WRK_REQS, WRK_SECS, WRK_RPS
#       (rounded), WRK_P50 and WRK_P99 (µs), WRK_ERRS (non-2xx + socket errors).
#   metric PORT NAME    the first value in the gateway's /metrics of a line starting NAME.
#
# Reporting
#   say TEXT...         prints TEXT and appends it to $SUMMARY.
#   ratio A B [DIGITS]  A / B with DIGITS decimals (3); "-" when a value is missing.
#   ms US               microseconds as milliseconds (%.3f); "-" when missing.
#   cpu_model           the CPU's model name.
#   bench_machine       "load average before: …; nproc N; <model>".
#   git_head            the checkout's short HEAD, or "?".
#   bin_desc            "binary <BIN_SRC> built <date>, sha256 <12 hex of BIN>".

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BENCH=$ROOT/spec/bench
BENCH_NAME=$(basename "$0" .sh)
HZ=$(getconf CLK_TCK)
NICE=()
PIDS=()
SERVICES=0
KEEP=0
BASE=$((20000 + RANDOM % 12000))
# shellcheck source=spec/lib/services.sh
. "$ROOT/spec/lib/services.sh"

# ---- session, checks, messages ----------------------------------------------------------
bench_session() {
    if [ -z "${TG_BENCH_IN_SESSION:-}" ] && command -v setsid >/dev/null; then
        local rc=0
        TG_BENCH_IN_SESSION=1 setsid "$0" "$@" &
        BENCH_CHILD=$!
        trap 'kill -TERM "$BENCH_CHILD" 2>/dev/null || true' INT TERM
        wait "$BENCH_CHILD" || rc=$?
        while kill -0 "$BENCH_CHILD" 2>/dev/null; do wait "$BENCH_CHILD" || rc=$?; done
        exit $rc
    fi
    AUTOGROUP=$( (echo -19 >/proc/self/autogroup && cat /proc/self/autogroup) 2>/dev/null || echo "autogroup nice unchanged")
    NICE=(nice -n -19)
}

log() { echo "$BENCH_NAME: $*" >&2; }

need() {
    local t
    for t in "$@"; do
        command -v "$t" >/dev/null || { log "$t is not installed (spec/install-deps.sh)"; exit 2; }
    done
}

need_bin() { [ -x "$BIN" ] || { log "$BIN is missing (build first, or set TG_BENCH_BIN)"; exit 2; }; }

need_core_libs() {
    local f
    for f in "$BUILD/libtollgate_core.a" "$BUILD/libllhttp.a"; do
        [ -f "$f" ] || { log "$f is missing (the in-process benchmark links against it)"; exit 2; }
    done
}

# ---- work directory, processes, cleanup -------------------------------------------------
bench_workdir() {
    T=$(mktemp -d "/tmp/$1.XXXXXX")
    chmod 755 "$T"
    SUMMARY=$T/summary.md
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

bench_cleanup() {
    set +e
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null
    done
    declare -F bench_on_exit >/dev/null && bench_on_exit
    if [ "$SERVICES" = 1 ]; then
        tg_redis_stop "$T/redis"
        tg_pg_stop "$T/pg"
    fi
    if [ "$KEEP" = 1 ]; then log "raw outputs kept in $T"; else rm -rf "$T"; fi
}

start() {
    local name=$1 cpu=$2 pin=()
    shift 2
    [ -z "$cpu" ] || pin=(taskset -c "$cpu")
    "${NICE[@]}" "${pin[@]}" "$@" >"$T/$name.out" 2>"$T/$name.err" &
    LAST_PID=$!
    PIDS+=("$LAST_PID")
}

start_mock() {
    next_port P_MOCK
    start mock "$1" "$BIN" mock-upstream --listen "127.0.0.1:$P_MOCK" --threads 1
    PID_MOCK=$LAST_PID
    wait_port "$P_MOCK"
}

stop_pid() {
    local p rest=()
    kill "$1" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || rest+=("$p"); done
    PIDS=("${rest[@]}")
}

bench_services() {
    local s
    [ $# -gt 0 ] || set -- pg redis
    SERVICES=1
    for s in "$@"; do
        case $s in
        pg) tg_pg_start "$T/pg" >/dev/null ;;
        redis)
            tg_redis_start "$T/redis" >/dev/null
            REDIS_SOCK=$T/redis/redis.sock
            PID_REDIS=$(cat "$T/redis/redis.pid")
            ;;
        esac
    done
}

pin_services() {
    local p
    taskset -p -c "$1" "$PID_REDIS" >/dev/null
    PG_PM=$(head -1 "$T/pg/pgdata/postmaster.pid")
    for p in "$PG_PM" $(pgrep -P "$PG_PM" || true); do # new backends inherit the postmaster's
        taskset -p -c "$1" "$p" >/dev/null 2>&1 || true
    done
    for p in "$PID_REDIS" "$PG_PM"; do
        echo -19 >"/proc/$p/autogroup" 2>/dev/null || log "cannot renice the autogroup of pid $p"
    done
}

snapshot_bin() {
    BIN_SRC=$BIN
    cp "$BIN" "$T/${1:-gw}"
    BIN=$T/${1:-gw}
}

build_loadgen() {
    cc -O2 -Wall -Wextra -Werror -std=gnu11 -I/usr/share/include/llhttp -c "$BENCH/tg_loadgen.c" -o "$T/tg_loadgen.o"
    cc -O2 -w -I/usr/share/include/llhttp "$T/tg_loadgen.o" /usr/share/llhttp/{llhttp,api,http}.c -luv -o "$T/tg_loadgen"
    LOADGEN=$T/tg_loadgen
}

build_core_bench() {
    local name=$1
    shift
    # shellcheck disable=SC2046 # pkg-config's output is a list of words
    cc -O2 -g -std=gnu11 -Wall -Wextra -Werror -D_GNU_SOURCE -I"$ROOT/core/include" "$@" "$BENCH/$name.c" \
        "$BUILD/libtollgate_core.a" "$BUILD/libllhttp.a" \
        $(pkg-config --libs luajit libuv hiredis libpq openssl jansson) -lm -lpthread -o "$T/$name"
}

# ---- ports --------------------------------------------------------------------------------
port_free() { ! (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }

next_port() {
    while ! port_free $BASE; do BASE=$((BASE + 1)); done
    printf -v "$1" %d $BASE
    BASE=$((BASE + 1))
}

wait_port() {
    for _ in $(seq $((${2:-10} * 20))); do port_free "$1" || return 0; sleep 0.05; done
    log "nothing listens on port $1"
    return 1
}

# ---- measuring ------------------------------------------------------------------------------
load_now() { cut -d' ' -f1-3 /proc/loadavg; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
per_req() { awk -v c="$1" -v hz="$HZ" -v n="$2" 'BEGIN { printf "%.1f", c / hz * 1e6 / n }'; }
kv() { sed -n "s/.*[[:space:]]$1=\([^[:space:]]*\).*/\1/p" <<<" $2"; }
to_us() {
    awk -v v="$1" 'BEGIN { n = v + 0; u = v; sub(/^[0-9.]+/, "", u);
        if (u == "ms") n *= 1000; else if (u == "s") n *= 1000000; printf "%.0f", n }'
}
pct() {
    [ -s "$1" ] || { echo ""; return; }
    sort -g -k"$2,$2" "$1" | awk -v c="$2" -v p="$3" '{ v[NR] = $c }
        END { r = int(p / 100 * NR + 0.999999); if (r < 1) r = 1; if (r > NR) r = NR; print v[r] }'
}
wrk_result() {
    WRK_REQS=$(awk '/requests in/ {print $1}' "$1")
    WRK_SECS=$(awk '/requests in/ {sub(/s,$/, "", $4); print $4}' "$1")
    WRK_RPS=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$1")
    WRK_P50=$(to_us "$(awk '$1 == "50%" {print $2}' "$1")")
    WRK_P99=$(to_us "$(awk '$1 == "99%" {print $2}' "$1")")
    WRK_ERRS=$(awk '/Non-2xx/ {n += $NF} /Socket errors/ {gsub(/,/, ""); n += $4 + $6 + $8 + $10} END {print n + 0}' "$1")
}
metric() { # reads the whole page: an awk that stopped early would fail curl (exit 23) under pipefail
    curl -s -m 5 "http://127.0.0.1:$1/metrics" | awk -v n="$2" 'index($0, n) == 1 && !found { print $NF; found = 1 }'
}

# ---- reporting ------------------------------------------------------------------------------
say() { echo "$*" | tee -a "$SUMMARY"; }
ratio() {
    awk -v a="${1:-}" -v b="${2:-}" -v d="${3:-3}" \
        'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%." d "f", a / b }'
}
ms() { awk -v a="${1:-}" 'BEGIN { if (a == "") print "-"; else printf "%.3f", a / 1000 }'; }
cpu_model() { grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
bench_machine() { echo "load average before: $(load_now); nproc $(nproc); $(cpu_model)"; }
git_head() { git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'; }
bin_desc() { echo "binary $BIN_SRC built $(date -r "$BIN_SRC" '+%F %T'), sha256 $(sha256sum "$BIN" | cut -c1-12)"; }

# ---- the full pipeline (pipeline_bench.sh, pipeline_callgrind.sh) --------------------------
# Its state for `tollgate apply`: a tenant key in a group with one account (the mock at
# MOCK_PORT), rpm/tpm/concurrency limits on key and tenant at BIG (never refusing), a price.
pipeline_state_lua() { # MOCK_PORT KEY BIG
    cat <<EOF
return {
  tenants = { { name = 'bench', balance = '100000000', rpm = $3, rpm_burst = $3, tpm = 2000000000, concurrency = 100000 } },
  groups = { { name = 'g', models = {} } },
  accounts = { { name = 'up', provider = 'openai', base_url = 'http://127.0.0.1:$1/v1',
                 credential = 'sk-pipeline-bench', concurrency = 1000, groups = { 'g' } } },
  keys = { { name = 'k', tenant = 'bench', group = 'g', key = '$2',
             rpm = $3, rpm_burst = $3, tpm = 2000000000, concurrency = 100000 } },
  prices = { { model = 'mock-gpt', input = '0.15', output = '0.60' } },
}
EOF
}
# The five shipped plugins, configured as the full pipeline runs them.
PIPELINE_PLUGINS_LUA="{ dirs = { '$ROOT/plugins' }, watch = false, enabled = {
    { name = 'model-map', config = { aliases = { ['gpt-4'] = 'gpt-4o', ['openai/*'] = '*', ['claude-*'] = 'claude-3-5-sonnet' } } },
    { name = 'router' }, { name = 'retry-budget' }, { name = 'fail-policy' },
    { name = 'pricing', config = { models = { ['mock-*'] = { input = 0.15, output = 0.6 } } } },
  } }"
# A full gateway's config: one worker on PORT, Postgres PG, Redis on unix socket
# REDIS_SOCK, the spool in SPOOL_DIR, the plugins table PLUGINS, and EXTRA (more fields).
pipeline_gw_lua() { # PORT PG REDIS_SOCK MOCK_PORT SPOOL_DIR PLUGINS [EXTRA]
    cat <<EOF
return {
  listen = "127.0.0.1:$1", workers = 1, access_log = false, log_level = "warn",
  postgres = "$2", redis = "unix://$3",
  upstream = { url = "http://127.0.0.1:$4/v1", api_key = "sk-unused" },
  billing = { spool_dir = "$5" },
  plugins = $6, ${7:-}
}
EOF
}

# ---- the settlement benches (settle_cpu_bench.sh, settle_lean_bench.sh) ------------------
median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# The SQL both use: 4 tenants with a key each, bench_batch(id, b) for the batches as text, a
# sequence to walk it, and bench_batch_make(i, n, merged): batch i of n requests started now
# (request ids of the gateway's form), round robin over the keys; each request a `reserve`
# element and its settlement, or with `merged` the settlement alone carrying its
# reservation's bound and instance (what the gateway sends since sql/0023).
settle_bench_sql() {
    cat <<'SQL'
INSERT INTO tenants (name, balance, opening_balance) SELECT 'cpu-' || i, 1000000000, 1000000000 FROM generate_series(1, 4) i;
INSERT INTO api_keys (tenant_id, name, key_hash, prefix)
SELECT id, 'k' || id, sha256(convert_to('tg-settle-cpu-' || id, 'UTF8')), 'tg-cpu' FROM tenants;
CREATE TABLE bench_batch (id int PRIMARY KEY, b text);
CREATE SEQUENCE bench_seq;
CREATE FUNCTION bench_batch_make(i int, n int, merged boolean) RETURNS jsonb LANGUAGE sql AS $$
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
$$;
SQL
}

# settle_cpu_one CAST N SQLCMD...: one session of SQLCMD (psql and its arguments) settles 2
# batches to warm its caches, then N, each its own transaction, the batch text cast to
# CAST (json or jsonb); prints the backend's own CPU ms per batch (utime + stime of
# /proc/self/stat, read by the backend itself, so other load on the box changes little).
settle_cpu_one() {
    local cast=$1 n=$2 call ticks
    shift 2
    call="SELECT count(*) FROM tg_settle_batch((SELECT b FROM bench_batch WHERE id = (SELECT nextval('bench_seq')))::$cast);"
    ticks="SELECT 'T', (string_to_array(pg_read_file('/proc/self/stat'), ' '))[14]::int
                       + (string_to_array(pg_read_file('/proc/self/stat'), ' '))[15]::int;"
    {
        echo "$call"
        echo "$call"
        echo "$ticks"
        for _ in $(seq "$n"); do echo "$call"; done
        echo "$ticks"
    } | "$@" | awk -F'|' -v n="$n" -v hz="$HZ" '/^T/ { if (c == "") c = $2; else printf "%.2f\n", ($2 - c) * 1000 / hz / n }'
}
