#!/usr/bin/env bash
# Account selection cost with 1, 10, 100 and 10,000 accounts in a key's group, measured
# three ways in one run against the real gateway (Postgres, Redis, the mock upstream):
#
#   1. end to end: wrk through the gateway, one key per group, same request; req/s and
#      p50/p99 for each group size, rounds alternating the order so drift on a shared
#      machine hits every size alike;
#   2. phase_select itself: uprobes on its entry and return (perf probe), the time
#      between them per call, under the same wrk load (uprobe traps add a constant,
#      so the 1-account group is the floor to compare against);
#   3. where the time goes: perf record --call-graph dwarf under load, the share of
#      the gateway's CPU in phase_select and in what it calls (tg_select,
#      tg_snapshot_pool, tg_health_get), turned into µs per request with the gateway's
#      CPU time per request.
# spec/bench/select_bench.sh measures the selection alone, in process.
# Plus a spread check: which accounts of the 10,000 receive traffic at all (the access
# log's account_id over a few thousand requests).
#
# The groups are made the cheap way: one account `seed` (sealed credential) by
# `tollgate apply`, then SQL copies of its row (same sealed credential bytes) with
# generate_series, each copy linked to its group in account_groups.
#
# Usage: spec/bench/routing_bench.sh [--quick] [--no-perf]
# Environment: TG_BENCH_BIN (default build/tollgate), TG_BENCH_DURATION (wrk seconds per
#   run, 5), TG_BENCH_ROUNDS (3), TG_BENCH_CONNS (16), TOLLGATE_PG / TOLLGATE_REDIS (use
#   these servers; otherwise private ones are started in the work directory),
#   TG_BENCH_KEEP (non-empty: keep the work directory).
# Pinning (2-core box): the gateway (1 worker) on core 1; the mock and wrk on core 0.
# Everything listens on 127.0.0.1 or a unix socket and is stopped by PID on exit; the
# uprobes are added under the group `tgrb` and removed on exit. Shared helpers:
# spec/bench/lib.sh.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"

BIN=${TG_BENCH_BIN:-$ROOT/build/tollgate}
DUR=${TG_BENCH_DURATION:-5}
ROUNDS=${TG_BENCH_ROUNDS:-3}
CONNS=${TG_BENCH_CONNS:-16}
PERF=1
for a in "$@"; do
    case $a in
    --quick) DUR=2 ROUNDS=1 ;;
    --no-perf) PERF=0 ;;
    *) echo "usage: $0 [--quick] [--no-perf]" >&2; exit 2 ;;
    esac
done
SIZES=(1 10 100 10000)
SECRET=$(printf 'ab%.0s' $(seq 32))
need_bin
need wrk

bench_workdir tg-routing-bench
[ -z "${TG_BENCH_KEEP:-}" ] || KEEP=1
PROBES=0
bench_on_exit() { # after the gateways have stopped, before the private servers do
    [ $PROBES = 1 ] && perf probe -q -d 'tgrb:*' >/dev/null 2>&1
    if [ -n "${DB:-}" ]; then psql -X -q -d "$ADMIN_PG" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1; fi
}

# ---- services and database ------------------------------------------------------------
if [ -z "${TOLLGATE_PG:-}" ] || [ -z "${TOLLGATE_REDIS:-}" ]; then
    bench_services # private Postgres and Redis in $T
fi
with_db() { # CONNINFO DBNAME -> the conninfo with dbname replaced
    if [[ $1 == *dbname=* ]]; then sed -E "s/dbname=[^ ]*/dbname=$2/" <<<"$1"; else echo "$1 dbname=$2"; fi
}
ADMIN_PG=$(with_db "$TOLLGATE_PG" postgres)
DB=tgrb_$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
psql -X -q -d "$ADMIN_PG" -c "CREATE DATABASE $DB" >/dev/null
PG=$(with_db "$TOLLGATE_PG" "$DB")
export TOLLGATE_PG=$PG TOLLGATE_SECRET_KEY=$SECRET
sql() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d "$PG" -c "$1"; }

start_mock 0
next_port P_GW
next_port P_GW2

