"""Read-back at scale: a 100k-element map and thousands of rules come back complete and in
order, across many multi-part dumps."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import IPv4Address

from nlproxy.nft.ir import Cmp, DataType, Element, Family, Field, Map, Rule, goto
from nlproxy.nft.readback import read_ruleset
from tests.kernel.nft_read_cases import load_nft

COUNT = 100_000


def backend_for(i: int) -> tuple[tuple[IPv4Address, int, int], tuple[IPv4Address, int]]:
    """Key (service IP, port, endpoint index) and data (endpoint IP, port) of element ``i``."""
    key = (IPv4Address(0x0A600000 + i // 10), 80 + i % 7, i % 10)
    return key, (IPv4Address(0x0AF40000 + i), 8000 + i % 1000)


def bulk_table(count: int) -> str:
    items = []
    for i in range(count):
        (vip, port, n), (ep, ep_port) = backend_for(i)
        items.append(f"{vip} . {port} . 0x{n:08x} : {ep} . {ep_port}")
    return (
        "table ip nlp {\n"
        "  map backends { type ipv4_addr . inet_service . mark : ipv4_addr . inet_service; }\n"
        "}\n"
        "add element ip nlp backends { " + ",\n".join(items) + " }\n"
    )


def test_100k_map_elements_read_back_completely(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("bulk")
    load_nft(ns, bulk_table(COUNT))

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    assert rs.sets["backends"] == Map(
        name="backends",
        key=(DataType.IPV4_ADDR, DataType.INET_SERVICE, DataType.MARK),
        data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
    )
    got = rs.elements["backends"]
    assert len(got) == COUNT
    for i in range(COUNT):
        key, data = backend_for(i)
        assert got[key] == Element(set="backends", key=key, value=data)


def test_thousands_of_rules_read_back_in_order(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("bulk")
    count = 3000
    rules = "\n".join(
        f'    ip daddr {IPv4Address(0x0A600000 + i)} th dport {i + 1} goto ep comment "svc {i}"'
        for i in range(count)
    )
    load_nft(ns, f"table ip nlp {{\n  chain ep {{\n  }}\n  chain svc {{\n{rules}\n  }}\n}}\n")

    rs = read_ruleset(Family.IP, "nlp", netns=ns)

    assert rs is not None
    assert rs.rules["svc"] == [
        Rule(
            chain="svc",
            exprs=(
                Cmp(Field.IP_DADDR, IPv4Address(0x0A600000 + i)),
                Cmp(Field.TH_DPORT, i + 1),
                goto("ep"),
            ),
            comment=f"svc {i}",
        )
        for i in range(count)
    ]
    handles = [r.handle for r in rs.rules["svc"]]
    assert len(set(handles)) == count
