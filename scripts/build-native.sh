#!/usr/bin/env bash
# Rebuilds nlproxy/_nftshim in place for development (pip install -e does the same on install).
# Builds in a temporary directory and renames the result over the old module, so processes that
# already loaded the old one keep running.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r native "$tmp/native"
py=$(pwd)/.venv/bin/python
(cd "$tmp" && "$py" - <<'PY'
import sys
sys.path.insert(0, "native")
from build_nftshim import ffibuilder
ffibuilder.compile(tmpdir=".", verbose=False)
PY
)
so=$(find "$tmp" -name '_nftshim*.so' | head -1)
target=$(ls nlproxy/_nftshim*.so 2>/dev/null | head -1)
target=${target:-nlproxy/_nftshim.abi3.so}
cp "$so" "$target.new" && mv -f "$target.new" "$target"
echo "built $target"
