#!/usr/bin/env bash
# tollgate quickstart: installs what is missing, builds build/tollgate, starts a private
# Postgres and Redis under ./var (unix sockets), the mock upstream and the gateway, prints
# how to reach it, streams one sample answer, then stays in the foreground until Ctrl-C
# or SIGTERM, when it stops everything it started.
#
#   examples/quickstart.sh
#
# Environment:
#   TOLLGATE_PORT        gateway port on 127.0.0.1 (default 8080)
#   TOLLGATE_UPSTREAM    an OpenAI/Anthropic-compatible base URL (http://host:port/v1) to
#                        route to instead of starting the mock upstream
#   TOLLGATE_UPSTREAM_KEY       its API key (read by the config at start, never written)
#   TOLLGATE_UPSTREAM_PROVIDER  openai (default) or anthropic
#   TOLLGATE_MODEL       model of the sample request (default mock-gpt; passed through)
#   TG_QUICKSTART_NO_DEPS=1     skip spec/install-deps.sh
#
# ./var keeps the demo key (var/demo.key), the admin token (var/admin.token), the
# Postgres data (var/pg) and the logs (var/*.log) across runs.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root"
# shellcheck source=spec/lib/services.sh
. "$root/spec/lib/services.sh"

say() { echo "quickstart: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

var=$root/var
mkdir -p "$var"
chmod 755 "$var"

if [ "${TG_QUICKSTART_NO_DEPS:-0}" != 1 ]; then
  spec/install-deps.sh --run >&2
fi

say "building build/tollgate (log: var/build.log)"
if ! { cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
       cmake --build build -j"${TG_BUILD_JOBS:-2}"; } >"$var/build.log" 2>&1; then
  tail -n 40 "$var/build.log" >&2
  die "build failed (full log: var/build.log)"
fi
tg=$root/build/tollgate
[ -x "$tg" ] || die "build finished but $tg is missing"

# --- secrets kept across runs --------------------------------------------------------
rand_hex() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }
if [ ! -s "$var/demo.key" ]; then
  (umask 077 && echo "tg-demo-$(rand_hex)" >"$var/demo.key")
fi
if [ ! -s "$var/admin.token" ]; then
  (umask 077 && echo "adm-$(rand_hex)" >"$var/admin.token")
fi
demo_key=$(cat "$var/demo.key")
admin_token=${TOLLGATE_ADMIN_TOKEN:-$(cat "$var/admin.token")}

# --- ports -----------------------------------------------------------------------------
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=${TOLLGATE_PORT:-8080}
if port_open "$port"; then
  die "port $port on 127.0.0.1 is already in use: set TOLLGATE_PORT to another port"
fi

# One quickstart per checkout: a second one would share (and then stop) ./var's services.
if [ -s "$var/quickstart.pid" ] && kill -0 "$(cat "$var/quickstart.pid")" 2>/dev/null; then
  die "another quickstart (pid $(cat "$var/quickstart.pid")) is running in this checkout"
fi
echo $$ >"$var/quickstart.pid"

# --- stop everything we started, newest first, each by its PID ---------------------------
gw_pid='' mock_pid='' pg_dir='' redis_dir=''
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
if [ -n "${TOLLGATE_UPSTREAM:-}" ]; then
  upstream_url=$TOLLGATE_UPSTREAM
  say "upstream: $upstream_url (model $model, passed through)"
else
  mock_port=$(tg_free_port)
  "${launcher[@]}" "$tg" mock-upstream --listen "127.0.0.1:$mock_port" \
    </dev/null >"$var/mock.log" 2>&1 &
  mock_pid=$!
  for ((i = 0; i < 100; i++)); do
    port_open "$mock_port" && break
    kill -0 "$mock_pid" 2>/dev/null || { tail -n 20 "$var/mock.log" >&2; die "mock-upstream exited"; }
    sleep 0.1
  done
  port_open "$mock_port" || die "mock-upstream is not listening on 127.0.0.1:$mock_port"
  upstream_url=http://127.0.0.1:$mock_port/v1
  say "mock upstream on $upstream_url (pid $mock_pid)"
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
  echo "  keys = { $(lua_str "$demo_key") },"
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

if "$tg" migrate --help >/dev/null 2>&1; then
  say "applying migrations"
  "$tg" migrate -c "$conf" >"$var/migrate.log" 2>&1 ||
    { tail -n 20 "$var/migrate.log" >&2; die "tollgate migrate failed (log: var/migrate.log)"; }
fi

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
body=$(printf '{"model":%s,"stream":true,"messages":[{"role":"user","content":"Hello from the tollgate quickstart [mock chunks=12 interval_ms=40]"}]}' \
  "$(lua_str "$model")")
echo "--- sample: POST /v1/chat/completions (stream) ---"
if ! curl -sS -N --max-time 60 "$base/v1/chat/completions" \
    -H "Authorization: Bearer $demo_key" -H 'Content-Type: application/json' \
    -d "$body" | stream_text; then
  say "the sample request failed (log: var/tollgate.log); the gateway keeps running"
fi
echo "---"
say "running (gateway pid $gw_pid); Ctrl-C or SIGTERM stops everything"

# --- foreground until a signal ---------------------------------------------------------------
status=0
wait "$gw_pid" || status=$?
gw_pid=''
tail -n 20 "$var/tollgate.log" >&2
die "tollgate serve exited on its own (status $status; log: var/tollgate.log)"
