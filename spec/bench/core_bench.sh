#!/usr/bin/env bash
# tollgate's core benchmark: the mock upstream called directly, through nginx
# (proxy_pass with an upstream keepalive pool) and through tollgate, in one run on this
# box, side by side. Measures, for each target:
#   1. non-stream POST /v1/chat/completions throughput with wrk (req/s, p50, p99),
#      plus tollgate once more with access_log = true;
#   2. latency added over direct at a fixed 2,000 req/s (open loop, tg_loadgen rate),
#      with two pinnings: proxy on its own core, and everything on one core;
#   3. stream time to first byte / first token overhead (tg_loadgen ttfb);
#   4. 10,000 concurrent open streams held through tollgate (and nginx): RSS
#      (fewer when the hard fd limit cannot give the proxy two descriptors per stream).
# Prints Markdown tables (spec/bench/RESULTS.md is written from them) and keeps the raw
# outputs in the work directory it names at the end when --keep is given. A full run
# takes about 3 minutes (4 with --perf).
#
# Usage: spec/bench/core_bench.sh [--quick] [--perf] [--keep] [--no-nginx-streams]
#   --quick  one short round of everything, to check the script itself
#   --perf   afterwards, profile nginx and tollgate under wrk (perf record, DWARF
#            call graphs) and print where the CPU goes
# Environment: TG_BENCH_BIN (default build/tollgate), TG_BENCH_ROUNDS (3),
#   TG_BENCH_WRK_SECONDS (per wrk round, 4), TG_BENCH_STREAMS (10000),
#   TG_BENCH_LOAD_CPU (0), TG_BENCH_PROXY_CPU (1).
#
# Everything listens on 127.0.0.1 only, is started by this script and stopped by PID on
# exit. Pinning (2-core box): the mock upstream and the load generator share
# TG_BENCH_LOAD_CPU; the proxy under test (nginx or tollgate, same worker count) gets
# TG_BENCH_PROXY_CPU alone. All benchmark processes run at nice -19 so that other work
# on the machine (builds, tests) takes as little of their CPU as possible, in a session
# of its own whose autogroup gets nice -19 (spec/bench/lib.sh, bench_session).
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_session "$@"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
ROUNDS=${TG_BENCH_ROUNDS:-3}
WRK_SLICE=${TG_BENCH_WRK_SECONDS:-4}
WARM=2
RATE_SLICE=3
STREAMS_WANTED=${TG_BENCH_STREAMS:-10000}
LOAD_CPU=${TG_BENCH_LOAD_CPU:-0}
PROXY_CPU=${TG_BENCH_PROXY_CPU:-1}
WRK_CONNS=64
RATE=2000
KEY=tg-bench-key-0001
PERF=0 NGINX_STREAMS=1
for a in "$@"; do
    case $a in
    --quick) ROUNDS=1 WRK_SLICE=3 WARM=1 RATE_SLICE=2 ;;
    --perf) PERF=1 ;;
    --keep) KEEP=1 ;;
    --no-nginx-streams) NGINX_STREAMS=0 ;;
    *) echo "usage: $0 [--quick] [--perf] [--keep] [--no-nginx-streams]" >&2; exit 2 ;;
    esac
done

need wrk nginx cc curl taskset
if [ ! -x "$BIN" ]; then
    log "$BIN missing, building"
    cmake -S "$ROOT" -B "$ROOT/build" >/dev/null && cmake --build "$ROOT/build" -j >/dev/null
fi

bench_workdir core-bench

