#!/usr/bin/env bash
# The pipeline benchmark (issue 17): what the whole gateway — auth, limits, money,
# routing, plugins, settlement — costs next to a plain rate limiter, in one run on this
# box, side by side. Targets (all behind the same mock upstream):
#
#   direct    the mock upstream itself (`tollgate mock-upstream`, one thread)
#   nginx     nginx proxy_pass with an upstream keepalive pool
#   limiter   nginx + Lua + Redis rate limiter (spec/bench/pipeline_limiter.{conf,lua},
#             pipeline_limiter_redis.lua): key lookup in an LRU cache, one EVALSHA
#             (token bucket + ZSET concurrency lease), the lease released from a timer
#   static    tollgate with a config-file key, no Postgres, no Redis
#   full      tollgate with a tenant key in a group with one account (concurrency 1000),
#             rpm/tpm/concurrency limits on the key and its tenant that never refuse,
#             billing on, the five shipped plugins enabled (model-map, router,
#             retry-budget, fail-policy, pricing), Postgres and Redis
# With --before BIN, "static" and "full" run a second time with that binary (its own
# database and Redis), so that before and after are measured in the same run.
#
# Placement (2 cores): every server (mock, nginx, tollgate, Redis, Postgres) on
# TG_BENCH_SERVER_CPU (1), the load generator alone on TG_BENCH_LOAD_CPU (0); all at
# nice -19 in a session of their own (spec/bench/lib.sh, bench_session). Measured, in
# interleaved rounds (each round visits every target; medians of the rounds):
#   1. req/s: wrk -t1 -c16, the small non-stream chat request of wrk_pipeline.lua
#      (max_tokens 16); per target and process (gateway, mock, Redis, all of Postgres)
#      CPU µs per request from /proc/<pid>/stat; Redis script calls (EVALSHA + EVAL +
#      FCALL) and other commands per request (INFO commandstats deltas);
#   2. latency at a fixed 2,000 req/s (open loop, tg_loadgen rate, 64 connections):
#      p50/p99 and what each adds over direct;
#   3. streamed time to first byte (tg_loadgen ttfb, 16 concurrent, mock: 20 chunks,
#      ttft_ms=50, interval_ms=5): head and first token, added over direct; with the
#      arrivals spread over a stream's length (3) and in bursts of 16 (3b);
#   4. for each full gateway, after it has stopped: Postgres rows written per request
#      (pg_stat_user_tables n_tup_ins and n_tup_upd over the whole run, per table) and
#      `tollgate ledger verify`, which must be clean: the script exits 1 otherwise.
# --phases measures only where a streamed request's time before its upstream call goes:
# the static and full gateways (with --before, the parent's too), and the full one
# without its plugins, each with tracing on (sample_ratio 1, to an OTLP receiver on the
# load core that stores the POSTs), under 3's spread streams; pipeline_phases.mjs reads
# each request's spans (core/README.md, Traces): first byte → account selection (parse,
# auth, the sticky lookup), selection → admission sent (the router hook), the admission
# (the Redis script's round trip), and its answer → the upstream call.
# --profile adds: callgrind instruction counts per request of the full gateway
# (inclusive and self, top functions), and perf (cpu-clock samples on the server core
# under wrk) turned into CPU µs per request per process and symbol (gateway, Redis,
# Postgres).
#
# Usage: spec/bench/pipeline_bench.sh [--quick] [--profile] [--phases] [--keep] [--no-install]
#                                     [--before BIN [--before-label TEXT]]
#   --quick       one short round of everything (checks the script; figures are rough)
#   --profile     the profiles described above (about 2 minutes more)
#   --no-install  do not run spec/install-deps.sh and the baseline's apt-get step
# Environment: TG_BENCH_BIN (build/tollgate; built when missing), TG_BENCH_LABEL
#   (what it was built from, default the checkout's short HEAD), TG_BENCH_ROUNDS (3),
#   TG_BENCH_WRK_SECONDS (4), TG_BENCH_RATE (2000), TG_BENCH_LOAD_CPU (0),
#   TG_BENCH_SERVER_CPU (1), TG_BENCH_PG_NICE (Postgres's nice; default -19 as the rest).
# One command on a fresh Debian machine: it installs what it needs (spec/install-deps.sh,
# then apt-get for the baseline's nginx Lua packages), builds tollgate if missing, starts
# everything on 127.0.0.1 or unix sockets in a temporary directory and stops it by PID.
# Prints Markdown (spec/bench/RESULTS.md, "Pipeline (issue 17)", is written from it).
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"

INSTALL=1
for a in "$@"; do [ "$a" = --no-install ] && INSTALL=0; done
# Before the session (bench_session re-runs the script): installing is not measured.
if [ $INSTALL = 1 ] && [ -z "${TG_BENCH_IN_SESSION:-}" ]; then
    "$ROOT/spec/install-deps.sh"
    LUA_PKGS=(libnginx-mod-http-lua lua-resty-core lua-resty-lrucache lua-nginx-redis valgrind linux-perf)
    missing=()
    for p in "${LUA_PKGS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        SUDO=(); [ "$(id -u)" = 0 ] || SUDO=(sudo)
        "${SUDO[@]}" apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi
