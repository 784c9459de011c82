#!/usr/bin/env bash
# Makes sure a VM has the Debian packages nlproxy builds against and the tests use. The local box
# (vm-tests/box/build.sh) already has them all, so this only reaches a mirror on other boxes.
set -euo pipefail
pkgs=(python3 python3-venv python3-dev gcc libc6-dev pkg-config libnftnl-dev libmnl-dev nftables
      conntrack iproute2 procps curl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