# The fd limit: 10,000 proxied streams need 20,000+ descriptors in the proxy.
HARD_NOFILE=$(ulimit -Hn)
[ "$HARD_NOFILE" = unlimited ] && HARD_NOFILE=1048576
NOFILE=$((HARD_NOFILE < 65536 ? HARD_NOFILE : 65536))
ulimit -n "$NOFILE"
STREAMS=$(( (NOFILE - 100) / 2 ))
[ "$STREAMS" -gt "$STREAMS_WANTED" ] && STREAMS=$STREAMS_WANTED
# nginx starts closing connections it deems reusable (new ones still reading their
# request) once fewer than 1/16 of worker_connections are free: it holds fewer.
NG_STREAMS=$(( ((NOFILE - 16) * 15 / 16 - 100) / 2 ))
[ "$NG_STREAMS" -gt "$STREAMS" ] && NG_STREAMS=$STREAMS

snapshot_bin gw # a snapshot of the binary (lib.sh)
build_loadgen

# ---- ports and processes ----------------------------------------------------------------
next_port P_NGINX; next_port P_TG; next_port P_TGLOG; next_port P_TGS

tg_config() { # PORT ACCESS_LOG
    cat >"$T/gw-$1.lua" <<EOF
return {
  listen = "127.0.0.1:$1",
  workers = 1,
  keys = { "$KEY" },
  access_log = $2,
  log_level = "info",  -- start/stop lines only; shows a shutdown signal if one arrives
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", api_key = "sk-bench" },
}
EOF
    echo "$T/gw-$1.lua"
}

start_mock "$LOAD_CPU"

mkdir -p "$T/nginx/logs" "$T/nginx/tmp"
cat >"$T/nginx/nginx.conf" <<EOF
user root;
worker_processes 1;
daemon off;
master_process on;
pid $T/nginx/nginx.pid;
error_log $T/nginx/logs/error.log warn;
worker_rlimit_nofile $NOFILE;
events { worker_connections $((NOFILE - 16)); }
http {
  access_log off;
  client_body_temp_path $T/nginx/tmp/body;
  proxy_temp_path $T/nginx/tmp/proxy;
  fastcgi_temp_path $T/nginx/tmp/fastcgi;
  uwsgi_temp_path $T/nginx/tmp/uwsgi;
  scgi_temp_path $T/nginx/tmp/scgi;
  keepalive_requests 1000000;
  upstream mock {
    server 127.0.0.1:$P_MOCK;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$P_NGINX;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF
start nginx "$PROXY_CPU" nginx -p "$T/nginx" -c "$T/nginx/nginx.conf" -e "$T/nginx/logs/error.log"
PID_NGINX=$LAST_PID

start tollgate "$PROXY_CPU" "$BIN" serve -c "$(tg_config $P_TG false)"
PID_TG=$LAST_PID
start tollgate-log "$PROXY_CPU" "$BIN" serve -c "$(tg_config $P_TGLOG true)"
PID_TGLOG=$LAST_PID

wait_port $P_NGINX; wait_port $P_TG; wait_port $P_TGLOG
for _ in $(seq 50); do PID_NGINX_W=$(pgrep -P "$PID_NGINX" | head -1 || true); [ -n "$PID_NGINX_W" ] && break; sleep 0.1; done

BODY='{"model":"mock-gpt","messages":[{"role":"user","content":"hello"}]}'
for p in $P_MOCK $P_NGINX $P_TG $P_TGLOG; do
    out=$(curl -sS -m 5 "http://127.0.0.1:$p/v1/chat/completions" -H "Authorization: Bearer $KEY" \
        -H 'Content-Type: application/json' -d "$BODY")
    case $out in *'"completion_tokens":8'*) ;; *) log "port $p answered: $out"; exit 1 ;; esac
done

# ---- helpers (and those of lib.sh) -------------------------------------------------------
# Formatting; a missing value (a run that failed) prints "-".
diff_ms() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "") print "-"; else printf "%+.3f", (a - b) / 1000 }'; }
ms() { awk -v a="${1:-}" 'BEGIN { if (a == "") print "-"; else printf "%.3f", a / 1000 }'; }
mb() { awk -v a="${1:-}" -v b="${2:-0}" 'BEGIN { if (a == "") print "-"; else printf "%.1f", (a + b) / 1024 }'; }
per_stream_kb() { awk -v a="${1:-}" -v b="${2:-}" -v n="$3" 'BEGIN { if (a == "" || b == "") print "-"; else printf "%.1f", (a - b) / n }'; }
sum() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "") print ""; else print a + b }'; }