bench_session "$@"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
LABEL=${TG_BENCH_LABEL:-$(git_head)}
ROUNDS=${TG_BENCH_ROUNDS:-3}
SLICE=${TG_BENCH_WRK_SECONDS:-4}
RATE=${TG_BENCH_RATE:-2000}
LOAD_CPU=${TG_BENCH_LOAD_CPU:-0}
SRV_CPU=${TG_BENCH_SERVER_CPU:-1}
RATE_SLICE=3
TTFB_N=150
WARM=2
CONNS=16
KEY=tg-pipeline-bench-key-0000000000000000000000
BEFORE="" BEFORE_LABEL=before PROFILE=0 PHASES=0
while [ $# -gt 0 ]; do
    case $1 in
    --quick) ROUNDS=1 SLICE=2 RATE_SLICE=2 TTFB_N=48 WARM=1 ;;
    --profile) PROFILE=1 ;;
    --keep) KEEP=1 ;;
    --no-install) ;;
    --before) BEFORE=$2; shift ;;
    --before-label) BEFORE_LABEL=$2; shift ;;
    --phases) PHASES=1 ;;
    *) echo "usage: $0 [--quick] [--profile] [--phases] [--keep] [--no-install] [--before BIN [--before-label TEXT]]" >&2; exit 2 ;;
    esac
    shift
done

need wrk nginx cc curl taskset psql redis-server redis-cli
[ $PROFILE = 0 ] || need valgrind callgrind_annotate callgrind_control perf
if [ ! -x "$BIN" ]; then
    log "$BIN missing, building"
    cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null && cmake --build "$ROOT/build" -j2 >/dev/null
fi
need_bin
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || { log "--before $BEFORE is not an executable"; exit 2; }

bench_workdir tg-pipeline-bench
snapshot_bin gw # a rebuild of build/ during the run cannot change what is measured
BIN_AFTER_DESC=$(bin_desc)
INST=(now)
declare -A IBIN=([now]=$BIN) ILABEL=([now]=$LABEL)
if [ -n "$BEFORE" ]; then
    cp "$BEFORE" "$T/gw-before"
    INST+=(before)
    IBIN[before]=$T/gw-before ILABEL[before]=$BEFORE_LABEL
fi
build_loadgen
BENCH_STARTED=$(date +%s)
LOAD_SAMPLES=$T/loads.txt
sample_load() { load_now >>"$LOAD_SAMPLES"; }
sample_load

# ---- services -----------------------------------------------------------------------------
bench_services # private Postgres and Redis in $T/pg, $T/redis (unix sockets)
pin_services "$SRV_CPU"
# TG_BENCH_PG_NICE=N (an experiment, not the measurement): Postgres's autogroup at nice N
# instead of -19, to see what the latency figures owe to Postgres's batches sharing the
# server core at the gateway's priority.
PG_NICE_NOTE=""
if [ -n "${TG_BENCH_PG_NICE:-}" ]; then
    echo "$TG_BENCH_PG_NICE" >"/proc/$PG_PM/autogroup"
    PG_NICE_NOTE="; **Postgres at autogroup nice $TG_BENCH_PG_NICE** (TG_BENCH_PG_NICE)"
fi
declare -A RSOCK RPID
RSOCK[now]=$REDIS_SOCK RPID[now]=$PID_REDIS
more_redis() { # NAME: one more private Redis in $T/redis-NAME, pinned like the first
    tg_redis_start "$T/redis-$1" >/dev/null
    RSOCK[$1]=$T/redis-$1/redis.sock RPID[$1]=$(cat "$T/redis-$1/redis.pid")
    taskset -p -c "$SRV_CPU" "${RPID[$1]}" >/dev/null
    echo -19 >"/proc/${RPID[$1]}/autogroup" 2>/dev/null || true
}
more_redis limiter
[ -z "$BEFORE" ] || more_redis before
bench_on_exit() {
    tg_redis_stop "$T/redis-limiter" 2>/dev/null
    [ -z "$BEFORE" ] || tg_redis_stop "$T/redis-before" 2>/dev/null
}
PG_ADMIN=$(sed -E 's/dbname=[^ ]*/dbname=postgres/' <<<"$TOLLGATE_PG")
PG_BASE=$TOLLGATE_PG
# The gateways read TOLLGATE_PG / TOLLGATE_REDIS before their config file: each gets its own.
unset TOLLGATE_PG TOLLGATE_REDIS
export TOLLGATE_SECRET_KEY
TOLLGATE_SECRET_KEY=$(printf 'cd%.0s' $(seq 32))

start_mock "$SRV_CPU"
BODY='{"model":"mock-gpt","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}'
STREAM_BODY='{"model":"mock-gpt","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"[mock ttft_ms=50 chunks=20 interval_ms=5] hello"}]}'

