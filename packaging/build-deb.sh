#!/usr/bin/env bash
# build-deb.sh [OUTDIR]: the nlproxy Debian package, for Debian bookworm (make deb).
# NLPROXY_ARCH (a Debian architecture, default the machine's: amd64 or arm64) chooses the package's
# architecture; another one than the machine's is cross-built (make deb ARCH=arm64): the shim by
# Debian's cross compiler against that architecture's libnftnl-dev, libmnl-dev and Python headers
# (multiarch), and the dependencies from the lock's wheels for that architecture. Nothing of the
# target architecture runs during the build.
#
# /opt/nlproxy is a venv of Debian's /usr/bin/python3.11 holding nlproxy (with its compiled
# libnftnl shim) and exactly the Python dependencies of packaging/requirements.lock (wheels whose
# sha256 the lock names); the systemd unit is deploy/systemd/nlproxy.service, unchanged. The rest
# of the package is packaging/deb/, README.md, docs/, CHANGELOG.md and a CycloneDX SBOM of
# /opt/nlproxy. Reproducible: one commit gives one .deb (every timestamp is SOURCE_DATE_EPOCH,
# packaging/meta.sh). Installs the Debian packages it builds with; work files stay in build/deb.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/dist}
deb=$root/packaging/deb
python=/usr/bin/python3.11
dest=/opt/nlproxy
lock=$root/packaging/requirements.lock

bash "$root/packaging/need-debs.sh" python3 python3.11 python3-venv python3-dev gcc pkg-config \
  libnftnl-dev libmnl-dev dpkg git
# shellcheck source=packaging/meta.sh
. "$root/packaging/meta.sh"
arch=${NLPROXY_ARCH:-$(dpkg --print-architecture)}
# shellcheck source=packaging/target.sh
. "$root/packaging/target.sh"
work=$root/build/deb
awork=$work/$arch
mkdir -p "$awork" "$out"
out=$(cd "$out" && pwd)

# The shim is compiled by Debian's interpreter (or cross compiler), in a build venv of the build
# lock; the build venv itself is the machine's.
benv=$(bash "$root/packaging/build-env.sh" "$work/buildenv")
NLPROXY_ARCH=$arch bash "$root/packaging/build-wheel.sh" "$benv" "$awork/wheel" >/dev/null

# The dependencies' wheels for $arch, checked against the lock's hashes (kept until the lock
# changes).
wheels=$awork/wheels-$(sha256sum "$lock" | cut -c1-16)
if [ ! -f "$wheels/.complete" ]; then
  rm -rf "$awork"/wheels-*
  "${target[@]}" "$benv" -m pip download -q --require-hashes --only-binary :all: --no-deps \
    -d "$wheels" -r "$lock"
  touch "$wheels/.complete"
fi

stage=$awork/stage
rm -rf "$stage"
opt=$stage$dest
"$python" -m venv --without-pip "$opt"
pipopt=(-q --no-compile --no-index --find-links "$wheels" --only-binary :all: --no-deps)
pipin=("${target[@]}" "$benv" -m pip --python "$opt/bin/python")
"${pipin[@]}" install "${pipopt[@]}" --require-hashes -r "$lock"
"${pipin[@]}" install "${pipopt[@]}" "$awork"/wheel/nlproxy-*.whl
"${pipin[@]}" check >/dev/null || {
  echo "build-deb: $lock does not satisfy nlproxy's requirements (make lock):" >&2
  "${pipin[@]}" check >&2
  exit 1
}
site=$(echo "$opt"/lib/python3.*/site-packages)
# Where the wheel was read from is this machine's business, not the package's.
for dist in "$site"/nlproxy-*.dist-info; do
  rm -f "$dist/direct_url.json"
  sed -i '/\/direct_url\.json,/d' "$dist/RECORD"
