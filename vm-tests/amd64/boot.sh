#!/usr/bin/env bash
# boot.sh ROOTFS SCRIPT LOG: ../boot.sh for amd64 (Debian bookworm's linux-image-amd64, ROOTFS an amd64
# Debian root with nlproxy installed); see there.
exec bash "$(dirname "$0")/../boot.sh" amd64 "$@"
