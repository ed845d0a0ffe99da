#!/usr/bin/env bash
# GPU check for dra-node-agent: on a machine with an NVIDIA GPU, runs the NVML backend's
# tests (crates/dra-node-agent/tests/nvml.rs: discovery against nvidia-smi, the slices, the
# health watch), prints the ResourceSlices the agent would publish for this node, and a
# prepare dry run of a claim allocated the first GPU (the CDI spec it would write). Talks to
# no API server and changes no GPU setting. On a machine without a GPU it says so and
# exits 0.
#
# Usage: scripts/gpu-check.sh [node-name]
#   DRA_NODE_AGENT=/path/to/dra-node-agent  use this binary instead of building one
#   DRA_NVML_TESTS=/path/to/nvml-<hash>     and this test binary (cargo test --release
#                                           -p dra-node-agent --test nvml --no-run)
set -euo pipefail
cd "$(dirname "$0")/.."

node=${1:-$(hostname)}

have_gpu=no
if [[ -e /dev/nvidiactl ]] || command -v nvidia-smi >/dev/null 2>&1; then
  have_gpu=yes
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml\.so\.1'; then
  [[ $have_gpu == yes ]] && echo "gpu-check: an NVIDIA device is present but libnvidia-ml.so.1 is not in the linker cache" >&2
  have_gpu=no
fi
if [[ $have_gpu == no ]]; then
  echo "gpu-check: no NVIDIA GPU here (no /dev/nvidiactl or nvidia-smi, or no libnvidia-ml.so.1)."
  echo "gpu-check: nothing to check; the NVML backend needs a GPU node. Exiting 0."
  exit 0
fi

bin=${DRA_NODE_AGENT:-}
if [[ -z $bin ]]; then
  echo "==> building dra-node-agent" >&2
  cargo build --release -q -p dra-node-agent
  bin=${CARGO_TARGET_DIR:-target}/release/dra-node-agent
fi

echo "==> nvidia-smi -L"
nvidia-smi -L || true

echo
echo "==> the NVML backend's tests"
if [[ -n ${DRA_NVML_TESTS:-} ]]; then
  "$DRA_NVML_TESTS" --ignored --nocapture --test-threads 1
else
  cargo test --release -q -p dra-node-agent --test nvml -- --ignored --nocapture --test-threads 1
fi

echo
echo "==> ResourceSlices the agent would publish for node $node (NVML backend)"
slices=$("$bin" --backend nvml --node-name "$node" discover)
echo "$slices"

first=$(grep -m1 -oE 'name: gpu-[0-9]+$' <<<"$slices" | awk '{print $2}')
if [[ -z $first ]]; then
  echo "gpu-check: NVML found no GPU" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/claim.yaml" <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: gpu-check, namespace: default, uid: 00000000-0000-0000-0000-00000000c0de}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
status:
  allocation:
    devices:
      results:
      - {request: gpu, driver: gpu.nvidia.com, pool: "$node", device: "$first"}
      config:
      - source: FromClaim
        requests: [gpu]
        opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Default}}
YAML

echo
echo "==> prepare dry run: claim default/gpu-check allocated $first on $node"
"$bin" --backend nvml --node-name "$node" --cdi-dir /var/run/cdi prepare-dry-run --claim "$tmp/claim.yaml"
