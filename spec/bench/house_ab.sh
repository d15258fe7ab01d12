#!/usr/bin/env bash
# Before/after runs of the core, limits, billing and routing benchmarks for a change that
# must not move behaviour or figures (issue 16, the house restructuring): each script of
# spec/bench/ runs once with each binary, back to back, the order alternating from one
# script to the next (before/after, after/before, ...) so that a drift of the shared
# box's load does not favour one side, and with the scripts' short settings so that all
# of it fits in about a quarter of an hour. Each side runs its own checkout's script
# with its own build (limits_bench.sh compiles an in-process benchmark against the
# checkout's headers and build/libtollgate_core.a, which must match); the run says when
# the two checkouts' scripts (work tree files) differ (then the methods differ too). Prints every run's
# Markdown, each headed by the side; spec/bench/RESULTS.md ("House (issue 16)") is
# written from it, next to the instruction counts of core_callgrind.sh (which do not
# move with the load).
#
#   spec/bench/house_ab.sh BEFORE_CHECKOUT AFTER_CHECKOUT [SCRIPT...]
#
# Each CHECKOUT is a work tree of the repository built into its build/ (cmake, as in
# the README) with spec/node_modules installed (spec/install-deps.sh). SCRIPT: any of core,
# limits, billing, routing (default: all four, in that order). Settings: core_bench.sh
# with 2 rounds of 3 s, 2,000 held streams and no nginx streams; limits_bench.sh,
# billing_bench.sh and routing_bench.sh with --quick (routing also --no-perf).
# Everything each script starts it stops by PID itself.
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_CHECKOUT AFTER_CHECKOUT [core|limits|billing|routing ...]" >&2; exit 2; }
BEFORE=$(cd "$1" && pwd) AFTER=$(cd "$2" && pwd)
shift 2
[ $# -gt 0 ] || set -- core limits billing routing
for d in "$BEFORE" "$AFTER"; do
    [ -x "$d/build/tollgate" ] || { log "$d/build/tollgate is missing (build it first)"; exit 2; }
    [ -d "$d/spec/node_modules" ] || { log "$d/spec/node_modules is missing (spec/install-deps.sh there)"; exit 2; }
done

run_one() { # SCRIPT SIDE DIR
    local s=$1 side=$2 dir=$3 args=() env=()
    case $s in
    core) env=(TG_BENCH_ROUNDS=2 TG_BENCH_WRK_SECONDS=3 TG_BENCH_STREAMS=2000); args=(--no-nginx-streams) ;;
    limits) args=(--quick) ;;
    billing) args=(--quick) ;;
    routing) args=(--quick --no-perf) ;;
    *) log "unknown script $s"; exit 2 ;;
    esac
    echo "### $s, $side: $(git -C "$dir" rev-parse --short HEAD), $dir/build/tollgate (sha256 $(sha256sum "$dir/build/tollgate" | cut -c1-12)), load before: $(load_now)"
    echo ""
    env "${env[@]}" TG_BENCH_BIN="$dir/build/tollgate" TG_BENCH_COMMIT="$(git -C "$dir" rev-parse --short HEAD)" \
        "$dir/spec/bench/${s}_bench.sh" "${args[@]}" || echo "**${s}_bench.sh exited $? with the $side binary**"
    echo ""
}
i=0
for s in "$@"; do
    if ! diff -q "$BEFORE/spec/bench/${s}_bench.sh" "$AFTER/spec/bench/${s}_bench.sh" >/dev/null ||
        ! diff -q "$BEFORE/spec/bench/lib.sh" "$AFTER/spec/bench/lib.sh" >/dev/null; then
        echo "(${s}_bench.sh or lib.sh differ between the two checkouts: the methods may differ)"
    fi
    if [ $((i % 2)) = 0 ]; then
        run_one "$s" before "$BEFORE"; run_one "$s" after "$AFTER"
    else
        run_one "$s" after "$AFTER"; run_one "$s" before "$BEFORE"
    fi
    i=$((i + 1))
done
echo "load after: $(load_now)"
