#!/usr/bin/env bash
# build-wheel.sh PYTHON OUTDIR: the nlproxy wheel (with the compiled shim and the demo manifests),
# built by PYTHON, which must already have setuptools, wheel and cffi (no build isolation, so no
# download). Builds from a copy of the checkout's files, not in place: setuptools' build/ directory
# would otherwise carry modules deleted since the last build into the wheel. Stamps the build into
# that copy as nlproxy/_build.py: the version (pyproject.toml's, its one place), the commit, the
# tree state ("dirty" when tracked files differ from it) and the date (SOURCE_DATE_EPOCH), which
# `nlproxy version` and kubernetes_build_info report. Reproducible: the zip's timestamps are
# SOURCE_DATE_EPOCH (packaging/meta.sh), and the shim names no build path.
#
# The wheel is not architecture-independent: it carries the shim compiled for one architecture
# (tagged cp311-cp311-linux_x86_64 or linux_aarch64). NLPROXY_ARCH (a Debian architecture, amd64
# or arm64; default the machine's) chooses it; another one than the machine's is cross-compiled as
# the .deb's shim is (packaging/target.sh), which takes PYTHON to be a python3.11, the version of
# the target's libpython3.11-dev.
set -euo pipefail
py=${1:?usage: build-wheel.sh PYTHON OUTDIR}
out=${2:?usage: build-wheel.sh PYTHON OUTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=packaging/meta.sh
. "$root/packaging/meta.sh"
arch=${NLPROXY_ARCH:-}
# shellcheck source=packaging/target.sh
. "$root/packaging/target.sh"
# A relative interpreter path must survive the cd below (and a venv's python must not be resolved
# through its symlink, or it stops being the venv's).
case $py in */*) py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")" ;; esac
if [ "${#target[@]}" -gt 0 ] \
   && [ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != 3.11 ]; then
  echo "build-wheel: NLPROXY_ARCH=$arch: $py is not a python3.11 (the target's libpython3.11-dev)" >&2
  exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Tracked and new (not ignored) files; --ignore-failed-read skips files deleted but not yet staged.
(cd "$root" && git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$tmp"
commit=${revision%-dirty}
state=clean
[ "$commit" = "$revision" ] || state=dirty
[ "$commit" != unknown ] || { commit=; state=; }
cat >"$tmp/nlproxy/_build.py" <<EOF
"""This build of nlproxy, stamped by packaging/build-wheel.sh (not in the repository)."""

VERSION = "$version"
GIT_COMMIT = "$commit"
GIT_TREE_STATE = "$state"
BUILD_DATE = "$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
EOF
export CFLAGS="${CFLAGS:-} -ffile-prefix-map=$tmp=."
(cd "$tmp" && "${target[@]}" "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" .)
# It replaces the wheels of its architecture (another version's too), not the other one's.
whl=$(echo "$tmp"/dist/nlproxy-*.whl)
rm -f "$out"/nlproxy-*-"${whl##*-}"
mv "$whl" "$out/"
echo "$out/$(basename "$whl")"
