"""``nlproxy demo``: a throwaway node in network namespaces, real traffic through a Service.

Thin: arguments and exit status; the story is ``nlproxy/demo/run.py``. Needs root (it creates
namespaces); it deletes everything it made, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

NAME = "demo"
HELP = "show nlproxy at work on a throwaway node in network namespaces (needs root)"

EXIT_INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nlproxy.demo.run import DEFAULT_REQUESTS

    parser.add_argument(
        "--manifests",
        type=Path,
        metavar="DIR",
        help="Service, EndpointSlice and Node manifests (default: the demo's, from the source tree "
        "or the installed share/nlproxy/examples/demo)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=DEFAULT_REQUESTS,
        metavar="N",
        help=f"requests per path (default {DEFAULT_REQUESTS})",
    )


def _nlproxy(argv: Sequence[str]) -> int:
    from nlproxy.cli import main  # the demo's steps are subcommands of the same command line
    from nlproxy.commands import _fastexit

    with _fastexit.held():  # a step's `run --once` returns to the demo, not out of it
        return main(list(argv))


def run(args: argparse.Namespace) -> int:
    from nlproxy.demo.run import find_examples, run_demo
    from nlproxy.errors import ConfigError

    if args.requests < 1:
        raise ConfigError("--requests", f"{args.requests} is not a positive number")
    manifests = args.manifests or find_examples()
    if args.manifests is None and not manifests.is_dir():
        raise ConfigError(
            "--manifests", f"the example manifests are not at {manifests}; give a directory"
        )
    try:
        return run_demo(manifests=manifests, requests=args.requests, nlproxy=_nlproxy)
    except KeyboardInterrupt:
        print("\ninterrupted; every namespace the demo made is deleted", file=sys.stderr)
        return EXIT_INTERRUPTED
