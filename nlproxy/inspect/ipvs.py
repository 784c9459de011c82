"""kube-proxy's IPVS mode as it is left on a node: found, named, and removed on request.

Beside ``foreign.py`` (which finds the mode's iptables-nft chains with the other modes'): the
parts of IPVS mode that live outside nftables, each read and removed over its own netlink
protocol (no ``ipset``, ``ipvsadm`` or ``ip`` is run):

* its ipsets (``KUBE-CLUSTER-IP``, ``KUBE-NODE-PORT-TCP``, … and their ``KUBE-6-`` twins):
  nfnetlink subsystem NFNL_SUBSYS_IPSET;
* the ``kube-ipvs0`` dummy device that holds every ClusterIP, external and load-balancer IP:
  rtnetlink through pyroute2; deleting the device removes its addresses;
* its IPVS virtual servers: generic netlink family ``IPVS``. kube-proxy's are those whose
  address is on ``kube-ipvs0`` and the NodePorts (a port in the NodePort range on one of the
  node's own addresses); any other virtual server (keepalived's, a user's) is left alone.

Exactness over reach: only names kube-proxy uses, only a ``kube-ipvs0`` of kind ``dummy``.
The message encoders and decoders are pure functions, tested without a kernel.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Any

from nlproxy.errors import NlproxyError
from nlproxy.netlink import netns
from nlproxy.netlink.codec import (
    NLA_F_NET_BYTEORDER,
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    NLMSGHDR,
    Message,
    attr,
    attribute_map,
    be32_attr,
    nest,
    nfnl_attributes,
    nfnl_message,
    nfnl_type,
    str_attr,
    text,
    u8_attr,
)
from nlproxy.netlink.nlsock import NETLINK_GENERIC, NetfilterSocket
from nlproxy.nft.ir import IPAddress

DEVICE = "kube-ipvs0"
"""The dummy device kube-proxy's IPVS mode binds service addresses to."""

NODE_PORT_RANGE = (30000, 32767)
"""The API server's default ``--service-node-port-range``: NodePort virtual servers."""

IPSET_MAXNAMELEN = 32
"""With the terminating NUL."""

_IPSETS = (
    "LOOP-BACK",
    "CLUSTER-IP",
    "EXTERNAL-IP",
    "EXTERNAL-IP-LOCAL",
    "LOAD-BALANCER",
    "LOAD-BALANCER-LOCAL",
    "LOAD-BALANCER-FW",
    "LOAD-BALANCER-SOURCE-IP",
    "LOAD-BALANCER-SOURCE-CIDR",
    "NODE-PORT-TCP",
    "NODE-PORT-LOCAL-TCP",
    "NODE-PORT-UDP",
    "NODE-PORT-LOCAL-UDP",
    "NODE-PORT-SCTP-HASH",
    "NODE-PORT-LOCAL-SCTP-HASH",
    "HEALTH-CHECK-NODE-PORT",
    "IPVS-IPS",
)
KUBE_PROXY_IPSETS = frozenset(
    name
    for base in _IPSETS
    for name in (f"KUBE-{base}", f"KUBE-6-{base}")
    if len(name) < IPSET_MAXNAMELEN
)
"""The ipsets IPVS mode makes: ``KUBE-`` for IPv4, ``KUBE-6-`` for IPv6 (dual-stack); an
IPv6 name too long for the kernel cannot exist."""

# -- ipset over nfnetlink (include/uapi/linux/netfilter/ipset/ip_set.h) -----------------------
NFNL_SUBSYS_IPSET = 6
IPSET_CMD_DESTROY = 3
IPSET_CMD_LIST = 7
IPSET_ATTR_PROTOCOL = 1
IPSET_ATTR_SETNAME = 2
IPSET_ATTR_FLAGS = 6
IPSET_FLAG_LIST_SETNAME = 1 << 1
IPSET_PROTOCOL = 6
"""The oldest protocol version kernels still take (IPSET_PROTOCOL_MIN); names need no more."""
IPSET_ERR_BUSY = 4100
"""IPSET_ERR_PRIVATE (4096) + 4: the set is still referenced (a rule's ``match-set``)."""

