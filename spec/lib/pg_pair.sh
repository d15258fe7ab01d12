#!/usr/bin/env bash
# A streaming-replication Postgres pair for the failover tests (scale, #21): a primary
# and a hot standby made from it with pg_basebackup -R, each on its own unix socket
# directory (no TCP port), synchronous replication (a commit the gateway saw is on the
# standby too, so a promotion loses none of it).
#
#   spec/lib/pg_pair.sh start DIR   primary in DIR/a, standby in DIR/b, database
#                                   `tollgate`; writes DIR/conninfo:
#                                   host=DIR/a,DIR/b dbname=tollgate user=postgres
#                                   target_session_attrs=read-write
#   spec/lib/pg_pair.sh stop DIR    stops both (fast shutdown, by the PIDs in their
#                                   pidfiles) and removes DIR
#
# The tests stop the primary (`pg_ctl stop -m immediate`) and promote the standby
# (`pg_ctl promote`) themselves; DIR/bindir names the server binaries they use, DIR/as_pg
# the command prefix that runs them as the data's owner.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
# shellcheck source=spec/lib/services.sh
. "$root/spec/lib/services.sh"

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then echo "usage: $0 start|stop DIR" >&2; exit 2; fi

stop_one() {
  local data=$1 pid
  [ -f "$data/postmaster.pid" ] || return 0
  pid=$(head -n 1 "$data/postmaster.pid")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -INT "$pid" 2>/dev/null || return 0
  tg__wait_gone "$pid" 20 || { kill -KILL "$pid" 2>/dev/null; tg__wait_gone "$pid" 5; }
}

case $cmd in
start)
  mkdir -p "$dir/a" "$dir/b"
  chmod 755 "$dir" "$dir/a" "$dir/b"
  dir=$(tg__abs "$dir")
  bindir=$(tg__pg_bindir)
  [ "$(id -u)" = 0 ] && chown postgres: "$dir/a" "$dir/b"
  # The primary: spec/lib/services.sh's private server, database `tollgate` included
  # (wal_level replica and max_wal_senders 10 are the defaults).
  tg_pg_start "$dir/a" >/dev/null
  pa="host=$dir/a user=postgres"
  # The standby: a base backup with its primary_conninfo and standby.signal (-R); its
  # socket directory is its own (the copied postgresql.conf names the primary's).
  tg__as_pg "$bindir/pg_basebackup" -h "$dir/a" -U postgres -D "$dir/b/pgdata" -R -X stream -c fast --no-sync \
    >"$dir/basebackup.log" 2>&1 || { cat "$dir/basebackup.log" >&2; exit 1; }
  tg__as_pg "$bindir/pg_ctl" -D "$dir/b/pgdata" -l "$dir/b/pg.log" -w -t 60 \
    -o "-c unix_socket_directories='$dir/b' -c listen_addresses='' -c hot_standby=on" start >/dev/null
  for ((i = 0; i < 100; i++)); do
    n=$("$bindir/psql" -X -Atq -d "$pa dbname=postgres" -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
    [ "$n" = 1 ] && break
    sleep 0.1
  done
  [ "$n" = 1 ] || { echo "pg_pair: the standby is not streaming" >&2; tail -n 20 "$dir/b/pg.log" >&2; exit 1; }
  # Synchronous from now on (the standby is connected, so nothing waits for it to come):
  # a commit returns once the standby has it. Set on the primary only (ALTER SYSTEM
  # after the base backup), so the promoted standby does not wait for a standby of its own.
  "$bindir/psql" -X -q -d "$pa dbname=postgres" -v ON_ERROR_STOP=1 \
    -c "ALTER SYSTEM SET synchronous_standby_names = '*'" -c "ALTER SYSTEM SET synchronous_commit = on" \
    -c "SELECT pg_reload_conf()" >/dev/null
  echo "host=$dir/a,$dir/b dbname=tollgate user=postgres target_session_attrs=read-write" >"$dir/conninfo"
  echo "$bindir" >"$dir/bindir"
  if [ "$(id -u)" = 0 ]; then echo "runuser -u postgres --" >"$dir/as_pg"; else : >"$dir/as_pg"; fi
  echo "pg_pair: primary $dir/a, standby $dir/b (streaming, synchronous)"
  ;;
stop)
  [ -d "$dir" ] || exit 0
  stop_one "$dir/a/pgdata"
  stop_one "$dir/b/pgdata"
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
