#!/usr/bin/env bash
# boot.sh ROOTFS SCRIPT LOG: boots an arm64 VM under emulation (Debian's qemu-system-aarch64,
# software CPU, no network) whose root file system is a copy of ROOTFS (an arm64 Debian root,
# such as the one `make image ARCH=arm64` leaves in build/image/arm64/rootfs, nlproxy installed),
# runs SCRIPT in it with /bin/sh as root, and writes the serial console to LOG. The VM stops when
# SCRIPT ends; the last lines of LOG are "== script exit N" and the VM's own end.
#
# The kernel and its modules are Debian bookworm's linux-image-arm64 (downloaded with apt-get,
# kept in build/vm-arm64/); the netfilter modules go into the VM with kmod so that the kernel
# loads nftables' on first use, as on a node. The root is an initramfs (no disk image): /init
# mounts /proc, /sys, /dev, /run and /tmp, runs SCRIPT, and powers off.
set -euo pipefail
rootfs=$(cd "${1:?usage: boot.sh ROOTFS SCRIPT LOG}" && pwd)
script=${2:?usage: boot.sh ROOTFS SCRIPT LOG}
log=${3:?usage: boot.sh ROOTFS SCRIPT LOG}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$root/build/vm-arm64
mkdir -p "$work/debs"

bash "$root/packaging/need-debs.sh" qemu-system-arm cpio kmod
# The kernel package apt would install for linux-image-arm64, and kmod for the VM.
kernel=$(apt-cache depends linux-image-arm64:arm64 | sed -n 's/^ *Depends: \(linux-image-[^:]*\).*/\1/p' | head -n 1)
[ -n "$kernel" ] || { echo "boot.sh: no arm64 kernel package (apt-get update, dpkg --add-architecture arm64)" >&2; exit 1; }
for pkg in "$kernel" kmod libkmod2; do
  ls "$work/debs/${pkg}"_*_arm64.deb >/dev/null 2>&1 \
    || (cd "$work/debs" && apt-get download -q "$pkg:arm64" >/dev/null 2>&1)
done

kdir=$work/kernel
rm -rf "$kdir" "$work/root"
mkdir -p "$kdir"
dpkg-deb -x "$(ls "$work/debs/${kernel}"_*_arm64.deb | head -n 1)" "$kdir"
kver=$(ls "$kdir/lib/modules")
vmroot=$work/root
cp -a "$rootfs" "$vmroot"
# Into the merged /usr: the packages' /bin and /sbin must not replace the root's bin -> usr/bin.
for pkg in kmod libkmod2; do
  dpkg-deb --fsys-tarfile "$(ls "$work/debs/${pkg}"_*_arm64.deb | head -n 1)" \
    | tar -x --keep-directory-symlink -C "$vmroot"
done
# The modules nftables, NAT and conntrack need (and what they need: crc32c, ...), not all 400 MB.
mods=lib/modules/$kver
mkdir -p "$vmroot/$mods"
(cd "$kdir" && cp -a --parents "$mods"/modules.* "$mods/kernel/net" "$mods/kernel/lib" \
  "$mods/kernel/crypto" "$mods/kernel/arch" "$vmroot/")
depmod -b "$vmroot" "$kver"
install -m 0755 "$script" "$vmroot/vm-script.sh"
cat >"$vmroot/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
echo "== arm64 VM up: $(uname -m) $(uname -r)"
/bin/sh /vm-script.sh
echo "== script exit $?"
echo o >/proc/sysrq-trigger
sleep 30
INIT
chmod 0755 "$vmroot/init"
(cd "$vmroot" && find . -print0 | cpio --null -o -H newc --quiet) >"$work/initrd.cpio"
rm -rf "$vmroot"

# panic=-1 and -no-reboot: whatever way the VM ends (power off, or init dying), qemu exits.
timeout "${NLPROXY_VM_TIMEOUT:-1500}" qemu-system-aarch64 -machine virt -cpu cortex-a57 -smp 2 \
  -m "${NLPROXY_VM_MEMORY:-4096}" -nographic -no-reboot -nic none -kernel "$kdir/boot/vmlinuz-$kver" \
  -initrd "$work/initrd.cpio" -append "console=ttyAMA0 rdinit=/init rootfstype=ramfs panic=-1 loglevel=6" \
  </dev/null >"$log" 2>&1 || true
rm -f "$work/initrd.cpio"
grep -q '^== script exit ' "$log" || { echo "boot.sh: the VM did not run the script to its end: $log" >&2; exit 1; }