# ---- the full gateways: database, state, config --------------------------------------------
declare -A PGCONN PORT GWPID REDISOF CFG
BIGL=1000000000 # far above what this box can send: nothing is ever refused
setup_full() { # INSTANCE
    local i=$1 db=tg_pipeline_$1 off
    psql -X -q -d "$PG_ADMIN" -c "CREATE DATABASE $db" >/dev/null
    PGCONN[full-$i]=$(sed -E "s/dbname=[^ ]*/dbname=$db/" <<<"$PG_BASE")
    echo "return { upstream = { url = \"http://127.0.0.1:$P_MOCK/v1\" } }" >"$T/tool-$i.lua"
    TOLLGATE_PG=${PGCONN[full-$i]} "${IBIN[$i]}" migrate -c "$T/tool-$i.lua" >/dev/null
    off=$((1000000 + RANDOM * 32768 + RANDOM)) # ids (and so Redis keys) of this run only
    for s in $(psql -X -A -t -d "${PGCONN[full-$i]}" -c "SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = 'public'"); do
        psql -X -q -d "${PGCONN[full-$i]}" -c "ALTER SEQUENCE \"$s\" RESTART WITH $off" >/dev/null
    done
    pipeline_state_lua $P_MOCK $KEY $BIGL >"$T/state-$i.lua"
    TOLLGATE_PG=${PGCONN[full-$i]} TOLLGATE_REDIS="unix://${RSOCK[$i]}" \
        "${IBIN[$i]}" apply -c "$T/tool-$i.lua" "$T/state-$i.lua" >/dev/null
    full_config "full-$i" "$i" "$PIPELINE_PLUGINS_LUA"
}
trace_lua() { # TARGET: --phases: its tracing table
    [ $PHASES = 0 ] || echo "tracing = { endpoint = 'http://127.0.0.1:$P_OTLP/v1/traces', sample_ratio = ${TG_BENCH_TRACE_RATIO:-1}, batch_interval_ms = 200, service_name = '$1' },"
}
full_config() { # TARGET INSTANCE PLUGINS: a full gateway's config, its own port, the instance's database and Redis
    local t=$1 i=$2
    next_port "PORT[$t]"
    mkdir -p "$T/spool-${t#full-}"
    CFG[$t]=$T/$t.lua
    pipeline_gw_lua "${PORT[$t]}" "${PGCONN[full-$i]}" "${RSOCK[$i]}" $P_MOCK "$T/spool-${t#full-}" "$3" "$(trace_lua "$t")" >"${CFG[$t]}"
    REDISOF[$t]=$i
}
setup_static() { # INSTANCE
    local i=$1
    next_port "PORT[static-$i]"
    CFG[static-$i]=$T/static-$i.lua
    cat >"${CFG[static-$i]}" <<EOF
return {
  listen = "127.0.0.1:${PORT[static-$i]}", workers = 1, keys = { "$KEY" }, access_log = false, log_level = "warn",
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", api_key = "sk-bench" }, $(trace_lua "static-$i")
}
EOF
}
start_gw() { # TARGET INSTANCE [LOG NAME]
    start "${3:-$1}" "$SRV_CPU" "${IBIN[$2]}" serve -c "${CFG[$1]}"
    GWPID[$1]=$LAST_PID
}

# ---- nginx (plain) and the limiter ---------------------------------------------------------
start_nginx() { # NAME CONF: sets GWPID[NAME] to the worker's pid
    local p w=""
    start "$1" "$SRV_CPU" nginx -p "$T/$1" -c "$2" -e "$T/$1/error.log"
    p=$LAST_PID
    for _ in $(seq 100); do w=$(pgrep -P "$p" | head -1 || true); [ -n "$w" ] && break; sleep 0.05; done
    [ -n "$w" ] || { log "$1: no worker process"; cat "$T/$1/error.log" >&2; exit 1; }
    GWPID[$1]=$w
}
if [ $PHASES = 0 ]; then
    next_port "PORT[nginx]"
    mkdir -p "$T/nginx/tmp"
    sed -e "s#@DIR@#$T/nginx#g" -e "s#@MOCK_PORT@#$P_MOCK#g" -e "s#@PORT@#${PORT[nginx]}#g" \
        -e '/load_module/d' -e '/lua_package_path/d' -e '/init_by_lua_block/d' -e '/_by_lua_block/d' \
        "$BENCH/pipeline_limiter.conf" >"$T/nginx/nginx.conf"
    start_nginx nginx "$T/nginx/nginx.conf"

    next_port "PORT[limiter]"
    mkdir -p "$T/limiter/tmp"
    LIM_SHA=$(redis-cli -s "${RSOCK[limiter]}" SCRIPT LOAD "$(cat "$BENCH/pipeline_limiter_redis.lua")")
    redis-cli -s "${RSOCK[limiter]}" HSET "lim:key:$KEY" tenant 1 rate 1000000 burst $BIGL conc 100000 >/dev/null
    sed -e "s#@DIR@#$T/limiter#g" -e "s#@MOCK_PORT@#$P_MOCK#g" -e "s#@PORT@#${PORT[limiter]}#g" \
        -e "s#@BENCH@#$BENCH#g" -e "s#@REDIS_SOCK@#${RSOCK[limiter]}#g" -e "s#@SHA@#$LIM_SHA#g" \
        "$BENCH/pipeline_limiter.conf" >"$T/limiter/nginx.conf"
    start_nginx limiter "$T/limiter/nginx.conf"
    REDISOF[limiter]=limiter
    TARGETS=(direct nginx limiter)
else
    # An OTLP receiver on the load core: each POST's body kept for the spans' analysis.
    next_port P_OTLP
    mkdir -p "$T/otlp"
    start otlp "$LOAD_CPU" node -e "let n = 0; require('http').createServer((q, s) => { const b = [];
      q.on('data', (c) => b.push(c)); q.on('end', () => { require('fs').writeFileSync('$T/otlp/' + (n++) + '.json', Buffer.concat(b));
      s.writeHead(200, { 'content-type': 'application/json' }); s.end('{}'); }); }).listen($P_OTLP, '127.0.0.1')"
    wait_port "$P_OTLP"
    TARGETS=(direct)
fi
PORT[direct]=$P_MOCK GWPID[direct]=""
for i in "${INST[@]}"; do
    setup_static "$i"; setup_full "$i"
    start_gw "static-$i" "$i"; start_gw "full-$i" "$i"
    TARGETS+=("static-$i" "full-$i")
done
if [ $PHASES = 1 ]; then # the full gateway once more, without its plugins (same database and Redis)
    full_config bare-now now "{ enabled = {} }"
    start_gw bare-now now
    TARGETS+=(bare-now)
fi
for t in "${TARGETS[@]}"; do wait_port "${PORT[$t]}" 15; done

