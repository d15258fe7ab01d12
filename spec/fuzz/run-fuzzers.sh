#!/bin/sh
# Runs every libFuzzer target of a fuzz build for a while and fails on any crash.
#
#   spec/fuzz/run-fuzzers.sh BUILD_DIR SECONDS [LIBFUZZER_FLAG...]
#
# Each BUILD_DIR/fuzz_<name> fuzzes for SECONDS (-max_total_time) on a temporary copy of
# spec/fuzz/corpus/fuzz_<name>/ (so the committed seeds never change), with
# spec/fuzz/fuzz_<name>.dict when it exists. A crash, leak, sanitizer report or broken
# invariant makes the script exit 1; the input that did it is kept in
# BUILD_DIR/fuzz-artifacts/fuzz_<name>/ (commit it to the corpus as a regression seed
# once fixed). New targets need nothing here: build a fuzz_<name> binary and give it a
# corpus folder.
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 BUILD_DIR SECONDS [LIBFUZZER_FLAG...]" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
secs=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tg-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

found=0
failed=0
for bin in "$build"/fuzz_*; do
    if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then
        continue
    fi
    name=$(basename "$bin")
    found=$((found + 1))
    work="$tmp/$name"
    mkdir -p "$work/corpus" "$work/artifacts"
    if [ -d "$here/corpus/$name" ]; then
        cp -R "$here/corpus/$name/." "$work/corpus/"
    else
        echo "warning: no seed corpus spec/fuzz/corpus/$name/" >&2
    fi
    dict=""
    [ -f "$here/$name.dict" ] && dict="-dict=$here/$name.dict"

    # -timeout: one input running 10 s is a hang; -rss_limit_mb: a runaway allocation.
    if "$bin" ${dict:+"$dict"} -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$@" "$work/corpus" \
        >"$work/log" 2>&1; then
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
        cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -n 1 || true)
        seeds=$(find "$work/corpus" -type f | wc -l)
        echo "ok   $name: ${execs:-?} executions in ${secs}s, $cov, corpus $seeds"
    else
        failed=$((failed + 1))
        keep="$build/fuzz-artifacts/$name"
        mkdir -p "$keep"
        cp -R "$work/artifacts/." "$keep/" 2>/dev/null || true
        cp "$work/log" "$keep/log"
        echo "FAIL $name: see $keep/ (log and crashing input)"
        grep -E 'ERROR|invariant|SUMMARY|Test unit written' "$work/log" | head -n 20 || true
    fi
done

if [ "$found" -eq 0 ]; then
    echo "no fuzz_* binaries in $build (configure with -DTG_FUZZ=ON)" >&2
    exit 1
fi
echo "$found fuzz targets, $failed failed"
[ "$failed" -eq 0 ]
