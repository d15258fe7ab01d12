#!/usr/bin/env bash
# Redis Cluster against a single Redis (issue #21): the same billed deployment (limits on
# key and tenant: rpm, tpm, concurrency; billing on; one gateway worker) on a single
# redis-server over TCP and on a 3 primaries + 3 replicas cluster (spec/scale/cluster.sh),
# TG_BENCH_N (300) sequential non-stream requests each, after a warm-up. Reports Redis
# commands per request (INFO commandstats summed over every primary, CONFIG RESETSTAT
# first; the cluster's own CLUSTER / INFO traffic listed apart) and the gateway's
# instructions per request (callgrind on the whole gateway process, zeroed after the
# warm-up, dumped after the batch: load-independent).
#
# Usage: spec/bench/cluster_bench.sh [--keep] [BINARY]     (default build/tollgate)
# Everything started here is stopped by PID on exit; 127.0.0.1 only.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
BIN_ARG=""
for a in "$@"; do
    case $a in
    --keep) KEEP=1 ;;
    -*) echo "usage: $0 [--keep] [BINARY]" >&2; exit 2 ;;
    *) BIN_ARG=$a ;;
    esac
done
BIN=${BIN_ARG:-$ROOT/build/tollgate}
need node psql redis-server redis-cli valgrind callgrind_control callgrind_annotate
need_bin

bench_workdir cluster-bench
bench_services pg
cp "$BIN" "$T/tollgate" # a rebuild meanwhile cannot change what is measured
cat >"$T/tg-wrap" <<EOW
#!/bin/sh
# 'serve' runs under callgrind (its output file named by TG_CG_OUT); everything else as is.
if [ "\$1" = serve ] && [ -n "\${TG_CG_OUT:-}" ]; then
  exec valgrind --tool=callgrind --fair-sched=yes --instr-atstart=no --callgrind-out-file="\$TG_CG_OUT" "$T/tollgate" "\$@"
fi
exec "$T/tollgate" "\$@"
EOW
chmod +x "$T/tg-wrap"

next_port P_SINGLE
start redis-single "" redis-server --port "$P_SINGLE" --bind 127.0.0.1 --save '' --appendonly no
wait_port "$P_SINGLE"
bench_on_exit() { "$ROOT/spec/scale/cluster.sh" stop "$T/cluster" >/dev/null 2>&1 || true; }
"$ROOT/spec/scale/cluster.sh" start "$T/cluster" >/dev/null
CLUSTER=$(sed -n 's/^TOLLGATE_REDIS_CLUSTER=//p' "$T/cluster/env")

say "cluster_bench on $(git -C "$ROOT" rev-parse --short HEAD) ($(sha256sum "$BIN" | cut -c1-12)), $(date -u +%FT%TZ), load $(load_now)"
say ""
say "| Redis | requests | Redis commands / request | of which scripts | the rest | cluster upkeep / request | gateway instructions / request |"
say "|---|---:|---:|---:|---:|---:|---:|"
for target in "single redis://127.0.0.1:$P_SINGLE" "cluster $CLUSTER"; do
    set -- $target
    TG_BIN="$T/tg-wrap" TG_CG_DIR="$T" TOLLGATE_PG="$TOLLGATE_PG" TOLLGATE_REDIS="$2" TG_BENCH_PORTS="$(cat "$T/cluster/ports" 2>/dev/null)" \
        NODE_PATH="$ROOT/spec/node_modules" node "$BENCH/cluster_bench.mjs" "$1" | tee -a "$SUMMARY"
done
say ""
say "load average after: $(load_now)"
