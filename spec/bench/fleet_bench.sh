#!/usr/bin/env bash
# The capacity plan's stream figures (scale, #21, item 6): what an open stream costs a
# tollgate worker — memory per stream, and CPU per relayed chunk, from which streams per
# core at a given token rate follow. One worker (static key: the pipeline's per-request
# costs are in pipeline_bench.sh; a stream's relaying is the same in every variant),
# the mock upstream streaming each answer as `chunks` SSE events `interval_ms` apart.
#
# For each N in STREAMS (default "1000 2000"): tg_loadgen opens N streams, waits until all
# receive, holds them HOLD s (default 6) while sampling the gateway's RSS; the gateway's
# CPU (utime + stime) over the hold gives µs per chunk (chunks = N × HOLD × 1000 /
# INTERVAL_MS, default 100 ms); KB per stream is the held RSS over the RSS before the
# first N, per stream. Bounded: at most ramp + HOLD + 45 s (timeout) per N.
#
#   spec/bench/fleet_bench.sh [--quick]     --quick: STREAMS="1000", HOLD=4
#
# Prints a Markdown table (also in $T/summary.md); writes nothing else.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bench_session "$@"

STREAMS=${STREAMS:-"1000 2000"}
HOLD=${HOLD:-6}
INTERVAL_MS=${INTERVAL_MS:-100}
for arg in "$@"; do
  case $arg in
    --quick) STREAMS=1000; HOLD=4 ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
  esac
done

BUILD=${BUILD:-$ROOT/build}
BIN=${TG_BENCH_BIN:-$BUILD/tollgate}
need_bin
need taskset curl
bench_workdir fleet-bench
snapshot_bin gw
build_loadgen

HARD_NOFILE=$(ulimit -Hn)
[ "$HARD_NOFILE" = unlimited ] && HARD_NOFILE=1048576
ulimit -n "$((HARD_NOFILE < 65536 ? HARD_NOFILE : 65536))"

KEY=tg-fleet-bench-key
start_mock 0
next_port P_TG
cat >"$T/gw.lua" <<EOF
return {
  listen = "127.0.0.1:$P_TG",
  workers = 1,
  keys = { "$KEY" },
  access_log = false,
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", api_key = "sk-bench" },
}
EOF
start gw 1 "$BIN" serve -c "$T/gw.lua"
PID_GW=$LAST_PID
wait_port "$P_TG"

rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
say "### Open streams per worker (tollgate $rev, static key, 1 worker on CPU 1; mock on CPU 0; $(date -u +%FT%TZ), load $(load_now))"
say ""
say "| streams | chunk every | chunks/s relayed | gateway CPU over the hold | µs per chunk | RSS before MB | RSS held MB | KB per stream | errors |"
say "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
rss_idle=$(awk '/VmRSS/ { print $2 }' "/proc/$PID_GW/status")
for n in $STREAMS; do
  chunks=$(( (HOLD + 60) * 1000 / INTERVAL_MS ))
  body="{\"model\":\"mock-gpt\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"[mock chunks=$chunks interval_ms=$INTERVAL_MS] hi\"}]}"
  "${NICE[@]}" taskset -c 0 "$LOADGEN" streams "127.0.0.1:$P_TG" --auth "$KEY" --conns "$n" --ramp 10 \
    --hold "$HOLD" --timeout 45 --body "$body" --pid "$PID_GW" >"$T/streams-$n.txt" 2>"$T/streams-$n.err" &
  lg=$!
  until grep -q 'streams receiving' "$T/streams-$n.err" 2>/dev/null || ! kill -0 "$lg" 2>/dev/null; do sleep 0.05; done
  c0=$(cpu_ticks "$PID_GW"); t0=$(date +%s.%N)
  wait "$lg" || true
  c1=$(cpu_ticks "$PID_GW"); t1=$(date +%s.%N)
  line=$(cat "$T/streams-$n.txt")
  held=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  relayed=$(awk -v n="$n" -v i="$INTERVAL_MS" 'BEGIN { printf "%.0f", n * 1000 / i }')
  cpu_s=$(awk -v c=$((c1 - c0)) -v hz="$HZ" 'BEGIN { printf "%.2f", c / hz }')
  us_chunk=$(awk -v c=$((c1 - c0)) -v hz="$HZ" -v r="$relayed" -v h="$held" 'BEGIN { printf "%.1f", c / hz * 1e6 / (r * h) }')
  rss_max=$(kv rss_max_kb0 "$line")
  say "| $n | ${INTERVAL_MS} ms | $relayed | ${cpu_s} s in ${held} s | $us_chunk | $(awk -v k="$rss_idle" 'BEGIN { printf "%.1f", k / 1024 }') | $(awk -v k="$rss_max" 'BEGIN { printf "%.1f", k / 1024 }') | $(awk -v a="$rss_max" -v b="$rss_idle" -v n="$n" 'BEGIN { printf "%.1f", (a - b) / n }') | $(kv errors "$line") |"
  sleep 2
done
say ""
say "µs per chunk: the gateway's CPU over the hold / (streams × chunks per second × seconds held); it includes the streams' share of idle work (timers, epoll)."
