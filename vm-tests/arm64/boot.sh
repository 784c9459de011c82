#!/usr/bin/env bash
# boot.sh ROOTFS SCRIPT LOG: ../boot.sh for arm64 (Debian bookworm's linux-image-arm64, ROOTFS an arm64
# Debian root with nlproxy installed); see there.
exec bash "$(dirname "$0")/../boot.sh" arm64 "$@"
