"""Who is masqueraded on the way to a ClusterIP, with real packets: ``masqueradeAll`` and the
detect-local modes, that tell pods by source range or by the interface they come in on, from
kube-proxy's flags and from its configuration file.

pod-a and pod-b are on node1 (podCIDR 10.244.1.0/24, where nlproxy runs), pod-r on node2
(10.244.2.0/24). The outside client routes through node1; besides its own 192.168.50.2 it is given
``OFF_NODE_POD`` (inside the cluster's 10.244.0.0/16, outside node1's podCIDR) to stand for
cluster traffic that comes from off the node. What the endpoint sees as the source tells whether
node1 masqueraded the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nlproxy.cli import main
from nlproxy.demo.testbed import Testbed
from tests.configs import KUBEADM_CONFIGMAP
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, ask

testbed = topo.testbed

VIP = "10.96.0.10"
OFF_NODE_POD = "10.244.3.9"


def _web(tb: Testbed, pod: str) -> list[dict[str, object]]:
    p = tb.pod(pod)
    return [
        topo.service("web", VIP, PORTS),
        topo.endpoint_slice("web", [topo.endpoint(str(p.ipv4), p.node)], SLICE_PORTS),
    ]


def _program(tb: Testbed, directory: Path, objects: list[dict[str, object]], *flags: str) -> None:
    """``run --once`` as node1's proxy with ``flags`` (no --cluster-cidr unless given)."""
    manifests = topo.write_manifests(directory / "manifests", [tb.node_manifest(), *objects])
    argv = [
        "--netns", tb.node.netns, "--log-level", "error", "run", "--manifests", str(manifests),
        "--node-name", tb.node.name, "--service-cidr", tb.service_cidr(), *flags, "--once",
    ]  # fmt: skip
    status = main(argv)
    assert status == topo.EXIT_OK, f"run --once exited {status}\n{topo.nft_ruleset(tb)}"


def _detect_file(directory: Path, mode: str, field: str, interface: str) -> str:
    """kubeadm's ConfigMap with an interface detect-local mode."""
    detect = f"detectLocalMode: {mode}\ndetectLocal:\n  {field}: {interface}"
    return _config_file(directory, ('detectLocalMode: ""', detect))


def _no_changes(tb: Testbed, directory: Path, config: str) -> None:
    """``plan --exit-code`` with the same settings from a file finds the kernel as planned: the
    rules read back equal to the plan, so a restart sends nothing."""
    argv = [
        "--netns", tb.node.netns, "--log-level", "error", "plan", "--manifests",
        str(directory / "manifests"), "--node-name", tb.node.name, "--service-cidr",
        tb.service_cidr(), "--config", config, "--exit-code",
    ]  # fmt: skip
    assert main(argv) == topo.EXIT_OK, topo.nft_ruleset(tb)


def _config_file(directory: Path, *replacements: tuple[str, str]) -> str:
    text = KUBEADM_CONFIGMAP.replace("clusterCIDR: 10.244.0.0/16", "clusterCIDR: ''")
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = directory / "kube-proxy.conf"
    path.write_text(text)
    return str(path)


def _seen(tb: Testbed, ns: str, src: str | None = None) -> set[str]:
    """The sources the endpoints saw for TCP connections from ``ns`` to the ClusterIP."""
    seen = answers(ask("tcp", ns, VIP, 80, n=4, src=src))
    return set().union(*seen.values())


def _off_node_source(tb: Testbed) -> None:
    topo.sh(tb.client.netns, "ip", "addr", "add", f"{OFF_NODE_POD}/32", "dev", "lo")


