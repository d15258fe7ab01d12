#!/usr/bin/env bash
# req/s through tollgate with the shipped plugins on against off, in one run: the mock
# upstream and wrk on one core, tollgate (1 worker) alone on the other, wrk with 64
# connections sending the same small non-stream chat request. Off and on alternate
# (off, on, off, on, ...) so drift on a shared machine hits both; the best of each is
# kept. Also the gateway's own CPU time per request (utime + stime of the tollgate
# process over all rounds, divided by the requests wrk completed), which a loaded
# machine does not blur the way it blurs req/s: its off/on ratio is the throughput
# ratio of a worker that has a core to itself. Prints one Markdown table.
#
#   spec/bench/plugins_rps.sh [SECONDS] [ROUNDS]      (defaults 5 and 3)
#
# On this path (static upstream, no upstream error, limiter reachable) the hooks that
# run per request are on_request, map_model, price and on_log; select_account runs
# when accounts come from the state store. Everything listens on 127.0.0.1 and is
# stopped by PID on exit (spec/bench/lib.sh). No nice, no session of its own.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
DUR=${1:-5}
ROUNDS=${2:-3}
KEY=tg-bench-key-0001
bench_workdir tg-plugins-rps
need wrk

start_mock 0
next_port P_OFF; next_port P_ON

write_config() { # FILE PORT PLUGINS_LUA
    {
        echo "return {"
        echo "  listen = \"127.0.0.1:$2\", workers = 1, keys = { \"$KEY\" }, access_log = false, log_level = \"warn\","
        echo "  upstream = { url = \"http://127.0.0.1:$P_MOCK/v1\", api_key = \"sk-bench\" },"
        echo "$3"
        echo "}"
    } >"$1"
}
write_config "$T/off.lua" $P_OFF ""
write_config "$T/on.lua" $P_ON "plugins = { dirs = { '$ROOT/plugins', '$ROOT/policies' }, watch = false, enabled = {
    { name = 'model-map', config = { aliases = { ['gpt-4'] = 'gpt-4o', ['openai/*'] = '*', ['claude-*'] = 'claude-3-5-sonnet' } } },
    { name = 'router' }, { name = 'retry-budget' }, { name = 'fail-policy' },
    { name = 'pricing', config = { models = { ['mock-*'] = { input = 0.15, output = 0.6 } } } },
  } },"
start off 1 "$BIN" serve -c "$T/off.lua"
PID_OFF=$LAST_PID
start on 1 "$BIN" serve -c "$T/on.lua"
PID_ON=$LAST_PID
wait_port $P_OFF
wait_port $P_ON

TICK_US=$((1000000 / HZ))
rps() { # PORT PID NAME: prints req/s; adds the process's CPU ticks and requests to T/NAME.cpu
    local t0 t1
    t0=$(cpu_ticks "$2")
    taskset -c 0 wrk -t1 -c64 -d"${DUR}s" -s "$ROOT/spec/bench/wrk_chat.lua" \
        "http://127.0.0.1:$1/v1/chat/completions" >"$T/wrk.out"
    t1=$(cpu_ticks "$2")
    if grep -q "Non-2xx" "$T/wrk.out"; then echo "non-2xx answers:" >&2; cat "$T/wrk.out" >&2; exit 1; fi
    echo "$((t1 - t0)) $(awk '/requests in/ {print $1}' "$T/wrk.out")" >>"$T/$3.cpu"
    awk '/Requests\/sec/ {print $2}' "$T/wrk.out"
}
cpu_us() { awk -v tick="$TICK_US" '{ t += $1; n += $2 } END { printf "%.2f", t * tick / n }' "$T/$1.cpu"; }
# The CPU ratio off/on of round R alone (line R of each file).
round_ratio() {
    paste -d' ' "$T/off.cpu" "$T/on.cpu" | awk -v r="$1" 'NR == r { printf "%.3f", ($1 / $2) / ($3 / $4) }'
}
best_off=0 best_on=0
for r in $(seq "$ROUNDS"); do
    off=$(rps $P_OFF $PID_OFF off)
    on=$(rps $P_ON $PID_ON on)
    echo "round $r: off $off req/s, on $on req/s, CPU ratio off/on $(round_ratio $r)" >&2
    best_off=$(awk -v a="$best_off" -v b="$off" 'BEGIN { print (b > a ? b : a) }')
    best_on=$(awk -v a="$best_on" -v b="$on" 'BEGIN { print (b > a ? b : a) }')
done
c_off=$(cpu_us off) c_on=$(cpu_us on)
# Median of the rounds' own CPU ratios: a burst of other work during one round moves
# the all-rounds figure, not the median.
median=$(for r in $(seq "$ROUNDS"); do round_ratio "$r"; echo; done | sort -n |
    awk '{ v[NR] = $1 } END { printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
spread=$(for r in $(seq "$ROUNDS"); do round_ratio "$r"; echo; done | sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s to %s", lo, hi }')
echo "| tollgate, 1 worker, wrk -c64, ${DUR} s x $ROUNDS rounds, alternating | req/s (best) | gateway CPU µs per request (all rounds) |"
echo "|---|---|---|"
echo "| plugins off | $best_off | $c_off |"
echo "| plugins on (model-map, router, retry-budget, fail-policy, pricing) | $best_on | $c_on |"
awk -v a="$best_off" -v b="$best_on" -v c="$c_off" -v d="$c_on" \
    'BEGIN { printf "| on / off | %.3f | %.3f (CPU off / on: the throughput ratio on a free core) |\n", b / a, c / d }'
echo "| on / off, median of the rounds' CPU ratios (range) | | $median ($spread) |"
