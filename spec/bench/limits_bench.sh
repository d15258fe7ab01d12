#!/usr/bin/env bash
# Benchmark for the limits issue (issue 6, item 7): what admission plus release cost per
# request. One gateway, three keys that differ only in their limits, measured in
# interleaved rounds in one run:
#
#   off   no limit on the key or its tenant: phase_admit returns at once, no Redis call
#   key   rpm + rpm_burst, tpm and concurrency on the key (its tenant has none)
#   all   the same on the key and on its tenant (every bucket and lease of the script)
#
# The limits are far above anything the benchmark can reach, so nothing is refused.
#
#   1. the goal, "under 100 µs added at p50": the latency one request gets, measured
#      unsaturated (added latency is a property of one request, not of a queue):
#      a. closed loop on ONE connection (tg_loadgen ttfb --conns 1: the next request
#         leaves when the previous response ends), key and all against off;
#      b. the same with the gateway and Redis sharing a core (no cross-core wake-up);
#      d. the same with Redis alone on a core, and the gateway, the mock and the load
#         generator sharing the other (the nearest this 2-core box gets to a Redis with
#         a core of its own: its work never waits for, or delays, anyone else's);
#      c. a fixed, moderate 1,000 req/s (open loop, tg_loadgen rate, 4 connections);
#   2. latency at a busier fixed rate (TG_BENCH_RATE, 2,000 req/s over 32 connections),
#      as measured before;
#   3. Redis round trips per request: INFO commandstats over every measured run (EVALSHA
#      calls per admitted request; goal: one for admission, one for release), a
#      MONITOR capture of 200 requests that shows every command the gateway sent, and
#      Redis's own time per script (SLOWLOG) and in the commands inside (commandstats);
#   4. req/s with limits on against off (closed loop over 64 connections; saturated: a
#      throughput figure, not an added latency), with the gateway's and Redis's CPU per
#      request;
#   5. admission + release without HTTP (spec/bench/limits_admit_bench.c: the gateway's
#      tg_limits.c against the same Redis, one request at a time): the admission round
#      trip, the gateway's CPU and Redis's CPU per request; with --callgrind also the
#      instructions per request in Redis and in the gateway code (valgrind; exact on a
#      loaded box, unlike any time).
#
# Prints Markdown (spec/bench/RESULTS-limits.md is written from it).
#
# Usage: spec/bench/limits_bench.sh [--quick] [--latency] [--idle-poll] [--keep] [--perf] [--callgrind]
#   --quick      one short round of everything, to check the script
#   --latency    sections 1 and 5 only (the added latency, and the admission without HTTP)
#   --idle-poll  hold the PM QoS request cpu_dma_latency = 0 for the whole run (as tuned's
#                latency-performance profile does), so idle CPUs poll instead of halting.
#                On this VM a halted vCPU (guest_halt_poll_ns = 0) takes tens of µs to
#                wake, and every request crosses cores several times; the report names
#                which idle mode each run used. Released when the script exits.
#   --keep       keep the work directory (raw samples, logs)
#   --perf       profile the gateway under the closed loop for off and all, and Redis for
#                all (perf record -g); print the top of perf report --no-children of each
#   --callgrind  section 5 under valgrind --tool=callgrind too (about a minute more)
# Environment: TG_BENCH_BIN (default build/tollgate; its directory must hold
#   libtollgate_core.a and libllhttp.a for section 5), TG_BENCH_ROUNDS (5),
#   TG_BENCH_SECONDS (closed-loop seconds per round, 4), TG_BENCH_RATE (2000),
#   TG_BENCH_SINGLE (requests per single-connection round, 2000), TG_BENCH_LOAD_CPU (0),
#   TG_BENCH_PROXY_CPU (1), TG_BENCH_COMMIT (what the binary was built from, for the
#   report; default: the checkout's HEAD).
#
# Pinning (2-core box), as in core_bench.sh: the mock upstream, the load generator,
# Redis and Postgres on TG_BENCH_LOAD_CPU; the gateway (1 worker) alone on
# TG_BENCH_PROXY_CPU (1b moves Redis next to the gateway).
# Everything runs at nice -19 in a session of its own whose autogroup gets nice -19
# (spec/bench/lib.sh holds that preamble and the helpers). Postgres and Redis are
# private (spec/lib/services.sh, unix sockets in the work directory), the gateway and
# the mock listen on 127.0.0.1; everything started here is stopped by PID on exit.
# Billing is off: the measurement is admission, nothing else.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_session "$@"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
ROUNDS=${TG_BENCH_ROUNDS:-5}
SLICE=${TG_BENCH_SECONDS:-4}
RATE=${TG_BENCH_RATE:-2000}
SINGLE=${TG_BENCH_SINGLE:-2000}
MODERATE=1000
ADMIT_N=5000
CG_N=1000
LOAD_CPU=${TG_BENCH_LOAD_CPU:-0}
PROXY_CPU=${TG_BENCH_PROXY_CPU:-1}
CONNS=64
RATE_SLICE=3
WARM=2
MONITOR_N=200
SAMPLE_S=3
PERF=0 CALLGRIND=0 LATENCY=0 IDLE_POLL=0
for a in "$@"; do
    case $a in
    --quick) ROUNDS=1 SLICE=2 RATE_SLICE=1 WARM=1 SAMPLE_S=1 SINGLE=300 ADMIT_N=500 ;;
    --latency) LATENCY=1 ;;
    --idle-poll) IDLE_POLL=1 ;;
    --keep) KEEP=1 ;;
    --perf) PERF=1 ;;
    --callgrind) CALLGRIND=1 ;;
    *) echo "usage: $0 [--quick] [--latency] [--idle-poll] [--keep] [--perf] [--callgrind]" >&2; exit 2 ;;
    esac
