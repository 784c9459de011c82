"""``nlproxy version``: nlproxy's, libnftnl's and the kernel's versions."""

from __future__ import annotations

import argparse
import os

from nlproxy import __version__

NAME = "version"
HELP = "print nlproxy's, libnftnl's and the kernel's versions"
LOGS = False
"""Nothing here logs, so the command line leaves logging (and structlog) unloaded."""


def versions() -> dict[str, str]:
    from nlproxy._nftshim import ffi, lib

    return {
        "nlproxy": __version__,
        "libnftnl": ffi.string(lib.nls_libnftnl_version()).decode(),
        "kernel": os.uname().release,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    v = versions()
    if args.json:
        import json

        print(json.dumps(v))
    else:
        print(f"nlproxy {v['nlproxy']} (libnftnl {v['libnftnl']}, kernel {v['kernel']})")
    return 0