cat >"$T/tool.lua" <<EOF
return { upstream = { url = "http://127.0.0.1:$P_MOCK/v1" } }
EOF
"$BIN" migrate -c "$T/tool.lua" >/dev/null
# Ids start at a random offset, so the Redis keys of this run ({t:<id>}, {a:<id>}) are
# its own even on a shared Redis.
OFFSET=$((1000000 + RANDOM * 32768 + RANDOM))
for s in $(sql "SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = 'public'"); do
    sql "ALTER SEQUENCE \"$s\" RESTART WITH $OFFSET" >/dev/null
done

key_of() { echo "tg-routing-bench-key-g$1"; }
{
    echo "return {"
    echo "  tenants = { { name = 'bench', balance = '1000000000' } },"
    echo "  groups = {"
    for n in "${SIZES[@]}"; do echo "    { name = 'g$n', models = {} },"; done
    echo "  },"
    echo "  accounts = { { name = 'seed', provider = 'openai', base_url = 'http://127.0.0.1:$P_MOCK/v1',"
    echo "                 credential = 'sk-routing-bench', concurrency = 1000, groups = { 'g1' } } },"
    echo "  keys = {"
    for n in "${SIZES[@]}"; do echo "    { name = 'k$n', tenant = 'bench', group = 'g$n', key = '$(key_of "$n")' },"; done
    echo "  },"
    echo "  prices = { { model = 'mock-gpt', input = '0.15', output = '0.60' } },"
    echo "}"
} >"$T/state.lua"
"$BIN" apply -c "$T/tool.lua" "$T/state.lua" >/dev/null
for n in "${SIZES[@]}"; do
    [ "$n" = 1 ] && continue
    sql "INSERT INTO accounts (name, provider, base_url, credential, kind, concurrency, priority, weight)
         SELECT 'g$n-' || i, provider, base_url, credential, kind, concurrency, priority, weight
         FROM accounts, generate_series(1, $n) i WHERE name = 'seed'" >/dev/null
    sql "INSERT INTO account_groups (account_id, group_id)
         SELECT a.id, g.id FROM accounts a, groups g WHERE a.name LIKE 'g$n-%' AND g.name = 'g$n'" >/dev/null
done
log "accounts: $(sql "SELECT string_agg(g.name || '=' || c, ' ' ORDER BY c) FROM (SELECT group_id, count(*) c FROM account_groups GROUP BY 1) x JOIN groups g ON g.id = x.group_id")"

# ---- the gateway ----------------------------------------------------------------------
# Billing is off: with it every request also reserves in Redis and settles through
# Postgres, the same work for every group size, which only adds noise to the
# comparison of the selection cost.
gateway_config() { # FILE PORT ACCESS_LOG
    cat >"$1" <<EOF
return {
  listen = "127.0.0.1:$2", workers = 1, access_log = $3, log_level = "warn",
  keys = { "tg-routing-bench-static" },
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", api_key = "sk-static" },
  billing = { enabled = false },
}
EOF
}
gateway_config "$T/gw.lua" $P_GW false
start gw 1 "$BIN" serve -c "$T/gw.lua"
GW=$LAST_PID
wait_port $P_GW
URL=http://127.0.0.1:$P_GW
ready() { # SIZE: the group answers 200
    curl -s -o /dev/null -w '%{http_code}' "$URL/v1/chat/completions" -H "authorization: Bearer $(key_of "$1")" \
        -d '{"model":"mock-gpt","max_tokens":8,"messages":[{"role":"user","content":"hi [mock chunks=1]"}]}'
}
for n in "${SIZES[@]}"; do
    for _ in $(seq 100); do [ "$(ready "$n")" = 200 ] && break; sleep 0.1; done
    [ "$(ready "$n")" = 200 ] || { log "group g$n does not answer 200"; tail -20 "$T/gw.err" >&2; exit 1; }
done
log "gateway pid $GW ready; RSS $(awk '/VmRSS/ {print $2 " " $3}' /proc/$GW/status)"

