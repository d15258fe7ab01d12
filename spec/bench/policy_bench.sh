#!/usr/bin/env bash
# What the policy tooling of #22 costs a request: the capture at 1% and 100% sampling,
# and one shadow plugin, against both off — req/s and the gateway's CPU µs per request.
#
# One gateway (1 worker, billing off, the router plugin on) per variant, all on one
# private Postgres/Redis (or spec/run.sh's), each with a key of its group: `plain`, or
# `shadowed` (the router again, in shadow mode with top_k = 1, so it disagrees often):
#
#   off           capture off, group plain
#   capture 1%    plugins.capture.rate = 0.01 (cap 100000/s: never the limit)
#   capture 100%  rate = 1
#   shadow        capture off, group shadowed
#   1% + shadow   rate = 0.01, group shadowed       (the issue's goal: < 5% of req/s)
#   shadow10, 1% + shadow10: the same shadow with "sample": 0.1 (on 10% of requests)
#
# Rounds are interleaved (every variant once per round, the order rotating), wrk -c32
# for DUR seconds each; the median of the rounds is reported for req/s and, from the
# time its threads ran over each run (/proc/PID/task/*/schedstat: user + kernel, in ns),
# µs of gateway CPU per request, and the kernel's share of it (stime / (utime + stime)
# from /proc/PID/stat); "vs off" is the median of the per-round
# ratios to off (rounds share the machine's conditions). The load average is read
# before and after every run. Prints Markdown (TG_BENCH_RAW=1: every run's figures
# too). Then, in each round, the same requests at a fixed rate (TG_BENCH_RATE, default
# 1000 req/s, open loop, spec/bench/tg_loadgen.c; 0: skip) for DUR seconds: the CPU per
# request again, with every variant batching alike (under wrk, a variant that gets more
# of the machine answers more requests per loop turn, each cheaper). Everything
# listens on 127.0.0.1 and is stopped by PID on exit.
#
#   spec/bench/policy_bench.sh [SECONDS] [ROUNDS]     (defaults 4 and 5)
#   spec/bench/policy_bench.sh --callgrind             instructions per request instead
#
# TG_BENCH_VARIANTS="off shadow ..." runs only those variants (off first, the baseline);
# TG_BENCH_BIN and TG_BENCH_PLUGINS (a plugins folder) measure another build (A/B);
# TG_BENCH_CG_SECONDS=N measures N seconds per variant under callgrind instead of 4 (more
# requests: less weight for a GC cycle or a trace compiled in the window);
# TG_BENCH_CG_KEEP=DIR keeps each variant's callgrind output there (DIR/cg.VARIANT.1)
# for callgrind_annotate --inclusive=yes.
#
# --callgrind: each variant in turn under valgrind --tool=callgrind (all threads, the
# capture's writer included), warmed with wrk -c8 until it has answered 3000 requests
# (TG_BENCH_CG_WARM; at most 30 s) so that LuaJIT's traces have settled (a trace
# recorded or aborted in the window costs tens of thousands of instructions), counters
# zeroed, 4 s of wrk -c8 (TG_BENCH_CG_SECONDS), dumped, then as long idle, dumped
# again and taken off (the timers' share): instructions per request,
# which a loaded machine does not move. User space only: the kernel's share of each
# request (the socket calls) is not counted, so a relative cost here overstates the
# share of the whole request.
set -euo pipefail
CALLGRIND=0
if [ "${1:-}" = --callgrind ]; then
    CALLGRIND=1
    shift
fi
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
PLUGINS=${TG_BENCH_PLUGINS:-$ROOT/plugins}
DUR=${1:-4}
ROUNDS=${2:-5}
SECRET=$(printf 'cd%.0s' $(seq 32))
need_bin
need wrk
bench_workdir tg-policy-bench
bench_on_exit() {
    if [ -n "${DB:-}" ]; then psql -X -q -d "$ADMIN_PG" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1; fi
}
if [ -z "${TOLLGATE_PG:-}" ] || [ -z "${TOLLGATE_REDIS:-}" ]; then
    bench_services
