#!/usr/bin/env bash
# A real Redis Cluster on loopback for the `scale` tests: 3 primaries + 3 replicas
# (redis-server --cluster-enabled yes, joined by redis-cli --cluster create).
#
#   spec/scale/cluster.sh start DIR   start it under DIR (ports: DIR/ports), wait until
#                                     every node says cluster_state:ok; writes DIR/env
#                                     (TOLLGATE_REDIS_CLUSTER=redis-cluster://...)
#   spec/scale/cluster.sh stop DIR    stop every node by the PID in DIR/redis-PORT.pid
#   spec/scale/cluster.sh node DIR PORT   (re)start one node (after a kill -9)
#
# cluster-node-timeout is 1000 ms, so a primary killed is replaced by its replica in
# about 2 s. No persistence but the cluster's own nodes-PORT.conf.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=spec/lib/services.sh
. "$here/../lib/services.sh"

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop|node DIR [PORT]" >&2; exit 2; }

node_start() { # PORT
  local p=$1
  redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "$dir/nodes-$p.conf" --cluster-node-timeout 1000 \
    --save "" --appendonly no --daemonize no --supervised no --pidfile "$dir/redis-$p.pid" \
    --dir "$dir" --logfile "$dir/redis-$p.log" </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/redis-$p.pid"
  for _ in $(seq 100); do
    redis-cli -p "$p" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.05
  done
  echo "redis node $p did not answer PING" >&2
  return 1
}

cluster_ok() { # every node answers cluster_state:ok and agrees on 3 primaries
  local p
  for p in $(cat "$dir/ports"); do
    redis-cli -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || return 1
  done
}

case "$cmd" in
start)
  mkdir -p "$dir"
  # 6 consecutive free ports below 22768 (each node's bus is its port + 10000)
  for _ in $(seq 50); do
    base=$(( $(tg_free_port) % 2700 + 20000 ))
    ok=1
    for i in 0 1 2 3 4 5; do
      if cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk 'NR>1{split($2,a,":");print a[2]}' |
        grep -qix "$(printf '%04X' $((base + i)))\|$(printf '%04X' $((base + i + 10000)))"; then ok=0; fi
    done
    [ "$ok" = 1 ] && break
  done
  ports=""
  for i in 0 1 2 3 4 5; do ports="$ports $((base + i))"; done
  echo $ports >"$dir/ports"
  for p in $ports; do node_start "$p"; done
  addrs=""
  for p in $ports; do addrs="$addrs 127.0.0.1:$p"; done
  # shellcheck disable=SC2086
  redis-cli --cluster create $addrs --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 || {
    cat "$dir/create.log" >&2; exit 1; }
  for _ in $(seq 200); do
    cluster_ok && break
    sleep 0.05
  done
  cluster_ok || { echo "the cluster did not reach cluster_state:ok" >&2; exit 1; }
  seeds=$(for p in $ports; do printf '127.0.0.1:%s,' "$p"; done)
  echo "TOLLGATE_REDIS_CLUSTER=redis-cluster://${seeds%,}" >"$dir/env"
  echo "cluster up: $ports"
  ;;
node)
  node_start "${3:?PORT}"
  ;;
stop)
  [ -f "$dir/ports" ] || exit 0
  for p in $(cat "$dir/ports"); do
    pid=$(cat "$dir/redis-$p.pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null || true
  done
  for p in $(cat "$dir/ports"); do
    pid=$(cat "$dir/redis-$p.pid" 2>/dev/null || true)
    [ -n "$pid" ] && { tg__wait_gone "$pid" 10 || kill -KILL "$pid" 2>/dev/null || true; }
  done
  echo "cluster stopped"
  ;;
*) echo "usage: $0 start|stop|node DIR [PORT]" >&2; exit 2 ;;
esac