run_wrk() { # SIZE SECONDS OUT
    TG_RB_KEY=$(key_of "$1") taskset -c 0 wrk -t1 -c"$CONNS" -d"$2"s --latency -s "$BENCH/routing_bench.lua" "$URL/v1/chat/completions" >"$3" 2>&1
}
rps_of() { awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$1"; }
pct_of() { # FILE PERCENT: wrk's latency percentile (812.00us / 1.20ms / 2.00s) in µs, unrounded
    awk -v p="$2" '$1 == p { v = $2 } END { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000;
        else if (v ~ /s$/) print n * 1e6; else print n }' "$1"
}

# ---- 1. end to end --------------------------------------------------------------------
declare -A BEST_RPS P50 P99 CPU_US
for n in "${SIZES[@]}"; do BEST_RPS[$n]=0; done
for r in $(seq "$ROUNDS"); do
    order=("${SIZES[@]}")
    [ $((r % 2)) = 0 ] && order=(10000 100 10 1)
    for n in "${order[@]}"; do
        c0=$(cpu_ticks $GW)
        run_wrk "$n" "$DUR" "$T/wrk-$n-$r.txt"
        c1=$(cpu_ticks $GW)
        rps=$(rps_of "$T/wrk-$n-$r.txt")
        non2xx=$(awk '/Non-2xx/ {print $NF}' "$T/wrk-$n-$r.txt")
        [ -z "$non2xx" ] || log "g$n round $r: $non2xx non-2xx responses ($(grep '^statuses:' "$T/wrk-$n-$r.txt"))"
        reqs=$(awk '/requests in/ {print $1}' "$T/wrk-$n-$r.txt")
        cpu=$(per_req $((c1 - c0)) "$reqs")
        log "round $r g$n: $rps req/s, p50 $(pct_of "$T/wrk-$n-$r.txt" 50%) µs, gateway CPU $cpu µs/request"
        if [ "$rps" -gt "${BEST_RPS[$n]}" ]; then
            BEST_RPS[$n]=$rps
            P50[$n]=$(pct_of "$T/wrk-$n-$r.txt" 50%)
            P99[$n]=$(pct_of "$T/wrk-$n-$r.txt" 99%)
            CPU_US[$n]=$cpu
        fi
    done
done

echo "## End to end: wrk -t1 -c$CONNS, ${DUR} s x $ROUNDS rounds (order alternating), best round"
echo
echo "| accounts in the key's group | req/s | p50 µs | p99 µs | gateway CPU µs / request |"
echo "|---|---|---|---|---|"
for n in "${SIZES[@]}"; do
    echo "| $n | ${BEST_RPS[$n]} | ${P50[$n]} | ${P99[$n]} | ${CPU_US[$n]} |"
done
echo

