#!/usr/bin/env bash
# Gateway instances for the rolling-restart test (scale, #21): each NAME runs
# `tollgate serve -c DIR/NAME.lua` in the background, its PID in DIR/NAME.pid and its
# output appended to DIR/NAME.log; TG_BIN is the binary.
#
#   fleet_gw.sh start NAME DIR     start it (returns at once)
#   fleet_gw.sh stop NAME DIR      SIGTERM by its PID; wait until it has exited (drain included)
#   fleet_gw.sh restart NAME DIR   stop, then start: what `systemctl restart` does
set -euo pipefail

cmd=${1:-}; name=${2:-}; dir=${3:-}
if [ -z "$cmd" ] || [ -z "$name" ] || [ ! -d "$dir" ]; then echo "usage: $0 start|stop|restart NAME DIR" >&2; exit 2; fi
pidfile=$dir/$name.pid

start() {
  nohup "${TG_BIN:?}" serve -c "$dir/$name.lua" >>"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
}

stop() {
  [ -f "$pidfile" ] || return 0
  local pid
  pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
  for ((i = 0; i < 600; i++)); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
    sleep 0.05
  done
  echo "fleet_gw: $name (pid $pid) still running 30 s after SIGTERM; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
  return 1
}

case $cmd in
start) start ;;
stop) stop ;;
restart) stop; start ;;
*) echo "usage: $0 start|stop|restart NAME DIR" >&2; exit 2 ;;
esac
