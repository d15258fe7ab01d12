#!/usr/bin/env bash
# Instructions per request of the gateway with the shipped plugins on against off,
# counted by callgrind: the steady companion of plugins_rps.sh, whose CPU time and
# req/s swing on a shared machine. Each gateway (1 worker, same config as
# plugins_rps.sh) runs under callgrind twice while wrk sends the same small chat
# request, once for SHORT and once for LONG seconds; the difference of the two runs'
# instructions divided by the difference of their requests is the cost of one request
# (start-up, plugin loading and shutdown cancel out). User-space instructions only:
# the kernel's share (sockets) is the same on and off and not counted, so the CPU
# ratio is higher than the one printed here unless plugin code runs much slower per
# instruction than the rest. Prints one Markdown table.
#
#   spec/bench/plugins_rps_ir.sh [SHORT LONG]      (seconds, defaults 4 and 12)
#
# Everything listens on 127.0.0.1 and is stopped by PID on exit (spec/bench/lib.sh).
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
SHORT=${1:-4}
LONG=${2:-12}
KEY=tg-bench-key-0001
bench_workdir tg-plugins-ir
need wrk valgrind

start_mock "" # not pinned

PLUGINS="plugins = { dirs = { '$ROOT/plugins', '$ROOT/policies' }, watch = false, enabled = {
    { name = 'model-map', config = { aliases = { ['gpt-4'] = 'gpt-4o', ['openai/*'] = '*', ['claude-*'] = 'claude-3-5-sonnet' } } },
    { name = 'router' }, { name = 'retry-budget' }, { name = 'fail-policy' },
    { name = 'pricing', config = { models = { ['mock-*'] = { input = 0.15, output = 0.6 } } } },
  } },"

# run MODE SECONDS: prints "<instructions> <requests>"
run() {
    local port pl=""
    next_port port
    [ "$1" = on ] && pl=$PLUGINS
    cat >"$T/c.lua" <<EOC
return {
  listen = "127.0.0.1:$port", workers = 1, keys = { "$KEY" }, access_log = false, log_level = "warn",
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", api_key = "sk-bench" },
  $pl
}
EOC
    valgrind --tool=callgrind --callgrind-out-file="$T/cg.out" "$BIN" serve -c "$T/c.lua" >"$T/srv.out" 2>&1 &
    local pid=$!
    wait_port $port 30 # under valgrind
    wrk -t1 -c4 -d"$2s" -s "$ROOT/spec/bench/wrk_chat.lua" "http://127.0.0.1:$port/v1/chat/completions" >"$T/wrk.out"
    if grep -q "Non-2xx" "$T/wrk.out"; then echo "non-2xx answers:" >&2; cat "$T/wrk.out" >&2; exit 1; fi
    kill -TERM $pid
    wait $pid || true
    echo "$(grep -m1 '^summary:' "$T/cg.out" | cut -d' ' -f2) $(awk '/requests in/ {print $1}' "$T/wrk.out")"
}
per_request() { # MODE: instructions per request from a short and a long run
    read -r i1 r1 < <(run "$1" "$SHORT")
    read -r i2 r2 < <(run "$1" "$LONG")
    awk -v a="$i1" -v b="$i2" -v c="$r1" -v d="$r2" 'BEGIN { printf "%.0f", (b - a) / (d - c) }'
}
off=$(per_request off)
on=$(per_request on)
echo "| tollgate under callgrind, 1 worker, wrk -c4, ${SHORT} s and ${LONG} s runs | instructions per request (user space) |"
echo "|---|---|"
echo "| plugins off | $off |"
echo "| plugins on (model-map, router, retry-budget, fail-policy, pricing) | $on |"
awk -v a="$off" -v b="$on" 'BEGIN { printf "| on / off (instructions off / on) | %.3f (plugins add %d) |\n", a / b, b - a }'