# Every target answers the request with the mock's completion before anything is measured.
for t in "${TARGETS[@]}"; do
    out=""
    for _ in $(seq 100); do # a full gateway answers 503 until its account pool is loaded
        out=$(curl -sS -m 5 "http://127.0.0.1:${PORT[$t]}/v1/chat/completions" -H "Authorization: Bearer $KEY" \
            -H 'Content-Type: application/json' -d "$BODY" || true)
        case $out in *'"completion_tokens"'*) break ;; esac
        sleep 0.1
    done
    case $out in *'"completion_tokens"'*) ;; *) log "$t answered: $out"; exit 1 ;; esac
done

name_of() {
    case $1 in
    direct) echo "upstream directly" ;;
    nginx) echo "nginx proxy_pass, keepalive pool" ;;
    limiter) echo "nginx + Lua + Redis rate limiter" ;;
    static-*) echo "tollgate static key, no Postgres/Redis (${ILABEL[${1#static-}]})" ;;
    full-*) echo "tollgate full pipeline (${ILABEL[${1#full-}]})" ;;
    bare-*) echo "tollgate full pipeline without its plugins (${ILABEL[${1#bare-}]})" ;;
    esac
}

say "## Run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say ""
say "- $(bench_machine)"
say "- tollgate ${ILABEL[now]}: $BIN_AFTER_DESC$( [ -z "$BEFORE" ] || echo "; ${ILABEL[before]}: binary $BEFORE, sha256 $(sha256sum "$T/gw-before" | cut -c1-12)")"
say "- nginx $(nginx -v 2>&1 | sed 's/.*nginx\///'), $(redis-server --version | awk '{print $1, $3}'), $(psql --version | awk '{print "PostgreSQL", $3}') (as spec/run.sh runs it: fsync off), wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}')"
say "- placement: every server (mock, nginx, tollgate with workers = 1, Redis, Postgres) on CPU $SRV_CPU; the load generator on CPU $LOAD_CPU; nice -19 ($AUTOGROUP)$PG_NICE_NOTE"
say "- request: \`$BODY\`; full pipeline: limits on key and tenant (rpm = rpm_burst = $BIGL, tpm 2e9, concurrency 100000), account concurrency 1000, billing on, plugins model-map, router, retry-budget, fail-policy, pricing"
say ""

# ---- measuring helpers ----------------------------------------------------------------------
pg_snap() { # all of Postgres, the postmaster and every child: "pid ticks" lines
    local p
    for p in "$PG_PM" $(pgrep -P "$PG_PM" || true); do
        [ -r "/proc/$p/stat" ] && echo "$p $(cpu_ticks "$p" 2>/dev/null || echo 0)"
    done
    true
}
pg_delta() { # BEFORE AFTER (pg_snap outputs): ticks used in between by the processes alive at the end
    awk 'NR == FNR { b[$1] = $2; next } { d += $2 - ($1 in b ? b[$1] : 0) } END { print d + 0 }' <(echo "$1") <(echo "$2")
}
redis_stats() { # REDIS-INSTANCE: "<script calls> <all calls>"
    redis-cli -s "${RSOCK[$1]}" INFO commandstats | tr -d '\r' | awk -F'[:=,]' '
        /^cmdstat_/ { all += $3; if ($1 ~ /^cmdstat_(evalsha|eval|evalsha_ro|eval_ro|fcall|fcall_ro)$/) s += $3 }
        END { print s + 0, all + 0 }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
us_per() { awk -v t="$1" -v n="$2" -v hz="$HZ" 'BEGIN { if (n == 0) print ""; else printf "%.1f", t / hz * 1e6 / n }'; }
diff_ms() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "") print "-"; else printf "%+.3f", (a - b) / 1000 }'; }
spooled() { # TARGET: settlements the full gateway has spooled so far (its log's warnings)
    [[ $1 == full-* ]] || { echo 0; return; }
    { cat "$T/$1.err" "$T/$1-r.err" "$T/cg-${1#full-}.err" 2>/dev/null || true; } | sed -n 's/.* \([0-9][0-9]*\) settlement(s) spooled.*/\1/p'  | awk '{ s += $1 } END { print s + 0 }'
}
wait_spool() { # INSTANCE: until the full gateway's spool is replayed (at most 90 s)
    for _ in $(seq 450); do
        [ -z "$(find "$T/spool-$1" -type f -size +0 2>/dev/null)" ] && return 0
        sleep 0.2
    done
    log "the spool of full-$1 is not empty after 90 s"
}
declare -A SERVED
served_add() { # TARGET: adds the full gateway's chat 200s so far to SERVED (before it stops)
    local v
    v=$(metric "${PORT[$1]}" 'tollgate_requests_total{route="chat_completions",status="200"}' || true)
    SERVED[$1]=$(( ${SERVED[$1]:-0} + ${v:-0} ))
}
alive() {
    local t
    for t in "${TARGETS[@]}" mock; do
        local p=${GWPID[$t]:-}; [ "$t" = mock ] && p=$PID_MOCK
        [ -z "$p" ] || kill -0 "$p" 2>/dev/null || { log "$t (pid $p) is gone $1: $(tail -3 "$T/$t.err" 2>/dev/null)"; exit 1; }
    done
}