# ---- 2. phase_select timed by uprobes ---------------------------------------------------
if [ $PERF = 1 ] && command -v perf >/dev/null; then
    perf probe -q -d 'tgrb:*' >/dev/null 2>&1 || true
    if perf probe -q -x "$BIN" --add 'tgrb:sel=phase_select' >/dev/null 2>&1 &&
        perf probe -q -x "$BIN" --add 'tgrb:selret=phase_select%return' >/dev/null 2>&1; then
        PROBES=1
        echo "## phase_select per call (uprobes on entry and return, under the same load)"
        echo
        echo "| accounts | calls timed | p50 µs | mean µs | p99 µs |"
        echo "|---|---|---|---|---|"
        for n in "${SIZES[@]}"; do
            run_wrk "$n" 4 "$T/wrk-probe-$n.txt" &
            w=$!
            sleep 1
            perf record -q -e 'tgrb:sel' -e 'tgrb:selret__return' -p $GW -o "$T/probe-$n.data" -- sleep 2 >/dev/null 2>&1 || true
            wait $w || true
            perf script --ns -i "$T/probe-$n.data" -F tid,time,event 2>/dev/null |
                awk '{ t = $2; sub(":", "", t); if ($3 ~ /selret/) { if (s[$1] != "") { print (t - s[$1]) * 1e6; s[$1] = "" } } else s[$1] = t }' |
                sort -g >"$T/sel-$n.txt"
            awk -v n="$n" '{ v[NR] = $1; sum += $1 } END { if (NR == 0) { print "| " n " | 0 | | | |"; exit }
                printf "| %s | %d | %.2f | %.2f | %.2f |\n", n, NR, v[int(NR * 0.5) + 1], sum / NR, v[int(NR * 0.99) + 1] }' "$T/sel-$n.txt"
        done
        echo
        perf probe -q -d 'tgrb:*' >/dev/null 2>&1 || true
        PROBES=0
    else
        log "perf probe failed (uprobes unavailable?); skipping the per-call timing"
    fi

    # ---- 3. where the time goes -----------------------------------------------------------
    echo "## Where the gateway's CPU goes (perf record --call-graph dwarf, 4 s under wrk)"
    echo
    echo "Share of the gateway's CPU samples in each function including what it calls, and"
    echo "that share times the gateway's CPU time per request (µs)."
    echo
    SYMS=(phase_select tg_select tg_snapshot_pool tg_health_get tg_random_bytes slot_try tg_accounts_snapshot)
    header="| accounts | req/s while recorded | CPU µs / request |"
    sep="|---|---|---|"
    for s in "${SYMS[@]}"; do header+=" $s |"; sep+="---|"; done
    echo "$header"
    echo "$sep"
    for n in "${SIZES[@]}"; do
        run_wrk "$n" 6 "$T/wrk-perf-$n.txt" &
        w=$!
        sleep 1
        c0=$(cpu_ticks $GW)
        t0=$(date +%s.%N)
        perf record -q -F 999 --call-graph dwarf,16384 -p $GW -o "$T/perf-$n.data" -- sleep 4 >/dev/null 2>&1 || true
        c1=$(cpu_ticks $GW)
        t1=$(date +%s.%N)
        wait $w || true
        rps=$(rps_of "$T/wrk-perf-$n.txt")
        cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$HZ" -v r="$rps" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.1f", (b - a) / hz * 1e6 / (r * (t1 - t0)) }')
        perf report -i "$T/perf-$n.data" --children --stdio --sort sym -g none --percent-limit 0 2>/dev/null >"$T/report-$n.txt" || true
        row="| $n | $rps | $cpu |"
        for s in "${SYMS[@]}"; do
            pc=$(awk -v s="$s" '$4 == s && $1 ~ /%$/ { gsub("%", "", $1); print $1; exit }' "$T/report-$n.txt")
            if [ -z "$pc" ]; then row+=" – |"; else row+=" $pc% = $(awk -v p="$pc" -v c="$cpu" 'BEGIN { printf "%.2f", p / 100 * c }') µs |"; fi
        done
        echo "$row"
    done
    echo
    echo "### Top symbols with 10,000 accounts (children, ≥ 1.5%)"
    echo
    echo '```'
    grep -v '^#' "$T/report-10000.txt" | grep -v '^$' | grep -v '0x0000\|0xffff' | awk '$1 + 0 >= 1.5' | head -30 || true
    echo '```'
    echo
fi

# ---- 4. which of the 10,000 accounts get traffic -----------------------------------------
gateway_config "$T/gw2.lua" $P_GW2 true
start gw2 1 "$BIN" serve -c "$T/gw2.lua"
wait_port $P_GW2
URL=http://127.0.0.1:$P_GW2
for _ in $(seq 100); do [ "$(ready 10000)" = 200 ] && break; sleep 0.1; done
run_wrk 10000 2 "$T/wrk-spread.txt"
sleep 0.5
total=$(grep -c '"account_id"' "$T/gw2.out" || true)
distinct=$(grep -o '"account_id":[0-9]*' "$T/gw2.out" | sort -u | wc -l)
ids=$(grep -o '"account_id":[0-9]*' "$T/gw2.out" | cut -d: -f2 | sort -n | uniq | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo ".." hi }')
first=$(sql "SELECT min(a.id) FROM accounts a JOIN account_groups ag ON ag.account_id = a.id JOIN groups g ON g.id = ag.group_id WHERE g.name = 'g10000'")
echo "## Which accounts of the 10,000-account group receive traffic"
echo
echo "$total requests through a fresh gateway (access log on): $distinct distinct accounts used,"
echo "ids $ids (the group's accounts have ids $first..$((first + 9999)))."
echo
echo "Machine: $(nproc) cores, $(cpu_model), load average $(load_now) at the end."