@pytest.mark.parametrize("how", ["flag", "file"])
def test_masquerade_all_makes_a_pods_connection_come_from_the_node(
    testbed: Testbed, tmp_path: Path, how: str
) -> None:
    a = testbed.pod("pod-a")
    cidr = ["--cluster-cidr", testbed.cluster_cidr()]
    _program(testbed, tmp_path, _web(testbed, "pod-r"), *cidr)
    assert _seen(testbed, a.netns) == {str(a.ipv4)}  # a pod keeps its source by default
    if how == "flag":
        flags = [*cidr, "--masquerade-all"]
    else:
        masq = ("nftables:\n  masqueradeAll: false", "nftables:\n  masqueradeAll: true")
        flags = [*cidr, "--config", _config_file(tmp_path, masq)]
    _program(testbed, tmp_path, _web(testbed, "pod-r"), *flags)
    # To the endpoint on node2: from node1's address on the link to it.
    assert _seen(testbed, a.netns) == {str(testbed.node.ipv4)}
    # To an endpoint on node1: from node1's address on the pod's link.
    _program(testbed, tmp_path, _web(testbed, "pod-b"), *flags)
    assert _seen(testbed, a.netns) == {str(testbed.node.gateway_v4)}


# (the mode's flags) -> whether the endpoint saw each source masqueraded
CASES = {
    "ClusterCIDR": (["--cluster-cidr", "10.244.0.0/16"], False, False, True),
    "NodeCIDR": (
        ["--cluster-cidr", "10.244.0.0/16", "--detect-local-mode", "NodeCIDR"],
        False, True, True,
    ),
    "no-range-known": ([], False, False, False),  # upstream's no-op detector: none masqueraded
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_detect_local_by_source_range(testbed: Testbed, tmp_path: Path, case: str) -> None:
    """A pod of this node, a cluster source off the node, an outside client: which of them
    reach a ClusterIP masqueraded. ClusterCIDR and NodeCIDR differ on the second."""
    flags, pod, off_node_pod, outside = CASES[case]
    a, b = testbed.pod("pod-a"), testbed.pod("pod-b")
    _off_node_source(testbed)
    _program(testbed, tmp_path, _web(testbed, "pod-b"), *flags)
    masqueraded = str(testbed.node.gateway_v4)  # node1's address on pod-b's link

    def want(masq: bool, src: str) -> set[str]:
        return {masqueraded if masq else src}

    assert _seen(testbed, a.netns) == want(pod, str(a.ipv4))
    client = testbed.client
    assert _seen(testbed, client.netns, OFF_NODE_POD) == want(off_node_pod, OFF_NODE_POD)
    outside_ip = str(client.ipv4[0])
    assert _seen(testbed, client.netns, outside_ip) == want(outside, outside_ip)
    assert b.ipv4 != a.ipv4


def test_node_cidr_from_the_file_follows_the_node(testbed: Testbed, tmp_path: Path) -> None:
    """``detectLocalMode: NodeCIDR`` in kubeadm's ConfigMap: the pod range is the Node's
    podCIDR, read again when the Node changes."""
    a = testbed.pod("pod-a")
    _off_node_source(testbed)
    conf = _config_file(tmp_path, ('detectLocalMode: ""', "detectLocalMode: NodeCIDR"))
    _program(testbed, tmp_path, _web(testbed, "pod-b"), "--config", conf)
    masqueraded = str(testbed.node.gateway_v4)
    assert _seen(testbed, a.netns) == {str(a.ipv4)}
    assert _seen(testbed, testbed.client.netns, OFF_NODE_POD) == {masqueraded}
    # The Node's podCIDR now covers the off-node source instead of pod-a.
    node = testbed.node_manifest()
    node["spec"] = {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"]}
    manifests = topo.write_manifests(tmp_path / "manifests", [node, *_web(testbed, "pod-b")])
    argv = [
        "--netns", testbed.node.netns, "--log-level", "error", "run", "--manifests",
        str(manifests), "--node-name", testbed.node.name, "--config", conf, "--once",
    ]  # fmt: skip
    assert main(argv) == topo.EXIT_OK
    assert _seen(testbed, a.netns) == {masqueraded}
    assert _seen(testbed, testbed.client.netns, OFF_NODE_POD) == {OFF_NODE_POD}


BRIDGE = "cbr0"
BRIDGE_POD = "10.244.9.2"


def _bridge_pod(tb: Testbed, make_netns: Callable[[str], str]) -> str:
    """A pod namespace behind bridge ``cbr0`` on node1 (as a bridge CNI wires pods): its
    packets come in on the bridge, not on a veth of their own. Returns the namespace."""
    pod = make_netns("brpod")
    node = tb.node.netns
    topo.sh(node, "ip", "link", "add", BRIDGE, "type", "bridge")
    topo.sh(node, "ip", "addr", "add", "10.244.9.1/24", "dev", BRIDGE)
    topo.sh(node, "ip", "link", "set", BRIDGE, "up")
    topo.sh(node, "ip", "link", "add", "brport0", "type", "veth", "peer", "name", "eth0",
            "netns", pod)  # fmt: skip
    topo.sh(node, "ip", "link", "set", "brport0", "master", BRIDGE)
    topo.sh(node, "ip", "link", "set", "brport0", "up")
    topo.sh(pod, "ip", "addr", "add", f"{BRIDGE_POD}/24", "dev", "eth0")
    topo.sh(pod, "ip", "link", "set", "eth0", "up")
    topo.sh(pod, "ip", "route", "add", "default", "via", "10.244.9.1")
    return pod


def test_detect_local_by_bridge_interface(
    testbed: Testbed, tmp_path: Path, make_netns: Callable[[str], str]
) -> None:
    """``--detect-local-mode BridgeInterface``: what comes in on the bridge is a pod of this
    node, whatever its address; pod-a (on a veth of its own) and the outside client are not,
    and are masqueraded, as kube-proxy's ``iifname`` detector."""
    pod = _bridge_pod(testbed, make_netns)
    _off_node_source(testbed)
    flags = ["--cluster-cidr", "10.244.0.0/16", "--detect-local-mode", "BridgeInterface",
             "--pod-bridge-interface", BRIDGE]  # fmt: skip
    _program(testbed, tmp_path, _web(testbed, "pod-b"), *flags)
    masqueraded = str(testbed.node.gateway_v4)
    _no_changes(
        testbed, tmp_path, _detect_file(tmp_path, "BridgeInterface", "bridgeInterface", BRIDGE)
    )
    assert _seen(testbed, pod) == {BRIDGE_POD}
    assert _seen(testbed, testbed.pod("pod-a").netns) == {masqueraded}
    assert _seen(testbed, testbed.client.netns, OFF_NODE_POD) == {masqueraded}
    assert _seen(testbed, testbed.client.netns, str(testbed.client.ipv4[0])) == {masqueraded}


@pytest.mark.parametrize("how", ["flag", "file"])
def test_detect_local_by_interface_name_prefix(testbed: Testbed, tmp_path: Path, how: str) -> None:
    """``InterfaceNamePrefix`` ``veth`` (the node's side of every testbed pod): pod-a is this
    node's pod; from the client (in on eth1), a cluster address is masqueraded too, where
    ClusterCIDR would let it through (test_detect_local_by_source_range)."""
    a = testbed.pod("pod-a")
    assert a.host_veth.startswith("veth")
    _off_node_source(testbed)
    conf = _detect_file(tmp_path, "InterfaceNamePrefix", "interfaceNamePrefix", "veth")
    if how == "flag":
        flags = ["--cluster-cidr", "10.244.0.0/16", "--detect-local-mode", "InterfaceNamePrefix",
                 "--pod-interface-name-prefix", "veth"]  # fmt: skip
    else:
        flags = ["--config", conf]
    _program(testbed, tmp_path, _web(testbed, "pod-b"), *flags)
    _no_changes(testbed, tmp_path, conf)
    masqueraded = str(testbed.node.gateway_v4)
    assert _seen(testbed, a.netns) == {str(a.ipv4)}
    assert _seen(testbed, testbed.client.netns, OFF_NODE_POD) == {masqueraded}
    assert _seen(testbed, testbed.client.netns, str(testbed.client.ipv4[0])) == {masqueraded}