# ---- --phases: where the time before the upstream call goes --------------------------------
if [ $PHASES = 1 ]; then
    for round in $(seq "$ROUNDS"); do
        for t in "${TARGETS[@]}"; do
            out=$("${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" ttfb "127.0.0.1:${PORT[$t]}" --auth "$KEY" --conns 16 \
                --requests $TTFB_N --spread 150 --body "$STREAM_BODY" --timeout 60 \
                --samples "$T/ttfb-spread-$t.txt" 2>>"$T/loadgen.err" || true)
            log "phases $t: head $(kv head_p50_us "$out")us first token $(kv body_p50_us "$out")us (load $(load_now))"
        done
        sample_load
    done
    alive "after the stream runs"
    sleep 1 # the exporters' last batches (every 200 ms)
    say "### Where a streamed request's time before its upstream call goes ($ROUNDS × $TTFB_N streams per target, 16 open, arrivals spread over 150 ms, interleaved; tracing on, sample_ratio 1)"
    say ""
    say "| target | streams traced | head added p50 ms | request's first byte → account selection | selection → admission sent | admission (Redis script, answer read) | answer → upstream call | first byte → upstream call p50 | p90 |"
    say "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for t in "${TARGETS[@]}"; do
        [ "$t" = direct ] && continue
        row=$(node "$BENCH/pipeline_phases.mjs" "$T/otlp" "$t")
        read -r n c0 c1 c2 c3 c4 c5 <<<"$row"
        say "| $(name_of "$t") | $n | $(diff_ms "$(pct "$T/ttfb-spread-$t.txt" 1 50)" "$(pct "$T/ttfb-spread-direct.txt" 1 50)") | $c0 | $c1 | $c2 | $c3 | $c4 | $c5 |"
    done
    say ""
    say "Milliseconds, p50 of each phase over the traced streams (the phases' p50s need not add up to the total's; a phase a target does not have is -, its time in the next one); head added = time to the response head over the mock's own, from the load generator. From the spans of core/README.md (Traces): the server span starts at the request's first byte, \`select account\` at the sticky lookup before the router hook, \`admission\` when its script is handed to the Redis client (written before the loop next polls) and ends when its answer is read, the client span when the upstream request starts."
    say ""
    sample_load
    say "Load average (1 min) sampled before and after each round: $(awk '{ printf "%s%s", sep, $1; sep = ", " }' "$LOAD_SAMPLES"); run took $(( $(date +%s) - BENCH_STARTED )) s."
    exit 0
fi

# ---- 1. req/s, CPU, Redis commands ------------------------------------------------------------
run_wrk() { # TARGET ROUND: one line to $T/wrk-TARGET.rows
    local t=$1 f=$T/wrk-$1-$2.txt r=${REDISOF[$1]:-} g0=0 g1=0 m0 m1 p0=0 p1=0 r0=0 r1=0 s0="0 0" s1="0 0"
    [ -z "${GWPID[$t]}" ] || g0=$(cpu_ticks "${GWPID[$t]}")
    m0=$(cpu_ticks "$PID_MOCK")
    [ -z "$r" ] || { r0=$(cpu_ticks "${RPID[$r]}"); s0=$(redis_stats "$r"); }
    [[ $t != full-* ]] || p0=$(pg_snap)
    local sp0 sp1
    sp0=$(spooled "$t")
    TG_BENCH_KEY=$KEY "${NICE[@]}" taskset -c "$LOAD_CPU" wrk -t1 -c$CONNS -d${SLICE}s --latency \
        -s "$BENCH/wrk_pipeline.lua" "http://127.0.0.1:${PORT[$t]}/v1/chat/completions" >"$f"
    [ -z "${GWPID[$t]}" ] || g1=$(cpu_ticks "${GWPID[$t]}")
    m1=$(cpu_ticks "$PID_MOCK")
    [ -z "$r" ] || { r1=$(cpu_ticks "${RPID[$r]}"); s1=$(redis_stats "$r"); }
    [[ $t != full-* ]] || p1=$(pg_snap)
    sp1=$(spooled "$t")
    wrk_result "$f"
    [ "$WRK_ERRS" = 0 ] || { log "$t: $WRK_ERRS errors or non-2xx answers"; cat "$f" >&2; exit 1; }
    read -r sa0 aa0 <<<"$s0"; read -r sa1 aa1 <<<"$s1"
    # rps p50 p99 requests gw_ticks mock_ticks redis_ticks pg_ticks scripts other_cmds (less our INFO) spooled
    echo "$WRK_RPS $WRK_P50 $WRK_P99 $WRK_REQS $((g1 - g0)) $((m1 - m0)) $((r1 - r0)) $(pg_delta "$p0" "$p1") $((sa1 - sa0)) $((aa1 - aa0 - sa1 + sa0 - 1)) $((sp1 - sp0))" >>"$T/wrk-$t.rows"
    log "wrk $t round $2: $WRK_RPS req/s, $((sp1 - sp0)) settlements spooled (load $(load_now))"
    [[ $t != full-* ]] || wait_spool "${t#full-}" # its replay must not run in the next target's window
}
for t in "${TARGETS[@]}"; do # warm-up: connections, pools, caches, the JIT
    TG_BENCH_KEY=$KEY "${NICE[@]}" taskset -c "$LOAD_CPU" wrk -t1 -c$CONNS -d${WARM}s \
        -s "$BENCH/wrk_pipeline.lua" "http://127.0.0.1:${PORT[$t]}/v1/chat/completions" >/dev/null
