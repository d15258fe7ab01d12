#!/usr/bin/env bash
# Install everything tollgate needs to build, test and run on Debian 12, from Debian's
# packages and the npm registry only. Idempotent: packages already installed are not
# touched, `apt-get update` runs only when something is missing, and `npm ci` runs in
# spec/ only when spec/node_modules is missing or package(-lock).json changed.
#
#   spec/install-deps.sh            build + run + test/bench deps, then npm ci in spec/
#   spec/install-deps.sh --run      only what building and running tollgate need
#                                   (same as TG_DEPS_RUN_ONLY=1; used by the quickstart)
#
# Quiet on success: one summary line; the details go to $TG_DEPS_LOG
# (default ${TMPDIR:-/tmp}/tollgate-install-deps.log). Loud on failure: the log's tail
# goes to stderr and the exit status is non-zero. Needs root (or passwordless sudo)
# only when something has to be installed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run_only=${TG_DEPS_RUN_ONLY:-0}
for arg in "$@"; do
  case $arg in
    --run|--run-only) run_only=1 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log=${TG_DEPS_LOG:-${TMPDIR:-/tmp}/tollgate-install-deps.log}
: >"$log"
export DEBIAN_FRONTEND=noninteractive

fail() {
  echo "install-deps: FAILED: $*" >&2
  echo "install-deps: last lines of $log:" >&2
  tail -n 40 "$log" >&2 || true
  exit 1
}

# What building and running tollgate needs (the quickstart), then tests and benchmarks.
build_pkgs=(cmake gcc make pkg-config libluajit2-5.1-dev luajit2 libuv1-dev node-llhttp
  libhiredis-dev libpq-dev libssl-dev lua-cjson lua-cjson-dev libjansson-dev)
run_pkgs=(redis-server postgresql openssl curl procps psmisc util-linux)
test_pkgs=(clang libclang-rt-14-dev nginx wrk chromium chromium-driver shellcheck haproxy systemd)
# Debian's `luajit` conflicts with libluajit2-5.1-dev: we use luajit2 (see above).

wanted=("${build_pkgs[@]}" "${run_pkgs[@]}")
[ "$run_only" = 1 ] || wanted+=("${test_pkgs[@]}")

# Node.js: keep a working node (these machines ship v20 with its own npm); install
# Debian's only when the command is missing.
if [ "$run_only" != 1 ]; then
  if ! command -v node >/dev/null 2>&1 || ! node --version >/dev/null 2>&1; then
    wanted+=(nodejs)
    command -v npm >/dev/null 2>&1 || wanted+=(npm)
  elif ! command -v npm >/dev/null 2>&1; then
    wanted+=(npm)
  fi
fi

# One dpkg-query for all: a package counts as present when it is fully installed.
declare -A have=()
while read -r name status; do
  [ "$status" = installed ] && have[${name%%:*}]=1
done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${wanted[@]}" 2>/dev/null || true)
missing=()
for p in "${wanted[@]}"; do
  [ -n "${have[$p]:-}" ] || missing+=("$p")
done

summary=()
if [ ${#missing[@]} -gt 0 ]; then
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "not root and no sudo; missing: ${missing[*]}"
    sudo=(sudo -n)
  fi
  apt_opts=(-y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef
    -o Dpkg::Options::=--force-confold)
  echo "== apt-get update (missing: ${missing[*]})" >>"$log"
  ok=0
  for try in 1 2 3; do
    if "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q \
        -o DPkg::Lock::Timeout=600 >>"$log" 2>&1; then ok=1; break; fi
    echo "== apt-get update failed (try $try)" >>"$log"; sleep $((try * 5))
  done
  [ $ok = 1 ] || fail "apt-get update"
  echo "== apt-get install ${missing[*]}" >>"$log"
  ok=0
  for try in 1 2; do
    if "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" \
        "${missing[@]}" >>"$log" 2>&1; then ok=1; break; fi
    echo "== apt-get install failed (try $try)" >>"$log"; sleep 5
  done
  [ $ok = 1 ] || fail "apt-get install ${missing[*]}"
  summary+=("installed ${missing[*]}")
else
  summary+=("${#wanted[@]} Debian packages present")
fi

# npm ci in a folder when node_modules is missing or the lock (or package.json) changed:
# spec/ (test clients) unless --run, and admin-ui/ (the console, embedded by the build)
# whenever npm is there.
npm_ci() {
  local dir=$1
  [ -f "$dir/package-lock.json" ] || return 0
  local stamp="$dir/node_modules/.tg-lock.sha256" want
  want=$(cat "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -d' ' -f1)
  if [ -d "$dir/node_modules" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    summary+=("$(basename "$dir")/node_modules up to date")
    return 0
  fi
  echo "== npm ci in $dir" >>"$log"
  local ok=0 try
  for try in 1 2 3; do
    if (cd "$dir" && npm ci --no-audit --no-fund --loglevel=warn </dev/null) >>"$log" 2>&1
    then ok=1; break; fi
    echo "== npm ci failed (try $try)" >>"$log"; sleep $((try * 5))
  done
  [ $ok = 1 ] || fail "npm ci in $dir"
  echo "$want" >"$stamp"
  summary+=("npm ci in $(basename "$dir") done")
}
if [ "$run_only" != 1 ]; then
  npm_ci "$here"
fi
if command -v npm >/dev/null 2>&1; then
  npm_ci "$(cd "$here/.." && pwd)/admin-ui"
fi

# A last check of what the build really needs, so a broken install is caught here.
pkg-config --exists luajit libuv hiredis libpq openssl jansson >>"$log" 2>&1 ||
  fail "pkg-config cannot find luajit libuv hiredis libpq openssl jansson"
[ -f /usr/share/llhttp/llhttp.c ] || fail "node-llhttp sources missing in /usr/share/llhttp"
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || fail "postgresql initdb not found"
command -v redis-server >/dev/null 2>&1 || fail "redis-server not found"

joined=$(IFS=';'; echo "${summary[*]}")
echo "install-deps: ok: ${joined//;/; } (log: $log)"
