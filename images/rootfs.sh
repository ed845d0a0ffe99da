#!/usr/bin/env bash
# The runtime root filesystem both images share: glibc and libgcc from Debian bookworm's
# packages (what the binaries link against, `ldd` shows libc, libm, libgcc_s and the
# loader), the users root (0) and nonroot (65532), and nothing else: no shell, no package
# manager. The same steps run in the Dockerfile's `rootfs` stage (in debian:bookworm-slim)
# and in images/build-local.sh (on this Debian machine), so both builds hold the same files.
#
#   images/rootfs.sh OUT [DEB_DIR]
#
# OUT must not exist. The packages are fetched with `apt-get download` into DEB_DIR
# (default: a temporary folder), or taken from there when DEB_DIR already holds them.
set -euo pipefail

out=${1:?usage: images/rootfs.sh OUT [DEB_DIR]}
debs=${2:-}
packages=(libc6 libgcc-s1)

if [[ -e $out ]]; then
  echo "rootfs.sh: $out exists" >&2
  exit 1
fi
if [[ -z $debs ]]; then
  debs=$(mktemp -d)
  trap 'rm -rf "$debs"' EXIT
fi
mkdir -p "$debs"

for pkg in "${packages[@]}"; do
  if ! compgen -G "$debs/${pkg}_*.deb" >/dev/null; then
    (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2) || {
      echo "rootfs.sh: apt-get download $pkg failed (run apt-get update, or put ${pkg}_*.deb in $debs)" >&2
      exit 1
    }
  fi
done

mkdir -p "$out"
for pkg in "${packages[@]}"; do
  deb=$(compgen -G "$debs/${pkg}_*.deb" | sort -V | tail -n 1)
  dpkg-deb --extract "$deb" "$out"
  # What is installed, where scanners (trivy, grype, syft) look in distroless images.
  mkdir -p "$out/var/lib/dpkg/status.d"
  { dpkg-deb --field "$deb"; echo "Status: install ok installed"; } >"$out/var/lib/dpkg/status.d/$pkg"
  echo "rootfs.sh: $(basename "$deb")" >&2
done

# Not needed at run time: documentation (the copyright files stay), lintian overrides, and
# glibc's iconv modules (8 MB; Rust's strings are UTF-8 and nothing here calls iconv).
find "$out/usr/share/doc" -type f ! -name copyright -delete
rm -rf "$out/usr/share/lintian" "$out"/usr/lib/*-linux-gnu/gconv

mkdir -p "$out/etc" "$out/tmp"
chmod 1777 "$out/tmp"
cat >"$out/etc/passwd" <<'EOF'
root:x:0:0:root:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin
EOF
cat >"$out/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
cat >"$out/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF
