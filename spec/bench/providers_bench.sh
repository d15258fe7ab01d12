#!/usr/bin/env bash
# The cost of the provider translations (issue #19): builds tg_providers_bench, prints
# the CPU-time table (translated vs passthrough, per request, per answer, per streamed
# chunk, for each client protocol served by a Gemini account; per request and per
# streamed chunk for a Bedrock account against an Anthropic one) and the instructions per
# operation counted by callgrind (--toggle-collect=measured, N operations, divided).
#
#   spec/bench/providers_bench.sh [BUILD_DIR] [ITERATIONS]
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$repo/build}
n=${2:-2000}
[ -f "$build/CMakeCache.txt" ] || cmake -S "$repo" -B "$build" >/dev/null
cmake --build "$build" --target tg_providers_bench >/dev/null
bin=$build/tg_providers_bench
"$bin" "$n"
command -v valgrind >/dev/null || { echo "valgrind not found: no instruction counts"; exit 0; }
echo
echo "| operation | client | translated Ir/op | passthrough Ir/op | extra Ir/op |"
echo "|---|---|---:|---:|---:|"
ir() { # CASE N -> instructions per operation
    local out
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect=measured "$bin" --one "$1" "$2" >/dev/null 2>&1
    awk -v n="$2" '/^summary:/ {printf "%.0f", $2 / n}' "$out"
    rm -f "$out"
}
for what in request answer chunk; do
    for client in chat anthropic responses; do
        reps=200
        per=1
        [ "$what" = chunk ] && reps=2 && per=1001
        t=$(ir "$what:$client" "$reps")
        p=$(ir "${what}_pass:$client" "$reps")
        echo "| $what | $client | $((t / per)) | $((p / per)) | $(((t - p) / per)) |"
    done
done
echo
echo "| Bedrock (vs an Anthropic account) | client | bedrock Ir/op | anthropic Ir/op | extra Ir/op |"
echo "|---|---|---:|---:|---:|"
for what in request chunk; do
    for client in chat anthropic responses; do
        reps=200
        per=1
        [ "$what" = chunk ] && reps=2 && per=1005
        t=$(ir "bedrock_$what:$client" "$reps")
        p=$(ir "anthropic_$what:$client" "$reps")
        echo "| $what | $client | $((t / per)) | $((p / per)) | $(((t - p) / per)) |"
    done
done