# -- generic netlink (include/uapi/linux/genetlink.h) ------------------------------------------
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
GENLMSGHDR = struct.Struct("=BBH")

# -- IPVS over generic netlink (include/uapi/linux/ip_vs.h) -----------------------------------
IPVS_GENL_NAME = "IPVS"
IPVS_GENL_VERSION = 1
IPVS_CMD_DEL_SERVICE = 3
IPVS_CMD_GET_SERVICE = 4
IPVS_CMD_ATTR_SERVICE = 1
IPVS_SVC_ATTR_AF = 1
IPVS_SVC_ATTR_PROTOCOL = 2
IPVS_SVC_ATTR_ADDR = 3
IPVS_SVC_ATTR_PORT = 4
IPVS_SVC_ATTR_FWMARK = 5

_U16 = struct.Struct("=H")
_U32 = struct.Struct("=I")
_PROTOCOLS = {socket.IPPROTO_TCP: "TCP", socket.IPPROTO_UDP: "UDP", socket.IPPROTO_SCTP: "SCTP"}


class IpvsCleanupError(NlproxyError):
    """The kernel refused to remove a part of IPVS mode."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualServer:
    """One IPVS virtual service: an address, protocol and port (or a firewall mark)."""

    family: int
    """AF_INET or AF_INET6."""
    protocol: int
    address: IPAddress | None
    port: int
    fwmark: int = 0

    def __str__(self) -> str:
        if self.fwmark:
            return f"fwmark {self.fwmark}"
        proto = _PROTOCOLS.get(self.protocol, str(self.protocol))
        host = f"[{self.address}]" if self.family == socket.AF_INET6 else str(self.address)
        return f"{proto} {host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class IpvsLeftovers:
    """What IPVS mode left outside nftables."""

    ipsets: tuple[str, ...] = ()
    device: int | None = None
    """``kube-ipvs0``'s interface index, when it exists and is a dummy."""
    addresses: tuple[IPAddress, ...] = ()
    """The addresses on ``kube-ipvs0``."""
    virtual_servers: tuple[VirtualServer, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.ipsets or self.device is not None or self.virtual_servers)

    def named(self) -> list[tuple[str, str]]:
        """(name, description) per kind of leftover, for logs, ``cleanup`` and ``preflight``."""
        out = []
        if self.virtual_servers:
            n = len(self.virtual_servers)
            out.append(("ipvs virtual servers", f"{n} IPVS virtual servers (kube-proxy, IPVS)"))
        if self.ipsets:
            out.append(("ipsets", f"{len(self.ipsets)} KUBE-* ipsets (kube-proxy, IPVS)"))
        if self.device is not None:
            n = len(self.addresses)
            out.append(
                (f"device {DEVICE}", f"device {DEVICE} with {n} addresses (kube-proxy, IPVS)")
            )
        return out

    def describe(self) -> list[str]:
        """One line per kind of leftover."""
        return [line for _, line in self.named()]


# -- pure: messages --------------------------------------------------------------------------


def ipset_list_request(seq: int) -> bytes:
    """A dump of every ipset's name (``ipset list -n``)."""
    attrs = u8_attr(IPSET_ATTR_PROTOCOL, IPSET_PROTOCOL)
    attrs += be32_attr(IPSET_ATTR_FLAGS | NLA_F_NET_BYTEORDER, IPSET_FLAG_LIST_SETNAME)
    mtype = nfnl_type(NFNL_SUBSYS_IPSET, IPSET_CMD_LIST)
    return nfnl_message(mtype, NLM_F_REQUEST | NLM_F_DUMP, seq, socket.AF_INET, attrs)


def ipset_destroy_request(seq: int, name: str) -> bytes:
    """Destroy the ipset ``name`` (``ipset destroy NAME``), acknowledged."""
    attrs = u8_attr(IPSET_ATTR_PROTOCOL, IPSET_PROTOCOL) + str_attr(IPSET_ATTR_SETNAME, name)
    mtype = nfnl_type(NFNL_SUBSYS_IPSET, IPSET_CMD_DESTROY)
    return nfnl_message(mtype, NLM_F_REQUEST | NLM_F_ACK, seq, socket.AF_INET, attrs)


