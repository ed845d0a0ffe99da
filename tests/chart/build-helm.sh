#!/usr/bin/env bash
# Builds the Helm CLI (helm.sh/helm/v3, the version go.mod pins) from Go modules, once per
# machine, into ~/.cache/dra-scheduler/helm-<version>/helm; prints that path. Nothing is
# downloaded but Go modules, and a present binary is kept as it is.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HELM_VERSION=v3.22.0
DIR=${DRA_HELM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dra-scheduler/helm-$HELM_VERSION}
HELM=$DIR/helm

if [[ ! -x $HELM ]]; then
  command -v go >/dev/null || { echo "build-helm.sh: go is not installed; it is needed to build helm" >&2; exit 1; }
  echo "build-helm.sh: building helm $HELM_VERSION from Go modules (first time: a few minutes)" >&2
  mkdir -p "$DIR"
  # Stamp what Helm's Makefile stamps: the release (`helm version`) and the Kubernetes
  # version of its client-go, which `helm template` and `helm lint` assume (unstamped it is
  # 1.20, older than any chart that needs resource.k8s.io/v1 accepts).
  k8s=$(cd "$HERE" && GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" go list -m -f '{{.Version}}' k8s.io/client-go)
  k8s_minor=$(echo "$k8s" | cut -d. -f2)
  ldflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
  done
  # Build next to the target and move into place, so an interrupted build never leaves a
  # half-written binary that looks complete.
  tmp=$(mktemp "$DIR/.helm.XXXXXX")
  (cd "$HERE" && GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" go build -trimpath -ldflags "$ldflags" -o "$tmp" helm.sh/helm/v3/cmd/helm) \
    || { rm -f "$tmp"; echo "build-helm.sh: go build of helm failed" >&2; exit 1; }
  chmod +x "$tmp"
  mv "$tmp" "$HELM"
fi
echo "$HELM"
