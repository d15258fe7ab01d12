#!/usr/bin/env bash
# The test command: installs what is missing, builds, starts a private Postgres and
# Redis, and runs ctest in build/ with all of this script's arguments.
#
#   spec/run.sh                 everything
#   spec/run.sh -L limits       one label (any ctest arguments: -R REGEX, -j2, -V ...)
#   TG_SKIP_ASAN=1 spec/run.sh  skip the clang ASan/UBSan + fuzz build (quick local runs)
#   TG_CTEST_DIR=build-asan spec/run.sh -L routing
#                               run ctest in the sanitizer build instead: every test,
#                               integration ones included, then drives the ASan binary
#
# Tests see these environment variables:
#   TOLLGATE_PG      libpq conninfo of the private Postgres (database `tollgate`)
#   TOLLGATE_REDIS   unix:///…/redis.sock of the private Redis
#   TG_SOURCE_DIR    the repository root
#   TG_BUILD_DIR     the release build (build/)
#   TG_ASAN_BUILD    the sanitizer/fuzz build (build-asan/); with TG_SKIP_ASAN=1 a path
#                    that does not exist (build-asan.skipped), so asan variants skip
#   TG_TEST_TMP      a scratch directory (mode 755) removed at exit; the services live there
# Exits with ctest's status; the services are stopped by PID on any exit.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$root"
# shellcheck source=spec/lib/services.sh
. "$root/spec/lib/services.sh"

spec/install-deps.sh

# Exported before configuring: spec/tests.cmake reads TG_ASAN_BUILD at configure time.
export TG_SOURCE_DIR="$root"
export TG_BUILD_DIR="$root/build"
if [ "${TG_SKIP_ASAN:-0}" = 1 ]; then
  # A path that does not exist, so the asan variants skip instead of running a stale
  # build-asan/ left by an earlier run.
  export TG_ASAN_BUILD="$root/build-asan.skipped"
else
  export TG_ASAN_BUILD="$root/build-asan"
fi

jobs=${TG_BUILD_JOBS:-2}
echo "== release build: build/"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$jobs"

if [ "${TG_SKIP_ASAN:-0}" = 1 ]; then
  echo "== sanitizer build skipped (TG_SKIP_ASAN=1)"
else
  echo "== sanitizer + fuzz build: build-asan/"
  cmake -S . -B build-asan -DCMAKE_C_COMPILER=clang -DTG_SANITIZE=ON -DTG_FUZZ=ON
  cmake --build build-asan -j"$jobs"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-test.XXXXXX")
chmod 755 "$tmp"
export TG_TEST_TMP="$tmp"

# shellcheck disable=SC2317  # invoked by the traps
cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  if [ -n "${ctest_pid:-}" ] && kill -0 "$ctest_pid" 2>/dev/null; then
    kill -TERM -- "-$ctest_pid" 2>/dev/null || kill -TERM "$ctest_pid"
    tg__wait_gone "$ctest_pid" 10 || kill -KILL -- "-$ctest_pid" 2>/dev/null
  fi
  tg_redis_stop "$tmp/redis"
  tg_pg_stop "$tmp/pg"
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== services in $tmp"
tg_pg_start "$tmp/pg"
tg_redis_start "$tmp/redis"
echo "TOLLGATE_PG=$TOLLGATE_PG"
echo "TOLLGATE_REDIS=$TOLLGATE_REDIS"

echo "== ctest $* (in ${TG_CTEST_DIR:-build})"
cd "${TG_CTEST_DIR:-build}"
# ctest runs in the background in its own session (setsid execs in place here, so its
# PID is its process group) and we wait for it: a SIGINT/SIGTERM to this script then
# stops ctest and its tests at once, and the services after them.
status=0
launcher=()
command -v setsid >/dev/null 2>&1 && launcher=(setsid)
"${launcher[@]}" ctest --output-on-failure "$@" &
ctest_pid=$!
wait "$ctest_pid" || status=$?
exit "$status"
