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
# process's utime + stime over its rounds, µs of gateway CPU per request. Prints one
# Markdown table. Everything listens on 127.0.0.1 and is stopped by PID on exit.
#
#   spec/bench/policy_bench.sh [SECONDS] [ROUNDS]     (defaults 4 and 5)
#   spec/bench/policy_bench.sh --callgrind             instructions per request instead
#
# TG_BENCH_VARIANTS="off shadow ..." runs only those variants (off first, the baseline);
# TG_BENCH_CG_SECONDS=N measures N seconds per variant under callgrind instead of 4 (more
# requests: less weight for a GC cycle or a trace compiled in the window);
# TG_BENCH_CG_KEEP=DIR keeps each variant's callgrind output there (DIR/cg.VARIANT.1)
# for callgrind_annotate --inclusive=yes.
#
# --callgrind: each variant in turn under valgrind --tool=callgrind (all threads, the
# capture's writer included), warmed with 1 s of wrk -c8, counters zeroed, 4 s of
# wrk -c8 (TG_BENCH_CG_SECONDS), dumped: instructions per request, which a loaded machine does not move.
set -euo pipefail
CALLGRIND=0
if [ "${1:-}" = --callgrind ]; then
    CALLGRIND=1
    shift
fi
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
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
cat >"$T/tool.lua" <<EOT
return { upstream = { url = "http://127.0.0.1:$P_MOCK/v1" } }
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
  },
  accounts = {
$(for i in 1 2 3 4; do echo "    { name = 'acc$i', provider = 'openai', base_url = 'http://127.0.0.1:$P_MOCK/v1', credential = 'sk-pb-$i', concurrency = 1000, groups = { 'plain', 'shadowed', 'shadowed10' } },"; done)
  },
  keys = {
    { name = 'kp', tenant = 'bench', group = 'plain', key = 'tg-policy-bench-plain' },
    { name = 'ks', tenant = 'bench', group = 'shadowed', key = 'tg-policy-bench-shadow' },
    { name = 'ks10', tenant = 'bench', group = 'shadowed10', key = 'tg-policy-bench-shadow10' },
  },
  prices = { { model = 'mock-gpt', input = '0.15', output = '0.60' } },
}
EOT
"$BIN" apply -c "$T/tool.lua" "$T/state.lua" >/dev/null

VARIANTS=(off cap1 cap100 shadow cap1shadow shadow10 cap1shadow10)
if [ -n "${TG_BENCH_VARIANTS:-}" ]; then read -r -a VARIANTS <<<"$TG_BENCH_VARIANTS"; fi
declare -A RATE=([off]=0 [cap1]=0.01 [cap100]=1 [shadow]=0 [cap1shadow]=0.01 [shadow10]=0 [cap1shadow10]=0.01)
declare -A KEYV=([off]=plain [cap1]=plain [cap100]=plain [shadow]=shadow [cap1shadow]=shadow [shadow10]=shadow10
    [cap1shadow10]=shadow10)
