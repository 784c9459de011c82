"""IPVS mode's leftovers: the ipset and IPVS netlink messages, byte for byte as the uapi headers
lay them out, and which virtual servers are kube-proxy's. The kernel side runs in
tests/kernel/test_cleanup_ipvs.py (ipsets) and vm-tests/test_7_ipvs.py (IPVS, dummy device)."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
from ipaddress import ip_address

import pytest

from nlproxy.inspect import ipvs
from nlproxy.inspect.ipvs import IpvsLeftovers, VirtualServer, has_device
from nlproxy.netlink.codec import Message


def nla(kind: int, value: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(value), kind) + value + bytes(-len(value) % 4)


def header(length: int, mtype: int, flags: int, seq: int) -> bytes:
    return struct.pack("=IHHII", length, mtype, flags, seq, 0)


def test_ipset_list_request_asks_for_names_only() -> None:
    msg = ipvs.ipset_list_request(7)
    body = (
        struct.pack("!BBH", socket.AF_INET, 0, 0)  # nfgenmsg
        + nla(1, b"\x06")  # IPSET_ATTR_PROTOCOL = 6
        + nla(6 | 0x4000, struct.pack("!I", 2))  # IPSET_ATTR_FLAGS: IPSET_FLAG_LIST_SETNAME
    )
    # (NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_LIST; NLM_F_REQUEST | NLM_F_DUMP
    assert msg == header(16 + len(body), 0x0607, 0x301, 7) + body


def test_ipset_destroy_request_names_the_set() -> None:
    msg = ipvs.ipset_destroy_request(9, "KUBE-CLUSTER-IP")
    body = struct.pack("!BBH", 2, 0, 0) + nla(1, b"\x06") + nla(2, b"KUBE-CLUSTER-IP\0")
    assert msg == header(16 + len(body), 0x0603, 0x5, 9) + body


def ipset_reply(name: str, seq: int = 1) -> Message:
    payload = struct.pack("!BBH", 2, 0, 0) + nla(1, b"\x06") + nla(2, name.encode() + b"\0")
    return Message(type=0x0607, flags=2, seq=seq, payload=payload)


def test_ipset_names_are_read_once_each() -> None:
    replies = [ipset_reply("KUBE-CLUSTER-IP"), ipset_reply("mine"), ipset_reply("KUBE-CLUSTER-IP")]
    assert ipvs.ipset_names(replies) == ["KUBE-CLUSTER-IP", "mine"]


def test_kube_proxy_ipsets_cover_both_families() -> None:
    assert {"KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP", "KUBE-NODE-PORT-LOCAL-SCTP-HASH"} <= (
        ipvs.KUBE_PROXY_IPSETS
    )
    assert "KUBE-USER-ALLOW" not in ipvs.KUBE_PROXY_IPSETS
    assert all(len(name) <= 31 for name in ipvs.KUBE_PROXY_IPSETS)  # IPSET_MAXNAMELEN - 1


def test_family_request_and_answer() -> None:
    msg = ipvs.family_request(3)
    body = struct.pack("=BBH", 3, 1, 0) + nla(2, b"IPVS\0")  # CTRL_CMD_GETFAMILY, version 1
    assert msg == header(16 + len(body), 0x10, 0x1, 3) + body
    reply = struct.pack("=BBH", 1, 2, 0) + nla(2, b"IPVS\0") + nla(1, struct.pack("=H", 37))
    answer = Message(type=0x10, flags=0, seq=3, payload=reply)
    assert ipvs.family_id(answer) == 37


def service_nest(af: int, proto: int, addr: bytes, port: int) -> bytes:
    return (
        nla(1, struct.pack("=H", af))
        + nla(2, struct.pack("=H", proto))
        + nla(3, addr.ljust(16, b"\0"))
        + nla(4, struct.pack("!H", port))
    )


@pytest.mark.parametrize(
    "vs",
    [
        pytest.param(
            VirtualServer(
                family=socket.AF_INET, protocol=6, address=ip_address("10.96.0.1"), port=443
            ),
            id="ipv4-tcp",
        ),
        pytest.param(
            VirtualServer(
                family=socket.AF_INET6, protocol=17, address=ip_address("fd00::a"), port=53
            ),
            id="ipv6-udp",
        ),
    ],
)
def test_delete_service_request_and_dump_reply(vs: VirtualServer) -> None:
    assert vs.address is not None
    nested = service_nest(vs.family, vs.protocol, vs.address.packed, vs.port)
    msg = ipvs.delete_service_request(42, 5, vs)
    body = struct.pack("=BBH", 3, 1, 0) + nla(1 | 0x8000, nested)  # IPVS_CMD_DEL_SERVICE
    assert msg == header(16 + len(body), 42, 0x5, 5) + body
    # The dump answers with the same nest plus fields a delete does not need.
    extra = nla(6, b"rr\0") + nla(5, struct.pack("=I", 0)) + nla(8, struct.pack("=I", 0))
    payload = struct.pack("=BBH", 1, 1, 0) + nla(1 | 0x8000, nested + extra)
    parsed = ipvs.parse_service(Message(type=42, flags=2, seq=6, payload=payload))
    assert parsed == vs


def test_fwmark_service_is_read_and_deleted_by_mark() -> None:
    nested = nla(1, struct.pack("=H", 2)) + nla(5, struct.pack("=I", 0x4000))
    payload = struct.pack("=BBH", 1, 1, 0) + nla(1 | 0x8000, nested)
    vs = ipvs.parse_service(Message(type=42, flags=2, seq=6, payload=payload))
    assert vs == VirtualServer(family=2, protocol=0, address=None, port=0, fwmark=0x4000)
    assert str(vs) == "fwmark 16384"
    assert ipvs.delete_service_request(42, 1, vs).endswith(nla(1 | 0x8000, nested))


def vs(addr: str, port: int, proto: int = 6) -> VirtualServer:
    a = ip_address(addr)
    family = socket.AF_INET if a.version == 4 else socket.AF_INET6
    return VirtualServer(family=family, protocol=proto, address=a, port=port)


def test_only_kube_proxys_virtual_servers_are_taken() -> None:
    on_device = [ip_address("10.96.0.1"), ip_address("10.96.0.10"), ip_address("203.0.113.5")]
    node = [ip_address("192.168.1.10"), ip_address("127.0.0.1"), *on_device]
    servers = [
        vs("10.96.0.1", 443),  # ClusterIP
        vs("10.96.0.10", 53, 17),  # ClusterIP, UDP
        vs("203.0.113.5", 80),  # load-balancer IP on kube-ipvs0
        vs("192.168.1.10", 30080),  # NodePort
        vs("127.0.0.1", 32767),  # NodePort on loopback
        vs("192.168.1.10", 80),  # a user's virtual server on the node's address
        vs("192.168.1.200", 30080),  # keepalived's VIP, not the node's
        VirtualServer(family=2, protocol=0, address=None, port=0, fwmark=1),
    ]
    taken = ipvs.kube_proxy_servers(servers, on_device, node)
    assert [str(s) for s in taken] == [
        "TCP 10.96.0.1:443",
        "UDP 10.96.0.10:53",
        "TCP 203.0.113.5:80",
        "TCP 192.168.1.10:30080",
        "TCP 127.0.0.1:32767",
    ]


def test_leftovers_describe_every_kind() -> None:
    found = IpvsLeftovers(
        ipsets=("KUBE-CLUSTER-IP",),
        device=4,
        addresses=(ip_address("10.96.0.1"),),
        virtual_servers=(vs("10.96.0.1", 443),),
    )
    assert found.describe() == [
        "1 IPVS virtual servers (kube-proxy, IPVS)",
        "1 KUBE-* ipsets (kube-proxy, IPVS)",
        "device kube-ipvs0 with 1 addresses (kube-proxy, IPVS)",
    ]
    assert not IpvsLeftovers()


def test_a_link_lookup_tells_no_such_link_from_a_failure_to_ask() -> None:
    """ENODEV is "no such link"; running out of descriptors is raised, not read as no link
    (the daemon would otherwise report no ``kube-ipvs0`` on a node that has one)."""
    assert has_device("lo")
    assert not has_device("nlp-none-0")
    script = (
        "import errno, resource, sys\n"
        "from nlproxy.inspect.ipvs import has_device\n"
        "held = []\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "try:\n"
        "    while True:\n"
        "        held.append(open('/dev/null'))\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        "    has_device('lo')\n"
        "except OSError as exc:\n"
        "    sys.exit(0 if exc.errno == errno.EMFILE else 3)\n"
        "sys.exit(4)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=120, check=False)
    assert done.returncode == 0
