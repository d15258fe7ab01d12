#!/usr/bin/env bash
# Before/after runs of the core, limits, billing and routing benchmarks for a change that
# must not move behaviour or figures (issue 16, the house restructuring): each script of
# spec/bench/ runs once with each binary, back to back, the order alternating from one
# script to the next (before/after, after/before, ...) so that a drift of the shared
# box's load does not favour one side, and with the scripts' short settings so that all
# of it fits in about a quarter of an hour. The scripts are this checkout's, for both
# binaries (the same method on both sides). Prints every run's Markdown, each headed by
# the binary; spec/bench/RESULTS.md ("House (issue 16)") is written from it, next to the
# instruction counts of core_callgrind.sh (which does not move with the load).
#
#   spec/bench/house_ab.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [SCRIPT...]
#
# Each BUILD_DIR holds a `tollgate` binary and, for limits_bench.sh's in-process section,
# libtollgate_core.a and libllhttp.a (a cmake build directory). SCRIPT: any of core,
# limits, billing, routing (default: all four, in that order). Settings: core_bench.sh
# with 2 rounds of 3 s, 2,000 held streams and no nginx streams; limits_bench.sh,
# billing_bench.sh and routing_bench.sh with --quick (routing also --no-perf).
# Everything each script starts it stops by PID itself.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_BUILD_DIR AFTER_BUILD_DIR [core|limits|billing|routing ...]" >&2; exit 2; }
BEFORE=$(cd "$1" && pwd) AFTER=$(cd "$2" && pwd)
shift 2
[ $# -gt 0 ] || set -- core limits billing routing
for d in "$BEFORE" "$AFTER"; do [ -x "$d/tollgate" ] || { log "$d/tollgate is missing"; exit 2; }; done

run_one() { # SCRIPT SIDE DIR
    local s=$1 side=$2 dir=$3 args=() env=()
    case $s in
    core) env=(TG_BENCH_ROUNDS=2 TG_BENCH_WRK_SECONDS=3 TG_BENCH_STREAMS=2000); args=(--no-nginx-streams) ;;
    limits) args=(--quick) ;;
    billing) args=(--quick) ;;
    routing) args=(--quick --no-perf) ;;
    *) log "unknown script $s"; exit 2 ;;
    esac
    echo "### $s, $side: $dir/tollgate (sha256 $(sha256sum "$dir/tollgate" | cut -c1-12)), load before: $(load_now)"
    echo ""
    env "${env[@]}" TG_BENCH_BIN="$dir/tollgate" "$BENCH/${s}_bench.sh" "${args[@]}" || echo "**${s}_bench.sh exited $? with the $side binary**"
    echo ""
}
i=0
for s in "$@"; do
    if [ $((i % 2)) = 0 ]; then
        run_one "$s" before "$BEFORE"; run_one "$s" after "$AFTER"
    else
        run_one "$s" after "$AFTER"; run_one "$s" before "$BEFORE"
    fi
    i=$((i + 1))
done
echo "load after: $(load_now)"
