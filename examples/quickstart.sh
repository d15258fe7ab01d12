#!/usr/bin/env bash
# tollgate quickstart: installs what is missing, builds build/tollgate, starts a private
# Postgres and Redis under ./var (unix sockets), the mock upstream and the gateway,
# applies the demo state (examples/state.lua: a tenant with a balance, a group over three
# mock accounts, prices, a key with limits and a budget), prints how to reach it, streams
# one sample answer through the demo key and prints what it cost, then stays in the
# foreground until Ctrl-C or SIGTERM, when it stops everything it started.
#
#   examples/quickstart.sh [--help]
#
# Environment:
#   TOLLGATE_PORT        gateway port on 127.0.0.1 (default 8080)
#   TOLLGATE_MOCK_PORT   mock upstream port on 127.0.0.1 (default: the gateway port + 1)
#   TOLLGATE_UPSTREAM    an OpenAI/Anthropic-compatible base URL (http://host:port/v1): the
#                        demo group's account "upstream" then routes to it (any model name
#                        is passed through) and the mock upstream is not started
#   TOLLGATE_UPSTREAM_KEY       its API key (sealed in Postgres under the secret key)
#   TOLLGATE_UPSTREAM_PROVIDER  openai (default) or anthropic
#   TOLLGATE_MODEL       model of the sample request (default mock-gpt; passed through)
#   TOLLGATE_BIN         use this tollgate binary instead of building build/tollgate
#   TG_QUICKSTART_NO_DEPS=1     skip spec/install-deps.sh
#
# Exit status: 0 after Ctrl-C or SIGTERM, 1 when something could not start (the line
# before says what, and which log to read).
#
# ./var keeps the demo key (var/demo.key), the admin token (var/admin.token), the secret
# key that seals upstream credentials (var/secret.key), the Postgres data (var/pg) and
# the logs (var/*.log) across runs; var/quickstart.env has the TOLLGATE_* lines as
# exports, for another terminal (`. var/quickstart.env`).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root"
# shellcheck source-path=SCRIPTDIR/.. source=spec/lib/services.sh
. "$root/spec/lib/services.sh"

say() { echo "quickstart: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

case ${1:-} in
  -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  '') ;;
  *) die "unknown argument \"$1\" (examples/quickstart.sh takes no arguments; see --help)" ;;
esac

var=$root/var
mkdir -p "$var"
chmod 755 "$var"

if [ "${TG_QUICKSTART_NO_DEPS:-0}" != 1 ]; then
  spec/install-deps.sh --run >&2
fi

if [ -n "${TOLLGATE_BIN:-}" ]; then
  tg=$TOLLGATE_BIN
  [ -x "$tg" ] || die "TOLLGATE_BIN=$tg is not an executable file"
  say "using $tg (TOLLGATE_BIN; not building)"
else
  say "building build/tollgate (log: var/build.log)"
  if ! { cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
         cmake --build build -j"${TG_BUILD_JOBS:-2}"; } >"$var/build.log" 2>&1; then
    tail -n 40 "$var/build.log" >&2
    die "build failed (full log: var/build.log)"
  fi
  tg=$root/build/tollgate
  [ -x "$tg" ] || die "build finished but $tg is missing"
fi

# --- secrets kept across runs --------------------------------------------------------
rand_hex() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }
if [ ! -s "$var/demo.key" ]; then
  (umask 077 && echo "tg-demo-$(rand_hex)" >"$var/demo.key")
fi
if [ ! -s "$var/admin.token" ]; then
  (umask 077 && echo "adm-$(rand_hex)" >"$var/admin.token")
fi
if [ ! -s "$var/secret.key" ]; then
  (umask 077 && echo "$(rand_hex)$(rand_hex)" >"$var/secret.key")
fi
demo_key=$(cat "$var/demo.key")
admin_token=${TOLLGATE_ADMIN_TOKEN:-$(cat "$var/admin.token")}
secret_key=${TOLLGATE_SECRET_KEY:-$(cat "$var/secret.key")}

# --- ports -----------------------------------------------------------------------------
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=${TOLLGATE_PORT:-8080}
if port_open "$port"; then
  die "port $port on 127.0.0.1 is already in use: set TOLLGATE_PORT to another port"
