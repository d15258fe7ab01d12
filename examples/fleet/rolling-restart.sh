#!/usr/bin/env bash
# A zero-downtime rolling restart (or upgrade: install the new binary first) of the
# tollgate instances behind a balancer that health-checks GET /readyz
# (examples/fleet/haproxy.cfg). One instance at a time:
#
#   1. restart it: TG_RESTART_CMD with %s replaced by its name (default
#      `ssh %s systemctl restart tollgate`: NAME is the host running
#      examples/systemd/tollgate.service). The stop is SIGTERM: /readyz turns 503, the
#      balancer takes the instance out within fall × inter, the listeners close after
#      limits.drain_delay_ms, requests in flight finish; then the new process starts.
#   2. wait until its /readyz answers 200 (every worker has its account snapshot),
#   3. wait TG_LB_RISE_MS (default 1000: at least rise × inter) for the balancer to send
#      it traffic again before the next instance goes down.
#
#   usage: rolling-restart.sh NAME=HOST:PORT...
#   e.g.   rolling-restart.sh gw-a=10.0.0.5:8080 gw-b=10.0.0.6:8080
#
# Exits 1 naming the instance that did not become ready within TG_READY_TIMEOUT_S
# (default 60): the rest are left alone, still serving.
set -euo pipefail

restart_cmd=${TG_RESTART_CMD:-ssh %s systemctl restart tollgate}
rise_ms=${TG_LB_RISE_MS:-1000}
ready_timeout=${TG_READY_TIMEOUT_S:-60}

[ $# -ge 1 ] || { echo "usage: $0 NAME=HOST:PORT..." >&2; exit 2; }
for inst in "$@"; do
  [[ $inst == *=*:* ]] || { echo "rolling-restart: \"$inst\" is not NAME=HOST:PORT" >&2; exit 2; }
done

ready() { [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://$1/readyz")" = 200 ]; }

for inst in "$@"; do
  name=${inst%%=*}
  addr=${inst#*=}
  echo "rolling-restart: $name ($addr): restarting"
  bash -c "${restart_cmd//%s/$name}"
  deadline=$((SECONDS + ready_timeout))
  until ready "$addr"; do
    if [ $SECONDS -ge $deadline ]; then
      echo "rolling-restart: $name ($addr) is not ready after ${ready_timeout} s; stopping here" >&2
      exit 1
    fi
    sleep 0.1
  done
  sleep "$(awk "BEGIN { print $rise_ms / 1000 }")"
  echo "rolling-restart: $name ($addr): ready"
done
echo "rolling-restart: done ($# instances)"
