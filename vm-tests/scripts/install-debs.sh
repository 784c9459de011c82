#!/usr/bin/env bash
# Installs the Debian packages the VM tests need on the host, once per machine (idempotent):
# vagrant and its libvirt provider, libvirt with QEMU/KVM, dnsmasq (the libvirt networks' DHCP),
# debootstrap and friends for building the box offline, rsync for the synced folder.
# nlproxy's own build dependencies come from scripts/install-debs.sh (make deps).
set -euo pipefail
pkgs=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-clients libvirt-daemon-driver-qemu
      qemu-system-x86 qemu-utils dnsmasq-base iptables debootstrap e2fsprogs fdisk rsync
      openssh-client curl ca-certificates)
bash "$(dirname "$0")/../../packaging/need-debs.sh" "${pkgs[@]}"