fi
# A fixed mock port keeps the demo accounts' base_url the same from run to run.
mock_port=${TOLLGATE_MOCK_PORT:-$((port + 1))}
if [ -z "${TOLLGATE_UPSTREAM:-}" ] && port_open "$mock_port"; then
  die "port $mock_port on 127.0.0.1 (the mock upstream) is already in use: set TOLLGATE_MOCK_PORT to another port"
fi

# One quickstart per checkout: a second one would share (and then stop) ./var's services.
if [ -s "$var/quickstart.pid" ] && kill -0 "$(cat "$var/quickstart.pid")" 2>/dev/null; then
  die "another quickstart (pid $(cat "$var/quickstart.pid")) is running in this checkout"
fi
echo $$ >"$var/quickstart.pid"

# --- stop everything we started, newest first, each by its PID ---------------------------
gw_pid='' mock_pid='' flaky_pid='' pg_dir='' redis_dir=''
# shellcheck disable=SC2317  # invoked by the traps
stop_pid() { # PID NAME
  if [ -z "$1" ] || ! kill -0 "$1" 2>/dev/null; then return 0; fi
  kill -TERM "$1" 2>/dev/null
  if ! tg__wait_gone "$1" 10; then
    say "$2 (pid $1) did not stop in 10s; killing it"
    kill -KILL "$1" 2>/dev/null
    tg__wait_gone "$1" 5
  fi
}
# shellcheck disable=SC2317  # invoked by the traps
cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  say "stopping"
  stop_pid "$flaky_pid" "fault re-arm loop"
  stop_pid "$gw_pid" gateway
  stop_pid "$mock_pid" mock-upstream
  [ -n "$redis_dir" ] && tg_redis_stop "$redis_dir"
  [ -n "$pg_dir" ] && tg_pg_stop "$pg_dir"
  rm -f "$var/quickstart.pid"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

