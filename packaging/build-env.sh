#!/usr/bin/env bash
# build-env.sh [DIR]: a venv of Debian's python3.11 holding exactly packaging/build-requirements.lock
# (hashes checked, wheels only) and the pip Debian's python3-venv bundles, which builds the wheel
# without build isolation; prints its python. Kept between runs (in DIR, default build/buildenv) until the lock changes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
benv=${1:-$root/build/buildenv}
python=/usr/bin/python3.11
lock=$root/packaging/build-requirements.lock

key=$(cat "$lock" | sha256sum | cut -c1-16)
if [ "$(cat "$benv/.lock-key" 2>/dev/null)" != "$key" ]; then
  bash "$root/packaging/need-debs.sh" python3.11 python3-venv >&2
  rm -rf "$benv"
  "$python" -m venv "$benv"
  "$benv/bin/python" -m pip install -q --require-hashes --only-binary :all: --no-deps \
    -r "$lock" >&2
  echo "$key" >"$benv/.lock-key"
fi
echo "$benv/bin/python"
