"""Which addresses accept NodePorts, and the warning when none does for a family that needs one.

Upstream matches ``nodePortAddresses`` CIDRs against the node's interface addresses (the
kernel's view), not only the Node object's ``status.addresses``; ``primary`` is the Node's first
address of each family.
"""

from __future__ import annotations

import dataclasses
from ipaddress import ip_address
from pathlib import Path

import pytest

from nlproxy.cluster.model import ClusterSnapshot, Protocol
from nlproxy.config import Flags, build_settings
from nlproxy.errors import ConfigError
from nlproxy.nft.ir import Family
from nlproxy.proxy import naming as n
from nlproxy.proxy.addresses import nodeport_gaps
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.planner import plan, plan_context
from nlproxy.proxy.tracer import trace
from tests.configs import KUBEADM_CONFIGMAP
from tests.unit.builders import NODE, node, port, service, snapshot


def _world(*, with_node: bool = True, local: tuple[str, ...] = ()) -> ClusterSnapshot:
    svcs = [
        service("ns", "np", ["172.30.0.1", "fd00:172:30::1"], [port("ns", "np", node_port=30080)])
    ]
    snap = snapshot(svcs, node=node(("192.168.0.2",)) if with_node else None)
    return dataclasses.replace(snap, local_addresses=tuple(ip_address(a) for a in local))


def _config(*addresses: str, node_name: str = NODE) -> ProxyConfig:
    return ProxyConfig(node_name=node_name, nodeport_addresses=addresses)


def _nodeport_ips(snap: ClusterSnapshot, cfg: ProxyConfig, family: Family) -> list[str]:
    rs = plan(snap, cfg).rulesets[family]
    return sorted(str(el.key[0]) for el in rs.elements.get(n.NODEPORT_IPS, {}).values())


@pytest.mark.parametrize(
    ("addresses", "local", "want"),
    [
        pytest.param(("primary",), (), ["192.168.0.2"], id="primary-is-the-node-ip"),
        pytest.param(
            ("10.77.0.0/24",), ("10.77.0.1", "192.168.0.2"), ["10.77.0.1"],
            id="cidr-selects-a-secondary-interface",
        ),
        pytest.param(
            ("primary", "10.77.0.0/24"), ("10.77.0.1", "10.78.0.1"), ["10.77.0.1", "192.168.0.2"],
            id="primary-and-a-cidr",
        ),
        pytest.param(
            ("10.77.0.0/24",), ("127.0.0.1", "10.77.0.9"), ["10.77.0.9"], id="no-loopback"
        ),
    ],
)  # fmt: skip
def test_nodeport_addresses(
    addresses: tuple[str, ...], local: tuple[str, ...], want: list[str]
) -> None:
    assert _nodeport_ips(_world(local=local), _config(*addresses), Family.IP) == want


def test_an_interface_address_change_replans_every_service() -> None:
    cfg = _config("10.77.0.0/24")
    before, after = _world(local=("10.77.0.1",)), _world(local=("10.77.0.2",))
    assert plan_context(before, cfg) != plan_context(after, cfg)


@pytest.mark.parametrize(
    ("snap", "cfg", "gaps"),
    [
        pytest.param(
            _world(), _config("primary"), {Family.IP6}, id="family-the-node-does-not-list"
        ),
        pytest.param(
            _world(with_node=False), _config("primary"), {Family.IP, Family.IP6},
            id="no-node-object",
        ),
        pytest.param(
            _world(local=("10.1.0.1",)), _config("10.77.0.0/24"), {Family.IP},
            id="cidr-matches-nothing",
        ),
        pytest.param(
            _world(local=("10.77.0.1",)), _config("10.77.0.0/24"), set(), id="cidr-matches"
        ),
        pytest.param(_world(), _config(), set(), id="no-entries-means-every-address"),
    ],
)  # fmt: skip
def test_gaps(snap: ClusterSnapshot, cfg: ProxyConfig, gaps: set[Family]) -> None:
    assert set(nodeport_gaps(snap, cfg)) == gaps


def test_gap_message_names_the_node_the_family_and_what_was_looked_at() -> None:
    gaps = nodeport_gaps(_world(local=("10.1.0.1",)), _config("10.77.0.0/24"))
    assert gaps[Family.IP] == (
        f"node {NODE}: nodePortAddresses 10.77.0.0/24 selects no IPv4 address "
        "(Node test-node: 192.168.0.2; interfaces: 10.1.0.1): IPv4 NodePorts are refused"
    )
    no_node = nodeport_gaps(_world(with_node=False), _config("primary", node_name="typo"))
    assert no_node[Family.IP6] == (
        "node typo: nodePortAddresses primary selects no IPv6 address "
        "(Node typo: no Node object): IPv6 NodePorts are refused"
    )


def test_no_gap_without_node_ports_in_the_family() -> None:
    snap = snapshot([service("ns", "c", "172.30.0.2")], node=node(("192.168.0.2",)))
    assert nodeport_gaps(snap, _config("primary")) == {}


def test_the_all_keyword_accepts_nodeports_on_every_local_address(tmp_path: Path) -> None:
    """kube-proxy 1.37's ``nodePortAddresses: [all]``, in the file and as the flag."""
    conf = tmp_path / "c.yaml"
    conf.write_text(
        KUBEADM_CONFIGMAP.replace("nodePortAddresses: null", "nodePortAddresses:\n- all")
    )
    for flags in (
        Flags(config=conf, node_name=NODE),
        Flags(nodeport_addresses="all", node_name=NODE),
    ):
        cfg = build_settings(flags).proxy
        snap = _world(local=("10.9.0.7",))
        for family in (Family.IP, Family.IP6):
            rs = plan(snap, cfg).rulesets[family]
            assert n.NODEPORT_IPS not in rs.sets  # every local address, as with 0.0.0.0/0
        got = trace(
            plan(snap, cfg).rulesets[Family.IP], ip_address("203.0.113.1"), Protocol.TCP,
            ip_address("10.9.0.7"), 30080, local_addrs={ip_address("10.9.0.7")},
        )  # fmt: skip
        # A secondary address takes the NodePort (no endpoints: rejected); with the default
        # (primary) it would not be a NodePort there, and pass untouched.
        assert got.verdict == "REJECT"
        assert nodeport_gaps(snap, cfg) == {}


@pytest.mark.parametrize("value", ["localhost", "primary,localhost"])
def test_localhost_is_refused_saying_why(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_settings(Flags(nodeport_addresses=value, node_name=NODE))
    assert str(err.value).startswith("nodePortAddresses: 'localhost': NodePorts on loopback")
    assert "nftables mode serves none" in str(err.value)


def test_all_must_stand_alone() -> None:
    with pytest.raises(ConfigError, match="'all' must be the only entry"):
        build_settings(Flags(nodeport_addresses="all,primary", node_name=NODE))
