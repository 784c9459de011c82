"""The names ``proxy/naming.py`` builds, recognised back by the recognisers beside the builders
(what ``operate/`` asks of a chain or set it reads from the kernel)."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from nlproxy.cluster.model import Protocol, ServicePortRef
from nlproxy.proxy import naming as n

REF = ServicePortRef(namespace="shop", name="web", port_name="http", protocol=Protocol.TCP)
UNNAMED = ServicePortRef(namespace="kube-system", name="dns", port_name="", protocol=Protocol.UDP)
IP = ip_address("10.180.0.7")

PER_PORT = {
    "affinity_service_chain": lambda r: n.affinity_service_chain(r),
    "affinity_local_chain": lambda r: n.affinity_local_chain(r),
    "affinity_external_chain": lambda r: n.affinity_external_chain(r),
    "affinity_endpoint_chain": lambda r: n.affinity_endpoint_chain(r, IP, 8080),
    "affinity_set": lambda r: n.affinity_set(r, IP, 8080),
    "affinity_clients_map": lambda r: n.affinity_clients_map(r),
    "affinity_learn_chain": lambda r: n.affinity_learn_chain(r),
    "affinity_local_clients_map": lambda r: n.affinity_local_clients_map(r),
    "affinity_local_endpoints": lambda r: n.affinity_local_endpoints(r),
    "balanced_chain internal": lambda r: n.balanced_chain("internal", r),
    "balanced_chain external": lambda r: n.balanced_chain("external", r),
    "balanced_chain dnat": lambda r: n.balanced_chain("dnat", r),
    "balanced_map cluster": lambda r: n.balanced_map(False, r),
    "balanced_map local": lambda r: n.balanced_map(True, r),
}
AFFINITY_DISPATCH = {"affinity_service_chain", "affinity_local_chain", "affinity_external_chain"}


@pytest.mark.parametrize("ref", [REF, UNNAMED], ids=["named-port", "unnamed-port"])
@pytest.mark.parametrize("builder", sorted(PER_PORT))
def test_every_per_port_name_is_recognised_with_its_service(
    builder: str, ref: ServicePortRef
) -> None:
    name = PER_PORT[builder](ref)
    assert n.port_object_owner(name) == (ref.namespace, ref.name)
    assert n.is_affinity_dispatch(name) is (builder in AFFINITY_DISPATCH)
    assert not n.is_local_dispatch(name)
    assert not n.is_cluster_dispatch(name)


def test_a_name_cut_at_the_kernels_limit_still_names_its_service() -> None:
    long = ServicePortRef(namespace="ns", name="x" * 300, port_name="p", protocol=Protocol.TCP)
    name = n.affinity_service_chain(long)
    assert len(name) == n.MAX_NAME
    assert n.port_object_owner(name) is None  # the name was cut inside the Service's name
    ref = ServicePortRef(namespace="ns", name="web", port_name="p" * 300, protocol=Protocol.TCP)
    cut = n.affinity_service_chain(ref)
    assert len(cut) == n.MAX_NAME
    assert n.port_object_owner(cut) == ("ns", "web")
    assert n.is_affinity_dispatch(cut)


@pytest.mark.parametrize("count", [0, 1, 7, 120])
def test_shared_dispatch_chains_are_told_apart_by_policy(count: int) -> None:
    for name in (n.external_local_chain(count), n.nodeport_local_chain(count)):
        assert n.is_local_dispatch(name)
        assert not n.is_cluster_dispatch(name)
        assert n.port_object_owner(name) is None
    for name in (n.external_chain(count), n.nodeport_chain(count)):
        assert n.is_cluster_dispatch(name)
        assert not n.is_local_dispatch(name)
        assert not n.is_affinity_dispatch(name)
    for name in (n.cluster_ip_chain(count), n.dnat_chain(count), n.nodeport_dnat_chain(count)):
        assert not n.is_cluster_dispatch(name)
        assert not n.is_local_dispatch(name)


@pytest.mark.parametrize(
    "name",
    [
        n.SERVICES,
        n.BACKENDS,
        n.AFFINITY_ADDRESSES,
        "external-07",  # a count the builders never write
        "external-local-",
        "nodeport-x",
        "service-ABCDEFGH-shop/web/tcp/http",  # the shape, but not the hash of its text
        "lb-other-" + n.balanced_map(False, REF).split("-", 2)[2],  # no such role
        "service-" + n.affinity_service_chain(REF).split("-", 1)[1].lower(),
    ],
)
def test_other_names_are_not_taken_for_nlproxys(name: str) -> None:
    assert n.port_object_owner(name) is None
    assert not n.is_affinity_dispatch(name)
    assert not n.is_local_dispatch(name)
    assert not n.is_cluster_dispatch(name)