def ipset_names(replies: Iterable[Message]) -> list[str]:
    """The set names a list dump answered, each once, in the kernel's order."""
    names: dict[str, None] = {}
    for msg in replies:
        if msg.type == nfnl_type(NFNL_SUBSYS_IPSET, IPSET_CMD_LIST):
            raw = nfnl_attributes(msg.payload).get(IPSET_ATTR_SETNAME)
            if raw is not None:
                names[text(raw)] = None
    return list(names)


def genl_message(family: int, cmd: int, version: int, flags: int, seq: int, attrs: bytes) -> bytes:
    """One generic netlink message: header, genlmsghdr and ``attrs``."""
    length = NLMSGHDR.size + GENLMSGHDR.size + len(attrs)
    return NLMSGHDR.pack(length, family, flags, seq, 0) + GENLMSGHDR.pack(cmd, version, 0) + attrs


def family_request(seq: int, name: str = IPVS_GENL_NAME) -> bytes:
    """Ask the generic netlink controller for family ``name``'s id."""
    return genl_message(
        GENL_ID_CTRL,
        CTRL_CMD_GETFAMILY,
        1,
        NLM_F_REQUEST,
        seq,
        str_attr(CTRL_ATTR_FAMILY_NAME, name),
    )


def family_id(reply: Message) -> int:
    """The family id in the controller's answer to :func:`family_request`."""
    attrs = attribute_map(reply.payload, GENLMSGHDR.size)
    return int(_U16.unpack_from(attrs[CTRL_ATTR_FAMILY_ID])[0])


def services_request(family: int, seq: int) -> bytes:
    """A dump of every IPVS virtual service (``ipvsadm -Ln``)."""
    flags = NLM_F_REQUEST | NLM_F_DUMP
    return genl_message(family, IPVS_CMD_GET_SERVICE, IPVS_GENL_VERSION, flags, seq, b"")


def _service_attrs(vs: VirtualServer) -> bytes:
    attrs = attr(IPVS_SVC_ATTR_AF, _U16.pack(vs.family))
    if vs.fwmark:
        return attrs + attr(IPVS_SVC_ATTR_FWMARK, _U32.pack(vs.fwmark))
    assert vs.address is not None
    # union nf_inet_addr: 16 bytes, an IPv4 address in the first four.
    addr = vs.address.packed.ljust(16, b"\0")
    attrs += attr(IPVS_SVC_ATTR_PROTOCOL, _U16.pack(vs.protocol))
    attrs += attr(IPVS_SVC_ATTR_ADDR, addr)
    return attrs + attr(IPVS_SVC_ATTR_PORT, struct.pack("!H", vs.port))


def delete_service_request(family: int, seq: int, vs: VirtualServer) -> bytes:
    """Delete one virtual service (``ipvsadm -D``), acknowledged."""
    body = nest(IPVS_CMD_ATTR_SERVICE, _service_attrs(vs))
    flags = NLM_F_REQUEST | NLM_F_ACK
    return genl_message(family, IPVS_CMD_DEL_SERVICE, IPVS_GENL_VERSION, flags, seq, body)


def parse_service(reply: Message) -> VirtualServer | None:
    """The virtual service in one answer of a :func:`services_request` dump."""
    outer = attribute_map(reply.payload, GENLMSGHDR.size)
    if IPVS_CMD_ATTR_SERVICE not in outer:
        return None
    svc = attribute_map(outer[IPVS_CMD_ATTR_SERVICE])
    family = int(_U16.unpack_from(svc[IPVS_SVC_ATTR_AF])[0])
    fwmark = (
        int(_U32.unpack_from(svc[IPVS_SVC_ATTR_FWMARK])[0]) if IPVS_SVC_ATTR_FWMARK in svc else 0
    )
    if fwmark:
        return VirtualServer(family=family, protocol=0, address=None, port=0, fwmark=fwmark)
    raw = svc.get(IPVS_SVC_ATTR_ADDR, b"")
    size = 4 if family == socket.AF_INET else 16
    return VirtualServer(
        family=family,
        protocol=int(_U16.unpack_from(svc[IPVS_SVC_ATTR_PROTOCOL])[0]),
        address=ip_address(raw[:size]),
        port=int(struct.unpack_from("!H", svc[IPVS_SVC_ATTR_PORT])[0]),
    )


