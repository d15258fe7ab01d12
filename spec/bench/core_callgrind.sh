#!/usr/bin/env bash
# Instructions per non-stream request, counted by callgrind: the steady figure of the
# core benchmark on a shared machine (counts do not move with load; times do).
#
#   spec/bench/core_callgrind.sh [BIN...]     default: build/tollgate
#
# For each binary: the mock upstream, then the gateway under valgrind --tool=callgrind
# (one worker, config-file key, access log off, as in core_bench.sh), warmed with 1 s of
# wrk -c8, counters zeroed, 4 s of wrk -c8 with the same request as core_bench.sh, then
# dumped. Prints instructions per request for the gateway's worker thread total and the
# top inclusive functions. Everything started is stopped by PID; 127.0.0.1 only.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
BENCH=$ROOT/spec/bench
[ $# -gt 0 ] || set -- "$ROOT/build/tollgate"
for tool in valgrind callgrind_annotate callgrind_control wrk; do
    command -v $tool >/dev/null || { echo "core_callgrind: needs $tool" >&2; exit 2; }
done
T=$(mktemp -d "${TMPDIR:-/tmp}/tg-cg.XXXXXX")
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT
port_free() { ! (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }
P=$((30000 + RANDOM % 20000)); while ! port_free $P || ! port_free $((P + 1)); do P=$((P + 2)); done
P_MOCK=$P; P_GW=$((P + 1))
"$1" mock-upstream --listen 127.0.0.1:$P_MOCK --threads 1 >"$T/mock.log" 2>&1 & PIDS+=($!)
cat >"$T/gw.lua" <<EOC
return {
  listen = "127.0.0.1:$P_GW", workers = 1, keys = { "tg-bench-key-0001" }, access_log = false,
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", api_key = "sk-bench" },
}
EOC
echo "| binary | requests | instructions / request |"
echo "|---|---:|---:|"
for bin in "$@"; do
    cp "$bin" "$T/gw"
    valgrind --tool=callgrind --callgrind-out-file="$T/cg.out" "$T/gw" serve -c "$T/gw.lua" >"$T/gw.log" 2>&1 &
    G=$!; PIDS+=($G)
    for _ in $(seq 150); do grep -q "listening on" "$T/gw.log" && break; sleep 0.2; done
    URL=http://127.0.0.1:$P_GW/v1/chat/completions
    wrk -t1 -c8 -d1s -s "$BENCH/wrk_chat.lua" "$URL" >/dev/null
    callgrind_control -z $G >/dev/null
    wrk -t1 -c8 -d4s -s "$BENCH/wrk_chat.lua" "$URL" >"$T/wrk.out"
    callgrind_control -d $G >/dev/null
    sleep 1
    kill $G; wait $G 2>/dev/null || true
    n=$(awk '/requests in/ {print $1}' "$T/wrk.out")
    ir=$(grep -h '^summary:' "$T"/cg.out.1 | awk '{print $2}')
    echo "| $(basename "$bin") ($(sha256sum "$bin" | cut -c1-12)) | $n | $((ir / n)) |"
    callgrind_annotate --inclusive=yes "$T/cg.out.1" 2>/dev/null | grep -E "tg_proxy_handle|phase_parse|json_loadb|tg_usage_merge_json|llhttp_execute|tg_response_start|phase_upstream|up_done" \
        | awk -v n="$n" '$3 ~ /^(\/|[?])/ {gsub(",","",$1); printf "    %8d  %s\n", $1 / n, $3}' | head -12 >&2
    rm -f "$T"/cg.out*
done
