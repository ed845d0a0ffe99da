#!/usr/bin/env bash
# Builds the images the Dockerfile describes on this machine, with buildah and without a
# registry or a Docker daemon, and writes them as OCI archives that
# `ctr -n k8s.io images import` loads under the chart's default image references.
#
#   images/build-local.sh [--binaries DIR] [--out DIR]   build; print the archives' paths
#   images/build-local.sh --list                         print the image references
#
# Nothing is pulled: the Dockerfile's `binaries` and `rootfs` stages (built FROM the Rust
# and Debian images with docker) are handed to `buildah bud` as local folders made by the
# same scripts the stages run (images/stage-binaries.sh on this machine's cargo build,
# images/rootfs.sh on Debian packages fetched with apt-get download), and the image
# stages of the Dockerfile run as they are.
#
# --binaries DIR  take dra-scheduler and dra-node-agent from DIR instead of running
#                 `cargo build --release` (the tests hand in their debug build)
# --out DIR       where the archives go (default ~/.cache/dra-scheduler/images); an archive
#                 whose inputs (binaries, Dockerfile, scripts, profiles, packages) have not
#                 changed is kept, not rebuilt
#
# Needs root (buildah's storage), buildah, dpkg-deb and apt-get (Debian).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/dra-scheduler/images

# The references the README's docker commands tag and the chart's values name (tests/chart.rs
# checks all three agree): ghcr.io/dra-scheduler/<binary>:<crate version = appVersion>.
registry=ghcr.io/dra-scheduler
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml")
targets=(dra-scheduler dra-node-agent)

log() { printf 'build-local.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

bin_dir=""
out=$cache
while [[ $# -gt 0 ]]; do
  case "$1" in
    --list)
      for t in "${targets[@]}"; do echo "$registry/$t:$version"; done
      exit 0 ;;
    --binaries) bin_dir=${2:?--binaries DIR}; shift 2 ;;
    --out) out=${2:?--out DIR}; shift 2 ;;
    *) die "unknown argument $1 (see the comment at the top of this script)" ;;
  esac
done
[[ -n $version ]] || die "no version under [workspace.package] in $repo/Cargo.toml"

missing=()
for tool in buildah dpkg-deb apt-get strip sha256sum; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
[[ ${#missing[@]} -eq 0 ]] || die "missing tools: ${missing[*]} (Debian: apt-get install buildah binutils)"
[[ $(id -u) -eq 0 ]] || die "needs root: buildah keeps its image storage under $out/.work.*"

if [[ -z $bin_dir ]]; then
  log "cargo build --release (both binaries)"
  (cd "$repo" && cargo build --release --locked \
    -p dra-scheduler --bin dra-scheduler -p dra-node-agent --bin dra-node-agent >&2)
  bin_dir=${CARGO_TARGET_DIR:-$repo/target}/release
fi
bin_dir=$(cd "$bin_dir" && pwd)

mkdir -p "$out" "$cache/debs"
out=$(cd "$out" && pwd)
# One work folder per run, so two builds into the same folder do not meet.
work=$(mktemp -d "$out/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The build contexts, made as the Dockerfile's stages make them (each stage's /out).
"$repo/images/stage-binaries.sh" "$bin_dir" "$work/binaries/out"
"$repo/images/rootfs.sh" "$work/rootfs/out" "$cache/debs" 2>"$work/rootfs.log" || {
  cat "$work/rootfs.log" >&2
  die "the root filesystem could not be made"
}

# Everything an image is made of; an archive built from the same inputs is kept.
inputs=$( (
  cd "$work" && find binaries rootfs -type f -print0 | sort -z | xargs -0 sha256sum
  cd "$repo" && sha256sum Dockerfile images/*.sh
) | sha256sum | cut -d' ' -f1)

# buildah's own storage and settings, inside the work folder: nothing of the machine's
# containers configuration plays a part, and nothing is left behind.
policy=$work/policy.json
echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$policy"
buildah=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
# The image's dates are the commit's, so rebuilding the same commit gives the same files.
timestamp=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)

for t in "${targets[@]}"; do
  ref=$registry/$t:$version
  archive=$out/$t-$version.oci.tar
  if [[ -f $archive && -f $archive.inputs && $(cat "$archive.inputs") == "$inputs" ]]; then
    log "$ref: unchanged, kept $archive"
    echo "$archive"
    continue
  fi
  log "$ref: buildah bud --target $t"
  # --layers: one layer per COPY, as docker makes them, so both images share the rootfs layer.
  "${buildah[@]}" bud --quiet --pull=never --layers --signature-policy "$policy" \
    --timestamp "$timestamp" \
    --build-context binaries="$work/binaries" --build-context rootfs="$work/rootfs" \
    --target "$t" --tag "$ref" --file "$repo/Dockerfile" "$repo" >/dev/null
  rm -f "$archive" "$archive.inputs"
  "${buildah[@]}" push --quiet --signature-policy "$policy" \
    "$ref" "oci-archive:$work/$t.oci.tar:$ref"
  mv "$work/$t.oci.tar" "$archive"
  echo "$inputs" >"$archive.inputs"
  log "$ref: $archive ($(du -h "$archive" | cut -f1))"
  echo "$archive"
done
