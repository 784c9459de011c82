"""Packet-tracer cases over planned rulesets: the world and the case table are ``tests/world.py``
(kube-proxy's nftables tracer cases, restated); the kernel tests trace the same table over what
the kernel holds."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from nlproxy.nft.ir import Family, Ruleset
from nlproxy.proxy.planner import plan
from nlproxy.proxy.tracer import Tracer
from tests.unit.builders import endpoint, eps_slice, node, service, snapshot
from tests.world import (
    CASES,
    EXT,
    EXT6,
    LOCAL,
    NODE6,
    NODE_ALT,
    NODE_IP,
    POD,
    TCP,
    Case,
    config,
    run,
    world,
)


@pytest.fixture(scope="module")
def rulesets() -> dict[Family, Ruleset]:
    return plan(world(), config()).rulesets


@pytest.mark.parametrize("case", CASES)
def test_trace(rulesets: dict[Family, Ruleset], case: Case) -> None:
    assert case.trace(rulesets) == case.expected


@pytest.fixture(scope="module")
def kept(rulesets: dict[Family, Ruleset]) -> dict[Family, Tracer]:
    """One Tracer per family for the whole case table, as ``compare`` keeps one per ruleset."""
    local = [ip_address(a) for a in LOCAL]
    return {f: Tracer(rs, local) for f, rs in rulesets.items()}


@pytest.mark.parametrize("case", CASES)
def test_a_kept_tracer_answers_each_case_as_a_fresh_one(
    kept: dict[Family, Tracer], case: Case
) -> None:
    """What a Tracer keeps between traces (the hooks' chains, the lookups made) never carries
    one connection's answer into the next one's: every case after the first is traced by a
    tracer that has traced the ones before it."""
    dst = ip_address(case.dst)
    tracer = kept[Family.IP if dst.version == 4 else Family.IP6]
    assert tracer.trace(ip_address(case.src), case.proto, dst, case.dport) == case.expected


@pytest.mark.parametrize(
    ("nodeport_addresses", "dst", "endpoints"),
    [
        pytest.param(
            ("0.0.0.0/0",), NODE_ALT, "10.180.0.3:80 10.180.1.3:80", id="all-secondary-ip"
        ),
        pytest.param(("0.0.0.0/0",), "127.0.0.1", "", id="all-but-localhost"),
        pytest.param(("192.168.1.0/24",), NODE_ALT, "10.180.0.3:80 10.180.1.3:80", id="cidr-match"),
        pytest.param(("192.168.1.0/24",), NODE_IP, "", id="cidr-excludes-primary"),
        pytest.param(
            ("primary", "192.168.1.0/24"), NODE_IP, "10.180.0.3:80 10.180.1.3:80", id="both"
        ),
        pytest.param(("192.168.1.0/24",), "5.5.5.6", "", id="cidr-other-local-ip"),
    ],
)
def test_nodeport_addresses(nodeport_addresses: tuple[str, ...], dst: str, endpoints: str) -> None:
    rs = plan(world(), config(nodeport_addresses=nodeport_addresses)).rulesets
    got = run(rs, NODE_IP, TCP, dst, 3003)
    assert got.endpoints == frozenset(endpoints.split())
    assert got.verdict == "ACCEPT"


def test_v6_nodeports_on_every_address_when_only_v4_cidrs_given() -> None:
    rs = plan(world(), config(nodeport_addresses=("192.168.1.0/24",))).rulesets
    got = run(rs, EXT6, TCP, NODE6, 3062)
    assert got.endpoints == {"[fd00:10:180::2]:80"}


@pytest.mark.parametrize(
    ("src", "dst", "dport", "masq"),
    [
        pytest.param(EXT, "172.30.0.41", 80, False, id="clusterip-no-pod-detection-no-masq"),
        pytest.param(EXT, NODE_IP, 3003, True, id="etp-cluster-still-masq"),
        pytest.param(EXT, NODE_IP, 3001, False, id="etp-local-still-keeps-source"),
    ],
)
def test_without_cluster_cidrs(src: str, dst: str, dport: int, masq: bool) -> None:
    rs = plan(world(), config(cluster_cidrs=())).rulesets
    got = run(rs, src, TCP, dst, dport)
    assert got.masquerade is masq
    assert got.endpoints


def test_without_service_cidrs_unallocated_is_untouched() -> None:
    rs = plan(world(), config(service_cidrs=())).rulesets
    assert run(rs, POD, TCP, "172.30.255.1", 80).verdict == "ACCEPT"


def test_servicecidr_objects_add_ranges() -> None:
    base = world()
    snap = snapshot(
        base.services.values(),
        [s for group in base.slices.values() for s in group],
        node=base.node,
        service_cidrs=["172.31.0.0/16"],
    )
    rs = plan(snap, config()).rulesets
    assert run(rs, POD, TCP, "172.31.0.1", 80).verdict == "DROP"
    assert run(rs, POD, TCP, "172.30.255.1", 80).verdict == "DROP"


@pytest.mark.parametrize(
    ("ranges", "src", "dst", "verdict"),
    [
        pytest.param(["192.168.0.0/24"], "9.9.9.2", "9.9.9.1", "ACCEPT", id="other-vip-allowed"),
        pytest.param(["192.168.0.0/24"], EXT, "9.9.9.1", "DROP", id="outside-blocked"),
        pytest.param(["203.0.113.0/24"], "9.9.9.2", "9.9.9.1", "DROP", id="vips-only-with-node"),
        pytest.param(["2001:db8::/32"], EXT, "9.9.9.1", "ACCEPT", id="other-family-ranges-ignored"),
    ],
)
def test_source_ranges_with_two_lb_ips(ranges: list[str], src: str, dst: str, verdict: str) -> None:
    svc = service(
        "fw", "two", "172.30.0.90", load_balancer_ips=["9.9.9.1", "9.9.9.2"],
        load_balancer_source_ranges=ranges,
    )  # fmt: skip
    slices = [eps_slice("fw", "two", [endpoint("10.180.9.1")])]
    rs = plan(snapshot([svc], slices, node=node()), config()).rulesets
    got = run(rs, src, TCP, dst, 80)
    assert got.verdict == verdict
    assert got.endpoints == ({"10.180.9.1:80"} if verdict == "ACCEPT" else set())
