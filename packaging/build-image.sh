#!/usr/bin/env bash
# build-image.sh [OUTDIR [DEB]]: the nlproxy OCI image archive (make image), tagged as the DaemonSet
# names it, assembled without pulling any base image:
#   1. mmdebstrap builds a minimal Debian bookworm root filesystem from the Debian archive, with
#      the packages the .deb depends on (cached in build/image/ until that list changes);
#   2. the .deb (DEB, or build-deb.sh builds it) is installed into a copy of it with dpkg --root;
#   3. packaging/oci.py writes that tree as a one-layer OCI archive, with OCI labels (version,
#      revision, created, source, ...) and a CycloneDX SBOM of the image (the .deb's, with the
#      Debian packages added) inside it, at /usr/share/doc/nlproxy/image.sbom.cdx.json, and
#      beside the archive.
# NLPROXY_ARCH (default the machine's) is the image's architecture: another one than the machine's
# (make image ARCH=arm64) is built from Debian's archive for that architecture, its packages'
# scripts run under qemu-user-static (packaging/need-binfmt.sh), and its files are named
# nlproxy_VERSION_ARCH.*. Reproducible: one .deb (one commit, packaging/build-deb.sh) gives one
# image digest, which it prints after the archive's path. Every timestamp is SOURCE_DATE_EPOCH (packaging/meta.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/dist}
work=$root/build/image
mkdir -p "$work" "$out"
out=$(cd "$out" && pwd)

bash "$root/packaging/need-debs.sh" mmdebstrap tar python3 git
# shellcheck source=packaging/meta.sh
. "$root/packaging/meta.sh"
native=$(dpkg --print-architecture)
arch=${NLPROXY_ARCH:-$native}
export NLPROXY_ARCH=$arch
[ "$arch" = "$native" ] || bash "$root/packaging/need-binfmt.sh" "$arch"
deb=${2:-}
[ -n "$deb" ] || deb=$(bash "$root/packaging/build-deb.sh" "$out" | tail -n 1)
if [ "$(dpkg-deb --field "$deb" Architecture)" != "$arch" ]; then
  echo "build-image: $deb is not for $arch (NLPROXY_ARCH)" >&2
  exit 2
fi

# The name and tag: the DaemonSet's image (tests/packaging/test_image.py holds its tag equal to
# the version in pyproject.toml).
image=$(sed -n 's/^ *image: *\([^ ]*\) *$/\1/p' "$root/deploy/kubernetes/daemonset.yaml" | head -n 1)
name=${image%:*}
tag=${image##*:}

# Step 1: the base, keyed by the .deb's dependencies and this script's mmdebstrap options.
deps=$(dpkg-deb --field "$deb" Depends | tr ',' '\n' | sed 's/(.*)//; s/ //g' | sort -u | paste -sd, -)
opts=(--variant=essential --include="passwd,$deps"
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright')
suffix=
if [ "$arch" != "$native" ]; then
  opts+=(--architectures="$arch")
  suffix=_$arch
  work=$work/$arch
  mkdir -p "$work"
fi
key=$(printf '%s\n' bookworm "${opts[@]}" | sha256sum | cut -c1-16)
base=$work/base-$key.tar
if [ ! -f "$base" ]; then
  rm -f "$work"/base-*.tar
  mmdebstrap --quiet --format=tar "${opts[@]}" bookworm "$base.part"
  mv "$base.part" "$base"
fi

# Step 2: the package on top, as apt would install it (its maintainer scripts run chrooted).
rootfs=$work/rootfs
rm -rf "$rootfs"
mkdir -p "$rootfs"
tar --numeric-owner -xpf "$base" -C "$rootfs"
if [ "$arch" = "$native" ]; then
  dpkg --root="$rootfs" -i "$deb" >/dev/null
else
  # The machine's dpkg takes no other architecture's package for that root: the root's own dpkg
  # does, under emulation. Its configuration has the base's path-excludes (step 1): nlproxy's
  # own documentation (SBOM, docs/) goes in all the same, as the machine's dpkg puts it.
  cp "$deb" "$rootfs/tmp/nlproxy.deb"
  chroot "$rootfs" dpkg --path-include='/usr/share/doc/nlproxy/*' -i /tmp/nlproxy.deb >/dev/null
  rm -f "$rootfs/tmp/nlproxy.deb"
fi
rm -rf "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old "$rootfs"/var/log/*
sbom=$out/${name}_${tag}${suffix}.sbom.cdx.json
python3 "$root/packaging/sbom.py" "$sbom" --extend "$rootfs/usr/share/doc/nlproxy/sbom.cdx.json" \
  --dpkg-status "$rootfs/var/lib/dpkg/status"
install -m 0644 "$sbom" "$rootfs/usr/share/doc/nlproxy/image.sbom.cdx.json"

# Step 3: the archive. Times clamped to SOURCE_DATE_EPOCH (dpkg and useradd wrote files just
# now), no access or change times: the tarball depends on the files' contents only.
tar --numeric-owner --xattrs --sort=name --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$rootfs" -cf "$work/rootfs.tar" .
archive=$out/${name}_${tag}${suffix}.oci.tar
description=$(dpkg-deb --field "$deb" Description | sed -n 1p)
labels=(--label "org.opencontainers.image.title=$name"
        --label "org.opencontainers.image.description=$description"
        --label "org.opencontainers.image.revision=$revision"
        --label "org.opencontainers.image.licenses=$licence")
if [ -n "$source_url" ]; then
  labels+=(--label "org.opencontainers.image.source=$source_url")
fi
digest=$(python3 "$root/packaging/oci.py" "$work/rootfs.tar" "$archive" --name "$name" \
  --tag "$tag" --arch "$arch" --cmd nlproxy --cmd run "${labels[@]}")
rm -f "$work/rootfs.tar"
echo "$archive"
echo "$digest"