declare -A URL=([direct]=http://127.0.0.1:$P_MOCK [nginx]=http://127.0.0.1:$P_NGINX
    [tollgate]=http://127.0.0.1:$P_TG [tollgate_log]=http://127.0.0.1:$P_TGLOG)
declare -A HOSTPORT=([direct]=127.0.0.1:$P_MOCK [nginx]=127.0.0.1:$P_NGINX [tollgate]=127.0.0.1:$P_TG)
declare -A PROXYPID=([direct]="" [nginx]=$PID_NGINX_W [tollgate]=$PID_TG [tollgate_log]=$PID_TGLOG)

# check_alive WHICH PHASE: true if the proxies named (tollgate | nginx | all) still run.
# Something outside the benchmark can end them (another job's stale pid file on a
# busy shared box); the summary then says so instead of showing silent gaps.
check_alive() {
    local ok=0 name pid
    for name in mock nginx tollgate tollgate-log; do
        case $1 in all) ;; tollgate) [ $name = tollgate ] || continue ;; nginx) [ $name = nginx ] || continue ;; esac
        case $name in mock) pid=$PID_MOCK ;; nginx) pid=$PID_NGINX ;; tollgate) pid=$PID_TG ;; tollgate-log) pid=$PID_TGLOG ;; esac
        if ! kill -0 "$pid" 2>/dev/null; then
            ok=1
            say "**$name (pid $pid) is gone $2**; its last log line: \`$(tail -1 "$T/$name.err" 2>/dev/null)\`"
            say ""
        fi
    done
    return $ok
}

say "## Run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say ""
say "- $(bench_machine)"
say "- nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}'), tollgate: tree at $(git_head)$( [ -z "$(git -C "$ROOT" status --porcelain -- core CMakeLists.txt 2>/dev/null)" ] || echo ' with uncommitted core changes'), $(bin_desc)"
say "- pinning: mock + load generator on CPU $LOAD_CPU, proxy on CPU $PROXY_CPU; nice -19 ($AUTOGROUP); fd limit $NOFILE"
say ""

# The measurements of sections 1-3 are interleaved: ROUNDS rounds, each visiting every
# target in turn, results pooled per target. A burst of load from elsewhere on the box
# then hits all targets alike instead of whichever happened to run at that moment.

# pct FILE COLUMN PERCENT (lib.sh): nearest-rank percentile of a column of pooled samples.

# ---- 1. throughput with wrk -------------------------------------------------------------
declare -A REQS SECS P50SUM P99SUM PT MT WT ERRS
run_wrk() { # TARGET ROUND
    local t=$1 url=${URL[$1]}/v1/chat/completions pp=${PROXYPID[$1]}
    local f=$T/wrk-$t-$2.txt m0 p0=0 p1=0 m1 t0 t1
    m0=$(cpu_ticks $PID_MOCK); [ -n "$pp" ] && p0=$(cpu_ticks "$pp"); t0=$(date +%s.%N)
    "${NICE[@]}" taskset -c "$LOAD_CPU" wrk -t1 -c$WRK_CONNS -d${WRK_SLICE}s --latency -s "$BENCH/wrk_chat.lua" "$url" >"$f"
    m1=$(cpu_ticks $PID_MOCK); [ -n "$pp" ] && p1=$(cpu_ticks "$pp"); t1=$(date +%s.%N)
    wrk_result "$f"
    REQS[$t]=$(( ${REQS[$t]:-0} + $WRK_REQS ))
    SECS[$t]=$(awk -v a="${SECS[$t]:-0}" -v b="$WRK_SECS" 'BEGIN {print a + b}')
    P50SUM[$t]=$(( ${P50SUM[$t]:-0} + $WRK_P50 ))
    P99SUM[$t]=$(( ${P99SUM[$t]:-0} + $WRK_P99 ))
    ERRS[$t]=$(( ${ERRS[$t]:-0} + $WRK_ERRS ))
    MT[$t]=$(( ${MT[$t]:-0} + m1 - m0 ))
    PT[$t]=$(( ${PT[$t]:-0} + p1 - p0 ))
    WT[$t]=$(awk -v a="${WT[$t]:-0}" -v b=$t0 -v c=$t1 'BEGIN {print a + c - b}')
    log "wrk $t round $2: $WRK_RPS req/s (load $(load_now))"
}
WRK_TARGETS="direct nginx tollgate tollgate_log"
for t in $WRK_TARGETS; do # warm-up: connections, pools, caches
    "${NICE[@]}" taskset -c "$LOAD_CPU" wrk -t1 -c$WRK_CONNS -d${WARM}s -s "$BENCH/wrk_chat.lua" "${URL[$t]}/v1/chat/completions" >/dev/null
