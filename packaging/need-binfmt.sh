#!/usr/bin/env bash
# need-binfmt.sh ARCH: makes this machine run ARCH's (a Debian architecture's) programs under
# emulation, as a cross build of the image and the tests of its artefacts need: Debian's
# qemu-user-static, binfmt-support and arch-test (mmdebstrap checks with it) installed, the
# binfmt_misc file system mounted, and qemu-user-static's handler for ARCH enabled (with the
# fix-binary flag, so that it works inside a chroot of ARCH's root file system too). Then checks
# that an ARCH program actually runs (arch-test's own).
set -euo pipefail
arch=${1:?usage: need-binfmt.sh ARCH}
root=$(cd "$(dirname "$0")/.." && pwd)
case $arch in
  arm64) qemu=aarch64 ;;
  amd64) qemu=x86_64 ;;
  *) echo "need-binfmt: $arch: only amd64 and arm64" >&2; exit 2 ;;
esac
bash "$root/packaging/need-debs.sh" qemu-user-static binfmt-support arch-test
dir=/proc/sys/fs/binfmt_misc
if [ ! -e "$dir/register" ]; then
  mount -t binfmt_misc binfmt_misc "$dir"
fi
if [ "$(sed -n 1p "$dir/qemu-$qemu" 2>/dev/null)" != enabled ]; then
  update-binfmts --enable "qemu-$qemu"
fi
grep -q '^flags: .*F' "$dir/qemu-$qemu" || {
  echo "need-binfmt: $dir/qemu-$qemu lacks the F flag: chroots of $arch would not run" >&2
  exit 1
}
arch-test "$arch" >/dev/null || {
  echo "need-binfmt: $arch programs do not run here, though qemu-$qemu is registered" >&2
  exit 1
}