done
# The venv was made at $opt: scripts and pyvenv.cfg name it; they must name /opt/nlproxy.
grep -rlI --null -F "$opt" "$opt" | xargs -0 -r sed -i "s#$opt#$dest#g"
# Only nlproxy's entry point and the interpreter: the dependencies' console scripts are not
# this package's commands.
find "$opt/bin" -mindepth 1 -maxdepth 1 ! -name nlproxy ! -name 'python*' -exec rm -f {} +
# Byte-code compiled now, with the installed paths (the service cannot write to /opt); checked
# against the source's hash, not its mtime, so the .pyc files are the same at every build.
"$opt/bin/python" -m compileall -q -j 0 --invalidation-mode checked-hash -s "$stage" -p / \
  "$opt/lib" >/dev/null
if grep -rlF "$stage" "$stage" >/dev/null; then
  echo "build-deb: files still name the staging directory:" >&2
  grep -rlF "$stage" "$stage" >&2
  exit 1
fi

doc=$stage/usr/share/doc/nlproxy
install -D -m 0644 "$root/deploy/systemd/nlproxy.service" "$stage/lib/systemd/system/nlproxy.service"
install -D -m 0644 "$deb/sysusers.conf" "$stage/usr/lib/sysusers.d/nlproxy.conf"
install -D -m 0644 "$deb/config.yaml" "$stage/etc/nlproxy/config.yaml"
install -D -m 0644 "$deb/default" "$stage/etc/default/nlproxy"
install -D -m 0644 "$root/deploy/sysctl/90-nlproxy-conntrack.conf" \
  "$stage/etc/sysctl.d/90-nlproxy-conntrack.conf"
# README.md links docs/*.md: they sit beside it, as in the repository.
install -D -m 0644 "$root/README.md" "$doc/README.md"
install -D -m 0644 -t "$doc/docs" "$root"/docs/*.md
{ cat "$deb/copyright"; sed -e 's/^$/./' -e 's/^/ /' "$root/LICENSE"; } >"$doc/copyright"
gzip -9n <"$root/CHANGELOG.md" >"$doc/changelog.gz"
maintainer=$(sed -n 's/^Maintainer: //p' "$deb/control")
printf '%s\n' "nlproxy ($version-1) bookworm; urgency=medium" "" \
  "  * nlproxy $version for Debian bookworm; its changes: changelog.gz (CHANGELOG.md)." \
  "    Built from revision $revision." "" \
  " -- $maintainer  $(date -u -R -d "@$SOURCE_DATE_EPOCH")" | gzip -9n >"$doc/changelog.Debian.gz"
"$python" "$root/packaging/sbom.py" "$doc/sbom.cdx.json" --site "$site" --wheels "$wheels" \
  --wheels "$awork/wheel" --name nlproxy --version "$version"
install -d "$stage/usr/bin"
ln -s "$dest/bin/nlproxy" "$stage/usr/bin/nlproxy"

install -d -m 0755 "$stage/DEBIAN"
# Installed-Size as dpkg-gencontrol counts it (KiB per file, rounded up; 1 per directory and
# link), not du's, which depends on the file system the build ran on.
size=$(cd "$stage" && find . -path ./DEBIAN -prune -o -printf '%y %s\n' \
  | awk '{ n += ($1 == "f") ? int(($2 + 1023) / 1024) : 1 } END { print n }')
sed -e "s/@VERSION@/$version-1/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" "$deb/control" \
  >"$stage/DEBIAN/control"
if [ -n "$source_url" ]; then
  sed -i "s#^Description:#Homepage: $source_url\nDescription:#" "$stage/DEBIAN/control"
fi
install -m 0644 "$deb/conffiles" "$stage/DEBIAN/conffiles"
install -m 0755 "$deb/postinst" "$deb/prerm" "$deb/postrm" "$stage/DEBIAN/"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z \
  | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/md5sums"
# Every file as old as the commit, at most: the archive then depends on the sources only.
find "$stage" -newermt "@$SOURCE_DATE_EPOCH" -print0 \
  | xargs -0 -r touch --no-dereference --date="@$SOURCE_DATE_EPOCH"

pkg=$out/nlproxy_${version}-1_${arch}.deb
dpkg-deb --root-owner-group -Zzstd --build "$stage" "$pkg" >/dev/null
echo "$pkg"
