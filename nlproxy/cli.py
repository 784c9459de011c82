"""Command line: ``main(argv) -> int`` wires subcommands (``nlproxy/commands/``) together.

Thin: parsing and dispatch only. Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration
error, 3 applied but some objects were invalid and left out, 4 ``inspect`` found unreachable
endpoints.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import cast

import nlproxy.commands
from nlproxy import __version__
from nlproxy.errors import ConfigError, NlproxyError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def _commands() -> list[ModuleType]:
    mods = [
        importlib.import_module(f"nlproxy.commands.{info.name}")
        for info in pkgutil.iter_modules(nlproxy.commands.__path__)
        if not info.name.startswith("_")
    ]
    return sorted(mods, key=lambda m: str(m.NAME))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nlproxy",
        description="Kubernetes service proxy that programs nftables over netlink.",
    )
    parser.add_argument("--version", action="version", version=f"nlproxy {__version__}")
    parser.add_argument(
        "--netns",
        metavar="NAME",
        help="work in this named network namespace (default: the current one)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument(
        "--log-format",
        default="auto",
        choices=["auto", "json", "console"],
        help="auto: console on a terminal, JSON lines otherwise",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _commands():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(func=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run nlproxy with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from nlproxy.log import configure

    configure(level=args.log_level, fmt=args.log_format)
    func = cast(Callable[[argparse.Namespace], int], args.func)
    try:
        return func(args)
    except ConfigError as exc:
        print(f"nlproxy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NlproxyError as exc:
        print(f"nlproxy: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:
        hint = " (nlproxy needs CAP_NET_ADMIN)" if exc.errno == errno.EPERM else ""
        print(f"nlproxy: {args.command}: {exc.strerror or exc}{hint}", file=sys.stderr)
        return EXIT_FAILURE


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
