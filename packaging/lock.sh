#!/usr/bin/env bash
# lock.sh [PIP-COMPILE ARGS...]: refreshes the lock files `make wheel`, `make deb` and `make image`
# install from (make lock):
#   packaging/requirements.lock        nlproxy's dependencies (pyproject.toml's [project]
#                                      dependencies and theirs), what /opt/nlproxy holds;
#   packaging/build-requirements.lock  what builds the wheel (pyproject.toml's build-system
#                                      requires: setuptools, wheel, cffi, and theirs).
# Each pins one version of every package with the sha256 of every file the index serves for it,
# resolved by pip-compile (pip-tools) for Debian bookworm's Python 3.11, the interpreter of the
# .deb and the image. Without arguments every pin moves to the newest release pyproject.toml
# allows; with arguments they go to pip-compile instead, e.g. `--upgrade-package trio` to move
# one pin and keep the rest. docs/packaging.md says why pip-compile and how to review a refresh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=/usr/bin/python3.11
tools=$root/build/lock-tools

bash "$root/packaging/need-debs.sh" python3.11 python3-venv
if [ ! -x "$tools/bin/pip-compile" ]; then
  rm -rf "$tools"
  "$python" -m venv "$tools"
  "$tools/bin/python" -m pip install -q 'pip-tools>=7.4'
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' \
  "$root/pyproject.toml" >"$tmp/build-requirements.in"
[ "$#" -gt 0 ] || set -- --upgrade

# The machine's own pip settings (local indexes, find-links, constraints) stay out: the lock
# names what the package index serves, and only that.
export CUSTOM_COMPILE_COMMAND="make lock"
compile=(env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null
         "$tools/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras
         --no-emit-index-url --no-emit-trusted-host --no-emit-find-links "$@")
(cd "$root" && "${compile[@]}" --output-file packaging/requirements.lock pyproject.toml)
cp "$root/packaging/build-requirements.lock" "$tmp/build-requirements.lock" 2>/dev/null || true
(cd "$tmp" && "${compile[@]}" --output-file build-requirements.lock build-requirements.in)
# The input's name as the repository knows it, not the temporary directory's.
sed 's#(build-requirements.in)#(pyproject.toml build-system.requires)#; s#-r build-requirements.in#pyproject.toml build-system.requires#' \
  "$tmp/build-requirements.lock" >"$root/packaging/build-requirements.lock"
rm -rf "$root"/*.egg-info
echo "packaging/requirements.lock: $(grep -c '==' "$root/packaging/requirements.lock") pins"
echo "packaging/build-requirements.lock: $(grep -c '==' "$root/packaging/build-requirements.lock") pins"