done
need cc curl taskset psql redis-server redis-cli jq
need_bin
BUILD=$(cd "$(dirname "$BIN")" && pwd)
need_core_libs # section 5 links against them
[ $CALLGRIND = 0 ] || need valgrind

bench_workdir tg-limits-bench
MON=""
bench_on_exit() { [ -z "$MON" ] || kill "$MON" 2>/dev/null; } # the MONITOR client of section 3

IDLE_DRV=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none)
IDLE_MODE="cpuidle driver $IDLE_DRV, governor $(cat /sys/devices/system/cpu/cpuidle/current_governor 2>/dev/null || cat /sys/devices/system/cpu/cpuidle/current_governor_ro 2>/dev/null || echo none)"
[ -r /sys/module/haltpoll/parameters/guest_halt_poll_ns ] && IDLE_MODE="$IDLE_MODE, guest_halt_poll_ns $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns)"
if [ $IDLE_POLL = 1 ]; then
    # The request lasts while this descriptor is open: until the script (and everything it
    # started, which inherits it) has exited.
    exec 9>/dev/cpu_dma_latency || { log "--idle-poll: cannot open /dev/cpu_dma_latency (root needed)"; exit 2; }
    printf '0' >&9
    IDLE_MODE="$IDLE_MODE; **idle polling: PM QoS cpu_dma_latency = 0 held for the run** (idle CPUs poll, no halt)"
else
    IDLE_MODE="$IDLE_MODE; default idle (a halted vCPU is woken by an interrupt)"
fi

snapshot_bin gw # a rebuild during the run cannot change what is measured
build_loadgen
# ---- the in-process admission benchmark (section 5), against the binary's own library ------
build_core_bench limits_admit_bench

# ---- helpers (and those of lib.sh) --------------------------------------------------------
added_us() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "") print "-"; else printf "%+.0f", a - b }'; }
gw_alive() { kill -0 "$PID_GW" 2>/dev/null || { log "the gateway (pid $PID_GW) is gone $1; its log ends:"; tail -5 "$T/gateway.err" >&2; exit 1; }; }
admitted() { metric "$P_GW" 'tollgate_admission_total{result="admitted"}'; }
redis() { redis-cli -s "$REDIS_SOCK" "$@"; }
cmdstat() { # NAME: calls of one command since the last CONFIG RESETSTAT
    redis INFO commandstats | tr -d '\r' | sed -n "s/^cmdstat_$1:calls=\([0-9]*\),.*/\1/p" | grep . || echo 0
}

# ---- services, database, keys ---------------------------------------------------------------
bench_services # private Postgres and Redis in $T: TOLLGATE_PG, REDIS_SOCK, PID_REDIS
# On the load side's core; their autogroups (sessions of their own) at nice -19 too, or
# our -19 group would leave them ~1.4% of the shared core.
pin_services "$LOAD_CPU"

start_mock "$LOAD_CPU"
next_port P_GW

echo "return { upstream = { url = \"http://127.0.0.1:$P_MOCK/v1\" } }" >"$T/tool.lua"
"$BIN" migrate -c "$T/tool.lua" >/dev/null
BIGL=1000000000 # far above what this box can send: nothing is ever refused
key_of() { printf 'tg-limits-bench-%-27s' "$1" | tr ' ' x; } # 43 bytes, like issued keys
psql -X -q -v ON_ERROR_STOP=1 -d "$TOLLGATE_PG" >/dev/null <<EOF
INSERT INTO tenants (name, balance) VALUES ('free', 1000000);
INSERT INTO tenants (name, balance, rpm, rpm_burst, tpm, concurrency)
    VALUES ('limited', 1000000, $BIGL, $BIGL, 2000000000, 100000);
