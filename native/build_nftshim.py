"""cffi build script for nlproxy._nftshim: libnftnl's API plus nlproxy's C helpers.

Declarations come from every ``*.cdef`` file beside this script (sorted by name), so each part of
the shim keeps its own. ``libnftnl.cdef`` is generated from Debian's libnftnl-dev headers by
``gen_cdef.py``; ``nftshim.cdef`` declares the helpers in ``nftshim.c``, ``genwatch.cdef`` the
generation watch's looks in ``genwatch.c`` (a thread of its own: ``-pthread``).
"""

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
# setuptools wants source paths relative to the project root (where setup.py runs).
REL = Path("native")


def _version_define() -> str:
    """libnftnl has no version call; take it from pkg-config's file at build time."""
    for pc in (
        "/usr/lib/x86_64-linux-gnu/pkgconfig/libnftnl.pc",
        "/usr/lib/pkgconfig/libnftnl.pc",
        "/usr/lib/aarch64-linux-gnu/pkgconfig/libnftnl.pc",
    ):
        path = Path(pc)
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith("Version:"):
                    return f'-DNLS_LIBNFTNL_VERSION="{line.split(":", 1)[1].strip()}"'
    return '-DNLS_LIBNFTNL_VERSION="unknown"'


ffibuilder = FFI()
ffibuilder.cdef("\n".join(p.read_text() for p in sorted(HERE.glob("*.cdef"))))
ffibuilder.set_source(
    "nlproxy._nftshim",
    '#include "nftshim.h"\n#include "genwatch.h"\n',
    sources=[str(REL / "nftshim.c"), str(REL / "genwatch.c")],
    include_dirs=[str(REL)],
    libraries=["nftnl", "mnl"],
    extra_compile_args=[
        "-O2",
        "-Wall",
        "-Wno-deprecated-declarations",
        "-pthread",
        _version_define(),
    ],
    extra_link_args=["-pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