done
for round in $(seq $ROUNDS); do for t in $WRK_TARGETS; do run_wrk $t $round; done; done
check_alive all "after the wrk runs" || true
declare -A RPS
for t in $WRK_TARGETS; do RPS[$t]=$(awk -v n=${REQS[$t]} -v s=${SECS[$t]} 'BEGIN {printf "%.0f", n / s}'); done
cpu_pct() { awk -v t="$1" -v w="$2" -v hz="$HZ" 'BEGIN {printf "%.0f", t / hz / w * 100}'; }
say "### 1. Non-stream throughput (wrk -t1 -c$WRK_CONNS, $ROUNDS × ${WRK_SLICE} s per target, interleaved; 1 proxy worker)"
say ""
say "| target | req/s | p50 ms | p99 ms | vs direct | vs nginx | proxy CPU % | mock CPU % | errors |"
say "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for t in $WRK_TARGETS; do
    name=$t; [ $t = tollgate_log ] && name="tollgate, access_log = true"
    pc=-; [ $t != direct ] && pc=$(cpu_pct ${PT[$t]} ${WT[$t]})
    say "| $name | ${RPS[$t]} | $(ms $((P50SUM[$t] / ROUNDS))) | $(ms $((P99SUM[$t] / ROUNDS))) | $(ratio "${RPS[$t]}" "${RPS[direct]}" 2) | $(ratio "${RPS[$t]}" "${RPS[nginx]}" 2) | $pc | $(cpu_pct ${MT[$t]} ${WT[$t]}) | ${ERRS[$t]} |"
done
say ""
say "req/s = all requests / all seconds; p50 and p99 = mean of the rounds' wrk percentiles; CPU % of one core."
say "tollgate / nginx req/s: **$(ratio "${RPS[tollgate]}" "${RPS[nginx]}" 2)** (goal ≥ 1.20); with access log: $(ratio "${RPS[tollgate_log]}" "${RPS[nginx]}" 2)"
say ""

