#!/usr/bin/env bash
# Installs the Debian packages nlproxy builds against and its tests use, once per machine.
# libnftnl/libmnl: the native shim; nftables/conntrack/iproute2/iptables: tests and benchmarks check
# nlproxy's work from outside with the standard tools (nlproxy itself never runs them);
# prometheus: its promtool checks the alert rules deploy/monitoring/ ships;
# python3-venv, mmdebstrap, podman, runc, containerd: the packaging tests build the .deb and the
# image, and load and run it.
set -euo pipefail
pkgs=(libnftnl-dev libmnl-dev pkg-config gcc python3-dev nftables conntrack iproute2 iptables procps
  prometheus python3-venv mmdebstrap podman runc containerd)
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
