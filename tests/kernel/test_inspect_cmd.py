"""``nlproxy inspect``: programmed endpoints read back from a real table, classified, reported."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from ipaddress import IPv4Address, IPv6Address

import pytest

from nlproxy.cli import main
from nlproxy.errors import NlproxyError
from nlproxy.nft.ir import (
    DROP,
    DataType,
    Element,
    Family,
    Map,
    Ruleset,
    Table,
    Verdict,
    goto,
)
from nlproxy.operate.inspect import programmed_endpoints
from tests.kernel.inspect_bed import add_pod, ip, node_ns

MakeNetns = Callable[[str], str]
V4 = (DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE)
V6 = (DataType.IPV6_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE)


def ruleset(
    family: Family,
    services: dict[tuple[object, ...], tuple[Verdict, str]],
    backends: dict[tuple[object, ...], tuple[object, int]],
) -> Ruleset:
    """A hand-built nlproxy table holding only the two maps the inspector reads."""
    key = V4 if family is Family.IP else V6
    rs = Ruleset(table=Table(family=family, name="nlproxy"))
    rs.add_set(Map(name="service-ips", key=key, data=(DataType.VERDICT,)))
    rs.add_set(Map(name="backends", key=(*key, DataType.MARK), data=(key[0], key[2])))
    for k, (verdict, comment) in services.items():
        rs.add_element(Element(set="service-ips", key=k, value=verdict, comment=comment))  # type: ignore[arg-type]
    for k, v in backends.items():
        rs.add_element(Element(set="backends", key=k, value=v))  # type: ignore[arg-type]
    return rs


VIP, EXT = IPv4Address("10.96.0.10"), IPv4Address("192.0.2.10")
POD1, POD2 = IPv4Address("10.244.2.4"), IPv4Address("10.244.3.5")


def test_programmed_endpoints_from_hand_built_rulesets() -> None:
    v4 = ruleset(
        Family.IP,
        {
            (VIP, 6, 80): (goto("lb2"), "default/web:http/TCP"),
            (EXT, 6, 80): (goto("lb2"), "default/web:http/TCP"),  # an external IP
            (IPv4Address("10.96.0.11"), 17, 53): (DROP, "kube-system/dns:dns/UDP"),
        },
        {
            # Out of index order on purpose; the external IP repeats the same endpoints.
            (VIP, 6, 80, 1): (POD2, 8080),
            (VIP, 6, 80, 0): (POD1, 8080),
            (EXT, 6, 80, 0): (POD1, 8080),
            (EXT, 6, 80, 1): (POD2, 8080),
            (IPv4Address("10.96.0.12"), 132, 9, 0): (POD1, 9),  # no service-ips element
        },
    )
    vip6, pod6 = IPv6Address("fd00:96::10"), IPv6Address("fd00:10:244::4")
    v6 = ruleset(
        Family.IP6,
        {(vip6, 6, 80): (goto("lb1"), "default/web6:http/TCP")},
        {(vip6, 6, 80, 0): (pod6, 8080)},
    )
    assert programmed_endpoints([v4, v6]) == {
        "default/web:http/TCP": [(POD1, 8080), (POD2, 8080)],
        "kube-system/dns:dns/UDP": [],
        "10.96.0.12:9/SCTP": [(POD1, 9)],
        "default/web6:http/TCP": [(pod6, 8080)],
    }
    assert programmed_endpoints([]) == {}


def test_programmed_endpoints_rejects_a_malformed_element() -> None:
    bad = ruleset(Family.IP, {}, {(VIP, 6, 80, 0): (POD1, 8080)})
    bad.elements["backends"][(VIP, 6, 80, 0)] = Element(set="backends", key=(VIP, 6, 80, 0))
    with pytest.raises(NlproxyError, match=r"map backends element .*10\.96\.0\.10.*addr \. port"):
        programmed_endpoints([bad])


TABLE = """
table ip nlproxy {
  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }
  map backends { type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service; }
  chain lb2 { }
}
add element ip nlproxy service-ips {
  10.96.0.10 . tcp . 80 comment "default/web:http/TCP" : goto lb2,
  10.96.0.11 . udp . 53 comment "kube-system/dns:dns/UDP" : drop,
  10.96.0.12 . tcp . 443 comment "other/api:https/TCP" : goto lb2
}
add element ip nlproxy backends {
  10.96.0.10 . tcp . 80 . 0 : 10.244.2.4 . 8080,
  10.96.0.10 . tcp . 80 . 1 : 10.244.3.5 . 8080,
  10.96.0.12 . tcp . 443 . 0 : 10.244.3.5 . 6443,
  10.96.0.12 . tcp . 443 . 1 : 10.244.3.6 . 6443
}
"""


@pytest.fixture
def node(make_netns: MakeNetns) -> str:
    """A node with a local ptp pod 10.244.2.4, node2's pods behind 172.18.0.2, and the table."""
    n1, n2 = node_ns(make_netns, "cmd-node1"), make_netns("cmd-node2")
    add_pod(n1, make_netns("cmd-pod"), "veth1a2b", "10.244.2.4")
    ip(n1, "link", "add", "eth1", "type", "veth", "peer", "name", "eth1", "netns", n2)
    for ns, addr in ((n1, "172.18.0.1/24"), (n2, "172.18.0.2/24")):
        ip(ns, "addr", "add", addr, "dev", "eth1")
        ip(ns, "link", "set", "eth1", "up")
    ip(n1, "route", "add", "10.244.3.0/24", "via", "172.18.0.2")
    nft(n1, TABLE)
    return n1


