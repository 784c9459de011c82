"""``nlproxy compare``'s pure parts: kube-proxy's undecoded rules made traceable, and the
comparison of two rulesets in words (the kernel half is ``tests/kernel/test_compare.py``)."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

import pytest

from nlproxy.cluster.model import ClusterSnapshot, Endpoint, Protocol
from nlproxy.inspect.kubeproxy import Anonymous, KubeProxyRulesetError, traceable
from nlproxy.nft.decode import UndecodedRule
from nlproxy.nft.ir import (
    Chain,
    ChainType,
    DataType,
    Element,
    Family,
    Hook,
    Ruleset,
    SetFlag,
    Table,
)
from nlproxy.nft.readsets import RawSet
from nlproxy.operate.compare import certify, render_text
from nlproxy.proxy.planner import plan
from nlproxy.proxy.tracer import TraceResult, trace
from tests.unit.builders import endpoint, eps_slice, node, service, snapshot
from tests.world import config

DNAT = (
    "[ meta load l4proto => reg 1 ]",
    "[ cmp eq reg 1 0x00000006 ]",
    "[ numgen reg 1 = random mod 2 ]",
    "[ lookup reg 1 set __map0 dreg 1 0x0 ]",
    "[ nat dnat ip addr_min reg 1 addr_max reg 1 proto_min reg 9 proto_max reg 9 flags 0x3 ]",
)
FIREWALL = (
    "[ payload load 4b @ network header + 12 => reg 1 ]",
    "[ lookup reg 1 set __set0 0x1 ]",
    "[ immediate reg 0 drop ]",
)


def _kube_proxy(*rules: tuple[str, tuple[str, ...]]) -> Ruleset:
    rs = Ruleset(table=Table(family=Family.IP, name="kube-proxy"))
    rs.add_chain(
        Chain(name="nat-prerouting", type=ChainType.NAT, hook=Hook.PREROUTING, priority=-100)
    )
    for chain, raw in rules:
        if chain not in rs.chains:
            rs.add_chain(Chain(name=chain))
        rs.add_rule(UndecodedRule(chain=chain, exprs=(), raw=raw, reason="anonymous"))
    return rs


def _raw(name: str, flag: SetFlag, key: DataType, data: tuple[DataType, ...] = ()) -> RawSet:
    """An anonymous constant set (or map, with ``data``) of 4-byte keys, as nft makes one."""
    flags = SetFlag.ANONYMOUS | SetFlag.CONSTANT | flag
    return RawSet(name=name, flags=flags, key=(key,), key_len=4, data=data, timeout_ms=0,
                  comment="", anonymous=True)  # fmt: skip


def _anonymous() -> dict[str, Anonymous]:
    backends = _raw(
        "__map0", SetFlag.MAP, DataType.INTEGER, (DataType.IPV4_ADDR, DataType.INET_SERVICE)
    )
    allowed = _raw("__set0", SetFlag.INTERVAL, DataType.IPV4_ADDR)
    pairs = [(0, "10.244.1.5", 8080), (1, "10.244.2.7", 8080)]
    return {
        "__map0": Anonymous(
            backends,
            tuple(Element(set="__map0", key=(i,), value=(ip_address(a), p)) for i, a, p in pairs),
        ),
        "__set0": Anonymous(allowed, (Element(set="__set0", key=(ip_network("203.0.113.0/24"),)),)),
    }


def _trace(rs: Ruleset, src: str, dst: str, local: tuple[str, ...] = ()) -> TraceResult:
    """A new TCP connection from ``src`` to ``dst``:80 through ``rs`` made traceable."""
    addrs = [ip_address(a) for a in local]
    return trace(traceable(rs, _anonymous()), ip_address(src), Protocol.TCP, ip_address(dst), 80,
                 local_addrs=addrs)  # fmt: skip


def test_an_anonymous_dnat_map_becomes_a_traceable_named_one() -> None:
    rs = _kube_proxy(("nat-prerouting", DNAT))
    traced = _trace(rs, "10.244.1.9", "10.96.10.10", local=("172.18.0.2",))
    assert traced.endpoints == {"10.244.1.5:8080", "10.244.2.7:8080"}
    assert "__map0" in rs.sets


@pytest.mark.parametrize(
    ("src", "verdict"),
    [
        pytest.param("203.0.113.9", "ACCEPT", id="inside-the-ranges"),
        pytest.param("192.0.2.9", "DROP", id="outside-the-ranges"),
    ],
)
def test_a_firewall_rule_drops_sources_outside_its_anonymous_set(src: str, verdict: str) -> None:
    rs = _kube_proxy(("nat-prerouting", FIREWALL))
    traced = _trace(rs, src, "172.18.255.200")
    assert traced.verdict == verdict


def test_a_rule_of_another_shape_is_named_not_guessed() -> None:
    rs = _kube_proxy(("odd-chain", ("[ counter pkts 0 bytes 0 ]", "[ lookup reg 1 set __set0 ]")))
    with pytest.raises(KubeProxyRulesetError, match="chain ip kube-proxy odd-chain"):
        traceable(rs, _anonymous())


def test_differences_are_told_in_words_with_what_the_slices_say() -> None:
    def web(*endpoints: Endpoint) -> ClusterSnapshot:
        svc = service("default", "web", "172.30.0.10")
        return snapshot([svc], [eps_slice("default", "web", endpoints)], node=node())

    kube = plan(web(endpoint("10.0.0.1"), endpoint("10.0.0.2")), config()).rulesets
    now = web(endpoint("10.0.0.1"), endpoint("10.0.0.2", ready=False, serving=False))
    ours = plan(now, config()).rulesets
    cert = certify(kube, ours, now, config())
    assert cert.differences
    assert not cert.designed
    text = render_text(cert)
    assert (
        "differs: default/web:p80/TCP from a client outside the cluster (192.0.2.77) to "
        "ClusterIP 172.30.0.10:80: kube-proxy sends to 2 endpoints (10.0.0.1:80, 10.0.0.2:80), "
        "nlproxy sends to 1 endpoint (10.0.0.1:80) (10.0.0.2 is not ready, on node other-node)"
    ) in text
    assert text.splitlines()[-1].endswith(f": {len(cert.differences)} differ")
    # The same plan on both sides: nothing differs.
    same = certify(ours, ours, now, config())
    assert not same.differences
    assert same.summary().endswith(": equivalent")