declare -A LABEL=([off]="off (router, no capture, no shadow)" [cap1]="capture 1%" [cap100]="capture 100%"
    [shadow]="one shadow plugin (router, top_k 1) on every request" [cap1shadow]="capture 1% + that shadow"
    [shadow10]="that shadow on a 10% sample" [cap1shadow10]="capture 1% + that shadow on a 10% sample")
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
  plugins = { dirs = { '$ROOT/plugins' }, watch = false, enabled = { 'router' },
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
    echo "| variant (1 worker, under callgrind, wrk -c8 $CG_SECONDS s after 1 s of warm-up) | requests | instructions / request | vs off |"
    echo "|---|---:|---:|---:|"
    base=0
    for v in "${VARIANTS[@]}"; do
        start "$v" "" valgrind --tool=callgrind --callgrind-out-file="$T/cg.$v" "$BIN" serve -c "$T/$v.lua"
        G=$LAST_PID
        wait_port "${PORT[$v]}" 60
        warm "$v"
        URL=http://127.0.0.1:${PORT[$v]}/v1/chat/completions
        wrk -t1 -c8 -d1s -s "$T/wrk_${KEYV[$v]}.lua" "$URL" >/dev/null
        callgrind_control -z $G >/dev/null
        wrk -t1 -c8 -d"${CG_SECONDS}s" -s "$T/wrk_${KEYV[$v]}.lua" "$URL" >"$T/wrk.out"
        callgrind_control -d $G >/dev/null
        sleep 1
        stop_pid $G
        n=$(awk '/requests in/ {print $1}' "$T/wrk.out")
        ir=$(grep -h '^summary:' "$T"/cg.$v.1 | awk '{print $2}')
        per=$((ir / n))
        [ $base = 0 ] && base=$per
        awk -v l="${LABEL[$v]}" -v n="$n" -v p="$per" -v b="$base" 'BEGIN { printf "| %s | %d | %d | %+.1f%% |\n", l, n, p, (p - b) / b * 100 }'
        if [ -n "${TG_BENCH_CG_KEEP:-}" ]; then mkdir -p "$TG_BENCH_CG_KEEP" && cp "$T"/cg.$v.1 "$TG_BENCH_CG_KEEP/"; fi
        rm -f "$T"/cg.$v*
    done
    exit 0
fi
for v in "${VARIANTS[@]}"; do warm "$v"; done

TICK_US=$((1000000 / HZ))
round() { # VARIANT: one wrk run; appends "req/s cpu_us_per_req" to T/VARIANT.r
    local v=$1 t0 t1 n
    t0=$(cpu_ticks "${PID[$v]}")
    taskset -c 0 wrk -t1 -c32 -d"${DUR}s" -s "$T/wrk_${KEYV[$v]}.lua" "http://127.0.0.1:${PORT[$v]}/v1/chat/completions" >"$T/wrk.out"
    t1=$(cpu_ticks "${PID[$v]}")
    if grep -q "Non-2xx" "$T/wrk.out"; then log "$v: non-2xx answers"; cat "$T/wrk.out" >&2; exit 1; fi
    n=$(awk '/requests in/ {print $1}' "$T/wrk.out")
    echo "$(awk '/Requests\/sec/ {print $2}' "$T/wrk.out") $(awk -v c=$((t1 - t0)) -v n="$n" -v t="$TICK_US" 'BEGIN { printf "%.2f", c * t / n }')" >>"$T/$v.r"
}
for r in $(seq "$ROUNDS"); do
    k=$(( (r - 1) % ${#VARIANTS[@]} ))
    order=("${VARIANTS[@]:$k}" "${VARIANTS[@]:0:$k}")
    for v in "${order[@]}"; do round "$v"; done
    log "round $r of $ROUNDS done (load $(load_now))"
done
median() { sort -n | awk '{ v[NR] = $1 } END { printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "| variant (1 worker, wrk -c32, ${DUR} s x $ROUNDS interleaved rounds, medians) | req/s | vs off | gateway CPU µs/req | vs off | lines written |"
echo "|---|---:|---:|---:|---:|---:|"
off_r=$(cut -d' ' -f1 "$T/off.r" | median)
off_c=$(cut -d' ' -f2 "$T/off.r" | median)
for v in "${VARIANTS[@]}"; do
    rr=$(cut -d' ' -f1 "$T/$v.r" | median)
    cc=$(cut -d' ' -f2 "$T/$v.r" | median)
    lines=$( [ -f "$T/$v.jsonl" ] && wc -l <"$T/$v.jsonl" || echo 0)
    awk -v l="${LABEL[$v]}" -v r="$rr" -v c="$cc" -v r0="$off_r" -v c0="$off_c" -v n="$lines" \
        'BEGIN { printf "| %s | %.0f | %.3f | %.1f | %+.1f%% | %d |\n", l, r, r / r0, c, (c - c0) / c0 * 100, n }'
done
