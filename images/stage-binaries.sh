#!/usr/bin/env bash
# What the images take from the Cargo build: both binaries without their debug info
# (function names stay, for backtraces) and the node agent's fake-backend profiles. The
# release profile already leaves debug info out (Cargo.toml); stripping here keeps it out
# of the images whatever profile BIN_DIR was built with (the tests hand in debug builds).
# The Dockerfile's `binaries` stage runs it after `cargo build --release`;
# images/build-local.sh runs it on this machine's build.
#
#   images/stage-binaries.sh BIN_DIR OUT
#
# BIN_DIR holds dra-scheduler and dra-node-agent (target/release); OUT must not exist.
set -euo pipefail

bin=${1:?usage: images/stage-binaries.sh BIN_DIR OUT}
out=${2:?usage: images/stage-binaries.sh BIN_DIR OUT}
repo=$(cd "$(dirname "$0")/.." && pwd)

if [[ -e $out ]]; then
  echo "stage-binaries.sh: $out exists" >&2
  exit 1
fi
for b in dra-scheduler dra-node-agent; do
  if [[ ! -x $bin/$b ]]; then
    echo "stage-binaries.sh: $bin/$b is missing (cargo build --release -p $b --bin $b)" >&2
    exit 1
  fi
done

mkdir -p "$out/profiles"
for b in dra-scheduler dra-node-agent; do
  strip --strip-debug -o "$out/$b" "$bin/$b"
done
cp "$repo"/crates/dra-node-agent/profiles/*.yaml "$out/profiles/"
chmod 0755 "$out/dra-scheduler" "$out/dra-node-agent"
chmod 0644 "$out"/profiles/*.yaml
