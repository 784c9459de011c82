#!/usr/bin/env bash
# Builds a Debian bookworm box for vagrant-libvirt from Debian packages alone (no Vagrant Cloud):
# debootstrap a root file system, make it bootable with GRUB written straight into the image (no
# loop devices, no mounts of the image), convert to qcow2 and pack metadata.json, a Vagrantfile
# and a freshly generated SSH key into a .box.
#
#   vm-tests/box/build.sh            -> vm-tests/box/out/nlproxy-bookworm.box
#   vagrant box add --force --name nlproxy/bookworm vm-tests/box/out/nlproxy-bookworm.box
#
# The image carries everything the VM tests need (nlproxy's build dependencies, nftables,
# conntrack, Python), so provisioning needs no Debian mirror. /etc/machine-id is empty: every VM
# makes its own on first boot, and with it its own DHCP client identity; SSH host keys are
# likewise made on first boot. Environment: MIRROR (a Debian mirror, default deb.debian.org),
# OUT (output directory), DISK_SIZE (virtual disk size, default 8G).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/out}
mirror=${MIRROR:-http://deb.debian.org/debian}
size=${DISK_SIZE:-8G}
suite=bookworm
packages=(
  systemd-sysv udev dbus kmod linux-image-amd64 initramfs-tools grub-pc-bin
  openssh-server sudo rsync iproute2 iputils-ping procps netbase ca-certificates less
  python3 python3-venv python3-dev gcc libc6-dev pkg-config libnftnl-dev libmnl-dev
  nftables conntrack curl iptables ipset ipvsadm
)

for tool in debootstrap mkfs.ext4 sfdisk qemu-img ssh-keygen tar; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing (run vm-tests/scripts/install-debs.sh)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "build.sh: must run as root (debootstrap, chroot)" >&2; exit 1; }

work=$(mktemp -d /var/tmp/nlproxy-box.XXXXXX)
root=$work/root
cleanup() {
  # debootstrap or a failed chroot step may leave pseudo file systems mounted in the tree.
  for m in proc sys dev/pts dev; do
    mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m" || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

echo "box: debootstrap $suite from $mirror"
debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
  "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  echo "build.sh: debootstrap failed (log above)" >&2
  exit 1
}

uuid=$(cat /proc/sys/kernel/random/uuid)
kernel=$(cd "$root/boot" && ls vmlinuz-* | sort -V | tail -n 1)
initrd=initrd.img-${kernel#vmlinuz-}
[ -f "$root/boot/$initrd" ] || { echo "build.sh: no $initrd in the image" >&2; exit 1; }

echo "box: configuring (kernel $kernel, root UUID $uuid)"
"$here/configure-root.sh" "$root" "$uuid" "$kernel" "$initrd" "$work/vagrant_key"

echo "box: writing the disk image"
"$here/make-disk.sh" "$root" "$uuid" "$size" "$work/disk.raw"
qemu-img convert -f raw -O qcow2 "$work/disk.raw" "$work/box.img"
rm -f "$work/disk.raw"

virtual_gb=$(qemu-img info --output=json "$work/box.img" |
  python3 -c 'import json,sys; print(-(-json.load(sys.stdin)["virtual-size"] // 2**30))')
cat >"$work/metadata.json" <<EOF
{"provider": "libvirt", "format": "qcow2", "virtual_size": $virtual_gb}
EOF
cp "$here/Vagrantfile.box" "$work/Vagrantfile"

mkdir -p "$out"
tar -C "$work" -cf "$out/nlproxy-bookworm.box.tmp" metadata.json Vagrantfile box.img vagrant_key
mv -f "$out/nlproxy-bookworm.box.tmp" "$out/nlproxy-bookworm.box"
echo "box: built $out/nlproxy-bookworm.box"
