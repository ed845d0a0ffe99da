#!/usr/bin/env bash
# Writes a one-layer OCI image archive (an OCI image layout in a tar file) from local
# files, with no registry and no container engine: what `ctr images import` reads.
#
#   oci-image.sh OUT.tar NAME ROOTFS --entrypoint ARG...
#   oci-image.sh OUT.tar NAME ROOTFS --cmd ARG...
#
# NAME is the full image reference (localhost/dra-scheduler/pause:test); ROOTFS a folder
# whose contents become the image's only layer; ARG... the image's entrypoint, or its
# command (which a pod's `args` replace, as with Docker Hub's busybox). The
# layer is an uncompressed tar with fixed owners and times, so the same files give the
# same image digest on every machine. The platform is linux/$OCI_ARCH (default amd64).
set -euo pipefail

[[ $# -ge 5 && ($4 == --entrypoint || $4 == --cmd) ]] \
  || { echo "usage: $0 OUT.tar NAME ROOTFS --entrypoint|--cmd ARG..." >&2; exit 2; }
out=$1 name=$2 rootfs=$3 kind=$4
shift 4
[[ -d $rootfs ]] || { echo "$0: $rootfs is not a folder" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/blobs/sha256"

# blob FILE: move FILE into the blob store; prints "DIGEST SIZE".
blob() {
  local digest size
  digest=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  mv "$1" "$work/blobs/sha256/$digest"
  echo "$digest $size"
}

# JSON string array from arguments.
json_array() {
  python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
}

tar -C "$rootfs" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
  --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -cf "$work/layer" .
read -r layer layer_size < <(blob "$work/layer")

cat >"$work/config" <<JSON
{"architecture":"${OCI_ARCH:-amd64}","os":"linux","created":"1970-01-01T00:00:00Z",
 "config":{"$([[ $kind == --cmd ]] && echo Cmd || echo Entrypoint)":$(json_array "$@"),"Env":["PATH=/bin:/usr/bin:/sbin:/usr/sbin"],"WorkingDir":"/"},
 "rootfs":{"type":"layers","diff_ids":["sha256:$layer"]},
 "history":[{"created":"1970-01-01T00:00:00Z","created_by":"tests/cluster/node/oci-image.sh"}]}
JSON
read -r config config_size < <(blob "$work/config")

cat >"$work/manifest" <<JSON
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
 "config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config","size":$config_size},
 "layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:$layer","size":$layer_size}]}
JSON
read -r manifest manifest_size < <(blob "$work/manifest")

cat >"$work/index.json" <<JSON
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json",
 "manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest","size":$manifest_size,
  "platform":{"architecture":"${OCI_ARCH:-amd64}","os":"linux"},
  "annotations":{"io.containerd.image.name":"$name","org.opencontainers.image.ref.name":"${name##*:}"}}]}
JSON
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"

tar -C "$work" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
  -cf "$out.tmp" oci-layout index.json blobs
mv "$out.tmp" "$out"
