#!/usr/bin/env bash
# The unit tests as an unprivileged user with none of the kernel tools on PATH: they must need
# neither root nor `ip`/`nft`/`conntrack`. Run by `make test` (as root) and `make unit`.
#
# An unprivileged user cannot reach an interpreter or a checkout below /root, so the tests run on
# the system's python3 (Debian's, built for the same 3.11 ABI) with a venv of the dependencies
# in /var/tmp, kept per pyproject.toml, on a copy of the tree in a fresh directory.
set -euo pipefail
cd "$(dirname "$0")/.."
user=nobody
py=/usr/bin/python3
key=$(sha256sum pyproject.toml | cut -c1-12)
venv=/var/tmp/nlproxy-unit-venv-$key

if [ ! -e "$venv/.installed" ]; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # The dependencies and the dev tools of pyproject.toml, not the project: it runs from the copy.
  mapfile -t reqs < <("$venv/bin/python" -c '
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))')
  "$venv/bin/python" -m pip install -q "${reqs[@]}"
  chmod -R a+rX "$venv"
  touch "$venv/.installed"
fi

work=$(mktemp -d /tmp/nlproxy-unit.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The whole tree but the venvs and build output: unit tests read the files we ship.
tar --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./.vagrant \
  --exclude=__pycache__ --exclude=.mypy_cache --exclude=.ruff_cache --exclude=.pytest_cache -cf - . |
  tar -xf - -C "$work"
chmod -R a+rX "$work"

cmd=(env -i HOME="$work" PATH="$venv/bin" PYTHONPATH="$work" PYTHONDONTWRITEBYTECODE=1
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir="$work" "$work/tests/unit" "$@")
if [ "$(id -u)" = 0 ]; then
  cd "$work" && exec setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups --inh-caps=-all "${cmd[@]}"
fi
cd "$work" && "${cmd[@]}"
