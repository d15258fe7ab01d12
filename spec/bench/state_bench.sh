#!/usr/bin/env bash
# Benchmark for the state issue (issue 4, item 9), in one run on this box:
#
#   1. authentication with a warm cache, in-process (goal: under 1 µs per request):
#      spec/bench/state_auth_bench.c, built with cc against libtollgate_core.a, times
#      SHA-256 of the presented key + tg_state_auth + the checks + release on a
#      tg_state_t whose cache was warmed from Postgres (warm sets of 1, 300, 50,000 keys);
#   2. req/s through the gateway with 10, 1,000, 100,000 and 1,000,000 keys in api_keys
#      (goal: flat within 10% of N = 10): one database per N, one gateway per database,
#      wrk rotating the Authorization header over min(N, 300) keys spread over the
#      table (spec/bench/state_keys.lua), measured in interleaved rounds after a warm-up;
#      plus a gateway with a static key from its config file, as a reference;
#   3. the cost of a cache miss per N: the time of the first request for a key never
#      seen against a warm one (curl, one at a time, on an idle gateway).
#
# Prints Markdown (spec/bench/RESULTS-state.md is written from it).
#
# Usage: spec/bench/state_bench.sh [--quick] [--keep] [--perf]
#   --quick  small sizes and short rounds, to check the script (about a minute)
#   --keep   keep the work directory (raw wrk outputs, logs)
#   --perf   profile the gateway of the largest N under wrk (perf record -g) and print
#            the top of perf report --no-children
# Environment: TG_BENCH_BIN (default build/tollgate), TG_BENCH_BUILD (the build directory
#   holding libtollgate_core.a and libllhttp.a; default: that of TG_BENCH_BIN),
#   TG_BENCH_ROUNDS (5), TG_BENCH_WRK_SECONDS (4), TG_BENCH_SIZES ("10 1000 100000 1000000"),
#   TG_BENCH_KEYS (distinct keys per wrk run, 300), TG_BENCH_LOAD_CPU (0),
#   TG_BENCH_PROXY_CPU (1), TG_BENCH_COMMIT (what the binary was built from, for the
#   report; default: the checkout's HEAD).
#
# Pinning (2-core box), as in core_bench.sh: the mock upstream, wrk, Redis and Postgres
# on TG_BENCH_LOAD_CPU; the gateway under test (1 worker) alone on TG_BENCH_PROXY_CPU.
# Everything runs at nice -19 in a session of its own whose autogroup gets nice -19
# (spec/bench/lib.sh holds that preamble and the helpers). Postgres and Redis are
# private (spec/lib/services.sh, unix sockets in the work directory), the gateways and
# the mock listen on 127.0.0.1; everything started here is stopped by PID on exit.
# Billing is off and the keys have no limits and no group (the static upstream serves
# them): the measurement is authentication, nothing else.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_session "$@"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
BUILD=${TG_BENCH_BUILD:-$(dirname "$BIN")}
ROUNDS=${TG_BENCH_ROUNDS:-5}
SLICE=${TG_BENCH_WRK_SECONDS:-4}
read -r -a SIZES <<<"${TG_BENCH_SIZES:-10 1000 100000 1000000}"
NKEYS=${TG_BENCH_KEYS:-300}
LOAD_CPU=${TG_BENCH_LOAD_CPU:-0}
PROXY_CPU=${TG_BENCH_PROXY_CPU:-1}
CONNS=64
WARM=3
MICRO_ITERS=1000000
MICRO_SETS="1 300 50000"
PERF=0
for a in "$@"; do
    case $a in
    --quick) ROUNDS=1 SLICE=2 WARM=1 MICRO_ITERS=200000 MICRO_SETS="1 300"; [ -n "${TG_BENCH_SIZES:-}" ] || SIZES=(10 1000) ;;
    --keep) KEEP=1 ;;
    --perf) PERF=1 ;;
    *) echo "usage: $0 [--quick] [--keep] [--perf]" >&2; exit 2 ;;
    esac
