"""``nlproxy plan``: what the next sync would change, without changing anything.

Thin wiring over :func:`nlproxy.operate.plan.dry_run`, :mod:`nlproxy.operate.plan_report` and
``plan_render``.
The source is ``--manifests DIR`` or the API server (``--kubeconfig``, or in-cluster); the
settings are ``run``'s flags (kube-proxy's command line included) but those about running,
``--config`` among them, so ``plan --config NEW`` previews a configuration change. Exit status
0; with ``--exit-code``, 1 when the sync would change something (0 when not); 1 for a runtime
failure; 2 for a usage or configuration error. Read only.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nlproxy.config import Settings

NAME = "plan"
HELP = "show what the next sync would change (elements, chains, rules, conntrack flows), read only"
LOGS = False
"""It reports by printing; logging is set up only if something on its path logs after all."""
EXIT_CHANGES = 1

RUN_ONLY = frozenset(
    {
        "manifests",  # the source options, added first and mutually exclusive
        "kubeconfig",
        "cleanup",  # what run does instead of syncing
        "init_only",
        "write_config_to",
        "once",
        "force",
        "replace_kube_proxy",  # what the daemon does after a sync
        "exclude_unreachable_endpoints",  # needs the inspector of a running daemon
    }
)
"""``run``'s flags about running rather than about what a sync programs; plan takes every other
one as ``run`` spells, reads and explains it (kube-proxy's flags included, those nlproxy has no
use for named in a warning), so the plan of a daemon, or of a kube-proxy DaemonSet's command
line, is asked for with that command line."""


DESCRIPTION = (
    HELP
    + ". Like `terraform plan` or `kubectl diff`: the next sync runs with nothing applied (the "
    "tables are read back, each batch is checked by the kernel and kept, the conntrack cleanup "
    "lists the flows it would delete), so what is printed is the sync's own batch: exactly "
    "what run --once sends, and a daemon at its start or after a verify (a running daemon's "
    "in-place sync programs the same tables, its batch perhaps grouped otherwise). Per Service "
    "(and for the shared objects) it shows the elements, chains, rules and sets added (+), "
    "changed (~) and removed (-), and the flows that would be deleted; --json prints every "
    "operation of every batch, in order. The source is --manifests DIR or the API server; "
    "the settings are run's own flags (kube-proxy's command line included), so --config NEW "
    "previews a configuration change. "
    "Objects left out are named. Exit 0; with --exit-code 1 when anything would change; 1 for "
    "a runtime failure, 2 for a usage or configuration error."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    add_source_and_settings(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when the sync would change something, 0 when not (as `git diff --exit-code`)",
    )
    parser.epilog = (
        "The plan is the sync's own batch: the tables are read back, the next sync runs with "
        "nothing applied (the kernel checks each batch and aborts it) and the conntrack flows "
        "its cleanup would delete are listed. --config NEW previews a configuration change."
    )


def add_source_and_settings(parser: argparse.ArgumentParser) -> None:
    """``--manifests`` or ``--kubeconfig``, and ``run``'s flags but those of :data:`RUN_ONLY`."""
    from nlproxy.commands import run

    src = parser.add_mutually_exclusive_group()
    src.add_argument("--manifests", type=Path, metavar="DIR", help="read objects from DIR")
    src.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster)")
    donor = argparse.ArgumentParser(add_help=False)
    run.add_arguments(donor)
    for action in donor._actions:
        if action.dest not in RUN_ONLY:
            parser._add_action(action)


def settings(args: argparse.Namespace) -> Settings:
    """The settings the parsed flags (and ``--config``) give; their warnings are printed."""
    from nlproxy.config import Flags, build_settings

    names = {f.name for f in fields(Flags)}
    s = build_settings(Flags(**{k: v for k, v in vars(args).items() if k in names}))
    for warning in s.daemon.warnings:
        print(f"nlproxy: warning: {warning}", file=sys.stderr)
    return s


def run(args: argparse.Namespace) -> int:
    from nlproxy.operate.plan import dry_run
    from nlproxy.operate.plan_render import render_text, report_json
    from nlproxy.operate.plan_report import report

    dry = dry_run(settings(args))
    rep = report(
        dry.batches,
        dry.before,
        dry.after,
        dry.flows,
        problems=dry.problems,
        warnings=dry.warnings,
        services=dry.services,
    )
    for warning in rep.warnings:
        print(f"nlproxy: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(report_json(rep), indent=2))
    else:
        print(render_text(rep), end="")
    return EXIT_CHANGES if args.exit_code and rep.changed else 0
