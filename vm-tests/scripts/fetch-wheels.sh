#!/usr/bin/env bash
# Downloads, on the host, the wheels nlproxy needs to build and run (pyproject.toml's
# build-system.requires and project.dependencies, with their dependencies) into vm-tests/.wheels,
# so the VMs install nlproxy with `pip install --no-index --find-links` and need no route to PyPI.
# Host and VMs are both Debian bookworm (CPython 3.11, x86_64): the same wheels fit both.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=.venv/bin/python
dest=vm-tests/.wheels
mapfile -t reqs < <("$py" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    meta = tomllib.load(f)
for req in ["pip"] + meta["build-system"]["requires"] + meta["project"]["dependencies"]:
    print(req)
PY
)
mkdir -p "$dest"
"$py" -m pip download -q --only-binary :all: --python-version 3.11 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --implementation cp \
  --dest "$dest" "${reqs[@]}"
# A marker tells make the set is complete (pip is there so the VMs can upgrade their own).
touch "$dest/.complete"
echo "wheels in $dest: $(ls "$dest"/*.whl | wc -l)"