# ---- 2. added latency at a fixed rate ---------------------------------------------------
declare -A SENT FAILED
run_rate() { # TARGET PINNING
    local t=$1 auth=() out
    [ $t = tollgate ] && auth=(--auth $KEY)
    out=$("${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" rate "${HOSTPORT[$t]}" "${auth[@]}" --rate $RATE \
        --conns 32 --duration $RATE_SLICE --warmup 0.5 --samples "$T/rate-$2-$t.txt" 2>>"$T/loadgen.err" || true)
    echo "$out" >>"$T/rate.txt"
    SENT[$2.$t]=$(( ${SENT[$2.$t]:-0} + $(kv sent "$out" | grep . || echo 0) ))
    FAILED[$2.$t]=$(( ${FAILED[$2.$t]:-0} + $(kv errors "$out" | grep . || echo 1) + $(kv non2xx "$out" | grep . || echo 0) ))
    log "rate $2 $t: p50 $(kv svc_p50_us "$out")us p99 $(kv svc_p99_us "$out")us (load $(load_now))"
}
pin_proxies() { # CPU
    taskset -a -p -c "$1" $PID_TG >/dev/null
    taskset -p -c "$1" $PID_NGINX >/dev/null
    taskset -p -c "$1" $PID_NGINX_W >/dev/null
}
rate_table() { # PINNING TITLE
    local f=$T/rate-$1 t
    say "### 2$1. Latency at a fixed $RATE req/s, $2"
    say ""
    say "Open loop, 32 connections, $ROUNDS × ${RATE_SLICE} s per target (after 0.5 s warm-up each), interleaved, samples pooled."
    say ""
    say "| target | measured (sent incl. warm-up) | errors | p50 ms | p90 ms | p99 ms | p99.9 ms | p50 added ms | p99 added ms | p99 added, from due time ms |"
    say "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for t in direct nginx tollgate; do
        say "| $t | $(wc -l <"$f-$t.txt") (${SENT[$1.$t]}) | ${FAILED[$1.$t]} | $(ms "$(pct $f-$t.txt 1 50)") | $(ms "$(pct $f-$t.txt 1 90)") | $(ms "$(pct $f-$t.txt 1 99)") | $(ms "$(pct $f-$t.txt 1 99.9)") | $(diff_ms "$(pct $f-$t.txt 1 50)" "$(pct $f-direct.txt 1 50)") | $(diff_ms "$(pct $f-$t.txt 1 99)" "$(pct $f-direct.txt 1 99)") | $(diff_ms "$(pct $f-$t.txt 2 99)" "$(pct $f-direct.txt 2 99)") |"
    done
    say ""
}
for round in $(seq $ROUNDS); do for t in direct nginx tollgate; do run_rate $t a; done; done
pin_proxies "$LOAD_CPU"
for round in $(seq $ROUNDS); do for t in direct nginx tollgate; do run_rate $t b; done; done
pin_proxies "$PROXY_CPU"
check_alive all "after the fixed-rate runs" || true
rate_table a "proxy on CPU $PROXY_CPU, mock + client on CPU $LOAD_CPU"
rate_table b "everything on CPU $LOAD_CPU (no cross-core wake-ups)"
say "Latency is measured from the moment a request is written; \"from due time\" measures from when the"
say "open-loop schedule wanted it sent (includes waiting for a free connection, as wrk2 does)."
say ""

# ---- 3. stream time to first byte -------------------------------------------------------
STREAM_BODY='{"model":"mock-gpt","stream":true,"messages":[{"role":"user","content":"[mock ttft_ms=50 chunks=20 interval_ms=5] hello"}]}'
TTFB_N=$(( (400 + ROUNDS - 1) / ROUNDS ))
declare -A SFAIL
for round in $(seq $ROUNDS); do
    for t in direct nginx tollgate; do
        auth=(); [ $t = tollgate ] && auth=(--auth $KEY)
        out=$("${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" ttfb "${HOSTPORT[$t]}" "${auth[@]}" --conns 20 --requests $TTFB_N \
            --body "$STREAM_BODY" --timeout 60 --samples "$T/ttfb-$t.txt" 2>>"$T/loadgen.err" || true)
        echo "$out" >>"$T/ttfb.txt"
        SFAIL[$t]=$(( ${SFAIL[$t]:-0} + $(kv errors "$out" | grep . || echo 1) + $(kv non2xx "$out" | grep . || echo 0) ))
        log "ttfb $t: head $(kv head_p50_us "$out")us first token $(kv body_p50_us "$out")us (load $(load_now))"
    done