fi
with_db() { if [[ $1 == *dbname=* ]]; then sed -E "s/dbname=[^ ]*/dbname=$2/" <<<"$1"; else echo "$1 dbname=$2"; fi; }
ADMIN_PG=$(with_db "$TOLLGATE_PG" postgres)
DB=tgpb_$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
psql -X -q -d "$ADMIN_PG" -c "CREATE DATABASE $DB" >/dev/null
PG=$(with_db "$TOLLGATE_PG" "$DB")
export TOLLGATE_PG=$PG TOLLGATE_SECRET_KEY=$SECRET
sql() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$PG" -c "$1"; }

start_mock 0
# The null shadow: a select_account that decides nothing (what the shadow path costs
# without a plugin's own work).
mkdir -p "$T/plugins"
cat >"$T/plugins/noop.lua" <<'EOT'
return { name = "noop", priority = 1, version = "1.0.0", select_account = function() end }
EOT
cat >"$T/tool.lua" <<EOT
return { upstream = { url = "http://127.0.0.1:$P_MOCK/v1" }, plugins = { dirs = { '$PLUGINS', '$T/plugins' } } }
EOT
"$BIN" migrate -c "$T/tool.lua" >/dev/null
OFFSET=$((1000000 + RANDOM * 32768 + RANDOM))
for s in $(sql "SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = 'public'"); do
    sql "ALTER SEQUENCE \"$s\" RESTART WITH $OFFSET" >/dev/null
done
cat >"$T/state.lua" <<EOT
return {
  tenants = { { name = 'bench', balance = '1000000000' } },
  groups = {
    { name = 'plain', models = {} },
    { name = 'shadowed', models = {}, plugins = { router = { mode = 'shadow', config = { top_k = 1 } } } },
    { name = 'shadowed10', models = {}, plugins = { router = { mode = 'shadow', sample = 0.1, config = { top_k = 1 } } } },
    { name = 'nullshadowed', models = {}, plugins = { noop = { mode = 'shadow' } } },
  },
  accounts = {
$(for i in 1 2 3 4; do echo "    { name = 'acc$i', provider = 'openai', base_url = 'http://127.0.0.1:$P_MOCK/v1', credential = 'sk-pb-$i', concurrency = 1000, groups = { 'plain', 'shadowed', 'shadowed10', 'nullshadowed' } },"; done)
  },
  keys = {
    { name = 'kp', tenant = 'bench', group = 'plain', key = 'tg-policy-bench-plain' },
    { name = 'ks', tenant = 'bench', group = 'shadowed', key = 'tg-policy-bench-shadow' },
    { name = 'ks10', tenant = 'bench', group = 'shadowed10', key = 'tg-policy-bench-shadow10' },
    { name = 'ksn', tenant = 'bench', group = 'nullshadowed', key = 'tg-policy-bench-nullshadow' },
  },
  prices = { { model = 'mock-gpt', input = '0.15', output = '0.60' } },
}
EOT
"$BIN" apply -c "$T/tool.lua" "$T/state.lua" >/dev/null

VARIANTS=(off cap1 cap100 shadow cap1shadow shadow10 cap1shadow10 nullshadow)
if [ -n "${TG_BENCH_VARIANTS:-}" ]; then read -r -a VARIANTS <<<"$TG_BENCH_VARIANTS"; fi
declare -A RATE=([off]=0 [cap1]=0.01 [cap100]=1 [shadow]=0 [cap1shadow]=0.01 [shadow10]=0 [cap1shadow10]=0.01 [nullshadow]=0)
declare -A KEYV=([off]=plain [cap1]=plain [cap100]=plain [shadow]=shadow [cap1shadow]=shadow [shadow10]=shadow10
    [cap1shadow10]=shadow10 [nullshadow]=nullshadow)
declare -A LABEL=([off]="off (router, no capture, no shadow)" [cap1]="capture 1%" [cap100]="capture 100%"
    [shadow]="one shadow plugin (router, top_k 1) on every request" [cap1shadow]="capture 1% + that shadow"
    [shadow10]="that shadow on a 10% sample" [cap1shadow10]="capture 1% + that shadow on a 10% sample"
    [nullshadow]="a null shadow (select_account does nothing) on every request")
