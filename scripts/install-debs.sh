#!/usr/bin/env bash
# Installs the Debian packages nlproxy builds against and its tests use, once per machine.
# libnftnl/libmnl: the native shim; nftables/conntrack/iproute2/iptables/ipset/nfacct: tests and benchmarks check
# nlproxy's work from outside with the standard tools (nlproxy itself never runs them);
# prometheus: its promtool checks the alert rules deploy/monitoring/ ships;
# python3-venv, mmdebstrap, podman, runc, containerd: the packaging tests build the .deb and the
# image, and load and run it.
set -euo pipefail
pkgs=(libnftnl-dev libmnl-dev pkg-config gcc python3-dev nftables conntrack iproute2 iptables ipset procps
  prometheus python3-venv mmdebstrap podman runc containerd nfacct)
bash "$(dirname "$0")/../packaging/need-debs.sh" "${pkgs[@]}"
