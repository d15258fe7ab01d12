#!/usr/bin/env bash
# The quota headers' cost per request (#20): ns per request (tg_quota_bench, best of 3
# runs of 2M) and instructions per request (callgrind, 100k requests per header set,
# minus the program's fixed start-up counted with 0 requests).
#
#   spec/bench/quota_bench.sh [build dir]      default: build
set -euo pipefail
B=${1:-build}
BIN=$B/tg_quota_bench
[ -x "$BIN" ] || { echo "build $BIN first (cmake --build $B --target tg_quota_bench)" >&2; exit 2; }
echo "## time (best of 3)"
for i in 1 2 3; do "$BIN" 2000000; done | sort -t'|' -k4 -n | awk -F'|' 'NF>3 && $2 !~ /headers|---/ { k=$2; if (!(k in best) || $4+0 < best[k]+0) best[k]=$4 } END { for (k in best) printf "|%s|%s|\n", k, best[k] }'
echo "## instructions per request (callgrind)"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
count() { valgrind --tool=callgrind --callgrind-out-file="$T/cg" "$BIN" "$1" "$2" >/dev/null 2>&1; grep -m1 '^summary:' "$T/cg" | awk '{print $2}'; }
echo "| headers | instructions / request |"
echo "|---|---:|"
for s in openai anthropic unified codex none; do
    base=$(count 0 "$s")
    n=$(count 100000 "$s")
    awk -v a="$n" -v b="$base" -v s="$s" 'BEGIN { printf "| %s | %.0f |\n", s, (a - b) / 100000 }'
done
