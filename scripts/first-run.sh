#!/usr/bin/env bash
# Times a first `make test` as on a new machine: a clean clone of this checkout's HEAD, run
# by .ci/run with nothing cached (an empty HOME, so no ~/.cache/dra-scheduler; a fresh
# cargo registry; empty Go module and build caches). Debian packages and the Rust
# toolchain are this machine's. Needs about 25 GB of disk under WORK (default /tmp/first-run),
# which it removes at the end unless KEEP=1.
#
#   scripts/first-run.sh [WORK]      prints "rc=N seconds=S"; the log is WORK/run.log
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/first-run}
rm -rf "$work" && mkdir -p "$work/home"
git clone -q "$repo" "$work/repo"
export RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup} PYENV_ROOT=${PYENV_ROOT:-$HOME/.pyenv}
# Tools `go install` put in ~/go/bin are this machine's, not a new one's.
export PATH=${PATH//$HOME\/go\/bin:/}
export HOME=$work/home CARGO_HOME=$work/cargo GOPATH=$work/go GOCACHE=$work/go-build GOMODCACHE=$work/go/pkg/mod
cd "$work/repo"
start=$(date +%s)
CI=true bash .ci/run >"$work/run.log" 2>&1
rc=$?
echo "rc=$rc seconds=$(($(date +%s) - start)) commit=$(git rev-parse --short HEAD)" | tee "$work/result"
[[ ${KEEP:-0} == 1 ]] || rm -rf "$work/home" "$work/cargo" "$work/go" "$work/go-build"
exit "$rc"
