#!/usr/bin/env bash
# build-deb.sh [OUTDIR]: the nlproxy Debian package, for Debian bookworm (make deb).
#
# /opt/nlproxy is a venv of Debian's /usr/bin/python3.11 holding nlproxy (with its compiled
# libnftnl shim) and its Python dependencies from PyPI; the systemd unit is
# deploy/systemd/nlproxy.service, unchanged. The rest of the package is packaging/deb/.
# Installs the Debian packages it builds with; work files stay in build/deb.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/dist}
deb=$root/packaging/deb
work=$root/build/deb
python=/usr/bin/python3.11
dest=/opt/nlproxy

bash "$root/packaging/need-debs.sh" python3 python3.11 python3-venv python3-dev gcc pkg-config \
  libnftnl-dev libmnl-dev dpkg
mkdir -p "$work" "$out"
out=$(cd "$out" && pwd)
version=$("$python" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")
arch=$(dpkg --print-architecture)

# The shim is compiled by Debian's interpreter, in a build venv kept between runs.
benv=$work/buildenv
if [ ! -f "$benv/.complete" ]; then
  rm -rf "$benv"
  "$python" -m venv "$benv"
  mapfile -t reqs < <("$python" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' "$root/pyproject.toml")
  "$benv/bin/python" -m pip install -q "${reqs[@]}"
  touch "$benv/.complete"
fi
bash "$root/packaging/build-wheel.sh" "$benv/bin/python" "$work/wheel" >/dev/null

stage=$work/stage
rm -rf "$stage"
opt=$stage$dest
"$python" -m venv --without-pip "$opt"
"$benv/bin/python" -m pip --python "$opt/bin/python" install -q --no-compile "$work"/wheel/nlproxy-*.whl
# The venv was made at $opt: scripts and pyvenv.cfg name it; they must name /opt/nlproxy.
grep -rlI --null -F "$opt" "$opt" | xargs -0 -r sed -i "s#$opt#$dest#g"
rm -f "$opt"/bin/activate* "$opt"/bin/Activate.ps1
# Byte-code compiled now, with the installed paths (the service cannot write to /opt).
"$opt/bin/python" -m compileall -q -j 0 -s "$stage" -p / "$opt/lib" >/dev/null
if grep -rlF "$stage" "$stage" >/dev/null; then
  echo "build-deb: files still name the staging directory:" >&2
  grep -rlF "$stage" "$stage" >&2
  exit 1
fi

install -D -m 0644 "$root/deploy/systemd/nlproxy.service" "$stage/lib/systemd/system/nlproxy.service"
install -D -m 0644 "$deb/sysusers.conf" "$stage/usr/lib/sysusers.d/nlproxy.conf"
install -D -m 0644 "$deb/config.yaml" "$stage/etc/nlproxy/config.yaml"
install -D -m 0644 "$deb/default" "$stage/etc/default/nlproxy"
install -D -m 0644 "$root/deploy/sysctl/90-nlproxy-conntrack.conf" \
  "$stage/etc/sysctl.d/90-nlproxy-conntrack.conf"
install -D -m 0644 "$root/README.md" "$stage/usr/share/doc/nlproxy/README.md"
{ cat "$deb/copyright"; sed -e 's/^$/./' -e 's/^/ /' "$root/LICENSE"; } \
  >"$stage/usr/share/doc/nlproxy/copyright"
install -d "$stage/usr/bin"
ln -s "$dest/bin/nlproxy" "$stage/usr/bin/nlproxy"

install -d -m 0755 "$stage/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s/@VERSION@/$version-1/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" "$deb/control" \
  >"$stage/DEBIAN/control"
install -m 0644 "$deb/conffiles" "$stage/DEBIAN/conffiles"
install -m 0755 "$deb/postinst" "$deb/prerm" "$deb/postrm" "$stage/DEBIAN/"

pkg=$out/nlproxy_${version}-1_${arch}.deb
dpkg-deb --root-owner-group -Zzstd --build "$stage" "$pkg" >/dev/null
echo "$pkg"
