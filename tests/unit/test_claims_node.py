"""ClusterIPs and health-check ports that would take the node's own: a ClusterIP that is one of
this node's addresses, or inside the pods' ranges, is refused and named whether or not a
service range is known; a ``healthCheckNodePort`` outside the NodePort range is refused (the
Service stays, without its health check). Through ``ClusterState``, as the daemon feeds it."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

import pytest

from nlproxy.cluster.model import Node, ObjectRef, Service, Upsert
from nlproxy.cluster.state import ClusterState
from tests.unit.builders import NODE, service


def up(obj: Service | Node) -> Upsert:
    if isinstance(obj, Node):
        return Upsert(ref=ObjectRef(kind="Node", namespace="", name=obj.name), obj=obj)
    ref = ObjectRef(kind="Service", namespace=obj.key.namespace, name=obj.key.name)
    return Upsert(ref=ref, obj=obj)


def _node(addresses: tuple[str, ...] = (), pod_cidrs: tuple[str, ...] = ()) -> Node:
    return Node(
        name=NODE,
        addresses=tuple(ip_address(a) for a in addresses),
        pod_cidrs=tuple(ip_network(c) for c in pod_cidrs),
    )


def test_a_cluster_ip_that_is_the_nodes_interface_address_is_refused() -> None:
    ssh = service("default", "ssh", "172.18.0.2")
    web = service("default", "web", "10.96.0.10")
    state = ClusterState(NODE)  # no service range known: the manifests' default
    state.apply([up(ssh), up(web)])
    assert set(state.snapshot().services) == {ssh.key, web.key}  # addresses not known yet
    changed = state.set_local_addresses([ip_address("172.18.0.2"), ip_address("127.0.0.1")])
    assert ssh.key in changed
    assert set(state.snapshot().services) == {web.key}
    assert state.refused == [
        "Service default/ssh: spec.clusterIP: 172.18.0.2 is one of this node's own addresses; "
        "left out"
    ]
    # The address moves away: the Service is planned again.
    state.set_local_addresses([ip_address("172.18.0.3")])
    assert set(state.snapshot().services) == {ssh.key, web.key}
    assert state.refused == []


def test_a_cluster_ip_that_is_the_node_objects_address_is_refused_whatever_the_order() -> None:
    v6 = service("default", "v6", ["10.96.0.11", "fd00:18::2"])
    later = ClusterState(NODE)
    later.apply([up(v6)])
    later.apply([up(_node(("192.168.5.1", "fd00:18::2")))])
    first = ClusterState(NODE)
    first.apply([up(_node(("192.168.5.1", "fd00:18::2"))), up(v6)])
    for state in (later, first):
        assert state.snapshot().services == {}
        assert state.refused == [
            "Service default/v6: spec.clusterIPs[1]: fd00:18::2 is one of this node's own "
            "addresses; left out"
        ]


@pytest.mark.parametrize(
    ("cluster_cidrs", "pod_cidrs"),
    [
        pytest.param(("10.244.0.0/16",), (), id="cluster-cidr"),
        pytest.param((), ("10.244.1.0/24",), id="the-nodes-pod-cidr"),
    ],
)
def test_a_cluster_ip_inside_the_pod_ranges_is_refused(
    cluster_cidrs: tuple[str, ...], pod_cidrs: tuple[str, ...]
) -> None:
    pod = service("default", "pod", "10.244.1.7")
    web = service("default", "web", "10.96.0.10")
    state = ClusterState(NODE, cluster_cidrs=[ip_network(c) for c in cluster_cidrs])
    state.apply([up(_node(("192.168.5.1",), pod_cidrs)), up(pod), up(web)])
    assert set(state.snapshot().services) == {web.key}
    (message,) = state.refused
    assert message.startswith("Service default/pod: spec.clusterIP: 10.244.1.7 is inside the ")
    assert (cluster_cidrs or pod_cidrs)[0] in message


def test_an_address_inside_a_known_service_range_is_a_services_not_the_nodes() -> None:
    """``kube-ipvs0`` and NodeLocal DNSCache bind ClusterIPs on the node on purpose."""
    dns = service("kube-system", "kube-dns", "10.96.0.10")
    ssh = service("default", "ssh", "172.18.0.2")
    state = ClusterState(NODE, service_cidrs=[ip_network("10.96.0.0/12")])
    state.set_local_addresses([ip_address("10.96.0.10"), ip_address("172.18.0.2")])
    state.apply([up(dns), up(ssh)])
    assert set(state.snapshot().services) == {dns.key}
    assert state.refused == [
        "Service default/ssh: spec.clusterIP: 172.18.0.2 is one of this node's own addresses; "
        "left out"
    ]


@pytest.mark.parametrize(
    ("health", "refused"),
    [
        pytest.param(22, True, id="ssh"),
        pytest.param(29999, True, id="just-below"),
        pytest.param(32768, True, id="just-above"),
        pytest.param(30000, False, id="first"),
        pytest.param(32767, False, id="last"),
        pytest.param(None, False, id="none"),
    ],
)
def test_a_health_check_node_port_outside_the_node_port_range_is_refused(
    health: int | None, refused: bool
) -> None:
    lb = service(
        "default",
        "lb",
        "10.96.0.20",
        external_policy_local=True,
        health_check_node_port=health,
        load_balancer_ips=["203.0.113.7"],
    )
    state = ClusterState(NODE)
    state.apply([up(lb)])
    (seen,) = state.snapshot().services.values()
    assert seen.load_balancer_ips == lb.load_balancer_ips  # the Service itself stays
    if refused:
        assert seen.health_check_node_port is None
        assert state.refused == [
            f"Service default/lb: spec.healthCheckNodePort: {health} is outside the NodePort "
            "range (30000-32767, --service-node-port-range); no health check served"
        ]
    else:
        assert seen.health_check_node_port == health
        assert state.refused == []


def test_the_node_port_range_is_a_setting() -> None:
    lb = service("default", "lb", "10.96.0.20", health_check_node_port=20000)
    state = ClusterState(NODE, node_port_range=(20000, 22767))
    state.apply([up(lb)])
    assert state.snapshot().services[lb.key].health_check_node_port == 20000
    assert state.refused == []


def test_the_node_port_range_comes_from_the_flag() -> None:
    from nlproxy.config import Flags, build_settings

    assert build_settings(Flags()).daemon.node_port_range == (30000, 32767)
    assert build_settings(Flags(service_node_port_range="20000-40000")).daemon.node_port_range == (
        20000,
        40000,
    )


@pytest.mark.parametrize("text", ["40000-20000", "0-100", "a-b", "30000-70000", "x"])
def test_an_impossible_node_port_range_names_the_flag(text: str) -> None:
    from nlproxy.config import Flags, build_settings
    from nlproxy.errors import ConfigError

    with pytest.raises(ConfigError, match="--service-node-port-range"):
        build_settings(Flags(service_node_port_range=text))