INSERT INTO api_keys (tenant_id, name, key_hash, prefix)
    SELECT id, 'off', sha256(convert_to('$(key_of off)', 'UTF8')), 'tg-limit' FROM tenants WHERE name = 'free';
INSERT INTO api_keys (tenant_id, name, key_hash, prefix, rpm, rpm_burst, tpm, concurrency)
    SELECT id, 'key', sha256(convert_to('$(key_of key)', 'UTF8')), 'tg-limit', $BIGL, $BIGL, 2000000000, 100000
    FROM tenants WHERE name = 'free';
INSERT INTO api_keys (tenant_id, name, key_hash, prefix, rpm, rpm_burst, tpm, concurrency)
    SELECT id, 'all', sha256(convert_to('$(key_of all)', 'UTF8')), 'tg-limit', $BIGL, $BIGL, 2000000000, 100000
    FROM tenants WHERE name = 'limited';
EOF

cat >"$T/gw.lua" <<EOF
return {
  listen = "127.0.0.1:$P_GW", workers = 1, access_log = false, log_level = "warn",
  postgres = "$TOLLGATE_PG", redis = "unix://$REDIS_SOCK",
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", api_key = "sk-bench" },
  billing = { enabled = false },
}
EOF
start gateway "$PROXY_CPU" "$BIN" serve -c "$T/gw.lua"
PID_GW=$LAST_PID
wait_port $P_GW

TARGETS=(off key all)
BODY='{"model":"mock-gpt","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}'
for t in "${TARGETS[@]}"; do
    out=$(curl -sS -m 10 "http://127.0.0.1:$P_GW/v1/chat/completions" -H "Authorization: Bearer $(key_of $t)" \
        -H 'Content-Type: application/json' -d "$BODY")
    case $out in *'"completion_tokens"'*) ;; *) log "key $t answered: $out"; exit 1 ;; esac
done
a0=$(admitted)
curl -s -o /dev/null -m 10 "http://127.0.0.1:$P_GW/v1/chat/completions" -H "Authorization: Bearer $(key_of off)" -d "$BODY"
curl -s -o /dev/null -m 10 "http://127.0.0.1:$P_GW/v1/chat/completions" -H "Authorization: Bearer $(key_of all)" -d "$BODY"
a1=$(admitted)
[ $((a1 - a0)) = 1 ] || { log "admissions for one 'off' and one 'all' request: $((a1 - a0)), expected 1"; exit 1; }

say "## Run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say ""
say "- $(bench_machine)"
say "- tollgate: ${TG_BENCH_COMMIT:-tree at $(git_head)}, $(bin_desc)"
say "- $(redis-server --version | awk '{print $1, $2, $3}'), $(psql --version | head -1)"
say "- pinning: mock, load generator, Redis, Postgres on CPU $LOAD_CPU; gateway (workers = 1) on CPU $PROXY_CPU; nice -19 ($AUTOGROUP)"
say "- idle: $IDLE_MODE"
say "- limits of \`key\` and \`all\`: rpm = rpm_burst = $BIGL, tpm 2000000000, concurrency 100000; request: \`$BODY\`"
say ""

