# shellcheck shell=bash
# Private Postgres and Redis for tests and the quickstart: unix sockets only (no TCP
# port is opened), everything under one directory, each stopped by its own PID.
# Source it:  . spec/lib/services.sh
#
#   tg_pg_start DIR     initdb DIR/pgdata (once), start postgres with its socket in DIR,
#                       create database `tollgate`; exports
#                       TOLLGATE_PG="host=DIR dbname=tollgate user=postgres"
#   tg_pg_stop DIR      fast shutdown of that postgres by the PID in DIR/pgdata/postmaster.pid
#   tg_redis_start DIR  redis-server, no TCP port, socket DIR/redis.sock, no persistence;
#                       exports TOLLGATE_REDIS=unix://DIR/redis.sock
#   tg_redis_stop DIR   stop that redis by the PID in DIR/redis.pid
#   tg_free_port        print a free TCP port on 127.0.0.1
#
# DIR must be absolute or is made so. Postgres refuses to run as root, so when these
# run as root the server runs as the `postgres` user (created by Debian's postgresql
# package) and DIR is chowned to it: DIR and every parent of DIR must be traversable
# (o+x) by that user. A directory from `mktemp -d` under /tmp with `chmod 755` is; a
# checkout under /root (mode 700) is not. As a normal user the server runs as that user.
# Unix socket paths are limited to 107 bytes, so keep DIR shorter than ~90 characters.
# Data survives a stop/start in the same DIR (the quickstart keeps ./var); tests use a
# fresh temporary DIR. fsync is off: this is for tests and demos, not for production.

tg__abs() { (cd "$1" && pwd -P); }

tg__log() { echo "services: $*" >&2; }

# tg__as_pg CMD...: run CMD as the user that owns the Postgres data.
tg__as_pg() {
  # From / so that a cwd the postgres user cannot read (say /root) does not matter.
  if [ "$(id -u)" = 0 ]; then
    if command -v runuser >/dev/null 2>&1; then
      (cd / && runuser -u postgres -- "$@")
    else
      local q
      q=$(printf '%q ' "$@")
      (cd / && su postgres -s /bin/sh -c "$q")
    fi
  else
    (cd / && "$@")
  fi
}

tg__pg_bindir() {
  local d
  d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  if [ ! -x "$d/initdb" ]; then
    tg__log "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (run spec/install-deps.sh)"
    return 1
  fi
  echo "$d"
}

# tg__wait_gone PID SECONDS: wait until PID has exited; 0 if it did.
tg__wait_gone() {
  local pid=$1 i
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  ! kill -0 "$pid" 2>/dev/null
}

tg_pg_start() {
  local dir bindir data pid i
  [ -n "${1:-}" ] || { tg__log "usage: tg_pg_start DIR"; return 2; }
  mkdir -p "$1" || return 1
  dir=$(tg__abs "$1") || return 1
  bindir=$(tg__pg_bindir) || return 1
  data=$dir/pgdata

  if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
      tg__log "user postgres missing (install Debian's postgresql package)"
      return 1
    fi
    chown postgres: "$dir" || return 1
    [ -d "$data" ] && chown -R postgres: "$data"
    if ! tg__as_pg test -w "$dir" -a -x "$dir"; then
      tg__log "$dir is not reachable by user postgres: every parent directory needs o+x" \
        "(use a directory under /tmp from mktemp -d, chmod 755)"
      return 1
    fi
  fi

  if [ -f "$data/postmaster.pid" ]; then
    pid=$(head -n 1 "$data/postmaster.pid")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      tg__log "postgres already running in $dir (pid $pid)"
      export TOLLGATE_PG="host=$dir dbname=tollgate user=postgres"
      return 0
    fi
  fi

  if [ ! -f "$data/PG_VERSION" ]; then
    rm -rf "$data"
    if ! tg__as_pg "$bindir/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-locale \
        --no-sync >"$dir/initdb.log" 2>&1; then
      tg__log "initdb failed:"; tail -n 20 "$dir/initdb.log" >&2
      return 1
    fi
    {
      echo "# tollgate private test server (spec/lib/services.sh)"
      echo "listen_addresses = ''"
      echo "unix_socket_directories = '$dir'"
      echo "unix_socket_permissions = 0777"
      echo "fsync = off"
      echo "synchronous_commit = off"
      echo "full_page_writes = off"
      echo "max_connections = 200"
      echo "shared_buffers = 128MB"
      echo "log_min_messages = warning"
    } | tg__as_pg tee -a "$data/postgresql.conf" >/dev/null
  fi

  # pg_ctl detaches the postmaster in its own session, with its output in pg.log.
  if ! tg__as_pg "$bindir/pg_ctl" -D "$data" -l "$dir/pg.log" -w -t 60 \
      -o "-c unix_socket_directories='$dir' -c listen_addresses=''" start >/dev/null 2>&1; then
    tg__log "postgres failed to start:"; tail -n 20 "$dir/pg.log" >&2
    return 1
  fi
  for ((i = 0; i < 100; i++)); do
    "$bindir/pg_isready" -q -h "$dir" -U postgres && break
    sleep 0.1
  done
  if ! "$bindir/psql" -h "$dir" -U postgres -d postgres -Atqc \
      "SELECT 1 FROM pg_database WHERE datname = 'tollgate'" | grep -q 1; then
    "$bindir/createdb" -h "$dir" -U postgres tollgate || {
      tg__log "createdb tollgate failed"; return 1; }
  fi
  export TOLLGATE_PG="host=$dir dbname=tollgate user=postgres"
}

