# target.sh: sourced by the build scripts; how to build for the Debian architecture $arch (amd64
# or arm64) on this machine. Sets:
#   native   this machine's Debian architecture
#   target   a command prefix (an array) under which Python builds for $arch: empty natively; for
#            another architecture, Python told the target's platform (wheel tags:
#            _PYTHON_HOST_PLATFORM) and build configuration (compiler, extension suffix: the
#            target's _sysconfigdata from libpython3.11-dev:ARCH), whose cross compiler and
#            libraries it installs (multiarch). Nothing of the target architecture runs.
# Needs $root (the checkout) and $arch (empty: this machine's); exits 2 for an architecture that is not built.
# Without dpkg (a build host that is not Debian's), the machine's own architecture by uname.
if command -v dpkg >/dev/null 2>&1; then
  native=$(dpkg --print-architecture)
else
  case $(uname -m) in aarch64) native=arm64 ;; x86_64) native=amd64 ;; *) native=$(uname -m) ;; esac
fi
arch=${arch:-$native}
target=()
if [ "$arch" != "$native" ]; then
  case $arch in
    arm64) triplet=aarch64-linux-gnu platform=linux-aarch64 ;;
    amd64) triplet=x86_64-linux-gnu platform=linux-x86_64 ;;
    *) echo "NLPROXY_ARCH=$arch: only amd64 and arm64 are built" >&2; exit 2 ;;
  esac
  bash "$root/packaging/need-debs.sh" "gcc-$triplet" "libc6-dev-$arch-cross" "libnftnl-dev:$arch" \
    "libmnl-dev:$arch" "libpython3.11-dev:$arch" >&2
  target=(env "_PYTHON_HOST_PLATFORM=$platform" "_PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__$triplet")
fi
