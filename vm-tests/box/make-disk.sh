#!/usr/bin/env bash
# Writes ROOT into a bootable raw disk image without loop devices or mounts: one MBR partition
# from 1 MiB holding an ext4 file system filled by mkfs.ext4 -d, GRUB's boot.img in the MBR and a
# core.img (built in ROOT with ROOT's grub-pc-bin) in the gap before the partition. Called by
# build.sh.
#   make-disk.sh ROOT ROOT-UUID SIZE DISK-IMAGE
set -euo pipefail
root=$1 uuid=$2 size=$3 disk=$4
offset=$((1024 * 1024))

truncate -s "$size" "$disk"
echo 'start=2048, type=83, bootable' | sfdisk --quiet "$disk"
bytes=$(stat -c %s "$disk")
mkfs.ext4 -q -F -L root -U "$uuid" -d "$root" -E offset=$offset "$disk" $(((bytes - offset) / 1024))k

# core.img finds its modules and grub.cfg on the first partition of the first BIOS disk.
chroot "$root" grub-mkimage -O i386-pc -o /tmp/core.img -p '(hd0,msdos1)/boot/grub' \
  biosdisk part_msdos ext2 normal linux search configfile echo
core=$root/tmp/core.img
[ "$(stat -c %s "$core")" -lt $((offset - 512)) ] || { echo "make-disk.sh: core.img too big" >&2; exit 1; }
# boot.img's code only (446 bytes would overwrite the partition table at 446; the code ends at 440).
dd if="$root/usr/lib/grub/i386-pc/boot.img" of="$disk" bs=440 count=1 conv=notrunc status=none
dd if="$core" of="$disk" bs=512 seek=1 conv=notrunc status=none
rm -f "$core"