tg_pg_stop() {
  local dir pidfile pid
  [ -n "${1:-}" ] || { tg__log "usage: tg_pg_stop DIR"; return 2; }
  [ -d "$1" ] || return 0
  dir=$(tg__abs "$1") || return 0
  pidfile=$dir/pgdata/postmaster.pid
  [ -f "$pidfile" ] || return 0
  pid=$(head -n 1 "$pidfile")
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then return 0; fi
  kill -INT "$pid" 2>/dev/null || return 0 # fast shutdown
  tg__wait_gone "$pid" 30 && return 0
  tg__log "postgres $pid ignored SIGINT for 30s; sending SIGQUIT"
  kill -QUIT "$pid" 2>/dev/null
  tg__wait_gone "$pid" 10 && return 0
  kill -KILL "$pid" 2>/dev/null
  tg__wait_gone "$pid" 5
}

tg_redis_start() {
  local dir sock pid i
  [ -n "${1:-}" ] || { tg__log "usage: tg_redis_start DIR"; return 2; }
  mkdir -p "$1" || return 1
  dir=$(tg__abs "$1") || return 1
  sock=$dir/redis.sock
  command -v redis-server >/dev/null 2>&1 || {
    tg__log "redis-server not found (run spec/install-deps.sh)"; return 1; }

  if [ -f "$dir/redis.pid" ]; then
    pid=$(cat "$dir/redis.pid")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
        redis-cli -s "$sock" ping 2>/dev/null | grep -q PONG; then
      tg__log "redis already running in $dir (pid $pid)"
      export TOLLGATE_REDIS="unix://$sock"
      return 0
    fi
    rm -f "$dir/redis.pid"
  fi
  rm -f "$sock"

  # In its own session (setsid) so a terminal's Ctrl-C reaches only our caller, which
  # stops it in order; redis writes its PID to DIR/redis.pid, which tg_redis_stop uses.
  local launcher=()
  command -v setsid >/dev/null 2>&1 && launcher=(setsid)
  "${launcher[@]}" redis-server --port 0 --unixsocket "$sock" \
    --unixsocketperm 777 --daemonize no --supervised no --pidfile "$dir/redis.pid" \
    --dir "$dir" --save '' --appendonly no --logfile '' \
    </dev/null >>"$dir/redis.log" 2>&1 &
  local bgpid=$!
  for ((i = 0; i < 100; i++)); do
    if redis-cli -s "$sock" ping 2>/dev/null | grep -q PONG; then
      # setsid execs in place unless our job is a process group leader (interactive
      # shells), in which case the pidfile is the only right PID.
      [ -s "$dir/redis.pid" ] || echo "$bgpid" >"$dir/redis.pid"
      export TOLLGATE_REDIS="unix://$sock"
      return 0
    fi
    sleep 0.1
  done
  tg__log "redis did not answer PING on $sock within 10s:"
  tail -n 20 "$dir/redis.log" >&2
  kill "$bgpid" 2>/dev/null
  return 1
}

tg_redis_stop() {
  local dir pid
  [ -n "${1:-}" ] || { tg__log "usage: tg_redis_stop DIR"; return 2; }
  [ -d "$1" ] || return 0
  dir=$(tg__abs "$1") || return 0
  [ -f "$dir/redis.pid" ] || return 0
  pid=$(cat "$dir/redis.pid")
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    rm -f "$dir/redis.pid" "$dir/redis.sock"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null
  if ! tg__wait_gone "$pid" 15; then
    tg__log "redis $pid ignored SIGTERM for 15s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null
    tg__wait_gone "$pid" 5
  fi
  rm -f "$dir/redis.pid" "$dir/redis.sock"
}

# tg_free_port: a TCP port on 127.0.0.1 that nothing listens on or uses right now,
# chosen at random in 20000-32767, below Linux's ephemeral range (32768-60999), so that
# outgoing connections will not take it before the caller binds it.
tg_free_port() {
  local used port i
  used=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk 'NR > 1 { split($2, a, ":"); print a[2] }')
  for ((i = 0; i < 200; i++)); do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 12768))
    if ! grep -qix "$(printf '%04X' "$port")" <<<"$used"; then
      echo "$port"
      return 0
    fi
  done
  tg__log "no free port found"
  return 1
}
