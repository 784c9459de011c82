"""``nodePortAddresses`` CIDRs select the node's interface addresses, with real packets.

The node gets a second address on another interface (10.77.0.1, as a secondary NIC or a bridge
would hold it), which the Node object does not list. A CIDR covering it makes the NodePort answer
there; when nothing matches, nlproxy says so instead of refusing NodePorts in silence. The daemon
follows addresses as they come and go.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nlproxy.cli import main
from nlproxy.demo.echo import Result
from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import daemon, publish, wait_until
from tests.netns import sh

testbed = topo.testbed

SECONDARY = "10.77.0.1"
CIDR = "10.77.0.0/24"
NODE_PORT = 30080


def _nodeport_service(tb: Testbed) -> list[dict[str, Any]]:
    ep = topo.endpoint(str(tb.pod("pod-a").ipv4), tb.node.name)
    ports = [{"name": "tcp", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT}]
    return [
        topo.service("np", "10.96.0.40", ports, type="NodePort"),
        topo.endpoint_slice("np", [ep]),
    ]


def _add_secondary(tb: Testbed) -> None:
    ns = tb.node.netns
    sh("ip", "link", "add", "np0", "type", "veth", "peer", "name", "np1", ns=ns)
    sh("ip", "addr", "add", f"{SECONDARY}/32", "dev", "np0", ns=ns)
    for link in ("np0", "np1"):
        sh("ip", "link", "set", link, "up", ns=ns)


def _ask(tb: Testbed, n: int = 2) -> set[Result]:
    return topo.results(topo.ask("tcp", tb.client.netns, SECONDARY, NODE_PORT, n=n))


def test_a_cidr_selects_an_address_the_node_object_does_not_list(
    testbed: Testbed, tmp_path: Path
) -> None:
    _add_secondary(testbed)
    topo.write_manifests(tmp_path, [testbed.node_manifest(), *_nodeport_service(testbed)])
    assert topo.run_once(testbed, tmp_path, "--nodeport-addresses", CIDR) == topo.EXIT_OK
    seen = topo.answers(topo.ask("tcp", testbed.client.netns, SECONDARY, NODE_PORT, n=4))
    assert set(seen) == {"pod-a"}
    # Only the selected address: the node's own (Node object) address is not a NodePort now.
    node_ip = str(testbed.node.ipv4)
    assert topo.results(topo.ask("tcp", testbed.client.netns, node_ip, NODE_PORT, n=1)) != {
        Result.ANSWERED
    }


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        pytest.param(
            ("--nodeport-addresses", CIDR),
            f"nodePortAddresses {CIDR} selects no IPv4 address",
            id="cidr-matches-nothing",
        ),
        pytest.param(
            ("--node-name", "no-such-node"),
            "node no-such-node: nodePortAddresses primary selects no IPv4 address "
            "(Node no-such-node: no Node object)",
            id="wrong-node-name",
        ),
    ],
)
def test_no_address_is_a_warning_not_silence(
    testbed: Testbed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: tuple[str, ...],
    said: str,
) -> None:
    topo.write_manifests(tmp_path, [testbed.node_manifest(), *_nodeport_service(testbed)])
    assert topo.run_once(testbed, tmp_path, *flags) == topo.EXIT_OK
    assert said in capsys.readouterr().err


def _missing(proc: Any) -> float:
    for line in proc.get(proc.metrics, "/metrics")[1].splitlines():
        if line.startswith('nlproxy_nodeport_addresses_missing{ip_family="IPv4"}'):
            return float(line.split()[1])
    raise AssertionError("nlproxy_nodeport_addresses_missing missing from /metrics")


def test_daemon_follows_interface_addresses(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", [testbed.node_manifest(), *_nodeport_service(testbed)])
    with daemon(testbed, d, "--nodeport-addresses", CIDR) as proc:
        assert _missing(proc) == 1
        (event,) = proc.events("nodeport.no_address")
        assert f"nodePortAddresses {CIDR} selects no IPv4 address" in event["error"]
        _add_secondary(testbed)
        wait_until(
            lambda: _ask(testbed, 1) == {Result.ANSWERED}, 5.0, "NodePort on the new address"
        )
        assert _missing(proc) == 0
        sh("ip", "addr", "del", f"{SECONDARY}/32", "dev", "np0", ns=testbed.node.netns)
        wait_until(lambda: _missing(proc) == 1, 5.0, "the address gone again")
        assert len(proc.events("nodeport.no_address")) == 2


def test_explain_says_the_nodeports_are_refused(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topo.write_manifests(tmp_path, [testbed.node_manifest(), *_nodeport_service(testbed)])
    assert topo.run_once(testbed, tmp_path, "--nodeport-addresses", CIDR) == topo.EXIT_OK
    capsys.readouterr()
    ns = testbed.node.netns
    assert main(["--netns", ns, "--log-level", "warning", "explain", "default/np"]) != 0
    out = capsys.readouterr().out
    assert "IPv4 NodePorts are refused: nodePortAddresses selects no IPv4 address" in out
    _add_secondary(testbed)
    assert topo.run_once(testbed, tmp_path, "--nodeport-addresses", CIDR) == topo.EXIT_OK
    capsys.readouterr()
    main(["--netns", ns, "--log-level", "warning", "explain", "default/np"])
    assert "NodePorts are refused" not in capsys.readouterr().out
