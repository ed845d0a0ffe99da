#!/usr/bin/env bash
# Builds promtool (github.com/prometheus/prometheus/cmd/promtool, the module version go.mod
# pins) from Go modules, once per machine, into
# ~/.cache/dra-scheduler/promtool-<version>/promtool; prints that path. Nothing is
# downloaded but Go modules, and a present binary is kept as it is.
#
# Built with the tag remove_all_sd: promtool registers every service discovery Prometheus
# ships (AWS, Azure, GCE, ...), which the checks the tests run never use; without them the
# first build takes a few minutes instead of 7.5 (Kubernetes and file discovery, which
# promtool imports itself, stay).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The Go module v0.X.Y is Prometheus release 3.(X-300).Y.
MODULE_VERSION=v0.316.0
RELEASE=3.16.0
DIR=${DRA_PROMTOOL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dra-scheduler/promtool-$MODULE_VERSION}
PROMTOOL=$DIR/promtool

if [[ ! -x $PROMTOOL ]]; then
  command -v go >/dev/null || { echo "build-promtool.sh: go is not installed; it is needed to build promtool" >&2; exit 1; }
  echo "build-promtool.sh: building promtool $RELEASE from Go modules (first time: a few minutes)" >&2
  mkdir -p "$DIR"
  # What Prometheus' release build stamps, for `promtool --version`.
  ldflags="-X github.com/prometheus/common/version.Version=$RELEASE -X github.com/prometheus/common/version.Branch=HEAD -X github.com/prometheus/common/version.Revision=$MODULE_VERSION"
  # Build next to the target and move into place, so an interrupted build never leaves a
  # half-written binary that looks complete.
  tmp=$(mktemp "$DIR/.promtool.XXXXXX")
  (cd "$HERE" && GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" go build -trimpath -tags remove_all_sd -ldflags "$ldflags" -o "$tmp" github.com/prometheus/prometheus/cmd/promtool) \
    || { rm -f "$tmp"; echo "build-promtool.sh: go build of promtool failed" >&2; exit 1; }
  chmod +x "$tmp"
  mv "$tmp" "$PROMTOOL"
fi
echo "$PROMTOOL"
