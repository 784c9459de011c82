"""The endpoint inspector against real topologies built with ``ip`` in fresh namespaces.

Each CNI shape is built the way the CNI builds it (ptp veth + host route, bridge, gateway route to
another node, vxlan), then classified, and where the answer is "reachable" a real TCP connection
from the node to the pod confirms it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from contextlib import closing
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from nlproxy.inspect.classify import Reachability, classify, transitions
from nlproxy.inspect.watch import RouteWatcher
from nlproxy.netlink import netns as nsmod
from tests.kernel.inspect_bed import MakeNetns, add_pod, ip, node_ns
from tests.netns import sh

WAIT_S = 20.0  # upper bound for the kernel to settle (namespace teardown, ARP failure)


def connects(src: str, dst: str, addr: str, port: int = 8080, *, wait: float = 10.0) -> bool:
    """A real TCP connection from namespace ``src`` to ``addr:port`` served in ``dst``.

    ``wait`` bounds the attempt; it covers TCP's SYN retransmissions (1 s, 3 s, 7 s), since a
    link that just came up may drop the first ones while its peer's carrier settles.
    """
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with nsmod.entered(dst):
        server = socket.socket(fam, socket.SOCK_STREAM)
    with closing(server):
        server.bind((addr, port))
        server.listen(1)
        with nsmod.entered(src):
            client = socket.socket(fam, socket.SOCK_STREAM)
        with closing(client):
            client.settimeout(wait)
            try:
                client.connect((addr, port))
            except OSError:
                return False
            return True


def one(addr: str, ns: str) -> Reachability:
    a = ip_address(addr)
    return classify([a], netns=ns)[a]


def wait_until(ns: str, addr: str, pred: Callable[[Reachability], bool]) -> Reachability:
    """Re-classify on every rtnetlink change until ``pred`` holds (no polling, bounded)."""
    with RouteWatcher(ns) as watcher:
        for _ in range(50):
            r = one(addr, ns)
            if pred(r):
                return r
            if not watcher.wait_for_change(WAIT_S):
                break
    pytest.fail(f"{addr} in {ns}: still {one(addr, ns)}")


def wait_oper_up(ns: str, dev: str) -> None:
    """Wait (bounded) until ``dev`` in ``ns`` is operationally up.

    A veth's far end learns of its peer's carrier through the kernel's link watch, which runs
    late on a loaded machine; until then its replies are dropped.
    """
    deadline = time.monotonic() + WAIT_S
    while "state UP" not in ip(ns, "-o", "link", "show", "dev", dev):
        if time.monotonic() > deadline:
            pytest.fail(f"{dev} in {ns} is not up after {WAIT_S:.0f} s")
        time.sleep(0.05)


def udp_poke(ns: str, addr: str) -> None:
    """Send one datagram so the kernel tries to resolve the neighbour."""
    with nsmod.entered(ns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with closing(s):
        s.sendto(b"x", (addr, 9))


@pytest.fixture
def ptp(make_netns: MakeNetns) -> tuple[str, str]:
    node = node_ns(make_netns)
    pod = make_netns("pod")
    add_pod(node, pod, "veth1a2b", "10.244.2.4")
    return node, pod


def test_ptp_pod_is_local_and_reachable(ptp: tuple[str, str]) -> None:
    node, pod = ptp
    r = one("10.244.2.4", node)
    assert (r.kind, r.reachable, r.device, r.gateway) == ("local", True, "veth1a2b", None)
    assert r.route == "10.244.2.4 dev veth1a2b scope host"
    assert r.reason.startswith("route 10.244.2.4 dev veth1a2b scope host: ")
    assert connects(node, pod, "10.244.2.4")


def test_host_veth_down_then_up(ptp: tuple[str, str]) -> None:
    node, pod = ptp
    ip(node, "link", "set", "veth1a2b", "down")
    r = one("10.244.2.4", node)
    assert (r.kind, r.reachable, r.state) == ("unreachable", False, "down")
    assert r.reason == "route 10.244.2.4 dev veth1a2b scope host: device is down"
    assert not connects(node, pod, "10.244.2.4", wait=2)
    ip(node, "link", "set", "veth1a2b", "up")
    r = wait_until(node, "10.244.2.4", lambda r: r.reachable)
    assert r.kind == "local"
    wait_oper_up(pod, "eth0")
    # Connections again, each a fresh route and neighbour lookup: at load 9 one connection's
    # SYNs could all go while the neighbour entry the down link failed was still being retried.
    deadline = time.monotonic() + 3 * WAIT_S
    while not connects(node, pod, "10.244.2.4", wait=5):
        assert time.monotonic() < deadline, f"no connection {3 * WAIT_S:.0f} s after link up"


def test_pod_side_down_is_unreachable(ptp: tuple[str, str]) -> None:
    node, pod = ptp
    ip(pod, "link", "set", "eth0", "down")
    # The host end's carrier follows through the kernel's link watch, a moment later.
    r = wait_until(node, "10.244.2.4", lambda r: not r.reachable)
    assert (r.kind, r.reachable, r.device) == ("unreachable", False, "veth1a2b")
    assert "device is down" in r.reason
    assert not connects(node, pod, "10.244.2.4", wait=2)


def test_pod_namespace_deleted(ptp: tuple[str, str]) -> None:
    node, pod = ptp
    sh("ip", "netns", "delete", pod)
    # The kernel tears the namespace (and the veth pair with it) down asynchronously.
    r = wait_until(node, "10.244.2.4", lambda r: not r.reachable)
    assert r.kind == "unreachable"
    assert r.reason == "no route to 10.244.2.4"  # the route went with the veth


def test_missing_route(ptp: tuple[str, str]) -> None:
    node, _ = ptp
    r = one("10.244.7.7", node)
    assert (r.kind, r.reachable, r.state, r.device) == ("unreachable", False, "no-route", None)
    assert r.reason == "no route to 10.244.7.7"


@pytest.mark.parametrize("rtype", ["blackhole", "unreachable", "prohibit"])
def test_reject_routes(ptp: tuple[str, str], rtype: str) -> None:
    node, _ = ptp
    ip(node, "route", "add", rtype, "10.244.9.0/24")
    r = one("10.244.9.3", node)
    assert (r.kind, r.reachable, r.state) == ("unreachable", False, rtype)
    assert r.reason == f"route {rtype} 10.244.9.0/24: {rtype} route"


def test_own_address_is_local(ptp: tuple[str, str]) -> None:
    node, _ = ptp
    r = one("192.168.77.1", node)
    assert (r.kind, r.reachable, r.state, r.device) == ("local", True, "local", "lo")


def test_ipv6_ptp_pod(make_netns: MakeNetns) -> None:
    node = node_ns(make_netns)
    pod = make_netns("pod6")
    add_pod(node, pod, "vethv6", "fd00:10:244::4")
    r = one("fd00:10:244::4", node)
    assert (r.kind, r.reachable, r.device) == ("local", True, "vethv6")
    ip(node, "link", "set", "vethv6", "down")
    # IPv6 drops routes through a device that goes down; either way it is unreachable.
    assert not one("fd00:10:244::4", node).reachable


def test_many_endpoints_one_call(ptp: tuple[str, str]) -> None:
    node, _ = ptp
    addrs = [IPv4Address("10.244.2.4"), IPv4Address("10.244.7.7"), IPv4Address("192.168.77.1")]
    out = classify([*addrs, addrs[0]], netns=node)
    assert list(out) == addrs
    assert [r.kind for r in out.values()] == ["local", "unreachable", "local"]
    assert classify([], netns=node) == {}


# --- remote: another node behind a gateway ----------------------------------------------------


@pytest.fixture
def two_nodes(make_netns: MakeNetns) -> tuple[str, str]:
    """node1 and node2 on one link 172.18.0.0/24; node2 hosts pods in 10.244.3.0/24."""
    n1, n2 = node_ns(make_netns, "node1"), make_netns("node2")
    ip(n1, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1", "netns", n2)
    for ns, addr in ((n1, "172.18.0.1/24"), (n2, "172.18.0.2/24")):
        ip(ns, "addr", "add", addr, "dev", "eth1")
        ip(ns, "link", "set", "eth1", "up")
    ip(n2, "addr", "add", "10.244.3.5/32", "dev", "lo")
    return n1, n2


def test_remote_via_gateway(two_nodes: tuple[str, str]) -> None:
    n1, n2 = two_nodes
    ip(n1, "route", "add", "10.244.3.0/24", "via", "172.18.0.2")
    r = one("10.244.3.5", n1)
    assert (r.kind, r.reachable, r.device) == ("remote", True, "eth1")
    assert r.gateway == IPv4Address("172.18.0.2")
    assert r.route == "10.244.3.0/24 via 172.18.0.2 dev eth1"
    assert connects(n1, n2, "10.244.3.5")


def test_gateway_neighbour_failed(two_nodes: tuple[str, str]) -> None:
    n1, n2 = two_nodes
    ip(n1, "route", "add", "10.244.3.0/24", "via", "172.18.0.2")
    ip(n2, "addr", "del", "172.18.0.2/24", "dev", "eth1")  # node2 stops answering ARP
    udp_poke(n1, "10.244.3.5")
    r = wait_until(n1, "10.244.3.5", lambda r: not r.reachable)
    assert (r.kind, r.state, r.gateway) == ("unreachable", "failed", IPv4Address("172.18.0.2"))
    assert (
        r.reason
        == "route 10.244.3.0/24 via 172.18.0.2 dev eth1: neighbour 172.18.0.2 on eth1 is FAILED"
    )


def test_multipath_reachable_while_one_hop_works(two_nodes: tuple[str, str]) -> None:
    n1, _ = two_nodes
    ip(
        n1,
        "route",
        "add",
        "10.244.8.0/24",
        "nexthop",
        "via",
        "172.18.0.3",
        "nexthop",
        "via",
        "172.18.0.2",
    )
    ip(n1, "neigh", "replace", "172.18.0.3", "dev", "eth1", "nud", "failed")
    r = one("10.244.8.8", n1)
    assert (r.kind, r.reachable, r.gateway) == ("remote", True, IPv4Address("172.18.0.2"))
    ip(n1, "neigh", "replace", "172.18.0.2", "dev", "eth1", "nud", "failed")
    r = one("10.244.8.8", n1)
    assert (r.kind, r.reachable, r.gateway) == ("unreachable", False, IPv4Address("172.18.0.3"))
    assert r.reason == (
        "route 10.244.8.0/24 nexthop via 172.18.0.3 dev eth1 nexthop via 172.18.0.2 dev eth1: "
        "neighbour 172.18.0.3 on eth1 is FAILED"
    )


def test_calico_style_proxy_arp_pod(two_nodes: tuple[str, str], make_netns: MakeNetns) -> None:
    """Calico: no address on the host end, proxy ARP, a ``scope link`` route, pod gateway
    169.254.1.1 (answered by proxy ARP: the node forwards and has a default route elsewhere)."""
    n1, _ = two_nodes
    pod = make_netns("calipod")
    ip(n1, "route", "add", "default", "via", "172.18.0.2")
    ip(n1, "link", "add", "cali1234", "type", "veth", "peer", "name", "eth0", "netns", pod)
    sh("sysctl", "-qw", "net.ipv4.conf.cali1234.proxy_arp=1", "net.ipv4.ip_forward=1", ns=n1)
    ip(n1, "link", "set", "cali1234", "up")
    ip(pod, "link", "set", "eth0", "up")
    ip(pod, "addr", "add", "10.244.1.7/32", "dev", "eth0")
    ip(pod, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
    ip(pod, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
    ip(n1, "route", "add", "10.244.1.7", "dev", "cali1234", "scope", "link")

    r = one("10.244.1.7", n1)
    assert (r.kind, r.reachable, r.device) == ("local", True, "cali1234")
    assert r.route == "10.244.1.7 dev cali1234 scope link"
    assert connects(n1, pod, "10.244.1.7")
    # Without the pod route, the node's default route would send the traffic to node2.
    ip(n1, "route", "del", "10.244.1.7")
    r = one("10.244.1.7", n1)
    assert (r.kind, r.gateway) == ("remote", IPv4Address("172.18.0.2"))


# --- bridge CNI ---------------------------------------------------------------------------------


def test_bridge_cni(make_netns: MakeNetns) -> None:
    node = node_ns(make_netns)
    pod = make_netns("brpod")
    ip(node, "link", "add", "cni0", "type", "bridge")
    ip(node, "addr", "add", "10.244.5.1/24", "dev", "cni0")
    ip(node, "link", "set", "cni0", "up")
    ip(
        node,
        "link",
        "add",
        "vethbr1",
        "master",
        "cni0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        pod,
    )
    ip(node, "link", "set", "vethbr1", "up")
    ip(pod, "addr", "add", "10.244.5.10/24", "dev", "eth0")
    ip(pod, "link", "set", "eth0", "up")
    ip(pod, "route", "add", "default", "via", "10.244.5.1")

    r = one("10.244.5.10", node)
    assert (r.kind, r.reachable, r.device) == ("local", True, "cni0")
    assert r.route == "10.244.5.0/24 dev cni0 scope link"
    assert connects(node, pod, "10.244.5.10")
    r = one("10.244.5.10", node)
    assert r.reachable
    assert r.state in ("reachable", "stale", "delay", "probe")

    udp_poke(node, "10.244.5.99")  # no pod has this address: ARP fails
    r = wait_until(node, "10.244.5.99", lambda r: not r.reachable)
    assert (
        r.reason
        == "route 10.244.5.0/24 dev cni0 scope link: neighbour 10.244.5.99 on cni0 is FAILED"
    )


# --- vxlan overlay (flannel style) --------------------------------------------------------------


def _vtep(ns: str, local: str, addr: str, mac: str) -> None:
    ip(
        ns,
        "link",
        "add",
        "flannel.1",
        "address",
        mac,
        "type",
        "vxlan",
        "id",
        "1",
        "local",
        local,
        "dev",
        "eth1",
        "dstport",
        "8472",
        "nolearning",
    )
    ip(ns, "addr", "add", f"{addr}/32", "dev", "flannel.1")
    ip(ns, "link", "set", "flannel.1", "up")


def _vtep_peer(ns: str, subnet: str, vtep: str, mac: str, underlay: str) -> None:
    ip(ns, "route", "add", subnet, "via", vtep, "dev", "flannel.1", "onlink")
    ip(ns, "neigh", "add", vtep, "dev", "flannel.1", "lladdr", mac, "nud", "permanent")
    sh("bridge", "-n", ns, "fdb", "append", mac, "dev", "flannel.1", "dst", underlay)


def test_vxlan_remote(two_nodes: tuple[str, str]) -> None:
    n1, n2 = two_nodes
    mac1, mac2 = "02:42:0a:f4:01:00", "02:42:0a:f4:03:00"
    _vtep(n1, "172.18.0.1", "10.244.1.0", mac1)
    _vtep(n2, "172.18.0.2", "10.244.3.0", mac2)
    _vtep_peer(n1, "10.244.3.0/24", "10.244.3.0", mac2, "172.18.0.2")
    _vtep_peer(n2, "10.244.1.0/24", "10.244.1.0", mac1, "172.18.0.1")

    r = one("10.244.3.5", n1)
    assert (r.kind, r.reachable, r.device, r.state) == ("remote", True, "flannel.1", "permanent")
    assert r.gateway == IPv4Address("10.244.3.0")
    assert r.route == "10.244.3.0/24 via 10.244.3.0 dev flannel.1 onlink"
    assert connects(n1, n2, "10.244.3.5")

    ip(n1, "link", "set", "flannel.1", "down")
    r = wait_until(n1, "10.244.3.5", lambda r: not r.reachable)
    assert r.kind == "unreachable"


# --- transitions (pure) -------------------------------------------------------------------------


def _r(kind: str, ok: bool, state: str = "up", device: str | None = "veth0") -> Reachability:
    return Reachability(
        kind=kind,  # type: ignore[arg-type]
        reachable=ok,
        device=device,
        gateway=None,
        state=state,
        reason=f"{kind} {state}",
    )


A, B, C = (IPv4Address(f"10.0.0.{i}") for i in (1, 2, 3))
V6 = IPv6Address("fd00::1")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param({A: _r("local", True)}, {A: _r("local", True)}, [], id="same"),
        pytest.param(
            {A: _r("local", True, "reachable")},
            {A: _r("local", True, "stale")},
            [],
            id="neighbour-churn-is-not-a-transition",
        ),
        pytest.param(
            {A: _r("local", True)},
            {A: _r("unreachable", False, "down")},
            [(A, _r("local", True), _r("unreachable", False, "down"))],
            id="goes-down",
        ),
        pytest.param(
            {A: _r("unreachable", False, "down")},
            {A: _r("unreachable", False, "gone")},
            [(A, _r("unreachable", False, "down"), _r("unreachable", False, "gone"))],
            id="unreachable-for-another-reason",
        ),
        pytest.param(
            {B: _r("remote", True)},
            {A: _r("local", True), V6: _r("local", True)},
            [
                (A, None, _r("local", True)),
                (B, _r("remote", True), None),
                (V6, None, _r("local", True)),
            ],
            id="appear-and-disappear-sorted",
        ),
        pytest.param(
            {C: _r("local", True, device="a")},
            {C: _r("local", True, device="b")},
            [(C, _r("local", True, device="a"), _r("local", True, device="b"))],
            id="moved-device",
        ),
    ],
)
def test_transitions(
    old: dict[IPv4Address, Reachability],
    new: dict[IPv4Address, Reachability],
    expected: list[object],
) -> None:
    assert transitions(old, new) == expected