def nft(ns: str, text: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=text, text=True, check=True)


def run_inspect(node: str, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["--netns", node, "inspect", *args])
    return code, capsys.readouterr().out


def test_json_all_reachable(node: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_inspect(node, "--json", capsys=capsys)
    assert code == 0
    rows = json.loads(out)
    assert [(r["service"], r["port"], r["endpoint"]) for r in rows] == [
        ("default/web", "http/TCP", "10.244.2.4:8080"),
        ("default/web", "http/TCP", "10.244.3.5:8080"),
        ("other/api", "https/TCP", "10.244.3.5:6443"),
        ("other/api", "https/TCP", "10.244.3.6:6443"),
    ]
    local, remote = rows[0], rows[1]
    assert local["local"] is True
    assert local["reachable"] is True
    assert local["route"] == "10.244.2.4 dev veth1a2b scope host"
    assert local["reason"].startswith("route 10.244.2.4 dev veth1a2b scope host: ")
    assert (remote["local"], remote["kind"], remote["gateway"]) == (False, "remote", "172.18.0.2")
    assert remote["route"] == "10.244.3.0/24 via 172.18.0.2 dev eth1"
    for r in rows:
        assert {"service", "port", "endpoint", "local", "route", "reachable", "reason"} <= r.keys()


def test_unreachable_endpoint_exits_4(node: str, capsys: pytest.CaptureFixture[str]) -> None:
    ip(node, "link", "set", "veth1a2b", "down")
    code, out = run_inspect(node, "--json", capsys=capsys)
    assert code == 4
    bad = [r for r in json.loads(out) if not r["reachable"]]
    assert [(r["endpoint"], r["reason"]) for r in bad] == [
        ("10.244.2.4:8080", "route 10.244.2.4 dev veth1a2b scope host: device is down")
    ]


def test_service_filter(node: str, capsys: pytest.CaptureFixture[str]) -> None:
    ip(node, "link", "set", "veth1a2b", "down")  # only default/web is affected
    code, out = run_inspect(node, "--service", "other/api", "--json", capsys=capsys)
    assert code == 0
    assert {r["service"] for r in json.loads(out)} == {"other/api"}
    code, out = run_inspect(node, "--service", "default/web", capsys=capsys)
    assert code == 4
    assert "default/web:http/TCP" in out
    assert "other/api" not in out


def test_table_output(node: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_inspect(node, capsys=capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "default/web:http/TCP"
    assert lines[1].split() == [
        "ENDPOINT",
        "KIND",
        "DEVICE",
        "GATEWAY",
        "STATE",
        "REACHABLE",
        "REASON",
    ]
    assert lines[2].split()[:4] == ["10.244.2.4:8080", "local", "veth1a2b", "-"]
    assert lines[3].split()[:4] == ["10.244.3.5:8080", "remote", "eth1", "172.18.0.2"]
    assert "kube-system/dns:dns/UDP\n  (no endpoints)" in out


def test_bad_service_flag_is_usage_error(node: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--netns", node, "inspect", "--service", "web"])
    assert code == 2
    assert "--service: 'web' is not NAMESPACE/NAME" in capsys.readouterr().err


def test_no_table(make_netns: MakeNetns, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_inspect(make_netns("cmd-empty"), capsys=capsys)
    assert code == 0
    assert out.strip() == "no programmed service ports"


def test_unknown_service_is_a_usage_error(node: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--netns", node, "inspect", "--service", "default/wbe"])
    assert code == 2
    assert capsys.readouterr().err == (
        "nlproxy: service default/wbe: unknown: nothing is programmed for it\n"
    )
