"""``nlproxy compare``: kube-proxy's live rules against nlproxy's plan, frontend by frontend.

Thin wiring over :mod:`nlproxy.operate.compare`. Read only. Exit status 0 when every traced
connection has the same outcome in both (or differs only by design, each named), 4 when some
differ, 1 when kube-proxy's rules cannot be read (none on this node, or a rule of an unknown
shape), 2 for usage or configuration errors.

Named ``compare`` because that is what it does and what an operator asks before a switch
("compare kube-proxy with nlproxy on this node"): ``preflight`` answers whether the node is
ready to switch (its conntrack, other proxies, settings), ``compare`` whether the Services would
behave the same once it has.
"""

from __future__ import annotations

import argparse
import json

from nlproxy.operate.text import printable, printable_lines

NAME = "compare"
HELP = (
    "compare kube-proxy's live rules (nftables or iptables mode) with nlproxy's plan for the same "
    "cluster: every "
    "Service frontend traced from pods, the node and outside; differences in words (exit 4 if "
    "any differ)"
)
LOGS = False
EXIT_DIFFERENT = 4
EXIT_FAILURE = 1


DESCRIPTION = (
    HELP + ". "
    "The certificate before replacing kube-proxy on a node: kube-proxy's `ip`/`ip6 kube-"
    "proxy` tables (nftables mode), or its KUBE-* chains in the iptables-nft `nat` and "
    "`filter` tables with the compat matches and targets it uses (iptables mode), are read "
    "over netlink, nlproxy's plan is made from the same objects "
    "(--manifests DIR or the API server, with run's flags), and one new connection per "
    "Service port, family, frontend (ClusterIP, NodePort on the node's address, external and "
    "load-balancer IPs) and kind of client (a pod on this node, a pod on another node, the "
    "node itself, an outside client, and one inside loadBalancerSourceRanges), plus an "
    "unserved port and an unallocated ClusterIP, is traced through both. Every connection "
    "whose endpoints, masquerading or verdict (accept, reject, drop) differ is named in "
    "words; differences nlproxy means (kube-proxy's --masquerade-all; in iptables mode, "
    "connections to a ClusterIP's unserved port or an unallocated ClusterIP, which iptables "
    "mode routes on and nlproxy refuses) are marked by design with the reason; a summary line "
    "ends the report. Exit 0 when nothing differs but by design, 4 when something does, 1 "
    "when kube-proxy's rules cannot be read (none on this node, a rule of an unknown shape, "
    "named by its chain, or IPVS mode, named and declined; iptables-legacy rules are out of "
    "netlink's reach). Named compare, not a preflight flag: preflight says "
    "whether the node is ready to switch; compare says whether the Services would behave the "
    "same once it has, as diff and plan tools compare two states."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from nlproxy.commands.plan import add_source_and_settings

    parser.description = DESCRIPTION
    add_source_and_settings(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    import sys

    from nlproxy.commands.plan import settings
    from nlproxy.operate.compare import certify, read_kube, render_text, to_json, why_no_table
    from nlproxy.operate.inputs import cluster_inputs, local_addresses
    from nlproxy.operate.plan import source_changes
    from nlproxy.proxy.planner import plan

    s = settings(args)
    changes, load_errors, _ = source_changes(s)
    inputs = cluster_inputs(s, changes, load_errors, local=local_addresses(s))
    for problem in inputs.problems:
        print(f"nlproxy: left out: {printable(problem)}", file=sys.stderr)
    kube = read_kube(s.netns)
    if all(rs is None for rs in kube.values()):
        print(f"nlproxy: compare: {why_no_table(s.netns)}", file=sys.stderr)
        return EXIT_FAILURE
    ours = plan(inputs.snapshot, s.proxy).rulesets
    cert = certify(kube, ours, inputs.snapshot, s.proxy)
    if args.json:
        print(json.dumps(to_json(cert), indent=2))
    else:
        print(printable_lines(render_text(cert)), end="")
    return EXIT_DIFFERENT if cert.differences else 0
