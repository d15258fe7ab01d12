#!/usr/bin/env bash
# What OpenTelemetry traces (#21, item 5) cost a request: instructions per non-stream
# request under callgrind (all threads, the exporter included), tracing off against
# on at sample_ratio 1.0 and 0.01, as core_callgrind.sh counts them: one worker,
# config-file key and static upstream (the mock), access log off; a small node OTLP
# receiver on 127.0.0.1 answers 200 to every POST. Each variant: 1 s of wrk -c8 to
# warm, counters zeroed, 4 s of wrk -c8, dumped. Everything is stopped by PID.
#
#   spec/bench/traces_bench.sh [BIN]     default: build/tollgate
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN=${1:-$ROOT/build/tollgate}
need valgrind callgrind_control wrk node
bench_workdir tg-traces
next_port P_MOCK; next_port P_GW; next_port P_OTLP
start mock "" "$BIN" mock-upstream --listen 127.0.0.1:$P_MOCK --threads 1
wait_port $P_MOCK
start otlp "" node -e "require('http').createServer((q, s) => { q.resume(); q.on('end', () => { s.writeHead(200); s.end('{}'); }); }).listen($P_OTLP, '127.0.0.1')"
wait_port $P_OTLP
echo "| variant (1 worker, callgrind, wrk -c8 4 s after 1 s) | requests | instructions / request | vs off |"
echo "|---|---:|---:|---:|"
base=0
for v in off 1.0 0.01; do
    tr=""
    [ $v != off ] && tr="tracing = { endpoint = 'http://127.0.0.1:$P_OTLP/v1/traces', sample_ratio = $v, batch_interval_ms = 200 },"
    cat >"$T/gw.lua" <<EOC
return {
  listen = "127.0.0.1:$P_GW", workers = 1, keys = { "tg-bench-key-0001" }, access_log = false, log_level = "warn",
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", api_key = "sk-bench" }, $tr
}
EOC
    start gw "" valgrind --tool=callgrind --callgrind-out-file="$T/cg.out" "$BIN" serve -c "$T/gw.lua"
    G=$LAST_PID
    wait_port $P_GW 60
    URL=http://127.0.0.1:$P_GW/v1/chat/completions
    wrk -t1 -c8 -d1s -s "$BENCH/wrk_chat.lua" "$URL" >/dev/null
    callgrind_control -z $G >/dev/null
    wrk -t1 -c8 -d4s -s "$BENCH/wrk_chat.lua" "$URL" >"$T/wrk.out"
    sleep 0.5 # the exporter's last batch of the window
    callgrind_control -d $G >/dev/null
    sleep 1
    stop_pid $G
    n=$(awk '/requests in/ {print $1}' "$T/wrk.out")
    ir=$(grep -h '^summary:' "$T"/cg.out.1 | awk '{print $2}')
    per=$((ir / n))
    [ $base = 0 ] && base=$per
    awk -v l="$v" -v n="$n" -v p="$per" -v b="$base" 'BEGIN { printf "| %s | %d | %d | %+.1f%% |\n", l == "off" ? "tracing off" : "sample_ratio " l, n, p, (p - b) / b * 100 }'
    rm -f "$T"/cg.out*
done