done
for round in $(seq "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do run_wrk "$t" "$round"; done
    sample_load
done
alive "after the wrk runs"
col() { awk -v c="$2" '{ print $c }' "$T/wrk-$1.rows" | median; }
# CPU µs per request of column C, median over the rounds of each round's own figure.
col_per() { awk -v c="$2" -v hz="$HZ" '{ printf "%.3f\n", $c / hz * 1e6 / $4 }' "$T/wrk-$1.rows" | median; }
col_ratio() { awk -v c="$2" '{ printf "%.4f\n", $c / $4 }' "$T/wrk-$1.rows" | median; }
declare -A RPS
for t in "${TARGETS[@]}"; do RPS[$t]=$(col "$t" 1); done

say "### 1. Throughput (wrk -t1 -c$CONNS, $ROUNDS × $SLICE s per target, interleaved; medians of the rounds)"
say ""
say "| target | req/s | vs nginx | vs limiter | p50 ms | p99 ms | gateway CPU µs/req | mock µs/req | Redis µs/req | Postgres µs/req | Redis scripts/req | Redis commands/req | settlements spooled/req |"
say "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for t in "${TARGETS[@]}"; do
    gw=-; [ -z "${GWPID[$t]}" ] || gw=$(printf %.1f "$(col_per "$t" 5)")
    rd=- sc=- oc=-; [ -z "${REDISOF[$t]:-}" ] || { rd=$(printf %.1f "$(col_per "$t" 7)"); sc=$(printf %.2f "$(col_ratio "$t" 9)"); oc=$(printf %.2f "$(col_ratio "$t" 10)"); }
    pg=- sp=-; [[ $t != full-* ]] || { pg=$(printf %.1f "$(col_per "$t" 8)"); sp=$(printf %.2f "$(col_ratio "$t" 11)"); }
    say "| $(name_of "$t") | ${RPS[$t]} | $(ratio "${RPS[$t]}" "${RPS[nginx]}" 2) | $(ratio "${RPS[$t]}" "${RPS[limiter]}" 2) | $(ms "$(col "$t" 2)") | $(ms "$(col "$t" 3)") | $gw | $(printf %.1f "$(col_per "$t" 6)") | $rd | $pg | $sc | $oc | $sp |"
done
say ""
say "CPU from utime + stime in /proc/<pid>/stat over each wrk run (clock tick $((1000000 / HZ)) µs), per request, median of the rounds' figures; gateway = the tollgate process (all threads) or the nginx worker; Postgres = the postmaster and all its children. Redis from INFO commandstats deltas: scripts = EVALSHA + EVAL + FCALL calls; commands = every other command, the commands a script calls inside it included (Redis counts those too); background work (heartbeats, reconciler) included. Spooled: settlements the gateway's billing wrote to its disk spool because its queue to Postgres was full (replayed later; the Postgres work they need is then not in that run's CPU or rows)."
say ""

# ---- 2. latency at a fixed rate ---------------------------------------------------------------
run_rate() { # TARGET
    local t=$1 out
    out=$("${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" rate "127.0.0.1:${PORT[$t]}" --auth "$KEY" --body "$BODY" --rate "$RATE" \
        --conns 64 --duration $RATE_SLICE --warmup 0.5 --samples "$T/rate-$t.txt" 2>>"$T/loadgen.err" || true)
    echo "$t $out" >>"$T/rate.txt"
    echo "$(kv sent "$out") $(kv errors "$out") $(kv non2xx "$out")" >>"$T/rate-$t.rows"
    log "rate $t: p50 $(kv svc_p50_us "$out")us p99 $(kv svc_p99_us "$out")us (load $(load_now))"
}
for round in $(seq "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do run_rate "$t"; done
    sample_load
done
alive "after the fixed-rate runs"
say "### 2. Latency at a fixed $RATE req/s (open loop, tg_loadgen rate, 64 connections, $ROUNDS × $RATE_SLICE s per target after 0.5 s warm-up, interleaved, samples pooled)"
say ""
say "| target | responses | errors | p50 ms | p99 ms | p99.9 ms | p50 added ms | p99 added ms | p99 added, from due time ms |"
say "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
f=$T/rate
declare -A RP50 RP99
for t in "${TARGETS[@]}"; do
    RP50[$t]=$(pct "$f-$t.txt" 1 50) RP99[$t]=$(pct "$f-$t.txt" 1 99)
    errs=$(awk '{ e += $2 + $3 } END { print e + 0 }' "$f-$t.rows")
    say "| $(name_of "$t") | $(wc -l <"$f-$t.txt") | $errs | $(ms "${RP50[$t]}") | $(ms "${RP99[$t]}") | $(ms "$(pct "$f-$t.txt" 1 99.9)") | $(diff_ms "${RP50[$t]}" "${RP50[direct]}") | $(diff_ms "${RP99[$t]}" "${RP99[direct]}") | $(diff_ms "$(pct "$f-$t.txt" 2 99)" "$(pct "$f-direct.txt" 2 99)") |"
done
say ""

# ---- 3. streamed time to first byte -----------------------------------------------------------
# Two arrival patterns, each in every round: "spread", the 16 connections' first requests
# spread evenly over a stream's length (150 ms: 50 ms to the first event, 20 × 5 ms), so
# that a new stream arrives every ~9 ms, as independent clients do; and "burst", all 16
# at once, which, as every stream lasts as long, stays a burst of 16 arrivals every
# 150 ms: each waits for the CPU the 15 others' admissions and the previous burst's
# settlements take on the one server core (a worst case, kept for comparison).
TTFB_MODES=(spread burst)
for round in $(seq "$ROUNDS"); do
    for mode in "${TTFB_MODES[@]}"; do
        spread=0
        [ "$mode" = spread ] && spread=150
        for t in "${TARGETS[@]}"; do
            out=$("${NICE[@]}" taskset -c "$LOAD_CPU" "$LOADGEN" ttfb "127.0.0.1:${PORT[$t]}" --auth "$KEY" --conns 16 \
                --requests $TTFB_N --spread $spread --body "$STREAM_BODY" --timeout 60 \
                --samples "$T/ttfb-$mode-$t.txt" 2>>"$T/loadgen.err" || true)
            echo "$mode $t $out" >>"$T/ttfb.txt"
            echo "$(kv errors "$out") $(kv non2xx "$out")" >>"$T/ttfb-$mode-$t.rows"
            log "ttfb $mode $t: head $(kv head_p50_us "$out")us first token $(kv body_p50_us "$out")us (load $(load_now))"
        done
    done
    sample_load
done
alive "after the stream runs"
for mode in "${TTFB_MODES[@]}"; do
    if [ "$mode" = spread ]; then
        say "### 3. Streamed time to first byte, arrivals spread ($ROUNDS × $TTFB_N streams per target, 16 open at a time, their starts spread over a stream's 150 ms; interleaved; mock: ttft_ms=50 chunks=20 interval_ms=5)"
    else
        say "### 3b. Streamed time to first byte, arrivals in bursts of 16 ($ROUNDS × $TTFB_N streams per target, 16 started at once and again as each ends; interleaved with 3)"
    fi
    say ""
    say "| target | streams | errors | head p50 ms | first token p50 ms | first token p99 ms | head added p50 ms | first token added p50 ms | first token added p99 ms |"
    say "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    f=$T/ttfb-$mode
    for t in "${TARGETS[@]}"; do
        errs=$(awk '{ e += $1 + $2 } END { print e + 0 }' "$f-$t.rows")
        say "| $(name_of "$t") | $(wc -l <"$f-$t.txt") | $errs | $(ms "$(pct "$f-$t.txt" 1 50)") | $(ms "$(pct "$f-$t.txt" 2 50)") | $(ms "$(pct "$f-$t.txt" 2 99)") | $(diff_ms "$(pct "$f-$t.txt" 1 50)" "$(pct "$f-direct.txt" 1 50)") | $(diff_ms "$(pct "$f-$t.txt" 2 50)" "$(pct "$f-direct.txt" 2 50)") | $(diff_ms "$(pct "$f-$t.txt" 2 99)" "$(pct "$f-direct.txt" 2 99)") |"
    done
    say ""
done
say "head = time to the response head; first token = time to the first body byte (the mock sends its first SSE event 50 ms after its head)."
say ""

# ---- profile ----------------------------------------------------------------------------------
TOP=14
cg_top() { # yes|no INSTANCE REQUESTS: the top functions, inclusive or self, per request
    say '```'
    { callgrind_annotate --inclusive="$1" --threshold=100 "$T/cg-$2.out.1" 2>/dev/null |
        awk -v n="$3" '$1 ~ /^[0-9,]+$/ && $2 ~ /\(/ { v = $1; gsub(",", "", v); $1 = ""; $2 = ""; sub(/^ +/, "");
            sub(/^[^:]*:/, ""); if ($0 !~ /^0x/) sub(/ \[.*\]$/, ""); if (!seen[$0]++) printf "%9d  %s\n", v / n, $0 }' |
        grep -v -E ' (PROGRAM TOTALS|start_thread|clone3?|main|worker_main|__libc_start.*|_start|uv_run|uv__io_poll)$|libuv\.so' |
        head -$TOP | tee -a "$SUMMARY"; } || true
    say '```'
}
profile_callgrind() { # INSTANCE: a fresh full gateway under callgrind, the same state
    local i=$1 g port n ir
    wait_spool "$i"
    served_add "full-$i"
    stop_pid "${GWPID[full-$i]}"
    start "cg-$i" "" valgrind --tool=callgrind --callgrind-out-file="$T/cg-$i.out" "${IBIN[$i]}" serve -c "${CFG[full-$i]}"
    g=$LAST_PID port=${PORT[full-$i]}
    wait_port "$port" 60
    for _ in $(seq 100); do
        curl -s -m 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -H "Authorization: Bearer $KEY" \
            -d "$BODY" | grep -q 200 && break
        sleep 0.2
    done
    # An open loop the gateway under valgrind (about 40 times slower) keeps up with: no
    # timeouts, no spooling, the same path as natively.
    taskset -c "$LOAD_CPU" "$LOADGEN" rate "127.0.0.1:$port" --auth "$KEY" --body "$BODY" --rate 50 --conns 16 --duration 2 >/dev/null 2>&1 || true
    wait_spool "$i"
    callgrind_control -z "$g" >/dev/null
    out=$(taskset -c "$LOAD_CPU" "$LOADGEN" rate "127.0.0.1:$port" --auth "$KEY" --body "$BODY" --rate 100 --conns 16 --duration 8 2>/dev/null || true)
    sleep 1 # the settlements of the last requests
    callgrind_control -d "$g" >/dev/null
    sleep 1
    wait_spool "$i"
    served_add "full-$i"
    stop_pid "$g"
    n=$(kv completed "$out")
    ir=$(awk '/^summary:/ { s += $2 } END { print s }' "$T/cg-$i.out.1")
    say "#### Gateway instructions per request, full pipeline (${ILABEL[$i]}): $((ir / n)) ($n requests under callgrind, tg_loadgen at 100 req/s, all threads; $(kv non2xx "$out") non-2xx, $(kv errors "$out") errors, $(grep -c 'without Redis\|spooled' "$T/cg-$i.err" || true) timeout/spool warnings)"
    say ""
    say "Inclusive, top $TOP of the gateway's functions (instructions per request):"
    cg_top yes "$i" "$n"
    say "Self, top $TOP:"
    cg_top no "$i" "$n"
    say ""
    start_gw "full-$i" "$i" "full-$i-r" # back, for perf
    wait_port "$port" 15
}
profile_perf() { # INSTANCE: cpu-clock samples of everything on the server core under wrk
    local i=$1 port n wp secs=5 f=999
    port=${PORT[full-$1]}
    for j in "${INST[@]}"; do wait_spool "$j"; done # no replay of another gateway in the window
    for _ in $(seq 100); do
        curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/chat/completions" -H "Authorization: Bearer $KEY" \
            -d "$BODY" | grep -q 200 && break
        sleep 0.1
    done
    TG_BENCH_KEY=$KEY "${NICE[@]}" taskset -c "$LOAD_CPU" wrk -t1 -c$CONNS -d$((secs + 3))s -s "$BENCH/wrk_pipeline.lua" \
        "http://127.0.0.1:$port/v1/chat/completions" >"$T/wrk-perf-$i.txt" &
    wp=$!
    sleep 1.5
    local m0 m1
    m0=$(metric "$port" 'tollgate_requests_total{route="chat_completions",status="200"}' || true)
    if ! perf record -e cpu-clock -F $f -C "$SRV_CPU" -g -o "$T/perf-$i.data" -- sleep $secs >/dev/null 2>"$T/perf-$i.err"; then
        wait $wp || true
        say "(perf record failed: $(tail -1 "$T/perf-$i.err"))"
        return
    fi
    m1=$(metric "$port" 'tollgate_requests_total{route="chat_completions",status="200"}' || true)
    wait $wp || true
    n=$(awk -v a="${m0:-0}" -v b="${m1:-0}" 'BEGIN { print b - a }')
    [ "$n" -gt 0 ] 2>/dev/null || n=$(awk -v s=$secs '/^Requests\/sec:/ { printf "%d", $2 * s }' "$T/wrk-perf-$i.txt")
    say "#### Where the server core's CPU goes, full pipeline (${ILABEL[$i]}): perf, cpu-clock at $f Hz on CPU $SRV_CPU for $secs s under wrk -c$CONNS, $n requests"
    say ""
    say "CPU µs per request by process (samples / $f Hz / requests):"
    say '```'
    { perf report -i "$T/perf-$i.data" --no-children --stdio -n --sort comm -g none 2>/dev/null |
        awk -v n="$n" -v f=$f '$1 ~ /%$/ && $2 ~ /^[0-9]+$/ && $2 / f * 1e6 / n >= 0.5 { printf "%8.1f µs  %s\n", $2 / f * 1e6 / n, $3 }' | tee -a "$SUMMARY"; } || true
    say '```'
    say "Top $TOP symbols (self) per process, µs per request:"
    say '```'
    { perf report -i "$T/perf-$i.data" --no-children --stdio -n --sort comm,dso,sym -g none 2>/dev/null |
        awk -v n="$n" -v f=$f '$1 ~ /%$/ && $2 ~ /^[0-9]+$/ { us = $2 / f * 1e6 / n; c = $3; $1 = ""; $2 = ""; $3 = ""; sub(/^ +/, "");
            if (us >= 0.5 && ++k[c] <= top) printf "%-15s %7.2f µs  %s\n", c, us, $0 }' top=$TOP | sort -s -k1,1 | tee -a "$SUMMARY"; } || true
    say '```'
    say ""
}
if [ $PROFILE = 1 ]; then
    say "### Profile"
    say ""
    for i in "${INST[@]}"; do profile_perf "$i"; profile_callgrind "$i"; done
fi

# ---- 4. Postgres rows per request and ledger verify (each full gateway, once stopped) --------
say "### 4. Postgres rows written per request, and ledger verify (whole run, after the gateway stopped)"
say ""
say "| target | requests answered 200 | settlements spooled | rows inserted / request | rows updated / request | by table (ins+upd / request) | ledger verify |"
say "|---|---:|---:|---:|---:|---|---|"
VERIFY_FAIL=0
for i in "${INST[@]}"; do
    t=full-$i
    wait_spool "$i" # a stopped gateway replays nothing: verify would see its spooled settlements open
    served_add "$t"
    n=${SERVED[$t]}
    stop_pid "${GWPID[$t]}" # graceful: the settlement batcher flushes
    sleep 1.5 # the backends' last statistics
    rows=$(psql -X -A -t -F' ' -d "${PGCONN[$t]}" -c "SELECT relname, n_tup_ins, n_tup_upd FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd > 0 ORDER BY relname")
    # rows written by migrate and apply (before any request) are counted too: a few dozen, against thousands of requests
    ins=$(awk '{ s += $2 } END { print s + 0 }' <<<"$rows")
    upd=$(awk '{ s += $3 } END { print s + 0 }' <<<"$rows")
    by=$(awk -v n="$n" '{ v = ($2 + $3) / n; if (v >= 0.01) { printf "%s%s %.2f", sep, $1, v; sep = ", " } }' <<<"$rows")
    if TOLLGATE_PG=${PGCONN[$t]} TOLLGATE_REDIS="unix://${RSOCK[$i]}" "${IBIN[$i]}" ledger verify -c "${CFG[$t]}" >"$T/verify-$i.txt" 2>&1; then
        v=clean
    else
        v="**NOT CLEAN**: $(tr '\n' ' ' <"$T/verify-$i.txt" | cut -c1-300)"
        VERIFY_FAIL=1
    fi
    say "| $(name_of "$t") | $n | $(spooled "$t") | $(awk -v a="$ins" -v n="$n" 'BEGIN { printf "%.2f", a / n }') | $(awk -v a="$upd" -v n="$n" 'BEGIN { printf "%.2f", a / n }') | $by | $v |"
done
say ""
sample_load
say "Load average (1/5/15 min) sampled before, after each round and at the end: $(awk '{ printf "%s%s", sep, $1; sep = ", " }' "$LOAD_SAMPLES") (1-min values); run took $(( $(date +%s) - BENCH_STARTED )) s."
say ""
if [ $VERIFY_FAIL = 1 ]; then
    log "ledger verify is not clean after the benchmark"
    KEEP=1
    exit 1
fi
