#!/usr/bin/env bash
# Instructions per request of the full pipeline's gateway, counted by callgrind: the
# steady figure of pipeline_bench.sh on a shared machine (counts do not move with load;
# times do).
#
#   spec/bench/pipeline_callgrind.sh [--rounds N] [BIN...]     default: build/tollgate
#
# One Postgres, one Redis and the mock upstream for all binaries; the full pipeline of
# pipeline_bench.sh (a tenant key in a group with one account, rpm/tpm/concurrency
# limits that never refuse, billing on, the five shipped plugins), a small non-stream
# chat request with max_tokens 16. For each round and binary (interleaved): the gateway
# under valgrind --tool=callgrind (one worker), warmed with 2 s at 50 req/s, counters
# zeroed, then 6 s at 40 req/s (tg_loadgen, open loop, 16 connections), dumped.
# Prints instructions per request and the top inclusive functions per request.
# Everything started is stopped by PID; 127.0.0.1 and unix sockets only (lib.sh).
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROUNDS=1
if [ "${1:-}" = --rounds ]; then
    ROUNDS=$2
    shift 2
fi
[ $# -gt 0 ] || set -- "$ROOT/build/tollgate"
need valgrind callgrind_annotate callgrind_control cc curl
bench_workdir tg-pcg
bench_services pg redis
build_loadgen
next_port P_MOCK
next_port P_GW
export TOLLGATE_SECRET_KEY=$(printf 'cd%.0s' $(seq 32))
TOOL_BIN=$T/tool
cp "$1" "$TOOL_BIN"
start mock "" "$TOOL_BIN" mock-upstream --listen 127.0.0.1:$P_MOCK --threads 1
wait_port $P_MOCK
PG="host=$T/pg dbname=tollgate user=postgres"
echo "return { upstream = { url = \"http://127.0.0.1:$P_MOCK/v1\" }, postgres = \"$PG\" }" >"$T/tool.lua"
"$TOOL_BIN" migrate -c "$T/tool.lua" >/dev/null
KEY=tg-pipebench-key-0123456789abcdef
BIG=1000000000
pipeline_state_lua $P_MOCK $KEY $BIG >"$T/state.lua"
"$TOOL_BIN" apply -c "$T/tool.lua" "$T/state.lua" >/dev/null
mkdir -p "$T/spool"
pipeline_gw_lua $P_GW "$PG" "$REDIS_SOCK" $P_MOCK "$T/spool" "$PIPELINE_PLUGINS_LUA" >"$T/full.lua"
BODY='{"model":"mock-gpt","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}'
load() { "$LOADGEN" rate 127.0.0.1:$P_GW --auth $KEY --body "$BODY" --rate "$1" --conns 16 --duration "$2" 2>/dev/null || true; }
# Until a billed answer comes back (the accounts and the key loaded, under valgrind).
ready() {
    for _ in $(seq 100); do
        curl -s -m 3 "http://127.0.0.1:$P_GW/v1/chat/completions" -H "Authorization: Bearer $KEY" \
            -H 'Content-Type: application/json' -d "$BODY" | grep -q completion_tokens && return 0
        sleep 0.3
    done
    log "the gateway under callgrind never answered"
    return 1
}
echo "| round | binary | requests | instructions / request |"
echo "|---:|---|---:|---:|"
for r in $(seq "$ROUNDS"); do
    for bin in "$@"; do
        cp "$bin" "$T/gw"
        rm -f "$T"/cg.out*
        # --fair-sched: without it LuaJIT's startup can stall under valgrind.
        start gw "" valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file="$T/cg.out" "$T/gw" serve -c "$T/full.lua"
        G=$LAST_PID
        wait_port $P_GW 60
        ready
        load 50 2 >/dev/null
        callgrind_control -z $G >/dev/null
        out=$(load 40 6)
        sleep 1
        callgrind_control -d $G >/dev/null
        sleep 1
        stop_pid $G
        n=$(echo "$out" | sed -n 's/.*completed=\([0-9]*\).*/\1/p')
        [ -n "$n" ] || n=$(echo "$out" | grep -o 'responses=[0-9]*' | cut -d= -f2)
        f=$(ls -t "$T"/cg.out.* | head -1)
        ir=$(grep -h '^summary:' "$f" | awk '{print $2}')
        echo "| $r | $(basename "$bin") ($(sha256sum "$bin" | cut -c1-12)) | $n | $((ir / n)) |"
        callgrind_annotate --inclusive=yes "$f" 2>/dev/null |
            grep -E "tg_proxy_handle|up_done|tg__on_finish|tg__phase_admit|json_loadb|snprintf.c:snprintf|settlement_text|redis_send|ev_poll_cb" |
            awk -v n="$n" '$3 ~ /^(\/|[?.])/ {gsub(",","",$1); printf "    %8d  %s\n", $1 / n, $3}' | head -12 >&2
    done
done
