#!/bin/sh
# A fuzz campaign (outside CI): every libFuzzer target of a fuzz build for a fixed budget
# of executions, one after the other on one core, with a table of executions, coverage
# and crashes at the end.
#
#   spec/fuzz/campaign.sh [BUILD_DIR]          default build-asan/ (see spec/fuzz.cmake)
#
#   TG_FUZZ_RUNS=N         executions per target (default 10000000)
#   TG_FUZZ_MAX_SECONDS=S  stop a target after S seconds even if N is not reached
#                          (default 0: no time cap); the table says which stopped early
#   TG_FUZZ_RECORD=1       append the table to spec/bench/RESULTS.md ("fuzz campaign")
#
# Each target runs on a copy of its seed corpus (spec/fuzz/corpus/fuzz_<name>/, never
# changed) with its dictionary, -timeout=10 (an input running 10 s is a hang) and
# -rss_limit_mb=2048. A crash, leak, sanitizer report or broken invariant stops that
# target; its input and log are kept in BUILD_DIR/fuzz-campaign/fuzz_<name>/ and the
# script exits 1 after the other targets ran. Targets are found like run-fuzzers.sh
# does: every BUILD_DIR/fuzz_* binary.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build-asan}" && pwd)
runs=${TG_FUZZ_RUNS:-10000000}
maxs=${TG_FUZZ_MAX_SECONDS:-0}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tg-campaign.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

table="$tmp/table.md"
{
    echo "| target | executions | seconds | exec/s | cov (edges) | features | corpus (seeds → end) | crashes | stopped by |"
    echo "|---|---:|---:|---:|---:|---:|---|---:|---|"
} >"$table"

found=0
failed=0
total_start=$(date +%s)
for bin in "$build"/fuzz_*; do
    [ -f "$bin" ] && [ -x "$bin" ] || continue
    name=$(basename "$bin")
    found=$((found + 1))
    work="$tmp/$name"
    mkdir -p "$work/corpus" "$work/artifacts"
    [ -d "$here/corpus/$name" ] && cp -R "$here/corpus/$name/." "$work/corpus/"
    seeds=$(find "$work/corpus" -type f | wc -l)
    dict=""
    [ -f "$here/$name.dict" ] && dict="-dict=$here/$name.dict"
    echo "== $name: $runs executions${maxs:+ (cap ${maxs}s)}" >&2
    start=$(date +%s)
    status=ok
    # shellcheck disable=SC2086  # dict is one optional word
    if ! "$bin" $dict -runs="$runs" -max_total_time="$maxs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1; then
        status=crash
    fi
    secs=$(( $(date +%s) - start ))
    [ "$secs" -gt 0 ] || secs=1
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
    execs=${execs:-0}
    cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -n 1 | sed 's/cov: //')
    ft=$(grep -o 'ft: [0-9]*' "$work/log" | tail -n 1 | sed 's/ft: //')
    endc=$(find "$work/corpus" -type f | wc -l)
    crashes=$(find "$work/artifacts" -type f | wc -l)
    if [ "$status" = crash ] || [ "$crashes" -gt 0 ]; then
        failed=$((failed + 1))
        keep="$build/fuzz-campaign/$name"
        mkdir -p "$keep"
        cp -R "$work/artifacts/." "$keep/" 2>/dev/null || true
        cp "$work/log" "$keep/log"
        grep -E 'ERROR|invariant|SUMMARY|Test unit written' "$work/log" | head -n 20 >&2 || true
        stop="crash (see $keep/)"
    elif [ "$execs" -ge "$runs" ]; then
        stop="budget"
    else
        stop="time cap"
    fi
    echo "| $name | $execs | $secs | $((execs / secs)) | ${cov:-?} | ${ft:-?} | $seeds → $endc | $crashes | $stop |" >>"$table"
    echo "   $execs executions in ${secs}s, cov ${cov:-?}, crashes $crashes ($stop)" >&2
done

if [ "$found" -eq 0 ]; then
    echo "no fuzz_* binaries in $build (configure with -DTG_FUZZ=ON)" >&2
    exit 1
fi
total=$(( $(date +%s) - total_start ))
cat "$table"
echo "$found targets, $failed with crashes, ${total}s"

if [ "${TG_FUZZ_RECORD:-0}" = 1 ]; then
    commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')
    {
        echo
        echo "## fuzz campaign"
        echo
        echo "\`spec/fuzz/campaign.sh\` on commit $commit, $(date -u +%Y-%m-%d), one core of the shared 2-core VM,"
        echo "budget $runs executions per target$( [ "$maxs" -gt 0 ] && echo ", capped at ${maxs} s per target"); ${total} s in all, $failed target(s) with crashes."
        echo
        cat "$table"
    } >>"$root/spec/bench/RESULTS.md"
fi
[ "$failed" -eq 0 ]
