"""A service the kernel rejects is left out; every other service is programmed all the same.

The rejection is a real one: two LoadBalancer services claiming one address and port with
overlapping ``loadBalancerSourceRanges`` make overlapping elements in the ``firewall-allow``
interval set, which the kernel refuses (validation cannot know: each element is valid alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from nlproxy.cluster.model import ClusterSnapshot, EndpointSlice, Service, ServiceKey
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.nft.readback import KernelReadBack, read_ruleset
from nlproxy.proxy import naming as n
from nlproxy.proxy.naming import TABLE as TABLE_NAME
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer
from tests.netns import sh
from tests.unit.builders import endpoint, eps_slice, node, port, service, snapshot
from tests.unit.incremental import CONFIG

LB = "192.0.2.50"


def lb_service(
    name: str, cip: str, ranges: Sequence[str], ep: str
) -> tuple[Service, EndpointSlice]:
    svc = service(
        "default",
        name,
        cip,
        ports=[port("default", name, node_port=None)],
        load_balancer_ips=[LB],
        load_balancer_source_ranges=list(ranges),
    )
    return svc, eps_slice("default", name, [endpoint(ep)])


def plain(name: str, cip: str, ep: str) -> tuple[Service, EndpointSlice]:
    return service("default", name, cip), eps_slice("default", name, [endpoint(ep)])


def world(*pairs: tuple[Service, EndpointSlice]) -> ClusterSnapshot:
    return snapshot([s for s, _ in pairs], [sl for _, sl in pairs], node=node())


def key(name: str) -> ServiceKey:
    return ServiceKey(namespace="default", name=name)


def netns_of(syncer: Syncer) -> str:
    rb = syncer.kernel.readback
    assert isinstance(rb, KernelReadBack)
    assert rb.netns is not None
    return rb.netns


def table(ns: str) -> Ruleset:
    rs = read_ruleset(Family.IP, TABLE_NAME, netns=ns)
    assert rs is not None
    return rs


def allowed(rs: Ruleset) -> set[str]:
    """The source ranges programmed for the LB address, as text."""
    return {str(k[3]) for k in rs.elements.get(n.FIREWALL_ALLOW, {})}


def backends(rs: Ruleset) -> set[str]:
    return {str(el.value[0]) for el in rs.elements[n.BACKENDS].values()}  # type: ignore[index]


@pytest.fixture
def syncer(make_netns: Callable[[str], str]) -> Iterator[Syncer]:
    s = Syncer(CONFIG, real_kernel(make_netns("iso")))
    try:
        yield s
    finally:
        s.close()


A = lb_service("lb-a", "172.30.0.10", ["10.0.0.0/8"], "10.1.0.1")
B = lb_service("lb-b", "172.30.0.11", ["10.1.0.0/16"], "10.1.0.2")
WEB = plain("web", "172.30.0.20", "10.1.0.3")


def test_a_rejected_service_is_left_out_and_the_rest_programmed(syncer: Syncer) -> None:
    result = syncer.sync(world(A, B, WEB))
    assert set(result.excluded) == {key("lb-b")}
    reason = result.excluded[key("lb-b")]
    assert "firewall-allow" in reason
    assert "10.1.0.0/16" in reason
    assert "File exists" in reason
    rs = table(netns_of(syncer))
    assert allowed(rs) == {"10.0.0.0/8"}
    assert backends(rs) == {"10.1.0.1", "10.1.0.3"}  # lb-a and web, not lb-b
    # The next sync with the same objects neither retries nor sends anything.
    again = syncer.sync(world(A, B, WEB))
    assert again.total_ops == 0
    assert set(again.excluded) == {key("lb-b")}


def test_a_fixed_service_is_retried_and_programmed(syncer: Syncer) -> None:
    syncer.sync(world(A, B, WEB))
    fixed = lb_service("lb-b", "172.30.0.11", ["172.16.0.0/16"], "10.1.0.2")
    result = syncer.sync(world(A, fixed, WEB), changed={key("lb-b")})
    assert result.excluded == {}
    rs = table(netns_of(syncer))
    assert allowed(rs) == {"10.0.0.0/8", "172.16.0.0/16"}
    assert "10.1.0.2" in backends(rs)


def test_a_service_rejected_after_a_change_keeps_what_was_programmed(syncer: Syncer) -> None:
    first = lb_service("lb-b", "172.30.0.11", ["172.16.0.0/16"], "10.1.0.2")
    syncer.sync(world(A, first, WEB))
    # lb-b changes its ranges and endpoint, into a conflict with lb-a; web changes too.
    bad = lb_service("lb-b", "172.30.0.11", ["10.1.0.0/16"], "10.1.0.9")
    web2 = plain("web", "172.30.0.20", "10.1.0.4")
    result = syncer.sync(world(A, bad, web2), changed={key("lb-b"), key("web")})
    assert set(result.excluded) == {key("lb-b")}
    rs = table(netns_of(syncer))
    assert allowed(rs) == {"10.0.0.0/8", "172.16.0.0/16"}  # lb-b as last accepted
    assert backends(rs) == {"10.1.0.1", "10.1.0.2", "10.1.0.4"}  # web's change applied


def test_a_full_verify_retries_left_out_services(syncer: Syncer) -> None:
    syncer.sync(world(A, B, WEB))
    syncer.verify()
    result = syncer.sync(world(A, B, WEB))
    assert set(result.excluded) == {key("lb-b")}  # rejected again, still named
    assert result.total_ops == 0


def test_bisection_finds_the_culprit_when_the_error_names_no_service(
    syncer: Syncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without attribution the changed services are bisected with check-only batches.
    monkeypatch.setattr("nlproxy.sync.syncer.owners", lambda *_: [])
    others = [plain(f"s{i}", f"172.30.1.{i}", f"10.1.1.{i}") for i in range(1, 12)]
    result = syncer.sync(world(A, B, WEB, *others))
    assert set(result.excluded) == {key("lb-b")}
    rs = table(netns_of(syncer))
    assert allowed(rs) == {"10.0.0.0/8"}
    assert len(backends(rs)) == 13


def test_several_refused_services_are_each_left_out(syncer: Syncer) -> None:
    c = lb_service("lb-c", "172.30.0.12", ["10.1.2.0/24"], "10.1.0.4")
    result = syncer.sync(world(A, B, c, WEB))
    assert set(result.excluded) == {key("lb-b"), key("lb-c")}
    rs = table(netns_of(syncer))
    assert allowed(rs) == {"10.0.0.0/8"}
    assert backends(rs) == {"10.1.0.1", "10.1.0.3"}


def test_flows_of_endpoints_removed_in_a_committed_family_go_when_a_later_family_fails(
    syncer: Syncer,
) -> None:
    # dns loses 10.1.0.6 in the same sync as a dual-stack service arrives whose IPv6 source
    # range the kernel refuses: the ip table commits, ip6 fails, the service is left out and the
    # ip table synced again. The flow through the removed endpoint must not survive that.
    ns = netns_of(syncer)
    dns = service("default", "dns", "172.30.0.53", [port("default", "dns", "p53", 53, "UDP")])
    two = [endpoint("10.1.0.5"), endpoint("10.1.0.6")]

    def dns_slice(eps: list[Any]) -> EndpointSlice:
        return eps_slice("default", "dns", eps, [("p53", 53, "UDP")])

    def dual(name: str, cip: str, ranges: list[str]) -> Service:
        return service(
            "default",
            name,
            [cip, f"fd00:30::{cip.rsplit('.', 1)[1]}"],
            load_balancer_ips=[LB, "2001:db8::50"],
            load_balancer_source_ranges=ranges,
        )

    a6 = dual("lb-a", "172.30.0.10", ["10.0.0.0/8", "fd00:1::/32"])
    b6 = dual("lb-b", "172.30.0.11", ["172.16.0.0/16", "fd00:1:2::/48"])  # v6 inside a's
    syncer.sync(snapshot([dns, a6], [dns_slice(two)], node=node()))
    sh(
        "conntrack", "-I", "-p", "udp", "-s", "10.9.0.9", "-d", "172.30.0.53", "--sport", "4000",
        "--dport", "53", "-r", "10.1.0.6", "-q", "10.9.0.9", "--reply-port-src", "53",
        "--reply-port-dst", "4000", "-t", "120", ns=ns,
    )  # fmt: skip
    result = syncer.sync(
        snapshot([dns, a6, b6], [dns_slice(two[:1])], node=node()),
        changed={key("dns"), key("lb-b")},
    )
    assert set(result.excluded) == {key("lb-b")}
    assert "fd00:1:2::/48" in result.excluded[key("lb-b")]
    assert "src=10.1.0.6" not in sh("conntrack", "-L", "-p", "udp", ns=ns)
    assert allowed(table(ns)) == {"10.0.0.0/8"}  # lb-b's ip part was taken back out