# Every measured run: CONFIG RESETSTAT first, then EVALSHA / EVAL calls and the gateway's
# admission counter are added up per target.
declare -A EVALSHA EVAL ADMITTED REQUESTS USEC
count_begin() { redis CONFIG RESETSTAT >/dev/null; ADM0=$(admitted); }
count_end() { # TARGET REQUESTS
    EVALSHA[$1]=$(( ${EVALSHA[$1]:-0} + $(cmdstat evalsha) ))
    USEC[$1]=$(( ${USEC[$1]:-0} + $(redis INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:.*,usec=\([0-9]*\),.*/\1/p' | grep . || echo 0) ))
    EVAL[$1]=$(( ${EVAL[$1]:-0} + $(cmdstat eval) ))
    ADMITTED[$1]=$(( ${ADMITTED[$1]:-0} + $(admitted) - ADM0 ))
    REQUESTS[$1]=$(( ${REQUESTS[$1]:-0} + $2 ))
}

# ---- 1 and 2. latency: one request at a time, then fixed rates ---------------------------
declare -A FAILED
pct_of() { pct "$T/$1.txt" "$2" "$3"; }
# One connection, closed loop: the added latency of a request with nothing queued.
run_single() { # TARGET PINNING
    local t=$1 out
    count_begin
    out=$("${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" ttfb 127.0.0.1:$P_GW --auth "$(key_of "$t")" --body "$BODY" \
        --conns 1 --requests "$SINGLE" --timeout 60 --samples "$T/single-$2-$t.txt" 2>>"$T/loadgen.err" || true)
    sleep 0.1 # the last release
    count_end "$t" "$(kv completed "$out" | grep . || echo 0)"
    echo "$out" >>"$T/single.txt"
    FAILED[$2.$t]=$(( ${FAILED[$2.$t]:-0} + $(kv errors "$out" | grep . || echo 1) + $(kv non2xx "$out" | grep . || echo 0) ))
    log "single $2 $t: p50 $(pct_of "single-$2-$t" 3 50) µs (load $(load_now))"
}
run_rate() { # TARGET PINNING RATE CONNS
    local t=$1 out sent
    count_begin
    out=$("${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" rate 127.0.0.1:$P_GW --auth "$(key_of "$t")" --body "$BODY" \
        --rate "$3" --conns "$4" --duration $RATE_SLICE --warmup 0.5 --samples "$T/rate-$2-$t.txt" 2>>"$T/loadgen.err" || true)
    sleep 0.2 # the last releases
    sent=$(kv sent "$out" | grep . || echo 0)
    count_end "$t" "$sent"
    echo "$out" >>"$T/rate.txt"
    FAILED[$2.$t]=$(( ${FAILED[$2.$t]:-0} + $(kv errors "$out" | grep . || echo 1) + $(kv non2xx "$out" | grep . || echo 0) ))
    log "rate $2 $t: p50 $(kv svc_p50_us "$out") µs p99 $(kv svc_p99_us "$out") µs (load $(load_now))"
}
rounds() { # FUNCTION ARGS...: ROUNDS × (off, key, all), the order reversed every other round
    local r t order fn=$1
    shift
    for r in $(seq "$ROUNDS"); do
        order=("${TARGETS[@]}")
        [ $((r % 2)) = 0 ] && order=(all key off)
        for t in "${order[@]}"; do "$fn" "$t" "$@"; done
    done
}
lat_table() { # FILE-PREFIX COLUMN TITLE DESCRIPTION
    local f=$T/$1 c=$2 t
    say "### $3"
    say ""
    say "$4"
    say ""
    say "| key | samples | errors | p50 ms | p90 ms | p99 ms | **p50 added µs** | p90 added µs | p99 added µs |"
    say "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for t in "${TARGETS[@]}"; do
        say "| $t | $(wc -l <"$f-$t.txt") | ${FAILED[${1#*-}.$t]} | $(ms "$(pct "$f-$t.txt" "$c" 50)") | $(ms "$(pct "$f-$t.txt" "$c" 90)") | $(ms "$(pct "$f-$t.txt" "$c" 99)") | $(added_us "$(pct "$f-$t.txt" "$c" 50)" "$(pct "$f-off.txt" "$c" 50)") | $(added_us "$(pct "$f-$t.txt" "$c" 90)" "$(pct "$f-off.txt" "$c" 90)") | $(added_us "$(pct "$f-$t.txt" "$c" 99)" "$(pct "$f-off.txt" "$c" 99)") |"
    done
    say ""
}
for t in "${TARGETS[@]}"; do # warm-up: connections, key cache, script cache
    "${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" rate 127.0.0.1:$P_GW --auth "$(key_of "$t")" --body "$BODY" \
        --rate "$RATE" --conns 32 --duration $WARM >/dev/null 2>>"$T/loadgen.err" || true
done
rounds run_single a
taskset -a -p -c "$PROXY_CPU" "$PID_REDIS" >/dev/null
rounds run_single b
taskset -a -p -c "$LOAD_CPU" "$PID_GW" >/dev/null
rounds run_single d
taskset -a -p -c "$PROXY_CPU" "$PID_GW" >/dev/null
taskset -a -p -c "$LOAD_CPU" "$PID_REDIS" >/dev/null
rounds run_rate c "$MODERATE" 4
[ $LATENCY = 1 ] || rounds run_rate d "$RATE" 32
gw_alive "after the latency runs"
say "### 1. Added latency of one request, unsaturated (the goal: under 100 µs added at p50)"
say ""
lat_table single-a 3 "1a. One connection, closed loop; gateway on CPU $PROXY_CPU, mock + client + Redis on CPU $LOAD_CPU" \
    "tg_loadgen ttfb --conns 1: one request in flight at any time; $ROUNDS × $SINGLE requests per key, interleaved, samples pooled; latency = request written → response complete."
lat_table single-b 3 "1b. One connection, closed loop; gateway + Redis on CPU $PROXY_CPU, mock + client on CPU $LOAD_CPU" \
    "As 1a, with Redis moved next to the gateway (its reply does not wait behind the load side)."
lat_table single-d 3 "1d. One connection, closed loop; Redis alone on CPU $PROXY_CPU, gateway + mock + client on CPU $LOAD_CPU" \
    "As 1a, with Redis on a core of its own: the admission crosses cores twice, and Redis's work (the admission, and the release after each response) runs beside everything else instead of before it."
lat_table rate-c 1 "1c. A fixed $MODERATE req/s (open loop), 4 connections; pinning as 1a" \
    "tg_loadgen rate: $ROUNDS × $RATE_SLICE s per key after 0.5 s warm-up each, interleaved; latency from the moment each request is written."
if [ $LATENCY = 0 ]; then
say "### 2. Latency at a busier fixed $RATE req/s"
say ""
lat_table rate-d 1 "2. $RATE req/s (open loop), 32 connections; pinning as 1a" \
    "As 1c, at $RATE req/s over 32 connections (the figure measured before)."

# ---- 4. throughput (sections 2 to 4 are skipped with --latency) ---------------------------
# tg_loadgen ttfb, a closed loop over CONNS connections that lets every request finish
# before it closes; it sends a fixed number of requests, timed here from outside.
declare -A REQS SECS GCPU RCPU ERRS ROUND_RPS SENT
run_sat() { # TARGET REQUESTS SAMPLES: prints tg_loadgen's result line plus secs=
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$("${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" ttfb 127.0.0.1:$P_GW --auth "$(key_of "$1")" --body "$BODY" \
        --conns $CONNS --requests "$2" --timeout 120 --samples "$3" 2>>"$T/loadgen.err" || true)
    t1=$(date +%s.%N)
    echo "$out secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')"
}
# The warm-up also sizes the rounds: about SLICE seconds each at the rate it saw.
declare -A NSAT
for t in "${TARGETS[@]}"; do
    out=$(run_sat "$t" 10000 /dev/null)
    NSAT[$t]=$(awk -v c="$(kv completed "$out")" -v s="$(kv secs "$out")" -v d="$SLICE" 'BEGIN { n = int(c / s * d); print n < 1000 ? 1000 : n }')
done
log "closed loop: requests per round: off ${NSAT[off]}, key ${NSAT[key]}, all ${NSAT[all]}"
for r in $(seq "$ROUNDS"); do
    order=("${TARGETS[@]}")
    [ $((r % 2)) = 0 ] && order=(all key off)
    for t in "${order[@]}"; do
        count_begin
        g0=$(cpu_ticks "$PID_GW") r0=$(cpu_ticks "$PID_REDIS")
        out=$(run_sat "$t" "${NSAT[$t]}" "$T/sat-$t.txt")
        g1=$(cpu_ticks "$PID_GW") r1=$(cpu_ticks "$PID_REDIS")
        echo "$out" >>"$T/sat.txt"
        done_n=$(kv completed "$out" | grep . || echo 0)
        count_end "$t" "$done_n"
        REQS[$t]=$(( ${REQS[$t]:-0} + done_n ))
        SECS[$t]=$(awk -v a="${SECS[$t]:-0}" -v b="$(kv secs "$out")" 'BEGIN {print a + b}')
        ERRS[$t]=$(( ${ERRS[$t]:-0} + $(kv errors "$out" | grep . || echo 1) + $(kv non2xx "$out" | grep . || echo 0) ))
        GCPU[$t]=$(( ${GCPU[$t]:-0} + g1 - g0 ))
        RCPU[$t]=$(( ${RCPU[$t]:-0} + r1 - r0 ))
        rps=$(awk -v n="$done_n" -v s="$(kv secs "$out")" 'BEGIN {printf "%.0f", n / s}')
        ROUND_RPS[$t]="${ROUND_RPS[$t]:-}${ROUND_RPS[$t]:+ / }$rps"
        log "closed loop round $r $t: $rps req/s (load $(load_now))"
    done
done
gw_alive "after the closed-loop runs"
declare -A RPS
for t in "${TARGETS[@]}"; do RPS[$t]=$(awk -v n="${REQS[$t]}" -v s="${SECS[$t]}" 'BEGIN {printf "%.0f", n / s}'); done

# ---- 3. round trips -----------------------------------------------------------------------
say "### 3. Redis commands per request"
say ""
say "INFO commandstats, reset before and read after every measured run of sections 1, 2 and 4 (the gateway's own"
say "\`tollgate_admission_total{result=\"admitted\"}\` counts admissions over the same windows)."
say ""
say "| key | requests sent | admitted | EVALSHA | EVAL (NOSCRIPT fallback) | EVALSHA per request sent | EVALSHA per admitted request | Redis time per EVALSHA µs |"
say "|---|---:|---:|---:|---:|---:|---:|---:|"
for t in "${TARGETS[@]}"; do
    say "| $t | ${REQUESTS[$t]} | ${ADMITTED[$t]} | ${EVALSHA[$t]} | ${EVAL[$t]} | $(ratio "${EVALSHA[$t]}" "${REQUESTS[$t]}") | $(ratio "${EVALSHA[$t]}" "${ADMITTED[$t]}") | $(awk -v u="${USEC[$t]}" -v n="${EVALSHA[$t]}" 'BEGIN { if (n > 0) printf "%.1f", u / n; else print "-" }') |"
done
say ""
# MONITOR: every command Redis executes, with the client it came from; commands run by a
# script show as [N lua].
MON_OUT=$T/monitor.txt
redis-cli -s "$REDIS_SOCK" MONITOR >"$MON_OUT" &
MON=$!
sleep 0.3
"${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" rate 127.0.0.1:$P_GW --auth "$(key_of all)" --body "$BODY" \
    --rate 100 --conns 4 --duration $((MONITOR_N / 100)) --warmup 0 >"$T/monitor-load.txt" 2>>"$T/loadgen.err" || true
sleep 0.5
kill "$MON" 2>/dev/null || true
wait "$MON" 2>/dev/null || true
MON=""
mon_sent=$(kv sent "$(cat "$T/monitor-load.txt")")
say "MONITOR while $mon_sent requests with key \`all\` were sent (100 req/s): commands sent by the gateway (not by a script), by name:"
say ""
say '```'
grep -v ' lua\] ' "$MON_OUT" | grep -v '^OK' | awk '{ c = $4; gsub(/"/, "", c); n[toupper(c)]++ } END { for (c in n) printf "%-10s %d\n", c, n[c] }' | sort | tee -a "$SUMMARY"
say '```'
say ""
say "and inside the scripts (one line per redis.call, not a round trip): $(grep -c ' lua\] ' "$MON_OUT" || true) commands, $(awk -v a="$(grep -c ' lua\] ' "$MON_OUT" || true)" -v n="$mon_sent" 'BEGIN { if (n > 0) printf "%.1f", a / n }') per request."
say ""

# Where Redis's time goes, at the rate of section 1: SLOWLOG (threshold 5 µs: the scripts,
# not the ~1 µs commands inside them, whose logging would inflate the scripts' times) for
# each script's execution time, and commandstats for the commands the scripts ran.
say "Redis's own execution time, $SAMPLE_S s at $RATE req/s per key (the load of section 2): each script from SLOWLOG"
say "(\`slowlog-log-slower-than 5\` µs, so the ~1 µs commands inside scripts are not logged), the commands"
say "inside them from INFO commandstats over the same window."
say ""
say "| key | script | logged / sent | p50 µs | p90 µs | mean µs |"
say "|---|---|---:|---:|---:|---:|"
redis CONFIG SET slowlog-max-len 200000 >/dev/null
declare -A INNER INNER_US EVAL_US
for t in key all; do
    redis SLOWLOG RESET >/dev/null
    redis CONFIG RESETSTAT >/dev/null
    redis CONFIG SET slowlog-log-slower-than 5 >/dev/null
    out=$("${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" rate 127.0.0.1:$P_GW --auth "$(key_of $t)" --body "$BODY" \
        --rate "$RATE" --conns 32 --duration "$SAMPLE_S" --warmup 0 2>>"$T/loadgen.err" || true)
    sleep 0.3
    redis CONFIG SET slowlog-log-slower-than 10000 >/dev/null
    sent=$(kv sent "$out")
    redis INFO commandstats | tr -d '\r' | grep '^cmdstat_' >"$T/cmdstats-$t.txt"
    redis-cli -2 --json -s "$REDIS_SOCK" SLOWLOG GET 200000 >"$T/slowlog-$t.json"
    # Which script: by its number of ARGV (the admission has 9 or more, the release 4 to
    # 7, the renewal 2 or 3, in this version and the one before).
    jq -r '.[] | select(.[3][0] == "EVALSHA") | "\((.[3] | length) - 3 - (.[3][2] | tonumber)) \(.[2])"' \
        "$T/slowlog-$t.json" | awk '{ print ($1 >= 9 ? "admit" : $1 >= 4 ? "release" : "renew"), $2 }' >"$T/scripts-$t.txt"
    for name in admit release renew; do
        awk -v k=$name '$1 == k {print $2}' "$T/scripts-$t.txt" | sort -n >"$T/s.txt"
        [ -s "$T/s.txt" ] || continue
        say "| $t | $name | $(wc -l <"$T/s.txt") / $sent | $(awk '{ v[NR] = $1; s += $1 } END { printf "%d | %d | %.1f", v[int((NR + 1) / 2)], v[int(NR * 0.9 + 0.5)], s / NR }' "$T/s.txt") |"
    done
    # Commands run inside the scripts: everything but the scripts and our own admin commands.
    INNER[$t]=$(awk -F'[:=,]' -v n="$sent" '$1 !~ /^cmdstat_(evalsha|eval|config.*|slowlog.*|info|ping)$/ {
            printf "%s %.2f/req %.2f µs; ", substr($1, 9), $3 / n, $7 } ' "$T/cmdstats-$t.txt")
    INNER_US[$t]=$(awk -F'[:=,]' -v n="$sent" '$1 !~ /^cmdstat_(evalsha|eval|config.*|slowlog.*|info|ping)$/ { u += $5 } END { printf "%.1f", u / n }' "$T/cmdstats-$t.txt")
    EVAL_US[$t]=$(awk -F'[:=,]' -v n="$sent" '$1 == "cmdstat_evalsha" { printf "%.1f", $5 / n }' "$T/cmdstats-$t.txt")
done
say ""
for t in key all; do
    say "- \`$t\`: Redis spent ${EVAL_US[$t]} µs per request in EVALSHA (admit + release), of which ${INNER_US[$t]} µs in the commands the scripts ran"
    say "  (name, calls per request, µs per call): ${INNER[$t]}"
done
say ""

say "### 4. Throughput, limits on against off (closed loop over $CONNS connections, $ROUNDS rounds of ~$SLICE s per key, interleaved)"
say ""
say "| key | req/s | per round | vs off | p50 ms | p99 ms | gateway CPU µs / req | Redis CPU µs / req | errors + non-2xx |"
say "|---|---:|---|---:|---:|---:|---:|---:|---:|"
for t in "${TARGETS[@]}"; do
    say "| $t | ${RPS[$t]} | ${ROUND_RPS[$t]} | $(ratio "${RPS[$t]}" "${RPS[off]}") | $(ms "$(pct "$T/sat-$t.txt" 3 50)") | $(ms "$(pct "$T/sat-$t.txt" 3 99)") | $(per_req "${GCPU[$t]}" "${REQS[$t]}") | $(per_req "${RCPU[$t]}" "${REQS[$t]}") | ${ERRS[$t]} |"
done
say ""
say "tg_loadgen ttfb (every connection sends its next request when the previous response ends); req/s = all"
say "responses / all seconds (each run timed from outside, connection set-up included); p50 / p99 of the whole"
say "response time, pooled over the rounds; CPU from /proc/PID/stat over the same runs."
say ""
fi # LATENCY = 0

# ---- 5. admission + release without HTTP ---------------------------------------------------
say "### 5. Admission + release without HTTP (limits_admit_bench.c, one request at a time)"
say ""
say "The gateway's own tg_limits.c + tg_redis.c against the same Redis, $ADMIT_N requests per mode, client on CPU"
say "$PROXY_CPU, Redis on CPU $LOAD_CPU: tg_limits_admit → callback → tg_admit_release → next. Modes: \`rpm\` (rpm only:"
say "no lease, nothing to correct, so no release round trip), \`key\`, \`all\` as above."
say ""
say "| mode | admission round trip p50 / p90 / p99 µs | gateway CPU µs / req | EVALSHA / req | Redis µs per EVALSHA (commandstats) | Redis CPU µs / req |"
say "|---|---|---:|---:|---:|---:|"
for m in rpm key all; do
    "$T/limits_admit_bench" "unix://$REDIS_SOCK" $m 500 >/dev/null # warm: the script cache
    redis CONFIG RESETSTAT >/dev/null
    r0=$(cpu_ticks "$PID_REDIS")
    out=$("${NICE[@]}" taskset -c "$PROXY_CPU" "$T/limits_admit_bench" "unix://$REDIS_SOCK" $m $ADMIT_N || true)
    r1=$(cpu_ticks "$PID_REDIS")
    st=$(redis INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),usec=[0-9]*,usec_per_call=\([0-9.]*\),.*/\1 \2/p')
    say "| $m | $(kv admit_p50_us "$out") / $(kv admit_p90_us "$out") / $(kv admit_p99_us "$out") | $(kv cpu_us_per_req "$out") | $(ratio "${st% *}" $ADMIT_N) | ${st#* } | $(per_req $((r1 - r0)) $ADMIT_N) |"
    log "in-process $m: $out (load $(load_now))"
done
say ""
if [ $CALLGRIND = 1 ]; then
    # Instructions, not time: exact whatever else the box runs. A second Redis under
    # callgrind; its counters are zeroed after a warm-up and dumped after N requests.
    # The gateway side: the difference between two runs of the client under callgrind.
    CG=$T/callgrind
    mkdir -p "$CG"
    say "Instructions per request (valgrind --tool=callgrind, $CG_N requests per mode): Redis's whole process (scripts, event"
    say "loop, I/O; a second redis-server under callgrind), and the gateway code (tg_limits, tg_redis, hiredis, libuv: two runs"
    say "of limits_admit_bench, 200 and 200 + N requests, subtracted)."
    say ""
    say "| mode | Redis instructions / req | gateway instructions / req |"
    say "|---|---:|---:|"
    cg_total() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'; }
    for m in rpm key all; do
        rm -f "$CG"/*
        valgrind --tool=callgrind --callgrind-out-file="$CG/redis.out" redis-server --port 0 --unixsocket "$CG/r.sock" \
            --save '' --appendonly no >"$CG/redis.log" 2>"$CG/vg.err" &
        VG=$!
        PIDS+=("$VG")
        for _ in $(seq 100); do redis-cli -s "$CG/r.sock" PING >/dev/null 2>&1 && break; sleep 0.2; done
        "$T/limits_admit_bench" "unix://$CG/r.sock" $m 50 >/dev/null
        callgrind_control -z $VG >/dev/null
        "$T/limits_admit_bench" "unix://$CG/r.sock" $m $CG_N >/dev/null
        callgrind_control -d $VG >/dev/null
        valgrind --tool=callgrind --callgrind-out-file="$CG/c1.out" "$T/limits_admit_bench" "unix://$CG/r.sock" $m 200 >/dev/null 2>&1
        valgrind --tool=callgrind --callgrind-out-file="$CG/c2.out" "$T/limits_admit_bench" "unix://$CG/r.sock" $m $((200 + CG_N)) >/dev/null 2>&1
        kill $VG; wait $VG 2>/dev/null || true
        say "| $m | $(( $(cg_total "$CG/redis.out.1") / CG_N )) | $(( ($(cg_total "$CG/c2.out") - $(cg_total "$CG/c1.out")) / CG_N )) |"
    done
    say ""
fi

# ---- optional profile ---------------------------------------------------------------------
if [ $PERF = 1 ]; then
    command -v perf >/dev/null || { log "perf is not installed"; exit 1; }
    for t in off all; do
        run_sat "$t" $((NSAT[$t] * 9 / SLICE)) /dev/null >"$T/perf-load-$t.txt" &
        wp=$!
        sleep 2
        pr=""
        if [ $t = all ]; then
            perf record -F 999 -g -p "$PID_REDIS" -o "$T/perf-redis.data" -- sleep 5 >/dev/null 2>"$T/perf-redis.err" &
            pr=$!
        fi
        perf record -F 999 -g -p "$PID_GW" -o "$T/perf-$t.data" -- sleep 5 >/dev/null 2>"$T/perf-$t.err" || true
        [ -z "$pr" ] || wait "$pr" || true
        wait $wp || true
        say "#### perf record -g on the gateway, key \`$t\`, closed loop ($(awk -v n="$(kv completed "$(cat "$T/perf-load-$t.txt")")" -v s="$(kv secs "$(cat "$T/perf-load-$t.txt")")" 'BEGIN {printf "%.0f", n / s}') req/s): perf report --no-children, top 30"
        say '```'
        perf report -i "$T/perf-$t.data" --no-children --stdio --sort dso,sym -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30 | tee -a "$SUMMARY" || true
        say '```'
        say ""
    done
    say "#### perf record -g on Redis at the same time (key \`all\`): perf report --no-children, top 30"
    say '```'
    perf report -i "$T/perf-redis.data" --no-children --stdio --sort dso,sym -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30 | tee -a "$SUMMARY" || true
    say '```'
    say ""
fi
say "- gateway log: $(grep -c 'without Redis' "$T/gateway.err" || true) admissions decided without Redis, $(grep -c 'release failed' "$T/gateway.err" || true) failed releases"
say "- load average after: $(load_now)"