declare -A PORT PID
for v in "${VARIANTS[@]}"; do
    next_port p
    PORT[$v]=$p
done
for v in "${VARIANTS[@]}"; do
    p=${PORT[$v]}
    cat >"$T/$v.lua" <<EOT
return {
  listen = "127.0.0.1:$p", workers = 1, access_log = false, log_level = "warn",
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", api_key = "sk-static" },
  billing = { enabled = false },
  plugins = { dirs = { '$PLUGINS', '$T/plugins' }, watch = false, enabled = { 'router' },
    capture = { rate = ${RATE[$v]}, max_per_s = 100000, file = '$T/$v.jsonl', max_bytes = 1073741824 } },
}
EOT
    [ $CALLGRIND = 1 ] && continue
    start "$v" 1 "$BIN" serve -c "$T/$v.lua"
    PID[$v]=$LAST_PID
    wait_port "$p"
done
cat >"$T/wrk_plain.lua" <<'EOT'
wrk.method = "POST"
wrk.body = '{"model":"mock-gpt","max_tokens":8,"messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer tg-policy-bench-plain"
EOT
sed 's/tg-policy-bench-plain/tg-policy-bench-shadow/' "$T/wrk_plain.lua" >"$T/wrk_shadow.lua"
sed 's/tg-policy-bench-plain/tg-policy-bench-shadow10/' "$T/wrk_plain.lua" >"$T/wrk_shadow10.lua"
sed 's/tg-policy-bench-plain/tg-policy-bench-nullshadow/' "$T/wrk_plain.lua" >"$T/wrk_nullshadow.lua"
warm() { # VARIANT: the key cache and the account snapshot
    local v=$1 code=0
    for _ in $(seq 200); do
        code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORT[$v]}/v1/chat/completions" \
            -H "authorization: Bearer tg-policy-bench-${KEYV[$v]}" -d '{"model":"mock-gpt","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}')
        [ "$code" = 200 ] && break
        sleep 0.1
    done
    [ "$code" = 200 ] || { log "$v does not answer 200"; exit 1; }
}
if [ $CALLGRIND = 1 ]; then
    need valgrind callgrind_control
    CG_SECONDS=${TG_BENCH_CG_SECONDS:-4}
    CG_WARM=${TG_BENCH_CG_WARM:-3000}
    echo "| variant (1 worker, under callgrind, wrk -c8 $CG_SECONDS s after $CG_WARM requests of warm-up, less $CG_SECONDS s idle) | requests | instructions / request | vs off | idle instructions / s |"
    echo "|---|---:|---:|---:|---:|"
    base=0
    for v in "${VARIANTS[@]}"; do
        start "$v" "" valgrind --tool=callgrind --callgrind-out-file="$T/cg.$v" "$BIN" serve -c "$T/$v.lua"
        G=$LAST_PID
        wait_port "${PORT[$v]}" 60
        warm "$v"
        URL=http://127.0.0.1:${PORT[$v]}/v1/chat/completions
        # Warm until the JIT has settled: at least CG_WARM requests (bounded at 30 s).
        warmed=0
        for _ in $(seq 30); do
            wrk -t1 -c8 -d1s -s "$T/wrk_${KEYV[$v]}.lua" "$URL" >"$T/wrk.out"
            warmed=$((warmed + $(awk '/requests in/ {print $1}' "$T/wrk.out")))
            [ "$warmed" -ge "$CG_WARM" ] && break
        done
        callgrind_control -z $G >/dev/null
        wrk -t1 -c8 -d"${CG_SECONDS}s" -s "$T/wrk_${KEYV[$v]}.lua" "$URL" >"$T/wrk.out"
        callgrind_control -d $G >/dev/null
        # The same time again without requests: what the gateway's timers cost meanwhile
        # (under valgrind that is thousands of instructions per request when a loaded
        # machine lets only a few hundred requests through), taken off.
        sleep "$CG_SECONDS"
        callgrind_control -d $G >/dev/null
        sleep 1
        stop_pid $G
        n=$(awk '/requests in/ {print $1}' "$T/wrk.out")
        ir=$(grep -h '^summary:' "$T/cg.$v.1" | awk '{print $2}')
        idle=$(grep -h '^summary:' "$T/cg.$v.2" | awk '{print $2}')
        per=$(( (ir - idle) / n ))
        [ $base = 0 ] && base=$per
        awk -v l="${LABEL[$v]}" -v n="$n" -v p="$per" -v b="$base" -v i="$idle" -v t="$CG_SECONDS" \
            'BEGIN { printf "| %s | %d | %d | %+.1f%% | %.0f |\n", l, n, p, (p - b) / b * 100, i / t }'
        if [ -n "${TG_BENCH_CG_KEEP:-}" ]; then mkdir -p "$TG_BENCH_CG_KEEP" && cp "$T/cg.$v".[12] "$TG_BENCH_CG_KEEP/"; fi
        rm -f "$T/cg.$v"*
    done
    exit 0
