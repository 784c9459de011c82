#!/usr/bin/env bash
# Configures a debootstrapped root for use as a Vagrant box: fstab, GRUB menu, DHCP on the first
# NIC (systemd-networkd), the vagrant user with passwordless sudo and a generated SSH key, SSH
# host keys and machine-id made on first boot. Called by build.sh; touches only ROOT and KEY.
#   configure-root.sh ROOT ROOT-UUID KERNEL-FILE INITRD-FILE KEY-PATH
set -euo pipefail
root=$1 uuid=$2 kernel=$3 initrd=$4 key=$5

echo "nlproxy-box" >"$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tnlproxy-box\n::1\tlocalhost ip6-localhost\n' >"$root/etc/hosts"
echo "UUID=$uuid / ext4 errors=remount-ro 0 1" >"$root/etc/fstab"

# Empty, not absent: systemd then generates a new id on first boot (and each VM gets its own
# DHCP client identity and address) without treating the boot as a first-boot setup.
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"

# Predictable eth0/eth1 names on libvirt and VirtualBox alike; serial console for debugging.
mkdir -p "$root/boot/grub"
cp -r "$root/usr/lib/grub/i386-pc" "$root/boot/grub/"
cat >"$root/boot/grub/grub.cfg" <<CFG
set timeout=0
menuentry "Debian bookworm" {
  linux /boot/$kernel root=UUID=$uuid ro net.ifnames=0 biosdevname=0 console=tty0 console=ttyS0,115200n8
  initrd /boot/$initrd
}
CFG

mkdir -p "$root/etc/systemd/network"
cat >"$root/etc/systemd/network/10-eth0.network" <<'NET'
[Match]
Name=eth0

[Network]
DHCP=ipv4

[DHCPv4]
ClientIdentifier=mac
NET
chroot "$root" systemctl enable systemd-networkd.service >/dev/null 2>&1
# network-online.target (nlproxy.service waits for it) should mean "eth0 has an address".
chroot "$root" systemctl enable systemd-networkd-wait-online.service >/dev/null 2>&1

# SSH host keys differ per VM: delete the build's keys and make new ones before sshd starts.
rm -f "$root"/etc/ssh/ssh_host_*
cat >"$root/etc/systemd/system/ssh-host-keys.service" <<'UNIT'
[Unit]
Description=Generate SSH host keys on first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=ssh.service
UNIT
chroot "$root" systemctl enable ssh-host-keys.service ssh.service >/dev/null 2>&1
echo "UseDNS no" >"$root/etc/ssh/sshd_config.d/vagrant.conf"

chroot "$root" useradd --create-home --shell /bin/bash --groups sudo vagrant
echo "vagrant ALL=(ALL) NOPASSWD:ALL" >"$root/etc/sudoers.d/vagrant"
chmod 0440 "$root/etc/sudoers.d/vagrant"
# ed25519: vagrant's net-ssh (7.0 on bookworm) cannot load OpenSSH-format RSA keys with OpenSSL 3.
ssh-keygen -q -t ed25519 -N "" -C "nlproxy-box" -f "$key"
install -d -m 0700 "$root/home/vagrant/.ssh"
install -m 0600 "$key.pub" "$root/home/vagrant/.ssh/authorized_keys"
chroot "$root" chown -R vagrant:vagrant /home/vagrant/.ssh
chroot "$root" passwd --lock root >/dev/null

# No DNS inside the test networks; keep resolv.conf valid and apt pointed at Debian.
echo "nameserver 127.0.0.1" >"$root/etc/resolv.conf"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/log/*.log "$root"/tmp/*
