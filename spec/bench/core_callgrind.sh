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
# top inclusive functions (TG_BENCH_CG_KEEP=DIR keeps each binary's callgrind output
# there, for callgrind_annotate). Everything started is stopped by PID; 127.0.0.1 only
# (spec/bench/lib.sh).
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ $# -gt 0 ] || set -- "$ROOT/build/tollgate"
need valgrind callgrind_annotate callgrind_control wrk
bench_workdir tg-cg
next_port P_MOCK; next_port P_GW
start mock "" "$1" mock-upstream --listen 127.0.0.1:$P_MOCK --threads 1
wait_port $P_MOCK
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
    start gw "" valgrind --tool=callgrind --callgrind-out-file="$T/cg.out" "$T/gw" serve -c "$T/gw.lua"
    G=$LAST_PID
    wait_port $P_GW 30 # under valgrind
    URL=http://127.0.0.1:$P_GW/v1/chat/completions
    wrk -t1 -c8 -d1s -s "$BENCH/wrk_chat.lua" "$URL" >/dev/null
    callgrind_control -z $G >/dev/null
    wrk -t1 -c8 -d4s -s "$BENCH/wrk_chat.lua" "$URL" >"$T/wrk.out"
    callgrind_control -d $G >/dev/null
    sleep 1
    stop_pid $G
    n=$(awk '/requests in/ {print $1}' "$T/wrk.out")
    ir=$(grep -h '^summary:' "$T"/cg.out.1 | awk '{print $2}')
    echo "| $(basename "$bin") ($(sha256sum "$bin" | cut -c1-12)) | $n | $((ir / n)) |"
    callgrind_annotate --inclusive=yes "$T/cg.out.1" 2>/dev/null | grep -E "tg_proxy_handle|phase_parse|json_loadb|tg_usage_merge_json|llhttp_execute|tg_response_start|phase_upstream|up_done" \
        | awk -v n="$n" '$3 ~ /^(\/|[?])/ {gsub(",","",$1); printf "    %8d  %s\n", $1 / n, $3}' | head -12 >&2
    [ -z "${TG_BENCH_CG_KEEP:-}" ] || { mkdir -p "$TG_BENCH_CG_KEEP" && cp "$T/cg.out.1" "$TG_BENCH_CG_KEEP/cg.$(basename "$bin").$(sha256sum "$bin" | cut -c1-12)"; }
    rm -f "$T"/cg.out*
done
