"""``nlproxy version``: the versions that decide how nlproxy behaves on this node: its own, the
libnftnl its shim was built against and loads, and the running kernel's. Read only."""

from __future__ import annotations

import os

from nlproxy import __version__


def versions() -> dict[str, str]:
    """``{"nlproxy": ..., "libnftnl": ..., "kernel": ...}``."""
    from nlproxy._nftshim import ffi, lib

    return {
        "nlproxy": __version__,
        "libnftnl": ffi.string(lib.nls_libnftnl_version()).decode(),
        "kernel": os.uname().release,
    }
