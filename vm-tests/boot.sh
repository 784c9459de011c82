#!/usr/bin/env bash
# boot.sh ARCH ROOTFS SCRIPT LOG: boots a throwaway VM of ARCH (amd64 or arm64) under QEMU, with
# no network, whose root file system is a copy of ROOTFS (a Debian root of that architecture with
# nlproxy installed, such as the one `make image` leaves in build/image/rootfs, or
# build/image/arm64/rootfs for ARCH=arm64), runs SCRIPT in it with /bin/sh as root, and writes
# the serial console to LOG. The VM stops when SCRIPT ends; the first line of LOG is
# "== accel kvm|tcg", its last lines "== script exit N" and the VM's own end.
#
# The kernel and its modules are Debian bookworm's linux-image-ARCH (downloaded with apt-get,
# kept in build/vm-ARCH/, as are kmod and mount, which an image's root lacks); the modules of net/ (netfilter, SCTP, ...), of what they need
# (crc32c, ...) and veth go into the VM with kmod, so that the kernel loads them on first use, as
# on a node. The root is an initramfs (no disk image): /init mounts /proc, /sys, /dev, /run and
# /tmp, runs SCRIPT, and powers off.
#
# Environment:
#   NLPROXY_VM_DEBS     more Debian packages of ARCH to unpack into the VM's root (with the
#                       libraries they need that ROOTFS lacks), e.g. "iproute2 libbpf1 ...";
#   NLPROXY_VM_ACCEL    kvm or tcg (software CPU). Default: kvm when ARCH is the machine's, /dev/kvm
#                       opens for reading and writing and the kernel's KVM is hardware-assisted
#                       (kvm_intel or kvm_amd loaded: a paravirtual KVM such as kvm_pvm boots only
#                       kernels built as its guests, not Debian's), else tcg;
#   NLPROXY_VM_MEMORY   MiB (default 4096); NLPROXY_VM_TIMEOUT seconds for the whole VM (1500).
set -euo pipefail
usage="usage: boot.sh amd64|arm64 ROOTFS SCRIPT LOG"
arch=${1:?$usage}
rootfs=$(cd "${2:?$usage}" && pwd)
script=${3:?$usage}
log=${4:?$usage}
root=$(cd "$(dirname "$0")/.." && pwd)
case $arch in
  amd64) qemu_pkg=qemu-system-x86 qemu=qemu-system-x86_64 console=ttyS0 uname_m=x86_64
         machine=(-machine q35) cpu_tcg=max ;;
  arm64) qemu_pkg=qemu-system-arm qemu=qemu-system-aarch64 console=ttyAMA0 uname_m=aarch64
         machine=(-machine virt) cpu_tcg=cortex-a57 ;;
  *) echo "boot.sh: ARCH must be amd64 or arm64, not $arch" >&2; exit 2 ;;
esac
work=$root/build/vm-$arch
mkdir -p "$work/debs"

accel=${NLPROXY_VM_ACCEL:-}
if [ -z "$accel" ]; then
  accel=tcg
  if [ "$(uname -m)" = "$uname_m" ] && { : <>/dev/kvm; } 2>/dev/null \
     && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
    accel=kvm
  fi
fi
case $accel in
  kvm) cpu=host ;;
  tcg) cpu=$cpu_tcg ;;
  *) echo "boot.sh: NLPROXY_VM_ACCEL must be kvm or tcg, not $accel" >&2; exit 2 ;;
esac

bash "$root/packaging/need-debs.sh" "$qemu_pkg" cpio kmod
# The kernel package apt would install for linux-image-ARCH, kmod and mount (not in an image's
# root) for the VM, and the extras.
depends() { apt-cache depends "$1:$arch" 2>/dev/null | sed -n 's/^ *Depends: \([^:<>]*\).*/\1/p'; }
kernel=$(depends "linux-image-$arch" | grep '^linux-image-' | head -n 1 || true)
if [ -z "$kernel" ]; then
  apt-get update -qq
  kernel=$(depends "linux-image-$arch" | grep '^linux-image-' | head -n 1 || true)