def kube_proxy_servers(
    servers: Iterable[VirtualServer],
    device_addresses: Iterable[IPAddress],
    node_addresses: Iterable[IPAddress],
    node_ports: tuple[int, int] = NODE_PORT_RANGE,
) -> tuple[VirtualServer, ...]:
    """The virtual servers kube-proxy made: an address on ``kube-ipvs0`` (ClusterIPs, external
    and load-balancer IPs), or a NodePort (in ``node_ports``) on one of the node's addresses.
    Firewall-mark services are never kube-proxy's."""
    on_device = set(device_addresses)
    on_node = set(node_addresses) - on_device
    low, high = node_ports
    return tuple(
        vs
        for vs in servers
        if vs.address is not None
        and (vs.address in on_device or (vs.address in on_node and low <= vs.port <= high))
    )


# -- kernel ----------------------------------------------------------------------------------


def _acked(sock: NetfilterSocket, seq: int) -> int:
    """The error an acknowledged request got (0: done)."""
    while True:
        for msg in sock.recv(timeout=10.0):
            if msg.type == NLMSG_ERROR and msg.error_seq == seq:
                return msg.error


def _dump(sock: NetfilterSocket, request: bytes, seq: int) -> list[Message]:
    try:
        return list(sock.dump(request, seq))
    except OSError as exc:
        # nfnetlink answers EINVAL for a subsystem the kernel lacks (no ip_set, module or
        # built in): no ipset support, so no ipset of kube-proxy's either.
        if exc.errno in (errno.ENOENT, errno.EINVAL, errno.EPROTONOSUPPORT, errno.EOPNOTSUPP):
            return []
        raise


def list_ipsets(netns_name: str | None = None) -> list[str]:
    """Every ipset's name in ``netns_name``."""
    with NetfilterSocket(netns_name, bufsize=4 << 20) as sock:
        seq = sock.next_seq()
        return ipset_names(_dump(sock, ipset_list_request(seq), seq))


def _ipvs_family(sock: NetfilterSocket) -> int | None:
    seq = sock.next_seq()
    sock.send(family_request(seq))
    while True:
        for msg in sock.recv(timeout=10.0):
            if msg.seq != seq:
                continue
            if msg.type == NLMSG_ERROR:
                return None  # ENOENT: no IPVS module, so no virtual server
            return family_id(msg)


def list_virtual_servers(netns_name: str | None = None) -> list[VirtualServer]:
    """Every IPVS virtual service in ``netns_name``; none when IPVS is not loaded."""
    with NetfilterSocket(netns_name, bufsize=4 << 20, protocol=NETLINK_GENERIC) as sock:
        family = _ipvs_family(sock)
        if family is None:
            return []
        seq = sock.next_seq()
        found = (parse_service(m) for m in _dump(sock, services_request(family, seq), seq))
        return [vs for vs in found if vs is not None]


