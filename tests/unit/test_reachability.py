"""Leaving unreachable endpoints out, but never a service's last ready ones."""

from dataclasses import replace
from ipaddress import IPv4Address

import msgspec

from nlproxy.cluster.model import (
    ClusterSnapshot,
    Endpoint,
    EndpointPort,
    EndpointSlice,
    IPFamily,
    Protocol,
    ServiceKey,
)
from nlproxy.inspect.reachability import left_out, without_unreachable


def snapshot(ips: dict[str, list[str]]) -> ClusterSnapshot:
    slices = {}
    for name, addrs in ips.items():
        key = ServiceKey(namespace="default", name=name)
        eps = tuple(
            Endpoint(ip=IPv4Address(a), ready=True, serving=True, terminating=False) for a in addrs
        )
        slices[key] = (
            EndpointSlice(
                namespace="default",
                name=f"{name}-1",
                service=key,
                family=IPFamily.IPV4,
                ports=(EndpointPort(name="", port=80, protocol=Protocol.TCP),),
                endpoints=eps,
            ),
        )
    return ClusterSnapshot(services={}, slices=slices)


def ips(snap: ClusterSnapshot, name: str) -> list[str]:
    group = snap.slices[ServiceKey(namespace="default", name=name)]
    return [str(e.ip) for s in group for e in s.endpoints]


def test_unreachable_endpoints_are_left_out() -> None:
    snap = snapshot({"a": ["10.0.0.1", "10.0.0.2"], "b": ["10.0.0.3"]})
    out = without_unreachable(snap, frozenset({IPv4Address("10.0.0.1")}))
    assert ips(out, "a") == ["10.0.0.2"]
    assert (
        out.slices[ServiceKey(namespace="default", name="b")]
        is snap.slices[ServiceKey(namespace="default", name="b")]
    )


def test_a_service_never_loses_its_last_endpoints() -> None:
    snap = snapshot({"a": ["10.0.0.1", "10.0.0.2"]})
    bad = frozenset({IPv4Address("10.0.0.1"), IPv4Address("10.0.0.2")})
    assert ips(without_unreachable(snap, bad), "a") == ["10.0.0.1", "10.0.0.2"]


def test_nothing_unreachable_returns_the_same_snapshot() -> None:
    snap = snapshot({"a": ["10.0.0.1"]})
    assert without_unreachable(snap, frozenset()) is snap


def test_only_endpoints_that_could_serve_are_left_out_and_held() -> None:
    """An unreachable endpoint that is not ready (nor serving) is in no plan: the exclusion
    leaves it where it is and the inspector does not hold it (a node's lost pods turn NotReady
    and stay in their slices; held, they were counted unreachable for as long)."""
    snap = snapshot({"a": ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "b": ["10.0.0.4", "10.0.0.5"]})
    a, b = (ServiceKey(namespace="default", name=n) for n in ("a", "b"))
    down = msgspec.structs.replace(snap.slices[a][0].endpoints[2], ready=False, serving=False)
    eps = (*snap.slices[a][0].endpoints[:2], down)
    snap = replace(
        snap,
        slices={**snap.slices, a: (msgspec.structs.replace(snap.slices[a][0], endpoints=eps),)},
    )
    bad = frozenset(IPv4Address(ip) for ip in ("10.0.0.1", "10.0.0.3", "10.0.0.9"))
    out = without_unreachable(snap, bad)
    assert ips(out, "a") == ["10.0.0.2", "10.0.0.3"]
    assert out.slices[b] is snap.slices[b]
    assert left_out(snap, out, bad) == {IPv4Address("10.0.0.1")}
    # A not-ready unreachable endpoint alone does not make new objects.
    only_down = frozenset({IPv4Address("10.0.0.3")})
    assert without_unreachable(snap, only_down).slices[a] is snap.slices[a]
    assert left_out(snap, without_unreachable(snap, only_down), only_down) == frozenset()