# --- Postgres and Redis under ./var ---------------------------------------------------
# As root, Postgres runs as user `postgres`, which must reach var/pg; the socket path is
# limited to 107 bytes. If either fails (a checkout under /root, a very long path), the
# data goes to a private directory under /tmp instead.
pg_dir=$var/pg
if { [ "$(id -u)" = 0 ] && ! (cd / && runuser -u postgres -- test -x "$var") 2>/dev/null; } ||
   [ ${#pg_dir} -gt 90 ]; then
  pg_dir=${TMPDIR:-/tmp}/tollgate-quickstart-pg-$(printf '%s' "$root" | cksum | cut -d' ' -f1)
  say "Postgres cannot live in $var/pg (not reachable by user postgres, or path too long): using $pg_dir"
fi
say "starting Postgres ($pg_dir) and Redis ($var/redis)"
mkdir -p "$pg_dir"
chmod 755 "$pg_dir"
tg_pg_start "$pg_dir" || die "Postgres did not start (log: $pg_dir/pg.log)"
redis_dir=$var/redis
tg_redis_start "$redis_dir" || die "Redis did not start (log: $redis_dir/redis.log)"

# --- upstream: the mock, or TOLLGATE_UPSTREAM ------------------------------------------
launcher=()
command -v setsid >/dev/null 2>&1 && launcher=(setsid) # Ctrl-C reaches only this script
model=${TOLLGATE_MODEL:-mock-gpt}
mock_url=http://127.0.0.1:$mock_port/v1
if [ -n "${TOLLGATE_UPSTREAM:-}" ]; then
  upstream_url=$TOLLGATE_UPSTREAM
  say "upstream: $upstream_url (account \"upstream\" of group demo; model $model, passed through)"
else
  "${launcher[@]}" "$tg" mock-upstream --listen "127.0.0.1:$mock_port" \
    </dev/null >"$var/mock.log" 2>&1 &
  mock_pid=$!
  for ((i = 0; i < 100; i++)); do
    port_open "$mock_port" && break
    kill -0 "$mock_pid" 2>/dev/null || { tail -n 20 "$var/mock.log" >&2; die "mock-upstream exited"; }
    sleep 0.1
  done
  port_open "$mock_port" || die "mock-upstream is not listening on 127.0.0.1:$mock_port"
  upstream_url=$mock_url
  say "mock upstream on $upstream_url (pid $mock_pid)"
  # The mock's fault rules, by account credential (core/src/mock/tg_mock.c): mock-eu-west
  # answers slowly, mock-ap-south fails its next request with a 503 — re-armed every 20 s
  # by a small loop, so it fails now and then and the gateway's failover shows.
  mock_rule() {
    curl -fsS -o /dev/null --max-time 2 -X POST "http://127.0.0.1:$mock_port/_mock/faults" \
      -H 'Content-Type: application/json' -d "$1"
  }
  mock_rule '{"credential":"sk-mock-eu-west","ttft_ms":700}' || die "could not set the mock's fault rules"
  mock_rule '{"credential":"sk-mock-ap-south","count":1,"status":503}' || die "could not set the mock's fault rules"
  (
    sp=''
    # shellcheck disable=SC2317  # invoked by the trap
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM # `wait`, unlike a plain sleep, lets it run at once
    while :; do
      sleep 20 &
      sp=$!
      wait "$sp"
      mock_rule '{"credential":"sk-mock-ap-south","count":1,"status":503}' 2>/dev/null || true
    done
  ) </dev/null >/dev/null 2>&1 &
  flaky_pid=$!
fi

# --- config ------------------------------------------------------------------------------
lua_str() { # a Lua string literal
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "$s"
}
conf=$var/tollgate.lua
{
  echo "-- Written by examples/quickstart.sh on every run; edit that script, not this file."
  echo "return {"
  echo "  listen = $(lua_str "127.0.0.1:$port"),"
  echo "  workers = 2,"
  echo "  admin_token = $(lua_str "$admin_token"),"
  echo "  secret_key = $(lua_str "$secret_key"),"
  echo "  -- The demo key lives in Postgres (examples/state.lua); this upstream serves only"
  echo "  -- keys without a group."
  if [ -n "${TOLLGATE_UPSTREAM:-}" ]; then
    echo "  upstream = { url = $(lua_str "$upstream_url"),"
    echo "               api_key = os.getenv(\"TOLLGATE_UPSTREAM_KEY\"),"
    echo "               provider = os.getenv(\"TOLLGATE_UPSTREAM_PROVIDER\") },"
  else
    echo "  upstream = { url = $(lua_str "$upstream_url"), api_key = \"sk-mock-demo\" },"
  fi
  echo "  postgres = $(lua_str "$TOLLGATE_PG"),"
  echo "  redis = $(lua_str "$TOLLGATE_REDIS"),"
  echo "}"
} >"$conf.tmp"
chmod 600 "$conf.tmp"
mv "$conf.tmp" "$conf"

say "applying migrations"
"$tg" migrate -c "$conf" >"$var/migrate.log" 2>&1 ||
  { tail -n 20 "$var/migrate.log" >&2; die "tollgate migrate failed (log: var/migrate.log)"; }

# --- the demo state: tenant, group, accounts, prices, key ------------------------------------
say "applying the demo state (examples/state.lua; log: var/apply.log)"
TOLLGATE_MOCK_URL=$mock_url TOLLGATE_DEMO_KEY=$demo_key \
  "$tg" apply -c "$conf" examples/state.lua >"$var/apply.log" 2>&1 ||
  { tail -n 20 "$var/apply.log" >&2; die "tollgate apply failed (log: var/apply.log)"; }
say "$(tail -n 1 "$var/apply.log")"

# --- the gateway ---------------------------------------------------------------------------
"${launcher[@]}" "$tg" serve -c "$conf" </dev/null >"$var/tollgate.log" 2>&1 &
gw_pid=$!
base=http://127.0.0.1:$port
for ((i = 0; i < 300; i++)); do
  curl -fsS -o /dev/null --max-time 1 "$base/healthz" 2>/dev/null && break
  if ! kill -0 "$gw_pid" 2>/dev/null; then
    tail -n 20 "$var/tollgate.log" >&2
    die "tollgate serve exited (log: var/tollgate.log)"
  fi
  sleep 0.1
done
curl -fsS -o /dev/null --max-time 2 "$base/healthz" ||
  die "tollgate did not answer GET /healthz within 30s (log: var/tollgate.log)"

echo "TOLLGATE_URL=$base/v1"
echo "TOLLGATE_ADMIN_URL=$base/admin/"
echo "TOLLGATE_KEY=$demo_key"
echo "TOLLGATE_ADMIN_TOKEN=$admin_token"
# The same, for another terminal: `. var/quickstart.env` (the README's tour starts so).
(
  umask 077
  printf 'export TOLLGATE_URL=%q TOLLGATE_ADMIN_URL=%q TOLLGATE_KEY=%q TOLLGATE_ADMIN_TOKEN=%q\n' \
    "$base/v1" "$base/admin/" "$demo_key" "$admin_token" >"$var/quickstart.env"
)
if [ -n "${TOLLGATE_UPSTREAM:-}" ]; then
  accounts_line="account upstream ($upstream_url; the mock accounts are disabled)"
else
  accounts_line="mock-us-east, mock-eu-west (cheaper, slow first token), mock-ap-south (fails now and then)"
fi
say "demo state: tenant demo (opening balance 100 USD); group demo over $accounts_line;" \
  "key demo: 60 requests/min (burst 20), 4 at a time, budget 5 USD"

# --- one streamed sample answer --------------------------------------------------------------
# Prints each chunk's delta content as it arrives; anything that is not an SSE data line
# (an error body, say) is printed as it is.
stream_text() {
  local line c sp='[[:space:]]*'
  local re="\"delta\"$sp:$sp\\{[^}]*\"content\"$sp:$sp\"(([^\"\\\\]|\\\\.)*)\""
  while IFS= read -r line; do
    line=${line%$'\r'}
    case $line in
      data:*)
        if [[ $line =~ $re ]]; then
          c=${BASH_REMATCH[1]}
          c=${c//\\\"/\"}
          c=${c//\\\//\/}
          printf '%b' "$c"
        fi ;;
      '' | :* | event:* | id:* | retry:*) ;;
      *) printf '%s\n' "$line" ;;
    esac
  done
  echo
}
prompt="Hello from the tollgate quickstart"
[ -n "${TOLLGATE_UPSTREAM:-}" ] || prompt="$prompt [mock chunks=12 interval_ms=40]"
body=$(printf '{"model":%s,"stream":true,"messages":[{"role":"user","content":%s}]}' \
  "$(lua_str "$model")" "$(lua_str "$prompt")")
echo "--- sample: POST /v1/chat/completions (stream) ---"
rm -f "$var/sample.headers"
if ! curl -sS -N --max-time 60 -D "$var/sample.headers" "$base/v1/chat/completions" \
    -H "Authorization: Bearer $demo_key" -H 'Content-Type: application/json' \
    -d "$body" | stream_text; then
  say "the sample request failed (log: var/tollgate.log); the gateway keeps running"
fi
echo "---"

# --- what the sample cost: its usage row, written by the settlement a moment later ----------
rid=$(sed -n 's/^x-request-id: *\([A-Za-z0-9._-]*\).*/\1/Ip' "$var/sample.headers" 2>/dev/null | head -n 1)
psql_bin=$(tg__pg_bindir)/psql
row=''
if [ -n "$rid" ]; then
  for ((i = 0; i < 50; i++)); do
    row=$("$psql_bin" "$TOLLGATE_PG" -AtqF ' ' -c "SELECT trim(trailing '.' FROM trim(trailing '0' FROM u.cost::text)),
             coalesce(a.name, '-'), u.attempts, coalesce(u.input_tokens::text, '?'),
             coalesce(u.output_tokens::text, '?'), u.model
           FROM usage u LEFT JOIN accounts a ON a.id = u.account_id WHERE u.request_id = '$rid'" 2>/dev/null) || row=''
    [ -n "$row" ] && break
    sleep 0.1
  done
fi
if [ -n "$row" ]; then
  read -r cost account attempts in_tok out_tok used_model <<<"$row"
  [ "$cost" = 0 ] || cost=${cost/#./0.}
  echo "TOLLGATE_SAMPLE_REQUEST=$rid"
  echo "TOLLGATE_SAMPLE_COST=$cost"
  echo "cost: $cost USD for $in_tok input + $out_tok output tokens of $used_model, routed to account" \
    "$account ($attempts attempt(s)) within key demo's limits, debited from tenant demo's balance" \
    "(a usage row and a ledger entry)"
  [ "$cost" != 0 ] || say "no price for model $used_model: add one (examples/state.lua prices, or the console's Prices page)"
  echo "console: $base/admin/usage (log in with TOLLGATE_ADMIN_TOKEN; the dashboard, accounts and ledger pages show the rest)"
else
  say "the sample's usage row did not appear (request ${rid:-without an id}; log: var/tollgate.log)"
fi
say "running (gateway pid $gw_pid); Ctrl-C or SIGTERM stops everything"

# --- foreground until a signal ---------------------------------------------------------------
status=0
wait "$gw_pid" || status=$?
gw_pid=''
tail -n 20 "$var/tollgate.log" >&2
die "tollgate serve exited on its own (status $status; log: var/tollgate.log)"
