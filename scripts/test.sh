#!/usr/bin/env bash
# The one command that runs every test (README Quick start; .ci/run calls it).
# Installs what the tests need, builds the Kubernetes 1.37 control plane from Go modules
# when it is not built yet, then runs formatting, lints and every Rust test.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "checking tools"
missing=()
# buildah: images/build-local.sh, which tests/images.rs runs.
# ip and nsenter: the test node's cluster lives in a network namespace of its own.
for tool in cargo go openssl curl python3 setsid buildah ip nsenter; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  if command -v apt-get >/dev/null && [[ $(id -u) -eq 0 ]]; then
    pkgs=()
    for tool in "${missing[@]}"; do
      case "$tool" in
        go) pkgs+=(golang-go) ;;
        setsid | nsenter) pkgs+=(util-linux) ;;
        ip) pkgs+=(iproute2) ;;
        cargo) echo "cargo is missing: install Rust (rustup) first" >&2; exit 1 ;;
        *) pkgs+=("$tool") ;;
      esac
    done
    apt-get update -qq && apt-get install -y -qq "${pkgs[@]}"
  else
    echo "missing tools: ${missing[*]}" >&2
    exit 1
  fi
fi
# The test node (cluster.sh node, tests/node.rs) runs containers with Debian's runc and
# makes its busybox image from Debian's static busybox.
node_pkgs=()
command -v runc >/dev/null || [[ -x /usr/sbin/runc ]] || node_pkgs+=(runc)
[[ -x /bin/busybox ]] || node_pkgs+=(busybox-static)
# tests/node_e2e.rs gives the node a CNI bridge network with Debian's plugins.
[[ -x /usr/lib/cni/bridge ]] || node_pkgs+=(containernetworking-plugins)
if [[ ${#node_pkgs[@]} -gt 0 ]]; then
  if command -v apt-get >/dev/null && [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${node_pkgs[@]}"
  else
    echo "missing packages for the test node: ${node_pkgs[*]}" >&2
    exit 1
  fi
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt

step "building the control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd v1.37.2)"
start=$(date +%s)
tests/cluster/cluster.sh build
echo "control plane ready in $(( $(date +%s) - start ))s at $(tests/cluster/cluster.sh bindir)"

step "building the test node (kubelet v1.37.2, containerd v2.4.2, its runc shim, ctr)"
start=$(date +%s)
tests/cluster/cluster.sh build-node
echo "node ready in $(( $(date +%s) - start ))s"

step "building helm (for the chart test)"
start=$(date +%s)
helm=$(tests/chart/build-helm.sh)
echo "helm ready in $(( $(date +%s) - start ))s at $helm"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

# The test binaries `cargo test --workspace` builds, two at a time (most wait on a control
# plane; the real-node test runs alone), each to the end; then the doc tests.
step "cargo test: test binaries two at a time (scripts/run_tests.py)"
status=0
python3 scripts/run_tests.py || status=1
step "cargo test --doc"
cargo test --workspace --locked --doc || status=1
exit $status
