"""kube-proxy's nftables ruleset on this node (``ip kube-proxy``, ``ip6 kube-proxy``), read back
over netlink as a ruleset the packet tracer (``proxy/tracer.py``) walks.

Sits beside ``foreign.py`` (which names other proxies' tables): this one reads kube-proxy's table
whole, for ``nlproxy compare``. The read-back (``nft/readback.py``) decodes every rule of
kube-proxy's nftables mode but two shapes, whose anonymous sets the IR does not hold:

- a Service's DNAT through an anonymous map, ``meta l4proto tcp dnat ip to numgen random mod N
  map { 0 : addr . port, … }``;
- a firewall chain's ``ip saddr != { range, … } drop`` (``loadBalancerSourceRanges``).

Here those rules are read from their expressions and the anonymous sets' elements are dumped
(in the same generation as the rules), then given names in the returned ruleset: the DNAT
becomes ``dnat to numgen … map @__mapN`` and the lookup ``ip saddr != @__setN``, which the
tracer already walks. Any other rule it cannot read is an error naming the chain: a certificate
must not guess. Read only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nlproxy.errors import NlproxyError
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.decode import UndecodedRule
from nlproxy.nft.dump import dump
from nlproxy.nft.ir import (
    Cmp,
    DnatMap,
    Element,
    Expr,
    Family,
    Field,
    Lookup,
    Numgen,
    Rule,
    Ruleset,
    SetLike,
    Verdict,
    VerdictKind,
)
from nlproxy.nft.readback import at_one_generation, read_table_once
from nlproxy.nft.readsets import RawSet, parse_set, read_elements
from nlproxy.nft.uapi import NFT_MSG_GETSET

TABLE = "kube-proxy"

_DNAT = re.compile(
    r"\[ meta load l4proto => reg 1 \] \[ cmp eq reg 1 0x(?P<proto>[0-9a-f]{8}) \] "
    r"\[ numgen reg 1 = random mod (?P<mod>\d+) \] "
    r"\[ lookup reg 1 set (?P<map>__map\d+) dreg 1 0x0 \] "
    r"\[ nat dnat ip6? addr_min reg 1 addr_max reg 1 "
    r"proto_min reg (?P<preg>\d+) proto_max reg (?P=preg) flags 0x[0-9a-f]+ \]"
)
_SADDR = {Family.IP: ("4b", "12", Field.IP_SADDR), Family.IP6: ("16b", "8", Field.IP6_SADDR)}
_FIREWALL = re.compile(
    r"\[ payload load (?P<len>\d+b) @ network header \+ (?P<off>\d+) => reg 1 \] "
    r"\[ lookup reg 1 set (?P<set>__set\d+) 0x(?P<flags>[01]) \] "
    r"\[ immediate reg 0 (?P<verdict>drop|accept) \]"
)


class KubeProxyRulesetError(NlproxyError):
    """kube-proxy's ruleset holds a rule this reader cannot interpret."""


@dataclass(frozen=True, slots=True)
class Anonymous:
    """An anonymous set of the table: its declaration and elements."""

    raw: RawSet
    elements: tuple[Element, ...]


def read_kube_proxy(family: Family, netns: str | None = None) -> Ruleset | None:
    """``family``'s kube-proxy table, every rule traceable (None: there is no such table).

    Raises:
        KubeProxyRulesetError: a rule this reader cannot interpret, named by its chain.
        ReadbackError: the ruleset kept changing while it was read.
        ConfigError: the namespace cannot be entered.
    """

    def read() -> tuple[Ruleset | None, dict[str, Anonymous]]:
        rs = read_table_once(s, family, TABLE)
        return rs, _anonymous(s, family) if rs is not None else {}

    with NetfilterSocket(netns) as s:
        rs, anonymous = at_one_generation(s, f"table {family} {TABLE}", read)
    return None if rs is None else traceable(rs, anonymous)


def _anonymous(s: NetfilterSocket, family: Family) -> dict[str, Anonymous]:
    out: dict[str, Anonymous] = {}
    for raw in list(dump(s, NFT_MSG_GETSET, family, TABLE, parse_set)):
        if raw.anonymous:
            out[raw.name] = Anonymous(raw, tuple(read_elements(s, family, TABLE, raw)))
    return out


def traceable(rs: Ruleset, anonymous: dict[str, Anonymous]) -> Ruleset:
    """``rs`` with its undecoded rules read from their expressions and the anonymous sets they
    use added as named ones (``rs`` is changed and returned).

    Raises:
        KubeProxyRulesetError: a rule of another shape.
    """
    family = rs.table.family
    for chain, rules in rs.rules.items():
        for i, rule in enumerate(rules):
            if not isinstance(rule, UndecodedRule):
                continue
            exprs, used = _read(rule, family)
            if used not in anonymous:
                raise KubeProxyRulesetError(
                    f"chain {family} {TABLE} {chain}", f"set {used} was not found"
                )
            _add(rs, anonymous[used])
            rules[i] = Rule(chain=chain, exprs=exprs, comment=rule.comment, handle=rule.handle)
    return rs


def _read(rule: UndecodedRule, family: Family) -> tuple[tuple[Expr, ...], str]:
    text = " ".join(rule.raw)
    if m := _DNAT.fullmatch(text):
        proto = int(m["proto"], 16)  # one byte, printed as a host-order word
        dnat = DnatMap(key=(Numgen(int(m["mod"])),), map=m["map"])
        return (Cmp(Field.META_L4PROTO, proto), dnat), m["map"]
    if (m := _FIREWALL.fullmatch(text)) and (m["len"], m["off"]) == _SADDR[family][:2]:
        verdict = VerdictKind.DROP if m["verdict"] == "drop" else VerdictKind.ACCEPT
        lookup = Lookup(key=(_SADDR[family][2],), set=m["set"], negate=m["flags"] == "1")
        return (lookup, Verdict(verdict)), m["set"]
    raise KubeProxyRulesetError(
        f"chain {family} {TABLE} {rule.chain}", f"cannot read rule {text!r} ({rule.reason})"
    )


def _add(rs: Ruleset, anon: Anonymous) -> None:
    if anon.raw.name in rs.sets:
        return
    s: SetLike = anon.raw.ir
    rs.add_set(s)
    for el in anon.elements:
        rs.add_element(el)
