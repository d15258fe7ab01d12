#!/usr/bin/env bash
# Account selection alone, in process (spec/bench/select_bench.c): CPU ns per selection
# with 1, 10, 100 and 10,000 accounts in a group (and 10,000 with 99% cooling), the new
# tg_select next to the selection before it (commit 5a9f6cb) in the same run, plus how
# evenly the requests spread. Then, when valgrind is installed, the instructions per
# selection of each case under callgrind (--toggle-collect on the selection function):
# a count that the machine's load does not change.
#
# Usage: spec/bench/select_bench.sh [calls (1000000)] [repeats (5)]
# Run it under the shared lock: flock /tmp/tg-bench.lock spec/bench/select_bench.sh
# Environment: TG_BENCH_BIN_DIR (default build/), TG_BENCH_CPU (the core to pin to, 1).
set -euo pipefail
# shellcheck source=spec/bench/lib.sh
. "$(dirname "$0")/lib.sh"

BIN=${TG_BENCH_BIN_DIR:-$ROOT/build}/tg_select_bench
CALLS=${1:-1000000}
REPEATS=${2:-5}
CPU=${TG_BENCH_CPU:-1}
[ -x "$BIN" ] || { echo "no $BIN (cmake --build build --target tg_select_bench)" >&2; exit 2; }

echo "## Selection alone, in process: $(basename "$BIN") $CALLS $REPEATS, pinned to core $CPU"
echo
echo "Load average before: $(load_now)"
echo
taskset -c "$CPU" "$BIN" "$CALLS" "$REPEATS" 2>/dev/null
echo
echo "Load average after: $(load_now)"
echo

command -v valgrind >/dev/null || { echo "(valgrind not installed: no instruction counts)"; exit 0; }
bench_workdir tg-select-bench
LABELS=("1" "10" "100" "10000" "10000 (100 usable, the rest cooling)")
echo "## Instructions per selection (callgrind, 10,000 selections per case after a warm-up)"
echo
echo "| accounts in the group | before (5a9f6cb) | tg_select |"
echo "|---|---|---|"
for i in "${!LABELS[@]}"; do
    row="| ${LABELS[$i]} |"
    for v in before tg_select; do
        fn=$([ $v = before ] && echo legacy_select || echo tg_select)
        valgrind --tool=callgrind --callgrind-out-file="$T/cg" --toggle-collect="$fn" \
            "$BIN" 10000 1 "$i" "$v" >/dev/null 2>"$T/err"
        calls=$(awk '/^selections/ {print $2}' "$T/err")
        ir=$(awk '/^summary:/ {print $2}' "$T/cg")
        row+=" $(awk -v a="$ir" -v b="$calls" 'BEGIN { printf "%.0f", a / b }') |"
    done
    echo "$row"
done