done
need wrk cc curl taskset psql pkg-config redis-server
[ -e "$BIN" ] || { log "$BIN is missing (build first, or set TG_BENCH_BIN / TG_BENCH_BUILD)"; exit 2; }
need_core_libs

bench_workdir tg-state-bench
snapshot_bin gw # a rebuild during the run cannot change what is measured

# ---- services ---------------------------------------------------------------------------
bench_services # private Postgres and Redis in $T (REDIS_SOCK)
PG_ADMIN="host=$T/pg dbname=postgres user=postgres"
# Postgres and Redis share the load side's core: the gateway's core stays its own. Their
# autogroups (sessions of their own) get nice -19 too, or our -19 group would leave them
# ~1.4% of the shared core.
pin_services "$LOAD_CPU"
unset TOLLGATE_PG

start_mock "$LOAD_CPU"

# One database per N, each filled the same way: tenant `bench`, N keys
# 'tg-bench-' || lpad(i, 34, '0'), hashed in SQL (sha256() is core Postgres since 11).
declare -A PG_OF FILL_S
for n in "${SIZES[@]}"; do
    db=tgsb_$n
    psql -X -q -d "$PG_ADMIN" -c "CREATE DATABASE $db" >/dev/null
    PG_OF[$n]="host=$T/pg dbname=$db user=postgres"
    echo "return { upstream = { url = \"http://127.0.0.1:$P_MOCK/v1\" } }" >"$T/tool.lua"
    TOLLGATE_PG=${PG_OF[$n]} "$BIN" migrate -c "$T/tool.lua" >/dev/null
    t0=$(date +%s.%N)
    psql -X -q -v ON_ERROR_STOP=1 -d "${PG_OF[$n]}" >/dev/null <<EOF
INSERT INTO tenants (name, balance) VALUES ('bench', 1000000);
INSERT INTO api_keys (tenant_id, name, key_hash, prefix)
SELECT t.id, 'bench-' || i, sha256(convert_to('tg-bench-' || lpad(i::text, 34, '0'), 'UTF8')), 'tg-bench'
FROM tenants t, generate_series(1, $n) i WHERE t.name = 'bench';
VACUUM ANALYZE api_keys;
EOF
    FILL_S[$n]=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    log "N = $n: $(psql -X -A -t -d "${PG_OF[$n]}" -c "SELECT count(*) || ' keys, table ' || pg_size_pretty(pg_total_relation_size('api_keys'))
        FROM api_keys") in ${FILL_S[$n]} s"
done

say "## Run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say ""
say "- $(bench_machine)"
say "- tollgate: ${TG_BENCH_COMMIT:-tree at $(git_head)}, $(bin_desc); core library $BUILD/libtollgate_core.a"
say "- $(psql --version | head -1), $(redis-server --version | awk '{print $1, $2, $3}'), wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}'), $(cc --version | head -1)"
say "- pinning: mock, wrk, Postgres, Redis on CPU $LOAD_CPU; gateway (workers = 1) on CPU $PROXY_CPU; nice -19 ($AUTOGROUP)"
say ""

