#!/usr/bin/env bash
# Makes sure a VM has the Debian packages nlproxy's package depends on and the tests use. The local
# box (vm-tests/box/build.sh) already has them all, so this only reaches a mirror on other boxes.
set -euo pipefail
pkgs=(python3 python3.11 libnftnl11 libmnl0 nftables conntrack iproute2 procps curl iptables ipset ipvsadm)
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
