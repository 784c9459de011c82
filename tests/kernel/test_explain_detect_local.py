"""``nlproxy explain --from`` with the interface detect-local modes: the trace follows the
interface the source's packets come in on (the route back to it), so a pod of this node is not
reported masqueraded where real packets are not, and other sources are.

The same testbed and programming as ``test_datapath_local.py``, whose real packets prove what
each source sees; each trace here is also checked against a real connection.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.test_datapath_local import (
    BRIDGE,
    BRIDGE_POD,
    _bridge_pod,
    _program,
    _seen,
    _web,
)

testbed = topo.testbed


def _masquerade(capsys: pytest.CaptureFixture[str], tb: Testbed, src: str) -> bool:
    """What ``explain default/web --from src`` says of the TCP ClusterIP frontend."""
    capsys.readouterr()
    main(["--netns", tb.node.netns, "--log-level", "error", "explain", "default/web",
          "--port", "tcp", "--from", src, "--json"])  # fmt: skip
    report: Any = json.loads(capsys.readouterr().out)
    [row] = [r for r in report["trace"]["results"] if r["frontend"].startswith("10.96.0.10")]
    assert row["verdict"] == "ACCEPT", row
    return bool(row["masquerade"])


def test_interface_name_prefix(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = testbed.pod("pod-a")
    mode = ["--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "veth"]
    _program(testbed, tmp_path, _web(testbed, "pod-b"), "--cluster-cidr", "10.244.0.0/16", *mode)
    masqueraded = str(testbed.node.gateway_v4)
    # pod-a comes in on its veth: a pod of this node, as the endpoint sees it.
    assert _seen(testbed, a.netns) == {str(a.ipv4)}
    assert _masquerade(capsys, testbed, str(a.ipv4)) is False
    # The client comes in on the node's outside link: masqueraded.
    client = str(testbed.client.ipv4[0])
    assert _seen(testbed, testbed.client.netns, client) == {masqueraded}
    assert _masquerade(capsys, testbed, client) is True


def test_bridge_interface(
    testbed: Testbed,
    tmp_path: Path,
    make_netns: Callable[[str], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pod = _bridge_pod(testbed, make_netns)
    mode = ["--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", BRIDGE]
    _program(testbed, tmp_path, _web(testbed, "pod-b"), "--cluster-cidr", "10.244.0.0/16", *mode)
    masqueraded = str(testbed.node.gateway_v4)
    assert _seen(testbed, pod) == {BRIDGE_POD}
    assert _masquerade(capsys, testbed, BRIDGE_POD) is False
    a = testbed.pod("pod-a")  # on a veth of its own, not the bridge
    assert _seen(testbed, a.netns) == {masqueraded}
    assert _masquerade(capsys, testbed, str(a.ipv4)) is True
