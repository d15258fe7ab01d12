#!/usr/bin/env bash
# The request path's cost of an identity (issue #19, item 6): instructions per request of
# the gateway (callgrind, whole process, one worker) through an Azure account with a
# static api-key against the same account kind with a Microsoft Entra ID app (auth =
# entra: a bearer token the gateway obtains and renews), on a private Postgres and Redis
# and the mock upstream (its token endpoint). Billing off: what differs is the account.
#
# Two rounds per binary, interleaved (key, entra, key, entra): each a warm-up (the entra
# account's token is obtained then), counters zeroed, tg_loadgen at 40 req/s for 8 s,
# counters dumped. With tokens living TG_BENCH_LIFETIME_MS (default 3,600,000: no refresh
# during a round) the figure is the steady state; a short lifetime (e.g. 2000) puts the
# refreshes in the round (one per 1.5 s, amortised over the requests around it).
#
# Usage: flock /tmp/tg-bench.lock spec/bench/identity_bench.sh [--keep] [BINARY ...]
# Everything started here is stopped by PID on exit. Shared helpers: spec/bench/lib.sh.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"

BINS=()
for a in "$@"; do
    case $a in
    --keep) KEEP=1 ;;
    -*) echo "usage: $0 [--keep] [BINARY ...]" >&2; exit 2 ;;
    *) BINS+=("$a") ;;
    esac
done
[ ${#BINS[@]} -gt 0 ] || BINS=("$ROOT/build/tollgate")
need psql redis-server redis-cli valgrind callgrind_control curl cc
LIFETIME_MS=${TG_BENCH_LIFETIME_MS:-3600000}
RATE=${TG_BENCH_RATE:-40}
SECS=${TG_BENCH_SECS:-8}

bench_workdir identity-bench
bench_services pg redis
build_loadgen
export TOLLGATE_PG="host=$T/pg dbname=tollgate user=postgres"
export TOLLGATE_REDIS="unix://$REDIS_SOCK"
export TOLLGATE_SECRET_KEY=c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00
BODY='{"model":"gpt-4o","messages":[{"role":"user","content":"hello [mock chunks=4]"}]}'

say "load average before: $(load_now); nproc $(nproc); token lifetime ${LIFETIME_MS} ms; tg_loadgen ${RATE} req/s for ${SECS} s"
say ""
say "| binary | account | round | requests | non-2xx | instructions / request | of which tg_identity_token | of which the refresh's callbacks |"
say "|---|---|---:|---:|---:|---:|---:|---:|"
i=0
for b in "${BINS[@]}"; do
    i=$((i + 1))
    BIN=$b
    snapshot_bin "tollgate-$i"
    start_mock ""
    curl -sf -X POST "http://127.0.0.1:$P_MOCK/_mock/identity" \
        -d "{\"lifetime_ms\":$LIFETIME_MS,\"clients\":{\"app-1\":\"s-1\"}}" >/dev/null
    psql "$TOLLGATE_PG" -qc 'DROP SCHEMA public CASCADE; CREATE SCHEMA public' >/dev/null
    next_port P_GW
    cat >"$T/gw.lua" <<EOC
return {
  listen = "127.0.0.1:$P_GW", workers = 1, access_log = false, admin_token = "adm-bench",
  upstream = { url = "http://127.0.0.1:$P_MOCK/v1", first_byte_timeout_ms = 20000 },
}
EOC
    cat >"$T/state.lua" <<EOS
local mock = "http://127.0.0.1:$P_MOCK"
return {
  tenants = { { name = "t", balance = "1000" } },
  groups = { { name = "gk", models = {} }, { name = "ge", models = {} } },
  accounts = {
    { name = "key", provider = "azure", base_url = mock .. "/openai", credential = "az-key-1", concurrency = 1000,
      groups = { "gk" } },
    { name = "entra", provider = "azure", auth = "entra", base_url = mock .. "/openai", credential = "s-1",
      concurrency = 1000, settings = { tenant_id = "t-1", client_id = "app-1", authority = mock }, groups = { "ge" } },
  },
  keys = {
    { name = "kk", tenant = "t", group = "gk", key = "tgk-bench-static-0001" },
    { name = "ke", tenant = "t", group = "ge", key = "tgk-bench-entra-00001" },
  },
}
EOS
    "$BIN" migrate -c "$T/gw.lua" >/dev/null
    "$BIN" apply -c "$T/gw.lua" "$T/state.lua" >/dev/null
    start gw "" valgrind --tool=callgrind --callgrind-out-file="$T/cg-$i.out" "$BIN" serve -c "$T/gw.lua"
    G=$LAST_PID
    wait_port "$P_GW" 60
    for round in 1 2; do
        for acct in key entra; do
            key=tgk-bench-static-0001
            [ $acct = key ] || key=tgk-bench-entra-00001
            for _ in $(seq 150); do
                curl -s -m 20 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_GW/v1/chat/completions" \
                    -H "Authorization: Bearer $key" -d "$BODY" | grep -q 200 && break
                sleep 0.2
            done
            "$LOADGEN" rate "127.0.0.1:$P_GW" --auth "$key" --body "$BODY" --rate "$RATE" --conns 8 --duration 1 >/dev/null 2>&1 || true
            callgrind_control -z "$G" >/dev/null
            out=$("$LOADGEN" rate "127.0.0.1:$P_GW" --auth "$key" --body "$BODY" --rate "$RATE" --conns 8 --duration "$SECS" 2>/dev/null || true)
            callgrind_control -d "$G" >/dev/null
            sleep 1
            f=$(ls -t "$T"/cg-$i.out.* | head -1)
            n=$(kv completed "$out")
            ir=$(awk '/^summary:/ { s += $2 } END { print s }' "$f")
            # Inclusive counts: the request path's lookup, and the refresh's steps (each
            # runs from the loop: Redis and Postgres answers, the token endpoint's).
            incl=$(callgrind_annotate --inclusive=yes --threshold=100 "$f" 2>/dev/null | tr -d ',' |
                awk '/tg_identity\.c:(tg_identity_token|fleet_cb|lock_cb|read_cb|tok_head|tok_body|tok_done|tok_error|written|fail_written|timer_cb) / {
                         if ($0 ~ /tg_identity_token/) t += $1; else r += $1 } END { printf "%d %d", t, r }')
            say "| $(basename "$b") | $acct | $round | $n | $(kv non2xx "$out") | $((ir / n)) | $((${incl% *} / n)) | $((${incl#* } / n)) |"
            rm -f "$f"
        done
    done
    say ""
    say "token requests at the mock: $(curl -s "http://127.0.0.1:$P_MOCK/_mock/identity" | sed 's/.*"token_requests":\([0-9]*\).*/\1/')"
    stop_pid "$G"
    stop_pid "$PID_MOCK"
done
say ""
say "load average after: $(load_now)"
