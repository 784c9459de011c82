"""``nlproxy services``: one table of every service port's frontends and backends on this node.

Thin wiring over :mod:`nlproxy.operate.services`: reads what is programmed (tables ``ip``/``ip6
nlproxy``, read back from the kernel and decoded by ``explain.rules.kernel_frontends`` through
``proxy/layout.py``, the one copy of the ruleset read backwards), classifies each backend with
the inspector, and with ``--manifests DIR`` takes backend conditions and traffic policies from
the Services and EndpointSlices there. Exit status 0, 2 for a bad or unknown ``--service``.
Read only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import Upsert
from nlproxy.errors import ConfigError
from nlproxy.inspect.classify import classify
from nlproxy.nft.ir import Family
from nlproxy.nft.readback import read_ruleset
from nlproxy.operate.explain import parse_service_key
from nlproxy.operate.rules import FrontendReport, kernel_frontends
from nlproxy.operate.services import (
    Manifests,
    build_rows,
    join_frontends,
    manifests_index,
    render_table,
    row_json,
)
from nlproxy.proxy import naming as n

NAME = "services"
HELP = "list every service frontend with its backends, their state and the policies"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service", metavar="NS/NAME", help="only this Service")
    parser.add_argument(
        "--manifests",
        type=Path,
        metavar="DIR",
        help="take backend conditions (ready/serving/terminating) and traffic policies from the "
        "Services and EndpointSlices in DIR: the kernel's maps only tell which backends are in "
        "use, not why",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list, one per frontend")
    parser.epilog = (
        "Without --manifests a backend's state is 'in use' (ready, or serving while "
        "terminating when no backend is ready: the kernel cannot tell), and an internal "
        "traffic policy is known only when it drops ('?' otherwise). Local/remote and "
        "reachable come from this node's routes, as in `nlproxy inspect`."
    )


def run(args: argparse.Namespace) -> int:
    key = str(parse_service_key(args.service)) if args.service else None
    rulesets = {
        fam: rs
        for fam in (Family.IP, Family.IP6)
        if (rs := read_ruleset(fam, n.TABLE, netns=args.netns)) is not None
    }
    manifests = _manifests(args.manifests)
    frontends: list[FrontendReport] = [
        fe for rs in rulesets.values() for fe in kernel_frontends(rs, key)
    ]
    if manifests is not None:
        frontends = join_frontends(frontends, manifests, key)
    if key is not None and not frontends:
        where = f"nor defined in {args.manifests}" if manifests else "(no --manifests given)"
        raise ConfigError(f"service {key}", f"unknown: nothing is programmed for it {where}")
    frontends.sort(key=_order)
    reach = classify(
        [a for fe in frontends for a, _ in (*fe.endpoints, *fe.local_endpoints)], netns=args.netns
    )
    rows = build_rows(frontends, rulesets, reach, manifests)
    if args.json:
        print(json.dumps([row_json(r) for r in rows], indent=2))
    elif not rows:
        print("nlproxy has programmed no service here")
    else:
        print(render_table(rows))
    return 0


def _manifests(directory: Path | None) -> Manifests | None:
    if directory is None:
        return None
    if not directory.is_dir():
        raise ConfigError("flag --manifests", f"{directory} is not a directory")
    load = load_manifests(directory)
    return manifests_index(c.obj for r in load.changes for c in r.changes if isinstance(c, Upsert))


def _order(fe: FrontendReport) -> tuple[str, bool, int, int, int]:
    kinds = ("cluster-ip", "external-ip", "load-balancer", "external", "node-port")
    addr = 0 if fe.address is None else int(fe.address)
    return (fe.ref, fe.family is Family.IP6, kinds.index(fe.kind), addr, fe.port)