def has_device(name: str) -> bool:
    """Whether the current network namespace has a link called ``name``: one SIOCGIFINDEX.

    Only ENODEV means no such link; any other failure (no descriptor left, say) is raised as
    it is. ``socket.if_nametoindex`` cannot tell them apart: it answers every failure with the
    same errno-less error.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            fcntl.ioctl(sock, _SIOCGIFINDEX, _IFREQ.pack(name.encode(), 0))
        except OSError as exc:
            if exc.errno == errno.ENODEV:
                return False
            raise
    return True


_SIOCGIFINDEX = 0x8933
_IFREQ = struct.Struct("16si20x")  # struct ifreq: the name, ifr_ifindex, the union's rest


def _device(
    netns_name: str | None, *, addresses: bool
) -> tuple[int | None, list[IPAddress], list[IPAddress]]:
    """``kube-ipvs0``'s index (when a dummy) and addresses, and with ``addresses`` every
    address of the node. One link lookup by name when there is nothing more to ask: an
    ``if_nametoindex`` when there is no such device at all (the daemon's look every 30 s on a
    node without IPVS), which costs no pyroute2 socket and event loop (~1 ms)."""
    if not addresses:
        with netns.entered(netns_name):
            if not has_device(DEVICE):
                return None, [], []
    from nlproxy.inspect.pyroute import IPRoute, NetlinkError

    with netns.entered(netns_name):
        ipr = IPRoute(groups=0)
    try:
        index: int | None = None
        try:
            (link,) = ipr.link("get", ifname=DEVICE)
        except NetlinkError as exc:
            if exc.code != errno.ENODEV:
                raise
        else:
            if _kind(link) == "dummy":
                index = int(link["index"])
        mine: list[IPAddress] = []
        every: list[IPAddress] = []
        if index is None and not addresses:
            return index, mine, every
        for msg in ipr.get_addr():
            addr = ip_address(msg.get_attr("IFA_ADDRESS"))
            every.append(addr)
            if int(msg["index"]) == index:
                mine.append(addr)
        return index, mine, every
    finally:
        ipr.close()


def _kind(link: Any) -> str | None:
    kind = link.get(("linkinfo", "kind"))
    return None if kind is None else str(kind)


def detect(netns_name: str | None = None) -> IpvsLeftovers:
    """What IPVS mode left in ``netns_name``: its ipsets, device and virtual servers.

    Cheap when there is none (the daemon asks after every foreign nftables change): an ipset
    dump of names, one IPVS family lookup, one link lookup by name.
    """
    ipsets = tuple(sorted(n for n in list_ipsets(netns_name) if n in KUBE_PROXY_IPSETS))
    servers = list_virtual_servers(netns_name)
    index, mine, every = _device(netns_name, addresses=bool(servers))
    return IpvsLeftovers(
        ipsets=ipsets,
        device=index,
        addresses=tuple(mine),
        virtual_servers=kube_proxy_servers(servers, mine, every),
    )


def remove(found: IpvsLeftovers, netns_name: str | None = None, *, busy_for: float = 5.0) -> None:
    """Remove what :func:`detect` found: the virtual servers, the ipsets, then the device.

    Run after the rules that match the sets are gone (``foreign.remove``): the kernel frees a
    deleted rule's ``match-set`` reference after the commit, so a destroy answered "busy" is
    tried again for up to ``busy_for`` seconds. What is already gone counts as removed.

    Raises:
        IpvsCleanupError: the kernel refused (naming what).
    """
    if found.virtual_servers:
        with NetfilterSocket(netns_name, bufsize=4 << 20, protocol=NETLINK_GENERIC) as sock:
            family = _ipvs_family(sock)
            for vs in found.virtual_servers:
                if family is None:  # IPVS unloaded since: its virtual servers went with it
                    break
                seq = sock.next_seq()
                sock.send(delete_service_request(family, seq, vs))
                err = _acked(sock, seq)
                if err and err not in (errno.ESRCH, errno.ENOENT):
                    raise IpvsCleanupError(f"IPVS virtual server {vs}", os.strerror(err))
    if found.ipsets:
        with NetfilterSocket(netns_name, bufsize=4 << 20) as sock:
            for name in found.ipsets:
                _destroy_ipset(sock, name, busy_for)
    if found.device is not None:
        _delete_device(found.device, netns_name)


def _destroy_ipset(sock: NetfilterSocket, name: str, busy_for: float) -> None:
    deadline = time.monotonic() + busy_for
    while True:
        seq = sock.next_seq()
        sock.send(ipset_destroy_request(seq, name))
        err = _acked(sock, seq)
        if err in (0, errno.ENOENT):
            return
        if err != IPSET_ERR_BUSY or time.monotonic() > deadline:
            why = "still referenced by a rule" if err == IPSET_ERR_BUSY else _strerror(err)
            raise IpvsCleanupError(f"ipset {name}", why)
        time.sleep(0.05)


def _strerror(err: int) -> str:
    return os.strerror(err) if err < 4096 else f"ipset error {err}"


def _delete_device(index: int, netns_name: str | None) -> None:
    from nlproxy.inspect.pyroute import IPRoute, NetlinkError

    with netns.entered(netns_name):
        ipr = IPRoute(groups=0)
    try:
        ipr.link("del", index=index)
    except NetlinkError as exc:
        if exc.code != errno.ENODEV:
            raise IpvsCleanupError(f"device {DEVICE}", os.strerror(exc.code)) from exc
    finally:
        ipr.close()
