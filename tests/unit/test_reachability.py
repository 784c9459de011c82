"""Leaving unreachable endpoints out, but never a service's last ready ones."""

from ipaddress import IPv4Address

from nlproxy.cluster.model import (
    ClusterSnapshot,
    Endpoint,
    EndpointPort,
    EndpointSlice,
    IPFamily,
    Protocol,
    ServiceKey,
)
from nlproxy.inspect.reachability import without_unreachable


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
