"""``nlproxy version``: nlproxy's, libnftnl's and the kernel's versions (gathered by
:func:`nlproxy.operate.version.versions`), as one line or ``--json``."""

from __future__ import annotations

import argparse

NAME = "version"
HELP = "print nlproxy's, libnftnl's and the kernel's versions"
LOGS = False
"""Nothing here logs, so the command line leaves logging (and structlog) unloaded."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from nlproxy.operate.version import versions

    v = versions()
    if args.json:
        import json

        print(json.dumps(v))
    else:
        print(f"nlproxy {v['nlproxy']} (libnftnl {v['libnftnl']}, kernel {v['kernel']})")
    return 0
