"""Transactions through NftBackend: atomicity, errors that name the object, verbs, big batches,
elements of every value type, and validation that stops a batch before it is sent.

Each test works in its own fresh namespace and checks the kernel from outside with ``nft``.
"""

from __future__ import annotations

import errno
import json
import socket
import time
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any

import pytest

from nlproxy.errors import InvalidNftObject, KernelError
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import (
    ACCEPT,
    DROP,
    Chain,
    ChainType,
    Cmp,
    Counter,
    DataType,
    Element,
    Family,
    Field,
    Hook,
    L4Proto,
    Lookup,
    Map,
    Operation,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    Table,
    Verb,
    goto,
    jump,
)
from tests.netns import sh

V4 = IPv4Address
T = Table(family=Family.IP, name="nlp")
KEY3 = (DataType.IPV4_ADDR, DataType.INET_PROTO, DataType.INET_SERVICE)
SVC = Map(name="service-ips", key=KEY3, data=(DataType.VERDICT,))
BACKENDS = Map(
    name="backends",
    key=(*KEY3, DataType.MARK),
    data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
)


def add(*objs: Any) -> list[Operation]:
    return [Operation(Verb.ADD, o) for o in objs]


def nft_json(ns: str, *what: str, handles: bool = False) -> list[dict[str, Any]]:
    doc = json.loads(sh("nft", *(["-a"] if handles else []), "-j", "list", *what, ns=ns))
    items: list[dict[str, Any]] = doc["nftables"]
    return items


def ruleset_text(ns: str) -> str:
    return sh("nft", "list", "ruleset", ns=ns)


def elements(ns: str, kind: str, name: str) -> list[Any]:
    for item in nft_json(ns, kind, "ip", T.name, name):
        if kind in item:
            elems: list[Any] = item[kind].get("elem", [])
            return elems
    raise AssertionError(f"{kind} {name} not listed")


def rules(ns: str, chain: str) -> list[dict[str, Any]]:
    return [
        i["rule"] for i in nft_json(ns, "chain", "ip", T.name, chain, handles=True) if "rule" in i
    ]


@pytest.fixture
def ns(make_netns: Callable[[str], str]) -> str:
    return make_netns("nftx")


@pytest.fixture
def backend(ns: str) -> Iterator[NftBackend]:
    with NftBackend(T, netns=ns) as b:
        b.apply(add(T, Chain(name="c1"), Chain(name="c2"), SVC, BACKENDS))
        yield b


# -- atomicity and errors --------------------------------------------------------------------


def test_failing_last_op_rolls_back_everything(ns: str, backend: NftBackend) -> None:
    before = ruleset_text(ns)
    ops = [
        *add(Chain(name="c3"), Set(name="s", key=(DataType.IPV4_ADDR,))),
        *add(
            *(
                Element(set="service-ips", key=(V4(f"10.0.0.{i}"), 6, 80), value=jump("c1"))
                for i in range(1, 50)
            )
        ),
        Operation(Verb.ADD, Rule(chain="c1", exprs=(Counter(),))),
        Operation(Verb.CREATE, Chain(name="c2")),  # exists: EEXIST
    ]
    with pytest.raises(KernelError) as info:
        backend.apply(ops)
    assert str(info.value) == "chain c2: File exists"
    assert info.value.errno == errno.EEXIST
    assert info.value.index == len(ops) - 1
    assert ruleset_text(ns) == before


def test_error_names_the_element_in_a_bulk_message(ns: str, backend: NftBackend) -> None:
    els = [Element(set="service-ips", key=(V4(f"10.0.{i // 250}.{i % 250}"), 6, 80),
                   value=goto("c1")) for i in range(3000)]  # fmt: skip
    backend.apply(add(*els))
    before = ruleset_text(ns)
    missing = Element(set="service-ips", key=(V4("10.99.0.1"), L4Proto.TCP, 80))
    ops = [Operation(Verb.DELETE, el) for el in els[:1700]]
    ops.insert(1234, Operation(Verb.DELETE, missing))
    ops += [Operation(Verb.DELETE, el) for el in els[1700:]]
    with pytest.raises(KernelError) as info:
        backend.apply(ops)
    assert str(info.value) == (
        "element 10.99.0.1 . tcp . 80 in map service-ips: No such file or directory"
    )
    assert info.value.index == 1234
    assert ruleset_text(ns) == before