done
check_alive all "after the stream runs" || true
say "### 3. Stream time to first byte ($ROUNDS × $TTFB_N streams per target, 20 at a time, interleaved; mock: ttft_ms=50 chunks=20 interval_ms=5)"
say ""
say "| target | streams | errors | head p50 ms | head p99 ms | first token p50 ms | first token p99 ms | head added p50 / p99 ms | first token added p50 / p99 ms |"
say "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
f=$T/ttfb
for t in direct nginx tollgate; do
    say "| $t | $(wc -l <$f-$t.txt) | ${SFAIL[$t]} | $(ms "$(pct $f-$t.txt 1 50)") | $(ms "$(pct $f-$t.txt 1 99)") | $(ms "$(pct $f-$t.txt 2 50)") | $(ms "$(pct $f-$t.txt 2 99)") | $(diff_ms "$(pct $f-$t.txt 1 50)" "$(pct $f-direct.txt 1 50)") / $(diff_ms "$(pct $f-$t.txt 1 99)" "$(pct $f-direct.txt 1 99)") | $(diff_ms "$(pct $f-$t.txt 2 50)" "$(pct $f-direct.txt 2 50)") / $(diff_ms "$(pct $f-$t.txt 2 99)" "$(pct $f-direct.txt 2 99)") |"
done
say ""
say "head = time to the response head; first token = time to the first body byte (the first SSE event, sent by the mock 50 ms after its head)."
say ""

