"""Real-world KubeProxyConfigurations (``tests/data/config/``: kubeadm's, iptables mode, iptables
with masqueradeAll, IPVS with each scheduler, NodeCIDR, BridgeInterface) given to ``nlproxy run``
as kube-proxy was given them: each starts and programs what kube-proxy would, shown by the source
an endpoint on another node sees for a pod's connection to a ClusterIP."""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cli import main
from nlproxy.demo.testbed import Testbed
from tests.configs import KUBEADM, ROOT
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, ask

testbed = topo.testbed

REAL_WORLD = ROOT / "tests/data/config/real-world"
VIP = "10.96.0.10"


def _run(tb: Testbed, tmp_path: Path, config: Path) -> int:
    eps = [topo.endpoint(str(tb.pod(p).ipv4), tb.pod(p).node) for p in ("pod-b", "pod-r")]
    objects = [
        tb.node_manifest(),
        topo.service("web", VIP, PORTS),
        topo.endpoint_slice("web", eps, SLICE_PORTS),
    ]
    manifests = topo.write_manifests(tmp_path / "manifests", objects)
    return main(
        [
            "--netns", tb.node.netns, "run", "--config", str(config), "--manifests",
            str(manifests), "--node-name", tb.node.name, "--service-cidr", tb.service_cidr(),
            "--once",
        ]
    )  # fmt: skip


# file -> masqueraded (pod-r sees node1's address rather than pod-a's)
STARTS = {
    "kubeadm": (KUBEADM, False),
    "iptables": (REAL_WORLD / "iptables.conf", False),
    "iptables-masquerade-all": (REAL_WORLD / "iptables-masquerade-all.conf", True),
    "node-cidr": (REAL_WORLD / "node-cidr.conf", False),
    # The testbed's pods sit on veths, not on the file's cni0: not this node's pods for
    # kube-proxy either, so masqueraded (tests/kernel/test_datapath_local.py has a bridge).
    "bridge-interface": (REAL_WORLD / "bridge-interface.conf", True),
}


@pytest.mark.parametrize("name", STARTS)
def test_each_configuration_starts_and_masquerades_as_kube_proxy(
    testbed: Testbed, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config, masqueraded = STARTS[name]
    assert _run(testbed, tmp_path, config) == topo.EXIT_OK, capsys.readouterr().err
    a = testbed.pod("pod-a")
    node = testbed.node
    want = {
        "pod-b": {str(node.gateway_v4 if masqueraded else a.ipv4)},
        "pod-r": {str(node.ipv4 if masqueraded else a.ipv4)},
    }
    assert answers(ask("tcp", a.netns, VIP, 80)) == want
    err = capsys.readouterr().err
    iptables_mode = name in ("iptables", "bridge-interface")
    assert ("mode 'iptables': nlproxy programs nftables" in err) is iptables_mode


@pytest.mark.parametrize(
    ("scheduler", "spread", "warned"),
    [
        pytest.param("rr", True, False, id="rr"),
        pytest.param("sh", False, False, id="sh"),
        pytest.param("mh", False, False, id="mh"),
        pytest.param("lc", True, True, id="lc"),
        pytest.param("wlc", True, True, id="wlc"),
        pytest.param("sed", True, True, id="sed"),
        pytest.param("nq", True, True, id="nq"),
        pytest.param("wrr", True, True, id="wrr"),
        pytest.param("dh", True, True, id="dh"),
    ],
)
def test_ipvs_with_each_scheduler_starts(
    testbed: Testbed,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    scheduler: str,
    spread: bool,
    warned: bool,
) -> None:
    """rr spreads over both endpoints, sh and mh keep one client on one endpoint; the others
    have no equivalent: random choice, said in a warning."""
    config = tmp_path / "ipvs.conf"
    config.write_text(
        (REAL_WORLD / "ipvs.conf").read_text().replace("scheduler: rr", f"scheduler: {scheduler}")
    )
    assert _run(testbed, tmp_path, config) == topo.EXIT_OK
    err = capsys.readouterr().err
    assert "mode 'ipvs': nlproxy programs nftables" in err
    assert (f"ipvs.scheduler '{scheduler}' has no nlproxy equivalent" in err) is warned
    a = testbed.pod("pod-a")
    seen = answers(ask("tcp", a.netns, VIP, 80))
    assert len(seen) == (2 if spread else 1), seen
