"""A throwaway cluster node in network namespaces: node, pods, a second node, an outside client.

Used by ``nlproxy demo`` and the datapath tests; it sits outside the proxy's flow and only
provides somewhere real packets can go. It builds, with rtnetlink (pyroute2) and system calls —
never by exec'ing ``ip`` — the topology a kind node with kindnet has::

    client ──eth0═eth1── node1 ──eth0═eth0── node2
    192.168.50.2,.3      │ 192.168.50.1       172.18.0.3
                         │ 172.18.0.2         ├─veth─ remote pods 10.244.2.x
                         ├─vethXXXX═eth0─ pod 10.244.1.4    (route 10.244.2.0/24 via node2)
                         └─vethYYYY═eth0─ pod 10.244.1.5

Pods sit on point-to-point veths: the pod has its /32, a link route to the gateway ``10.244.1.1``
(the node-side address of every veth) and a default route through it; the node has a host route
``10.244.1.4 dev vethXXXX scope host`` per pod and forwards. With ``ipv6=True`` every link and pod
also gets an IPv6 address. Every pod runs an echo server (``testbed_echo``) that tells who
answered and which source it saw. Names are unique per process and call; :meth:`Testbed.close`
(also on Ctrl-C or SIGTERM inside ``with``) stops the servers it started and deletes every
namespace it created, and nothing else.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from types import FrameType, TracebackType
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from nlproxy.demo import ns as testbed_ns
from nlproxy.demo.echo import EchoServer
from nlproxy.demo.ns import TestbedError
from nlproxy.netlink import netns

CLUSTER_CIDR_V4 = IPv4Network("10.244.0.0/16")
CLUSTER_CIDR_V6 = IPv6Network("fd00:10:244::/56")
SERVICE_CIDR_V4 = IPv4Network("10.96.0.0/16")
SERVICE_CIDR_V6 = IPv6Network("fd00:10:96::/112")
NODE_NET_V4 = IPv4Network("172.18.0.0/24")
NODE_NET_V6 = IPv6Network("fc00:f853:ccd:e793::/64")
OUTSIDE_NET_V4 = IPv4Network("192.168.50.0/24")
OUTSIDE_NET_V6 = IPv6Network("fd00:192:168:50::/64")
SCOPE_LINK = 253
SCOPE_HOST = 254


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """A node namespace: Kubernetes node name, node (InternalIP) addresses, pod ranges."""

    name: str
    netns: str
    ipv4: IPv4Address
    pod_cidr_v4: IPv4Network
    ipv6: IPv6Address | None = None
    pod_cidr_v6: IPv6Network | None = None

    @property
    def gateway_v4(self) -> IPv4Address:
        """The node-side address of every pod veth (the pods' default gateway)."""
        return self.pod_cidr_v4[1]

    @property
    def gateway_v6(self) -> IPv6Address | None:
        return None if self.pod_cidr_v6 is None else self.pod_cidr_v6[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class Pod:
    """A pod namespace on ``node`` (a node name), reached from the node through ``host_veth``."""

    name: str
    node: str
    netns: str
    ipv4: IPv4Address
    ipv6: IPv6Address | None = None
    host_veth: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientInfo:
    """The outside client: its namespace and its addresses (two per family, to tell apart)."""

    netns: str
    ipv4: tuple[IPv4Address, ...]
    ipv6: tuple[IPv6Address, ...] = ()


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block.

    Only the main thread runs Python signal handlers, so that is where they are held; a signal
    the kernel hands to another thread of a multi-threaded process still gets through.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _veth_name(pod: str) -> str:
    return "veth" + hashlib.sha256(pod.encode()).hexdigest()[:8]


@contextmanager
def _rtnl(ns: str, what: str) -> Iterator[Any]:
    """An rtnetlink socket opened inside ``ns`` (closed afterwards, so it holds no reference).

    Raises:
        TestbedError: naming ``what`` was being set up, when the kernel refuses a request.
    """
    with netns.entered(ns):
        ipr = IPRoute()
    try:
        yield ipr
    except NetlinkError as exc:
        raise TestbedError(what, f"{os.strerror(exc.code)} (netns {ns})") from exc
    finally:
        ipr.close()


def _index(ipr: Any, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise TestbedError(f"link {ifname}", "not found after creating it")
    return int(found[0])


def _up(ipr: Any, ifname: str, addrs: Sequence[tuple[str, int]]) -> int:
    idx = _index(ipr, ifname)
    for addr, plen in addrs:
        ipr.addr("add", index=idx, address=addr, prefixlen=plen)
    ipr.link("set", index=idx, state="up")
    return idx


class Testbed:
    """Builds the topology on :meth:`start` (or ``with``); :meth:`close` removes it all.

    Args:
        local_pods: names of the pods on this node (``node1``), IPs from ``10.244.1.4`` on.
        remote_pods: names of the pods on the second node, IPs from ``10.244.2.4`` on.
        ipv6: give every link and pod an IPv6 address too (dual stack).
        ports: ports every echo server listens on, TCP and UDP each.
        tag: the namespace name prefix is ``nlp-<tag>-<pid>-…``.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        *,
        local_pods: Sequence[str] = ("pod-a", "pod-b", "pod-c"),
        remote_pods: Sequence[str] = ("pod-r",),
        ipv6: bool = False,
        ports: Sequence[int] = (8080,),
        tag: str = "tb",
    ) -> None:
        self.ipv6 = ipv6
        self.ports = tuple(ports)
        self.tag = tag
        self._local_names = tuple(local_pods)
        self._remote_names = tuple(remote_pods)
        self._namespaces: list[str] = []
        self._servers: list[EchoServer] = []
        self._old_sigterm: Any = None
        self.pods: dict[str, Pod] = {}
        self.node = self._node_info("node1", 2, 1)
        self.node2 = self._node_info("node2", 3, 2)
        self.client = ClientInfo(
            netns=testbed_ns.unique_name(tag, "client"),
            ipv4=(OUTSIDE_NET_V4[2], OUTSIDE_NET_V4[3]),
            ipv6=(OUTSIDE_NET_V6[2], OUTSIDE_NET_V6[3]) if ipv6 else (),
        )

    def _node_info(self, name: str, host: int, pod_net: int) -> NodeInfo:
        return NodeInfo(
            name=name,
            netns=testbed_ns.unique_name(self.tag, name),
            ipv4=NODE_NET_V4[host],
            pod_cidr_v4=IPv4Network(f"10.244.{pod_net}.0/24"),
            ipv6=NODE_NET_V6[host] if self.ipv6 else None,
            pod_cidr_v6=IPv6Network(f"fd00:10:244:{pod_net}::/64") if self.ipv6 else None,
        )

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Testbed:
        """Create every namespace, link, address and route, and start the echo servers.

        Raises:
            TestbedError: naming the namespace or link that failed; whatever was already
                created is removed again.
        """
        try:
            self._make_namespace(self.node.netns, router=True)
            self._make_namespace(self.node2.netns, router=True)
            self._make_namespace(self.client.netns, router=False)
            self._wire_nodes()
            self._wire_client()
            for i, name in enumerate(self._local_names):
                self._add_pod(name, self.node, 4 + i)
            for i, name in enumerate(self._remote_names):
                self._add_pod(name, self.node2, 4 + i)
            for pod in self.pods.values():
                server = EchoServer(pod.netns, pod.name, self.ports)
                self._servers.append(server)
                server.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the echo servers this test bed started and delete the namespaces it created.

        Ctrl-C and SIGTERM wait until this is done (they are held, then delivered), so a second
        interrupt cannot leave half the namespaces behind.
        """
        with _signals_held():
            self._close()

    def _close(self) -> None:
        errors: list[str] = []
        for server in reversed(self._servers):
            try:
                server.stop()
            except (OSError, ValueError) as exc:
                errors.append(f"echo server of pod {server.pod}: {exc}")
        self._servers.clear()
        for name in reversed(self._namespaces):
            try:
                testbed_ns.delete(name)
            except TestbedError as exc:
                errors.append(str(exc))
        self._namespaces.clear()
        if errors:
            raise TestbedError("test bed", "cleanup incomplete: " + "; ".join(errors))

    def __enter__(self) -> Testbed:
        self._catch_sigterm()
        try:
            return self.start()
        except BaseException:
            self._restore_sigterm()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        finally:
            self._restore_sigterm()

    def _catch_sigterm(self) -> None:
        """Turn SIGTERM into SystemExit while inside ``with``, so cleanup runs.

        Only from the main thread (the only one that may set handlers) and only when nobody
        else has claimed SIGTERM.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_term(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)

        self._old_sigterm = signal.signal(signal.SIGTERM, on_term)

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    # -- building ---------------------------------------------------------------------------

    def _make_namespace(self, name: str, *, router: bool) -> None:
        testbed_ns.create(name)
        self._namespaces.append(name)
        if self.ipv6:
            # No duplicate address detection: addresses are usable at once, not "tentative".
            for scope in ("all", "default"):
                testbed_ns.write_sysctl(name, f"net.ipv6.conf.{scope}.accept_dad", "0")
        if router:
            testbed_ns.write_sysctl(name, "net.ipv4.ip_forward", "1")
            if self.ipv6:
                testbed_ns.write_sysctl(name, "net.ipv6.conf.all.forwarding", "1")
        with _rtnl(name, f"loopback of netns {name}") as ipr:
            ipr.link("set", index=_index(ipr, "lo"), state="up")

    def _veth(self, ns: str, ifname: str, peer_ns: str, peer_ifname: str) -> None:
        """A veth pair ``ifname`` in ``ns`` and ``peer_ifname`` in ``peer_ns``."""
        fd = os.open(os.path.join(netns.NETNS_RUN_DIR, peer_ns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            with _rtnl(ns, f"veth {ifname} (peer {peer_ifname} in {peer_ns})") as ipr:
                ipr.link(
                    "add",
                    ifname=ifname,
                    kind="veth",
                    peer={"ifname": peer_ifname, "net_ns_fd": fd},
                )
        finally:
            os.close(fd)

    def _wire_nodes(self) -> None:
        n1, n2 = self.node, self.node2
        self._veth(n1.netns, "eth0", n2.netns, "eth0")
        for me, other in ((n1, n2), (n2, n1)):
            addrs = [(str(me.ipv4), NODE_NET_V4.prefixlen)]
            if me.ipv6 is not None:
                addrs.append((str(me.ipv6), NODE_NET_V6.prefixlen))
            with _rtnl(me.netns, f"eth0 of {me.name}") as ipr:
                idx = _up(ipr, "eth0", addrs)
                ipr.route("add", dst=str(other.pod_cidr_v4), gateway=str(other.ipv4), oif=idx)
                if other.pod_cidr_v6 is not None:
                    gw6 = str(other.ipv6)
                    ipr.route("add", dst=str(other.pod_cidr_v6), gateway=gw6, oif=idx)
        with _rtnl(
            n2.netns, f"default route of {n2.name}"
        ) as ipr:  # everything else (the outside) is behind node1
            ipr.route("add", dst="0.0.0.0/0", gateway=str(n1.ipv4))
            if n1.ipv6 is not None:
                ipr.route("add", dst="::/0", gateway=str(n1.ipv6))

    def _wire_client(self) -> None:
        """The outside link: the client routes everything via node1, node1 defaults to it."""
        node_v4, node_v6 = OUTSIDE_NET_V4[1], OUTSIDE_NET_V6[1]
        self._veth(self.node.netns, "eth1", self.client.netns, "eth0")
        node_addrs = [(str(node_v4), OUTSIDE_NET_V4.prefixlen)]
        client_addrs = [(str(a), OUTSIDE_NET_V4.prefixlen) for a in self.client.ipv4]
        if self.ipv6:
            node_addrs.append((str(node_v6), OUTSIDE_NET_V6.prefixlen))
            client_addrs.append((str(self.client.ipv6[0]), OUTSIDE_NET_V6.prefixlen))
        with _rtnl(self.node.netns, f"eth1 (outside link) of {self.node.name}") as ipr:
            _up(ipr, "eth1", node_addrs)
            # The node's default route (its "uplink"): node-originated traffic to a ClusterIP
            # needs a route before the output hook can DNAT it, as on a real node.
            ipr.route("add", dst="0.0.0.0/0", gateway=str(self.client.ipv4[0]))
            if self.ipv6:
                ipr.route("add", dst="::/0", gateway=str(self.client.ipv6[0]))
        with _rtnl(self.client.netns, "eth0 of the client") as ipr:
            idx = _up(ipr, "eth0", client_addrs)
            for alt in self.client.ipv6[1:]:
                # Deprecated (preferred_lft 0): usable when bound to, never picked as a
                # source by itself, so the first address stays the client's default source
                # (the second IPv4 address is a "secondary" and is never picked either).
                plen = OUTSIDE_NET_V6.prefixlen
                ipr.addr("add", index=idx, address=str(alt), prefixlen=plen, preferred=0)
            ipr.route("add", dst="0.0.0.0/0", gateway=str(node_v4))
            if self.ipv6:
                ipr.route("add", dst="::/0", gateway=str(node_v6))

    def _add_pod(self, name: str, node: NodeInfo, host: int) -> None:
        if name in self.pods:
            raise TestbedError(f"pod {name}", "name used twice")
        pod = Pod(
            name=name,
            node=node.name,
            netns=testbed_ns.unique_name(self.tag, "pod"),
            ipv4=node.pod_cidr_v4[host],
            ipv6=None if node.pod_cidr_v6 is None else node.pod_cidr_v6[host],
            host_veth=_veth_name(name),
        )
        self._make_namespace(pod.netns, router=False)
        self._veth(node.netns, pod.host_veth, pod.netns, "eth0")
        self._pod_side(pod, node)
        with _rtnl(node.netns, f"{pod.host_veth} of pod {pod.name}") as ipr:
            addrs = [(str(node.gateway_v4), 32)]
            if node.gateway_v6 is not None:
                addrs.append((str(node.gateway_v6), 128))
            idx = _up(ipr, pod.host_veth, addrs)
            ipr.route("add", dst=f"{pod.ipv4}/32", oif=idx, scope=SCOPE_HOST)
            if pod.ipv6 is not None:
                ipr.route("add", dst=f"{pod.ipv6}/128", oif=idx)
        self.pods[name] = pod

    def _pod_side(self, pod: Pod, node: NodeInfo) -> None:
        """The pod's eth0: its /32 (/128), a link route to the gateway, a default route."""
        addrs = [(str(pod.ipv4), 32)]
        if pod.ipv6 is not None:
            addrs.append((str(pod.ipv6), 128))
        with _rtnl(pod.netns, f"eth0 of pod {pod.name}") as ipr:
            idx = _up(ipr, "eth0", addrs)
            gw = str(node.gateway_v4)
            ipr.route("add", dst=f"{gw}/32", oif=idx, scope=SCOPE_LINK)
            ipr.route("add", dst="0.0.0.0/0", gateway=gw, oif=idx)
            if node.gateway_v6 is not None:
                gw6 = str(node.gateway_v6)
                ipr.route("add", dst=f"{gw6}/128", oif=idx)
                ipr.route("add", dst="::/0", gateway=gw6, oif=idx)

    # -- facts for manifests ----------------------------------------------------------------

    def pod(self, name: str) -> Pod:
        """The pod called ``name``.

        Raises:
            TestbedError: there is no such pod.
        """
        try:
            return self.pods[name]
        except KeyError:
            raise TestbedError(f"pod {name}", "not in this test bed") from None

    @property
    def local_pods(self) -> list[Pod]:
        return [p for p in self.pods.values() if p.node == self.node.name]

    @property
    def remote_pods(self) -> list[Pod]:
        return [p for p in self.pods.values() if p.node == self.node2.name]

    def cluster_cidr(self) -> str:
        """``--cluster-cidr`` for this topology (both families when dual stack)."""
        return f"{CLUSTER_CIDR_V4},{CLUSTER_CIDR_V6}" if self.ipv6 else str(CLUSTER_CIDR_V4)

    def service_cidr(self) -> str:
        """``--service-cidr`` for this topology (both families when dual stack)."""
        return f"{SERVICE_CIDR_V4},{SERVICE_CIDR_V6}" if self.ipv6 else str(SERVICE_CIDR_V4)

    def run_args(self) -> list[str]:
        """The ``nlproxy run`` flags that make it node1's proxy in this topology."""
        return [
            "--node-name",
            self.node.name,
            "--cluster-cidr",
            self.cluster_cidr(),
            "--service-cidr",
            self.service_cidr(),
        ]

    def node_manifest(self) -> dict[str, Any]:
        """The v1 Node object of node1 (the node nlproxy runs on), as a manifest."""
        n = self.node
        addresses = [{"type": "InternalIP", "address": str(n.ipv4)}]
        cidrs = [str(n.pod_cidr_v4)]
        if n.ipv6 is not None and n.pod_cidr_v6 is not None:
            addresses.append({"type": "InternalIP", "address": str(n.ipv6)})
            cidrs.append(str(n.pod_cidr_v6))
        addresses.append({"type": "Hostname", "address": n.name})
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": n.name, "labels": {"kubernetes.io/hostname": n.name}},
            "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs},
            "status": {"addresses": addresses},
        }