# ---- 4. concurrent open streams ---------------------------------------------------------
SLOW_BODY='{"model":"mock-gpt","stream":true,"messages":[{"role":"user","content":"[mock chunks=60 interval_ms=1000] hello"}]}'
hold_streams() { # NAME PORT AUTH N PID...: the loadgen result line plus mock_inflight=
    local name=$1 port=$2 auth=$3 n=$4; shift 4
    local pidargs=() p
    for p in "$@"; do pidargs+=(--pid "$p"); done
    local a=(); [ -n "$auth" ] && a=(--auth "$auth")
    "${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" streams 127.0.0.1:$port "${a[@]}" --conns "$n" --ramp 10 \
        --hold 5 --timeout 45 --body "$SLOW_BODY" "${pidargs[@]}" >"$T/streams-$name.txt" 2>"$T/streams-$name.err" &
    local lg=$! inflight=""
    for _ in $(seq 500); do
        if grep -q 'streams receiving' "$T/streams-$name.err"; then
            inflight=$(curl -s -m 5 http://127.0.0.1:$P_MOCK/_mock/stats | sed -n 's/^{"total":[0-9]*,"inflight":\([0-9]*\).*/\1/p')
            break
        fi
        kill -0 $lg 2>/dev/null || break
        sleep 0.1
    done
    wait $lg || true
    echo "$(cat "$T/streams-$name.txt") mock_inflight=$inflight"
}
# A fresh tollgate, so that VmHWM is this test's peak and nothing else's.
start tollgate-streams "$PROXY_CPU" "$BIN" serve -c "$(tg_config $P_TGS false)"
PID_TGS=$LAST_PID
wait_port $P_TGS
RSS0=$(awk '/VmRSS/ {print $2}' /proc/$PID_TGS/status)
log "holding $STREAMS streams through tollgate (load $(load_now))"
ST_TG=$(hold_streams tollgate $P_TGS $KEY $STREAMS $PID_TGS)
log "$ST_TG"
stop_pid $PID_TGS
sleep 1
ST_NG=""
if [ $NGINX_STREAMS = 1 ] && check_alive nginx "before the nginx streams"; then
    NG_RSS0=$(( $(awk '/VmRSS/ {print $2}' /proc/$PID_NGINX/status) + $(awk '/VmRSS/ {print $2}' /proc/$PID_NGINX_W/status) ))
    log "holding $NG_STREAMS streams through nginx (load $(load_now))"
    ST_NG=$(hold_streams nginx $P_NGINX "" $NG_STREAMS $PID_NGINX_W $PID_NGINX)
    log "$ST_NG"
fi
say "### 4. Concurrent open streams (mock: chunks=60 interval_ms=1000; held 5 s once all receive)"
say ""
say "| target | streams receiving | mock in flight | errors | RSS idle MB | RSS max while held MB | VmHWM MB | KB per stream | proxy fds |"
say "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
r=$ST_TG
say "| tollgate | $(kv receiving "$r") / $STREAMS | $(kv mock_inflight "$r") | $(kv errors "$r") | $(mb $RSS0) | $(mb "$(kv rss_max_kb0 "$r")") | $(mb "$(kv hwm_kb0 "$r")") | $(per_stream_kb "$(kv rss_max_kb0 "$r")" $RSS0 $STREAMS) | $(kv fds0 "$r") |"
if [ -n "$ST_NG" ]; then
    r=$ST_NG
    rss=$(sum "$(kv rss_max_kb0 "$r")" "$(kv rss_max_kb1 "$r")")
    say "| nginx (master + worker) | $(kv receiving "$r") / $NG_STREAMS | $(kv mock_inflight "$r") | $(kv errors "$r") | $(mb $NG_RSS0) | $(mb "$rss") | $(mb "$(sum "$(kv hwm_kb0 "$r")" "$(kv hwm_kb1 "$r")")") | $(per_stream_kb "$rss" $NG_RSS0 $NG_STREAMS) | $(kv fds0 "$r") |"
fi
say ""
TG_PER=$(per_stream_kb "$(kv rss_max_kb0 "$ST_TG")" $RSS0 $STREAMS)
[ "$TG_PER" != - ] && say "tollgate extrapolated to 10,000 streams: $(awk -v b=$RSS0 -v p=$TG_PER 'BEGIN {printf "%.1f", (b + p * 10000) / 1024}') MB RSS (goal < 256 MB)."
[ "$STREAMS" -lt "$STREAMS_WANTED" ] && say "Only $STREAMS streams: the hard fd limit here is $HARD_NOFILE and every proxied stream takes two descriptors in the proxy (client and upstream)."
say ""

# ---- optional profile -------------------------------------------------------------------
# The build has no frame pointers, so call chains come from DWARF unwinding.
profile() { # NAME PID URL
    "${NICE[@]}" taskset -c "$LOAD_CPU" wrk -t1 -c$WRK_CONNS -d9s -s "$BENCH/wrk_chat.lua" "$3/v1/chat/completions" >"$T/wrk-perf-$1.txt" &
    local wp=$!
    sleep 2
    perf record -F 499 --call-graph dwarf,16384 -p "$2" -o "$T/perf-$1.data" -- sleep 5 >/dev/null 2>"$T/perf-$1.err" || true
    wait $wp || true
    say "#### $1: $(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$T/wrk-perf-$1.txt") req/s while recorded; share of samples by object"
    say '```'
    perf report -i "$T/perf-$1.data" --no-children --stdio --sort dso -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -8 | tee -a "$SUMMARY"
    say '```'
}
if [ $PERF = 1 ] && check_alive tollgate "before perf"; then
    command -v perf >/dev/null || { log "perf is not installed"; exit 1; }
    log "profiling tollgate and nginx under wrk"
    say "### Profile under wrk (perf record --call-graph dwarf, 5 s)"
    say ""
    profile nginx $PID_NGINX_W "${URL[nginx]}"
    profile tollgate $PID_TG "${URL[tollgate]}"
    say ""
    say "tollgate, inclusive time (--children) of user-space functions:"
    say '```'
    perf report -i "$T/perf-tollgate.data" --children --stdio --percent-limit 1.5 -g none --sort sym 2>/dev/null |
        grep -v '^#' | grep -v '^$' | grep -v '\[k\]' | grep -v '\] 0x' | head -45 | tee -a "$SUMMARY"
    say '```'
    say ""
fi
check_alive all "at the end" || true
log "load average after: $(load_now)"
