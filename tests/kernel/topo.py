"""Shared topology fixtures and manifest builders for the datapath tests.

Import explicitly (there is deliberately no conftest here): ``testbed = topo.testbed`` in a test
module makes the fixture available to it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.cli import main
from nlproxy.demo.echo import Outcome, Result, request
from nlproxy.demo.testbed import Testbed
from tests.objects import endpoint, endpoint_slice, service

EXIT_OK = 0
EXIT_INVALID = 3
REQUESTS = 24  # per check: two endpoints both answer with probability 1 - 2**-23

# A Service port pair most tests use: TCP 80 and UDP 53, both to the echo servers' 8080.
PORTS = (
    {"name": "tcp", "port": 80, "targetPort": 8080, "protocol": "TCP"},
    {"name": "udp", "port": 53, "targetPort": 8080, "protocol": "UDP"},
)
SLICE_PORTS = (
    {"name": "tcp", "port": 8080, "protocol": "TCP"},
    {"name": "udp", "port": 8080, "protocol": "UDP"},
)
SVC_PORT = {"tcp": 80, "udp": 53}


@pytest.fixture
def testbed() -> Iterator[Testbed]:
    """IPv4 node with pods pod-a, pod-b, pod-c; node2 with pod-r; the outside client."""
    with Testbed(tag="tk") as tb:
        yield tb


@pytest.fixture
def testbed6() -> Iterator[Testbed]:
    """The same topology, dual stack."""
    with Testbed(tag="tk6", ipv6=True) as tb:
        yield tb


# -- manifests ---------------------------------------------------------------------------------


LB_IP = "192.168.70.10"


def lb(tb: Testbed, name: str, vip: str, pod: str, port: int, ranges: list[str]) -> list[Any]:
    """A LoadBalancer Service at ``LB_IP`` open to ``ranges``, with ``pod`` as its endpoint."""
    p = tb.pod(pod)
    ports = [{"name": "tcp", "port": port, "targetPort": 8080}]
    return [
        service(
            name,
            vip,
            ports,
            type="LoadBalancer",
            loadBalancerSourceRanges=ranges,
            status={"loadBalancer": {"ingress": [{"ip": LB_IP}]}},
        ),
        endpoint_slice(name, [endpoint(str(p.ipv4), p.node)]),
    ]


def write_manifests(directory: Path, objects: Sequence[dict[str, Any]]) -> Path:
    """Replace the YAML files in ``directory`` with one file per object."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.yaml"):
        old.unlink()
    for i, obj in enumerate(objects):
        meta = obj["metadata"]
        fname = f"{i:02d}-{obj['kind'].lower()}-{meta.get('namespace', '')}-{meta['name']}.yaml"
        (directory / fname).write_text(yaml.safe_dump(obj, sort_keys=False))
    return directory


def run_once(tb: Testbed, directory: Path, *extra: str) -> int:
    """``nlproxy --netns NODE run --once`` on ``directory``, as the node's proxy."""
    return main(
        [
            "--netns",
            tb.node.netns,
            "--log-level",
            "warning",
            "run",
            "--manifests",
            str(directory),
            *tb.run_args(),
            "--once",
            *extra,
        ]
    )


def apply(tb: Testbed, directory: Path, objects: Sequence[dict[str, Any]]) -> None:
    """Write ``objects`` plus the Node object, run once, and insist it applied cleanly."""
    write_manifests(directory, [tb.node_manifest(), *objects])
    status = run_once(tb, directory)
    assert status == EXIT_OK, f"run --once exited {status}\n{nft_ruleset(tb)}"


def nft_ruleset(tb: Testbed) -> str:
    """The node's ruleset as ``nft`` lists it (for failure messages)."""
    proc = subprocess.run(
        ["ip", "netns", "exec", tb.node.netns, "nft", "list", "ruleset"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout + proc.stderr


def sh(ns: str | None, *cmd: str) -> str:
    """Run a tool (inside ``ns`` when given) to set up or check from outside; stdout."""
    full = ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)
    proc = subprocess.run(full, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(full)}: {proc.stderr}"
    return proc.stdout


def decoy(tb: Testbed, addr: str) -> None:
    """Give the client ``addr`` on its loopback: node1 routes unknown addresses to the client,
    so a packet to ``addr`` that nlproxy fails to drop is answered with a reset (refused)
    instead of vanishing, and a drop test can tell the two apart."""
    sh(tb.client.netns, "ip", "addr", "add", f"{addr}/32", "dev", "lo")


def ask(
    proto: str, ns: str, addr: str, port: int, *, n: int = REQUESTS, src: str | None = None
) -> list[Outcome]:
    """``n`` requests, each from a fresh source port."""
    return [request(proto, ns, addr, port, src=src, timeout=2.0) for _ in range(n)]


def answers(outcomes: Sequence[Outcome]) -> dict[str, set[str]]:
    """Pod name -> the sources it saw; every request must have been answered."""
    failed = [str(o) for o in outcomes if o.result is not Result.ANSWERED]
    assert not failed, f"{len(failed)} of {len(outcomes)} requests failed: {failed[0]}"
    seen: dict[str, set[str]] = {}
    for o in outcomes:
        seen.setdefault(o.pod, set()).add(str(o.src))
    return seen


def results(outcomes: Sequence[Outcome]) -> set[Result]:
    return {o.result for o in outcomes}