def test_error_names_the_rule(ns: str, backend: NftBackend) -> None:
    # a jump to a chain the kernel does not have, hidden from validation by a stale view
    stale = Ruleset(table=T)
    for name in ("c1", "ghost"):
        stale.add_chain(Chain(name=name))
    rule = Rule(chain="c1", exprs=(Counter(), jump("ghost")), comment="svc default/web")
    with pytest.raises(KernelError) as info:
        backend.apply(add(rule), known=stale)
    assert (
        str(info.value) == "rule in chain c1 (svc default/web): exprs[1]: No such file or directory"
    )
    assert rules(ns, "c1") == []


def test_answers_for_a_batch_that_succeeds_are_consumed(backend: NftBackend) -> None:
    for i in range(5):  # each apply sees only its own answers
        result = backend.apply(add(Rule(chain="c1", exprs=(Counter(),), comment=f"r{i}")))
        assert result.messages == 1
    assert backend.apply([]).messages == 0


# -- big batches -------------------------------------------------------------------------------


def test_100k_element_map_in_one_batch(ns: str, backend: NftBackend) -> None:
    els = [
        Element(
            set="backends",
            key=(V4(0x0A000000 + i // 10), L4Proto.TCP, 80, i % 10),
            value=(V4(0x0AF40000 + i), 8080),
        )
        for i in range(100_000)
    ]
    result = backend.apply(add(*els))
    assert 50 < result.messages < 200  # bulk messages of ~1300 elements, not one per element
    # A listing walks the hash table, and a walk that meets the kernel's background resize of it
    # may repeat or skip elements: count distinct keys, listed again until the resize is over.
    deadline = time.monotonic() + 120
    while len(keys := {json.dumps(e[0]) for e in elements(ns, "map", "backends")}) != 100_000:
        assert time.monotonic() < deadline, f"{len(keys)} distinct keys listed, not 100000"
        time.sleep(1)
    # lookups do not walk: both ends and a spread of the elements map to their own backend
    sample = [0, 99_999, *range(1, 99_999, 997)]

    def key(i: int) -> str:
        return f"{V4(0x0A000000 + i // 10)} . tcp . 80 . "

    wanted = "{ " + ", ".join(f"{key(i)}{i % 10}" for i in sample) + " }"
    found = sh("nft", "get", "element", "ip", T.name, "backends", wanted, ns=ns)
    for i in sample:
        assert f"{key(i)}0x{i % 10:08x} : {V4(0x0AF40000 + i)} . 8080" in found


# -- verbs -------------------------------------------------------------------------------------


def test_insert_replace_delete_by_handle(ns: str, backend: NftBackend) -> None:
    first = Rule(chain="c1", exprs=(Cmp(Field.TH_DPORT, 1), ACCEPT))
    backend.apply(add(first))
    backend.apply([Operation(Verb.INSERT, Rule(chain="c1", exprs=(Cmp(Field.TH_DPORT, 2), DROP)))])
    listed = rules(ns, "c1")
    assert [r["expr"][0]["match"]["right"] for r in listed] == [2, 1]
    handle = listed[1]["handle"]
    new = Rule(chain="c1", exprs=(Cmp(Field.TH_DPORT, 3), ACCEPT), handle=handle)
    backend.apply([Operation(Verb.REPLACE, new)])
    listed = rules(ns, "c1")
    assert [r["expr"][0]["match"]["right"] for r in listed] == [2, 3]
    assert listed[1]["handle"] == handle
    backend.apply([Operation(Verb.DELETE, Rule(chain="c1", exprs=(), handle=listed[0]["handle"]))])
    assert [r["handle"] for r in rules(ns, "c1")] == [handle]
    gone = Rule(chain="c1", exprs=(), handle=listed[0]["handle"])
    with pytest.raises(KernelError, match=r"rule in chain c1 handle \d+: No such file"):
        backend.apply([Operation(Verb.DELETE, gone)])
    backend.apply([Operation(Verb.DESTROY, gone)])  # absent: fine


def test_flush_and_delete(ns: str, backend: NftBackend) -> None:
    s = Set(name="s", key=(DataType.INET_SERVICE,))
    backend.apply(add(s, Element(set="s", key=(80,)), Element(set="s", key=(443,))))
    backend.apply(add(Rule(chain="c1", exprs=(Lookup((Field.TH_DPORT,), "s"), ACCEPT))))
    backend.apply(add(Rule(chain="c2", exprs=(Counter(),))))
    backend.apply([Operation(Verb.FLUSH, s)])
    assert elements(ns, "set", "s") == []
    backend.apply([Operation(Verb.FLUSH, Chain(name="c1"))])
    assert rules(ns, "c1") == []
    assert len(rules(ns, "c2")) == 1
    backend.apply([Operation(Verb.FLUSH, T)])
    assert rules(ns, "c2") == []
    backend.apply([Operation(Verb.DELETE, s), Operation(Verb.DELETE, Chain(name="c2"))])
    text = ruleset_text(ns)
    assert "set s " not in text
    assert "chain c2" not in text


def test_destroy_absent_objects_and_create_existing(ns: str, backend: NftBackend) -> None:
    backend.apply([
        Operation(Verb.DESTROY, Chain(name="nothere")),
        Operation(Verb.DESTROY, Set(name="nothere", key=(DataType.MARK,))),
        Operation(Verb.DESTROY, Element(set="service-ips", key=(V4("1.2.3.4"), 6, 1))),
    ])  # fmt: skip
    with pytest.raises(KernelError, match=r"^map service-ips: File exists$"):
        backend.apply([Operation(Verb.CREATE, SVC)])
    el = Element(set="service-ips", key=(V4("1.2.3.4"), 17, 53), value=jump("c1"))
    backend.apply(add(el))
    backend.apply(add(el))  # add: idempotent
    with pytest.raises(KernelError, match=r"^element 1.2.3.4 . udp . 53 in map service-ips: File"):
        backend.apply([Operation(Verb.CREATE, el)])


def test_delete_table(ns: str, backend: NftBackend) -> None:
    assert backend.table_exists()
    assert backend.delete_table()
    assert not backend.table_exists()
    assert not backend.delete_table()
    assert ruleset_text(ns) == ""
    backend.apply([Operation(Verb.DESTROY, T)])  # absent: fine
    with pytest.raises(KernelError, match=r"^table ip nlp: No such file or directory$"):
        backend.apply([Operation(Verb.DELETE, T)])
    backend.apply([Operation(Verb.CREATE, T), Operation(Verb.ADD, Chain(name="again"))])
    backend.apply([Operation(Verb.DESTROY, T)])
    assert ruleset_text(ns) == ""


def test_base_chain_and_comments(ns: str, backend: NftBackend) -> None:
    base = Chain(name="out", type=ChainType.FILTER, hook=Hook.OUTPUT, priority=-5, comment="hi")
    backend.apply(add(base))
    listed = [i["chain"] for i in nft_json(ns, "chain", "ip", T.name, "out") if "chain" in i]
    assert listed[0]["hook"] == "output"
    assert listed[0]["prio"] == -5
    assert 'comment "hi"' in sh("nft", "list", "chain", "ip", T.name, "out", ns=ns)


def test_backend_reads_declarations_from_the_kernel(ns: str, backend: NftBackend) -> None:
    with NftBackend(T, netns=ns) as other:  # a fresh backend knows nothing yet
        view = other.known()
        assert set(view.chains) == {"c1", "c2"}
        assert view.sets["backends"] == BACKENDS
        other.apply(add(Element(set="service-ips", key=(V4("9.9.9.9"), 6, 9), value=jump("c2"))))
    assert elements(ns, "map", "service-ips") == [
        [{"concat": ["9.9.9.9", "tcp", 9]}, {"jump": {"target": "c2"}}]
    ]


# -- values of every type ---------------------------------------------------------------------


def test_element_values_of_every_type(ns: str, backend: NftBackend) -> None:
    sets = [
        Set(name="addrs", key=(DataType.IPV4_ADDR,)),
        Set(name="ranges", key=(DataType.IPV4_ADDR,), flags=SetFlag.INTERVAL),
        Set(name="ports", key=(DataType.INET_SERVICE,), flags=SetFlag.TIMEOUT),
        Set(name="protos", key=(DataType.INET_PROTO,)),
        Set(name="marks", key=(DataType.MARK,)),
        Set(
            name="src-ranges",
            key=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
            flags=SetFlag.INTERVAL,
        ),
        Map(name="port-map", key=(DataType.INET_SERVICE,), data=(DataType.MARK,)),
        Map(name="fw", key=(DataType.IPV4_ADDR,), data=(DataType.VERDICT,), flags=SetFlag.INTERVAL),
    ]
    backend.apply(add(
        *sets,
        Element(set="addrs", key=(V4("192.0.2.1"),), comment="one"),
        Element(set="ranges", key=(IPv4Network("10.0.0.0/8"),)),
        Element(set="ranges", key=(V4("192.0.2.7"),)),
        Element(set="ranges", key=(IPv4Network("255.255.255.0/24"),)),
        Element(set="ports", key=(65535,), timeout=90),
        Element(set="protos", key=(L4Proto.SCTP,)),
        Element(set="marks", key=(0x4000,)),
        Element(set="src-ranges", key=(IPv4Network("172.16.0.0/12"), 443)),
        Element(set="port-map", key=(53,), value=(0xDEADBEEF,)),
        Element(set="fw", key=(IPv4Network("203.0.113.0/24"),), value=DROP),
        Element(set="fw", key=(V4("198.51.100.1"),), value=jump("c1")),
    ))  # fmt: skip
    assert elements(ns, "set", "addrs") == [{"elem": {"val": "192.0.2.1", "comment": "one"}}]
    assert elements(ns, "set", "ranges") == [
        {"prefix": {"addr": "10.0.0.0", "len": 8}},
        "192.0.2.7",
        {"prefix": {"addr": "255.255.255.0", "len": 24}},
    ]
    [port] = elements(ns, "set", "ports")
    assert port["elem"]["val"] == 65535
    assert port["elem"]["timeout"] == 90
    assert elements(ns, "set", "protos") == ["sctp"]
    assert elements(ns, "set", "marks") == [16384]
    assert elements(ns, "set", "src-ranges") == [
        {"concat": [{"prefix": {"addr": "172.16.0.0", "len": 12}}, 443]}
    ]
    assert elements(ns, "map", "port-map") == [[53, 0xDEADBEEF]]
    assert elements(ns, "map", "fw") == [
        ["198.51.100.1", {"jump": {"target": "c1"}}],
        [{"prefix": {"addr": "203.0.113.0", "len": 24}}, {"drop": None}],
    ]


def test_ipv6_table(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("nftx6")
    t6 = Table(family=Family.IP6, name="nlp")
    m = Map(name="m", key=(DataType.IPV6_ADDR, DataType.INET_SERVICE),
            data=(DataType.IPV6_ADDR, DataType.INET_SERVICE))  # fmt: skip
    nets = Set(name="nets", key=(DataType.IPV6_ADDR,), flags=SetFlag.INTERVAL)
    with NftBackend(t6, netns=ns) as b:
        b.apply(add(t6, m, nets,
                    Element(set="m", key=(IPv6Address("fd00::1"), 80),
                            value=(IPv6Address("fd00:244::1"), 8080)),
                    Element(set="nets", key=(IPv6Network("2001:db8::/32"),))))  # fmt: skip
    doc = nft_json(ns, "map", "ip6", "nlp", "m")
    assert [i["map"]["elem"] for i in doc if "map" in i] == [
        [[{"concat": ["fd00::1", 80]}, {"concat": ["fd00:244::1", 8080]}]]
    ]
    doc = nft_json(ns, "set", "ip6", "nlp", "nets")
    assert [i["set"]["elem"] for i in doc if "set" in i] == [
        [{"prefix": {"addr": "2001:db8::", "len": 32}}]
    ]


# -- validation before sending ----------------------------------------------------------------

BAD = [
    # error lines cut a long name: its start, "...", and its length
    pytest.param(add(Chain(name="x" * 256)),
                 r"chain x+\.\.\.\(256 characters\): chain name is 256 bytes, "
                 r"over the kernel's 255", id="long-chain-name"),
    pytest.param(add(Set(name="s" * 300, key=(DataType.MARK,))),
                 r"set s+\.\.\.\(300 characters\): set name is 300", id="long-set-name"),
    pytest.param(add(Rule(chain="c1", exprs=(Counter(),), comment="c" * 300)),
                 r"rule in chain c1 \(c+\.\.\.\(302 characters\): comment is 300 bytes",
                 id="long-comment"),
    pytest.param(add(Element(set="service-ips", key=(V4("10.0.0.1"), 6, 80), value=jump("c1"),
                             comment="e" * 253)),
                 r"element .* comment is 253 bytes", id="long-element-comment"),
    pytest.param(add(Element(set="service-ips", key=(V4("10.0.0.1"), 6), value=jump("c1"))),
                 r"^element 10.0.0.1 . tcp in map service-ips: key: key has 2 parts", id="count"),
    pytest.param(add(Element(set="service-ips", key=(V4("10.0.0.1"), 6, 70000),
                             value=jump("c1"))),
                 r"key\[2\]: 70000 is not in 0..65535", id="port-range"),
    pytest.param(add(Element(set="service-ips", key=(IPv6Address("::1"), 6, 80),
                             value=jump("c1"))),
                 r"key\[0\]: .* is not an IPv4 address", id="wrong-family"),
    pytest.param(add(Element(set="service-ips", key=(IPv4Network("10.0.0.0/8"), 6, 80),
                             value=jump("c1"))),
                 r"key\[0\]: 10.0.0.0/8 is a network", id="network-in-plain-set"),
    pytest.param(add(Element(set="backends", key=(V4("10.0.0.1"), 6, 80, 0),
                             value=(V4("10.0.0.2"),))),
                 r"value: map backends wants 2 data parts", id="data-count"),
    pytest.param(add(Element(set="service-ips", key=(V4("10.0.0.1"), 6, 80),
                             value=(V4("10.0.0.2"),))),
                 r"value: map service-ips wants a verdict", id="vmap-value"),
    pytest.param(add(Element(set="service-ips", key=(V4("10.0.0.1"), 6, 80),
                             value=jump("nowhere"))),
                 r"jump to chain nowhere, which neither", id="element-jump-unknown"),
    pytest.param(add(Rule(chain="c1", exprs=(goto("nowhere"),))),
                 r"rule in chain c1: exprs\[0\]: goto to chain nowhere", id="rule-goto-unknown"),
    pytest.param(add(Rule(chain="c9", exprs=(Counter(),))), r"chain c9 is neither",
                 id="rule-in-unknown-chain"),
    pytest.param(add(Rule(chain="c1", exprs=(Lookup((Field.IP_DADDR,), "nope"),))),
                 r"exprs\[0\]: set nope is neither", id="lookup-unknown-set"),
    pytest.param(add(Element(set="nope", key=(1,))), r"set nope is neither",
                 id="element-unknown-set"),
    pytest.param([Operation(Verb.REPLACE, Rule(chain="c1", exprs=(Counter(),)))],
                 r"replace needs the rule's handle", id="replace-without-handle"),
    pytest.param([Operation(Verb.INSERT, Chain(name="c1"))], r"cannot insert",
                 id="verb-for-kind"),
    pytest.param(add(Rule(chain="c1", exprs=(Cmp(Field.IP6_DADDR, IPv6Address("::1")),))),
                 r"ip6 daddr in an ip table", id="ip6-in-ip"),
]  # fmt: skip


@pytest.mark.parametrize(("ops", "message"), BAD)
def test_invalid_before_sending(
    ns: str, backend: NftBackend, ops: list[Operation], message: str
) -> None:
    before = ruleset_text(ns)
    # a valid op first: if anything were sent, the new chain would show
    with pytest.raises(InvalidNftObject, match=message):
        backend.apply([*add(Chain(name="sentinel")), *ops])
    assert ruleset_text(ns) == before


def test_interleaved_elements_share_messages_and_keep_order(ns: str, backend: NftBackend) -> None:
    old = Element(set="service-ips", key=(V4("10.0.0.1"), 6, 80), value=jump("c1"))
    backend.apply(add(old))
    ops = [Operation(Verb.DELETE, old)]
    for i in range(200):
        vip = V4(0x0A600000 + i)
        ops += add(
            Element(set="service-ips", key=(vip, 6, 80), value=goto("c2")),
            Element(set="backends", key=(vip, 6, 80, 0), value=(V4("10.244.0.1"), 80)),
        )
    ops += add(Element(set="service-ips", key=(V4("10.0.0.1"), 6, 80), value=jump("c2")))
    result = backend.apply(ops)
    assert result.messages == 3  # delete run, then one add run per set
    listed = elements(ns, "map", "service-ips")
    assert [{"concat": ["10.0.0.1", "tcp", 80]}, {"jump": {"target": "c2"}}] in listed
    assert len(listed) == 201


def test_150k_messages_with_100k_errors(ns: str, backend: NftBackend) -> None:
    """Every failing message gets an answer; the first names the object, nothing applies and
    the socket is clean for the next batch."""
    ops = [Operation(Verb.ADD, Rule(chain="c2", exprs=(Counter(),))) for _ in range(50_000)]
    ops += [
        Operation(Verb.DELETE, Rule(chain="c1", exprs=(), handle=1_000_000 + i))
        for i in range(100_000)
    ]
    with pytest.raises(KernelError) as info:
        backend.apply(ops)
    assert str(info.value) == "rule in chain c1 handle 1000000: No such file or directory"
    assert info.value.index == 50_000
    assert rules(ns, "c2") == []
    assert backend.apply(add(Rule(chain="c2", exprs=(Counter(),)))).messages == 1
    assert len(rules(ns, "c2")) == 1


def test_answers_overflowing_the_receive_buffer(ns: str, backend: NftBackend) -> None:
    """With a tiny receive buffer most error answers are dropped (ENOBUFS): the first one still
    names the object, and the next batch is not confused by what was lost."""
    backend.sock.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    ops = [
        Operation(Verb.DELETE, Rule(chain="c1", exprs=(), handle=2_000_000 + i))
        for i in range(5000)
    ]
    with pytest.raises(KernelError) as info:
        backend.apply(ops)
    assert str(info.value) == "rule in chain c1 handle 2000000: No such file or directory"
    assert backend.apply(add(Rule(chain="c2", exprs=(Counter(),)))).messages == 1
    assert len(rules(ns, "c2")) == 1