# ---- 1. in-process warm lookup ----------------------------------------------------------
build_core_bench state_auth_bench
BIG=${SIZES[${#SIZES[@]} - 1]}
MSETS=""
for w in $MICRO_SETS; do [ "$w" -le "$BIG" ] && MSETS+=" $w"; done
log "in-process warm lookups (warm sets:$MSETS) against the N = $BIG database (load $(load_now))"
say "### 1. Authentication with a warm cache, in-process (goal: < 1 µs per request)"
say ""
say "$MICRO_ITERS lookups per run cycling over the warm set, best of 3 runs (thread CPU time), on CPU $PROXY_CPU, each case"
say "right after a fresh warm-up of the cache from Postgres (so no entry can expire while measured: TTL ≥ 22.5 s);"
say "keys are 43 bytes. Database: $BIG keys."
say ""
"${NICE[@]}" taskset -c "$PROXY_CPU" timeout 600 "$T/state_auth_bench" "${PG_OF[$BIG]}" "$MICRO_ITERS" $MSETS \
    2>"$T/micro.err" | tee -a "$SUMMARY"
cat "$T/micro.err" >&2
say ""

# ---- 2. the gateways ----------------------------------------------------------------------
gw_config() { # FILE PORT PG|"" : one worker, no billing, no access log
    {
        echo "return {"
        echo "  listen = \"127.0.0.1:$2\", workers = 1, access_log = false, log_level = \"warn\","
        if [ -n "$3" ]; then
            echo "  postgres = \"$3\", redis = \"unix://$REDIS_SOCK\","
        else
            echo "  keys = { \"tg-bench-key-0001\" }, -- the key of wrk_chat.lua"
        fi
        echo "  upstream = { url = \"http://127.0.0.1:$P_MOCK/v1\", api_key = \"sk-bench\" },"
        echo "  billing = { enabled = false },"
        echo "}"
    } >"$1"
}
declare -A PORT GWPID KEYS_OF
TARGETS=()
for n in "${SIZES[@]}"; do
    next_port p
    gw_config "$T/gw-$n.lua" "$p" "${PG_OF[$n]}"
    TOLLGATE_PG=${PG_OF[$n]} TOLLGATE_REDIS=unix://$REDIS_SOCK start "gw-$n" "$PROXY_CPU" "$BIN" serve -c "$T/gw-$n.lua"
    PORT[$n]=$p GWPID[$n]=$LAST_PID
    KEYS_OF[$n]=$((n < NKEYS ? n : NKEYS))
    TARGETS+=("$n")
done
BIGK=$BIG/10 # the biggest table again, with 10 distinct keys as for N = 10
PORT[$BIGK]=${PORT[$BIG]} GWPID[$BIGK]=${GWPID[$BIG]} KEYS_OF[$BIGK]=10
[ "$BIG" -gt 10 ] && [ "${KEYS_OF[$BIG]}" -gt 10 ] && TARGETS+=("$BIGK")
next_port p
gw_config "$T/gw-static.lua" "$p" ""
TOLLGATE_PG="" TOLLGATE_REDIS="" start gw-static "$PROXY_CPU" "$BIN" serve -c "$T/gw-static.lua"
PORT[static]=$p GWPID[static]=$LAST_PID KEYS_OF[static]=1
TARGETS+=(static)
for t in "${TARGETS[@]}"; do wait_port "${PORT[$t]}"; done

BODY='{"model":"mock-gpt","messages":[{"role":"user","content":"hello"}]}'
key_n() { printf 'tg-bench-%034d' "$1"; }
for t in "${TARGETS[@]}"; do
    k=$(key_n 1); [ "$t" = static ] && k=tg-bench-key-0001
    out=$(curl -sS -m 10 "http://127.0.0.1:${PORT[$t]}/v1/chat/completions" -H "Authorization: Bearer $k" \
        -H 'Content-Type: application/json' -d "$BODY")
    case $out in *'"completion_tokens"'*) ;; *) log "gateway $t answered: $out"; exit 1 ;; esac
done

run_wrk() { # TARGET SECONDS OUTFILE
    local t=$1 n=${1%/*} count=${KEYS_OF[$1]}
    if [ "$t" = static ]; then
        "${NICE[@]}" taskset -c "$LOAD_CPU" wrk -t1 -c$CONNS -d"$2"s --latency -s "$BENCH/wrk_chat.lua" "http://127.0.0.1:${PORT[$t]}/v1/chat/completions" >"$3"
    else
        TG_SB_N=$n TG_SB_COUNT=$count "${NICE[@]}" taskset -c "$LOAD_CPU" wrk -t1 -c$CONNS -d"$2"s --latency \
            -s "$BENCH/state_keys.lua" "http://127.0.0.1:${PORT[$t]}/v1/chat/completions" >"$3"
    fi
}

log "warm-up: $WARM s of wrk per gateway (load $(load_now))"
for t in "${TARGETS[@]}"; do run_wrk "$t" $WARM "$T/warm-${t//\//-}.txt"; done

declare -A REQS SECS P50S P99S CPUT ERRS LK ROUND_RPS
db_lookups() { # TARGET: the gateway's DB lookups so far
    [ "$1" = static ] || metric "${PORT[$1]}" tollgate_auth_db_lookups_total
}
for r in $(seq "$ROUNDS"); do
    order=("${TARGETS[@]}")
    if [ $((r % 2)) = 0 ]; then
        order=()
        for ((i = ${#TARGETS[@]} - 1; i >= 0; i--)); do order+=("${TARGETS[$i]}"); done
    fi
    for t in "${order[@]}"; do
        f=$T/wrk-${t//\//-}-$r.txt
        c0=$(cpu_ticks "${GWPID[$t]}") l0=$(db_lookups "$t")
        run_wrk "$t" "$SLICE" "$f"
        c1=$(cpu_ticks "${GWPID[$t]}") l1=$(db_lookups "$t")
        [ "$t" = static ] || LK[$t]=$(( ${LK[$t]:-0} + l1 - l0 ))
        wrk_result "$f"
        REQS[$t]=$(( ${REQS[$t]:-0} + $WRK_REQS ))
        SECS[$t]=$(awk -v a="${SECS[$t]:-0}" -v b="$WRK_SECS" 'BEGIN {print a + b}')
        P50S[$t]=$(( ${P50S[$t]:-0} + $WRK_P50 ))
        P99S[$t]=$(( ${P99S[$t]:-0} + $WRK_P99 ))
        ERRS[$t]=$(( ${ERRS[$t]:-0} + $WRK_ERRS ))
        CPUT[$t]=$(( ${CPUT[$t]:-0} + c1 - c0 ))
        rps=$WRK_RPS
        ROUND_RPS[$t]="${ROUND_RPS[$t]:-}${ROUND_RPS[$t]:+ / }$rps"
        log "round $r N=$t: $rps req/s (load $(load_now))"
    done
done
for t in "${TARGETS[@]}"; do kill -0 "${GWPID[$t]}" 2>/dev/null || { log "gateway $t (pid ${GWPID[$t]}) is gone"; exit 1; }; done

declare -A RPS
for t in "${TARGETS[@]}"; do RPS[$t]=$(awk -v n="${REQS[$t]}" -v s="${SECS[$t]}" 'BEGIN {printf "%.0f", n / s}'); done
REF=${SIZES[0]}
say "### 2. req/s against the number of keys in api_keys (goal: within 10% of N = $REF)"
say ""
say "wrk -t1 -c$CONNS, $ROUNDS × $SLICE s per gateway after a $WARM s warm-up, interleaved (order reversed every other round);"
say "each request carries the next of min(N, $NKEYS) keys spread evenly over the table."
say ""
say "| keys in api_keys | distinct keys sent | req/s | per round | vs N = $REF | p50 ms | p99 ms | gateway CPU µs / req | DB lookups while measured | non-2xx + socket errors |"
say "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"
for t in "${TARGETS[@]}"; do
    name=$t lk=${LK[$t]:--}
    [ "$t" = "$BIGK" ] && name="$BIG (10 keys sent, as for N = 10)"
    [ "$t" = static ] && name="static key (config file, no database)"
    say "| $name | ${KEYS_OF[$t]} | ${RPS[$t]} | ${ROUND_RPS[$t]} | $(ratio "${RPS[$t]}" "${RPS[$REF]}") | $(ms $((P50S[$t] / ROUNDS))) | $(ms $((P99S[$t] / ROUNDS))) | $(per_req "${CPUT[$t]}" "${REQS[$t]}") | $lk | ${ERRS[$t]} |"
done
say ""
say "req/s = all requests / all measured seconds; p50 and p99 = mean of the rounds' wrk percentiles."
say "Cache entries live 30 s ±25%, so a key is looked up again about every 30 s (the DB lookups column)."
say ""

# ---- 3. the cost of a miss --------------------------------------------------------------------
# Every cache dropped (the invalidation an admin change publishes), then 10 keys one at
# a time (each a miss: one Postgres query), then the same 10 again (hits); 3 times.
# curl's time_total on an otherwise idle gateway.
say "### 3. First request of an uncached key against a cached one (curl, one at a time, idle gateway)"
say ""
say "| keys in api_keys | miss p50 ms | miss max ms | hit p50 ms | miss cost p50 ms |"
say "|---:|---:|---:|---:|---:|"
for n in "${SIZES[@]}"; do
    : >"$T/cold-$n.txt"; : >"$T/hot-$n.txt"
    for _ in 1 2 3; do
        redis-cli -s "$REDIS_SOCK" PUBLISH tollgate:invalidate '*' >/dev/null
        sleep 0.2
        for pass in cold hot; do
            for j in $(seq 0 9); do
                curl -s -o /dev/null -m 10 -w '%{time_total}\n' "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" \
                    -H "Authorization: Bearer $(key_n $(( n - j * (n / 10) )))" -H 'Content-Type: application/json' \
                    -d "$BODY" >>"$T/$pass-$n.txt"
            done
        done
    done
    c50=$(pct "$T/cold-$n.txt" 1 50) cmax=$(pct "$T/cold-$n.txt" 1 100) w50=$(pct "$T/hot-$n.txt" 1 50)
    say "| $(printf "%'d" "$n") | $(awk -v v="$c50" 'BEGIN {printf "%.3f", v * 1000}') | $(awk -v v="$cmax" 'BEGIN {printf "%.3f", v * 1000}') | $(awk -v v="$w50" 'BEGIN {printf "%.3f", v * 1000}') | $(awk -v a="$c50" -v b="$w50" 'BEGIN {printf "%+.3f", (a - b) * 1000}') |"
done
say ""

# ---- optional profile ---------------------------------------------------------------------
if [ $PERF = 1 ]; then
    command -v perf >/dev/null || { log "perf is not installed"; exit 1; }
    for t in "$REF" "$BIG"; do
        run_wrk "$t" 9 "$T/wrk-perf-$t.txt" &
        wp=$!
        sleep 2
        perf record -F 999 -g -p "${GWPID[$t]}" -o "$T/perf-$t.data" -- sleep 5 >/dev/null 2>"$T/perf-$t.err" || true
        wait $wp || true
        say "#### perf record -g, gateway of N = $t under wrk ($(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$T/wrk-perf-$t.txt") req/s); perf report --no-children, top 25"
        say '```'
        perf report -i "$T/perf-$t.data" --no-children --stdio --sort dso,sym -g none 2>/dev/null >"$T/report-$t.txt" || true
        grep -v '^#' "$T/report-$t.txt" | grep -v '^$' | head -25 | tee -a "$SUMMARY" || true
        say '```'
        say ""
        say "Authentication's own symbols in that profile (self time): $(grep -E 'tg_state_auth|sha256|SHA256|EVP_Digest|EVP_MD|tg_principal|phase_auth|auth_check|tg_cidr' "$T/report-$t.txt" |
            awk '{ s += $1; printf "%s %s; ", $NF, $1 } END { printf "total %.2f%%", s }'); all of libcrypto (its SHA-256 compression function has no symbol): $(awk '$2 == "libcrypto.so.3" { s += $1 } END { printf "%.2f%%", s }' "$T/report-$t.txt")"
        say ""
    done
fi
for n in "${SIZES[@]}"; do say "- N = $(printf "%'d" "$n"): filled in ${FILL_S[$n]} s"; done
say "- load average after: $(load_now)"