fi
[ -n "$kernel" ] || { echo "boot.sh: no $arch kernel package (apt-get update; dpkg --add-architecture $arch)" >&2; exit 1; }
# An extra package's libraries that ROOTFS does not have come along (one level deep: enough for
# a tool and its libraries).
extras=()
for pkg in ${NLPROXY_VM_DEBS:-}; do
  extras+=("$pkg")
  for dep in $(depends "$pkg"); do
    case $dep in lib*) ;; *) continue ;; esac
    [ -n "$(find "$rootfs/var/lib/dpkg/info" -maxdepth 1 \( -name "$dep.list" -o -name "$dep:$arch.list" \) -print -quit)" ] \
      || extras+=("$dep")
  done
done
deb() { ls "$work/debs/${1}"_*_"$arch".deb 2>/dev/null | head -n 1; }
for pkg in "$kernel" kmod libkmod2 mount "${extras[@]}"; do
  [ -n "$(deb "$pkg")" ] || (cd "$work/debs" && apt-get download -q "$pkg:$arch" >/dev/null 2>&1) \
    || { echo "boot.sh: apt-get download $pkg:$arch failed" >&2; exit 1; }
done
# Kernels the index no longer names (a security update replaced them): 70 MB each.
find "$work/debs" -name "linux-image-*_$arch.deb" ! -name "${kernel}_*" -delete

# This boot's own files (two boots of one architecture at once must not share them); the .debs
# above are the cache every boot shares.
run=$(mktemp -d "$work/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
kdir=$run/kernel
mkdir -p "$kdir"
dpkg-deb -x "$(deb "$kernel")" "$kdir"
kver=$(ls "$kdir/lib/modules")
vmroot=$run/root
cp -a "$rootfs" "$vmroot"
# Into the merged /usr: the packages' /bin and /sbin must not replace the root's bin -> usr/bin.
for pkg in kmod libkmod2 mount "${extras[@]}"; do
  dpkg-deb --fsys-tarfile "$(deb "$pkg")" | tar -x --keep-directory-symlink -C "$vmroot"
done
# The modules nftables, NAT, conntrack, SCTP and veth need (and what they need: crc32c, ...),
# not all 400 MB.
mods=lib/modules/$kver
mkdir -p "$vmroot/$mods"
(cd "$kdir" && cp -a --parents "$mods"/modules.* "$mods/kernel/net" "$mods/kernel/lib" \
  "$mods/kernel/crypto" "$mods/kernel/arch" "$mods/kernel/drivers/net/veth.ko" "$vmroot/")
depmod -b "$vmroot" "$kver"
install -m 0755 "$script" "$vmroot/vm-script.sh"
cat >"$vmroot/init" <<INIT
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
echo "== $arch VM up: \$(uname -m) \$(uname -r)"
/bin/sh /vm-script.sh
echo "== script exit \$?"
echo o >/proc/sysrq-trigger
sleep 30
INIT
chmod 0755 "$vmroot/init"
(cd "$vmroot" && find . -print0 | cpio --null -o -H newc --quiet) >"$run/initrd.cpio"
rm -rf "$vmroot"

# panic=-1 and -no-reboot: whatever way the VM ends (power off, or init dying), qemu exits.
echo "== accel $accel" >"$log"
timeout "${NLPROXY_VM_TIMEOUT:-1500}" "$qemu" "${machine[@]}" -accel "$accel" -cpu "$cpu" -smp 2 \
  -m "${NLPROXY_VM_MEMORY:-4096}" -nographic -no-reboot -nic none -kernel "$kdir/boot/vmlinuz-$kver" \
  -initrd "$run/initrd.cpio" -append "console=$console rdinit=/init rootfstype=ramfs panic=-1 loglevel=6" \
  </dev/null >>"$log" 2>&1 || true
rm -rf "$run"
grep -q '^== script exit ' "$log" || { echo "boot.sh: the VM did not run the script to its end: $log" >&2; exit 1; }