fi
for v in "${VARIANTS[@]}"; do warm "$v"; done

FIXED=${TG_BENCH_RATE:-1000}
BODY='{"model":"mock-gpt","max_tokens":8,"messages":[{"role":"user","content":"hello"}]}'
[ "$FIXED" -gt 0 ] && build_loadgen
# PID: utime stime (clock ticks, all threads) and the ns its threads ran (schedstat:
# user + kernel, to the ns, where ticks are 1/HZ s)
ticks() { echo "$(awk '{print $14, $15}' "/proc/$1/stat") $(cat /proc/"$1"/task/*/schedstat | awk '{ s += $1 } END { printf "%.0f", s }')"; }
round() { # ROUND VARIANT: one wrk run; appends "round req/s cpu_us user_ticks sys_ticks requests" to T/VARIANT.r
    local r=$1 v=$2 u0 s0 n0 u1 s1 n1 n
    cut -d' ' -f1 /proc/loadavg >>"$T/load"
    read -r u0 s0 n0 < <(ticks "${PID[$v]}")
    taskset -c 0 wrk -t1 -c32 -d"${DUR}s" -s "$T/wrk_${KEYV[$v]}.lua" "http://127.0.0.1:${PORT[$v]}/v1/chat/completions" >"$T/wrk.out"
    read -r u1 s1 n1 < <(ticks "${PID[$v]}")
    cut -d' ' -f1 /proc/loadavg >>"$T/load"
    if grep -q "Non-2xx" "$T/wrk.out"; then log "$v: non-2xx answers"; cat "$T/wrk.out" >&2; exit 1; fi
    n=$(awk '/requests in/ {print $1}' "$T/wrk.out")
    awk -v r="$r" -v rps="$(awk '/Requests\/sec/ {print $2}' "$T/wrk.out")" -v c=$((n1 - n0)) -v u=$((u1 - u0)) \
        -v s=$((s1 - s0)) -v n="$n" 'BEGIN { printf "%d %s %.3f %d %d %d\n", r, rps, c / 1000 / n, u, s, n }' >>"$T/$v.r"
    [ "$FIXED" -gt 0 ] || return 0
    # The same requests at a fixed rate (open loop): every variant batches alike, so its
    # CPU per request is not moved by how many requests each loop turn finds.
    cut -d' ' -f1 /proc/loadavg >>"$T/load"
    read -r u0 s0 n0 < <(ticks "${PID[$v]}")
    taskset -c 0 "$LOADGEN" rate "127.0.0.1:${PORT[$v]}" --rate "$FIXED" --conns 16 --duration "$DUR" --warmup 0 \
        --body "$BODY" --auth "tg-policy-bench-${KEYV[$v]}" >"$T/lg.out" || { log "$v: errors at the fixed rate"; cat "$T/lg.out" >&2; exit 1; }
    read -r u1 s1 n1 < <(ticks "${PID[$v]}")
    cut -d' ' -f1 /proc/loadavg >>"$T/load"
    n=$(kv completed "$(cat "$T/lg.out")")
    awk -v r="$r" -v c=$((n1 - n0)) -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v n="$n" \
        'BEGIN { printf "%d %.3f %.3f %d %d %d\n", r, c / 1000 / n, c / 1000 / n, u, s, n }' >>"$T/$v.f"
}
LOAD_START=$(load_now)
for r in $(seq "$ROUNDS"); do
    k=$(( (r - 1) % ${#VARIANTS[@]} ))
    order=("${VARIANTS[@]:$k}" "${VARIANTS[@]:0:$k}")
    for v in "${order[@]}"; do round "$r" "$v"; done
    log "round $r of $ROUNDS done (load $(load_now))"
done
LOAD_END=$(load_now)
median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.4f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { cut -d' ' -f"$2" "$T/$1.${3:-r}" | median; } # VARIANT COLUMN [EXT]: the median of the rounds
# VARIANT COLUMN: the median over the rounds of VARIANT's value / off's in the same round
# VARIANT COLUMN [EXT]: the median over the rounds of VARIANT's value / off's in the same round
paired() { join <(cut -d' ' -f1,"$2" "$T/$1.${3:-r}" | sort) <(cut -d' ' -f1,"$2" "$T/off.${3:-r}" | sort) | awk '{ print $2 / $3 }' | median; }
echo "| variant (1 worker, wrk -c32, ${DUR} s × $ROUNDS interleaved rounds, medians) | req/s | vs off | gateway CPU µs/req (user + kernel) | vs off | kernel share of it | lines written |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for v in "${VARIANTS[@]}"; do
    lines=$( [ -f "$T/$v.jsonl" ] && wc -l <"$T/$v.jsonl" || echo 0)
    awk -v l="${LABEL[$v]}" -v r="$(col "$v" 2)" -v rr="$(paired "$v" 2)" -v c="$(col "$v" 3)" -v cr="$(paired "$v" 3)" \
        -v k="$(awk '{ u += $4; s += $5 } END { printf "%.3f", s / (u + s) }' "$T/$v.r")" -v n="$lines" \
        'BEGIN { printf "| %s | %.0f | %.3f | %.2f | %+.1f%% | %.0f%% | %d |\n", l, r, rr, c, (cr - 1) * 100, k * 100, n }'
done
if [ "$FIXED" -gt 0 ]; then
    echo
    echo "| variant (open loop at $FIXED req/s, 16 connections, ${DUR} s in each round after its wrk run) | gateway CPU µs/req (user + kernel) | vs off | kernel share of it |"
    echo "|---|---:|---:|---:|"
    for v in "${VARIANTS[@]}"; do
        awk -v l="${LABEL[$v]}" -v c="$(col "$v" 2 f)" -v cr="$(paired "$v" 2 f)" \
            -v k="$(awk '{ u += $4; s += $5 } END { printf "%.3f", s / (u + s) }' "$T/$v.f")" \
            'BEGIN { printf "| %s | %.2f | %+.1f%% | %.0f%% |\n", l, c, (cr - 1) * 100, k * 100 }'
    done
fi
echo
echo "vs off: the median over the rounds of the variant's figure divided by off's in the same round."
echo "CPU: the time the gateway's threads ran (/proc/PID/task/*/schedstat, user + kernel, in ns) per request;"
echo "kernel share: stime / (utime + stime) from /proc/PID/stat over all its rounds."
echo "Load average (1 min) at the start $LOAD_START, at the end $LOAD_END; before and after each of the" \
    "$(( ${#VARIANTS[@]} * ROUNDS * (FIXED > 0 ? 2 : 1) )) runs: $(sort -g "$T/load" | head -1)–$(sort -g "$T/load" | tail -1)" \
    "(median $(median <"$T/load" | awk '{ printf "%.1f", $1 }'))."
if [ -n "${TG_BENCH_RAW:-}" ]; then
    echo
    echo "| round | variant | req/s | CPU µs/req | utime ticks | stime ticks | requests |"
    echo "|---:|---|---:|---:|---:|---:|---:|"
    for v in "${VARIANTS[@]}"; do awk -v v="$v" '{ printf "| %d | %s | %.0f | %.2f | %d | %d | %d |\n", $1, v, $2, $3, $4, $5, $6 }' "$T/$v.r"; done | sort -t'|' -k2,2n
fi
