"""kube-proxy's iptables mode on this node (through iptables-nft), read back over netlink as one
ruleset the packet tracer (``proxy/tracer.py``) walks, for ``nlproxy compare``.

iptables-nft keeps iptables' tables as nftables tables of the same names (``ip nat``, ``ip
filter``, ``ip mangle``, and ``ip6 …``), their built-in chains as base chains at iptables'
priorities. kube-proxy's part of them is its ``KUBE-*`` chains and the rules of the built-in
chains that jump to one; everything else there (a CNI's or Docker's rules) is left out, as the
nftables-mode reader (``kubeproxy.py``) reads only kube-proxy's own table. The tables are merged
into one :class:`Ruleset` whose chains are named ``table/chain`` (``nat/KUBE-SERVICES``,
``filter/KUBE-SERVICES``); the tracer runs the base chains of each hook in priority order, nat
before filter where iptables runs them so. Rules are read by ``xt.py``; one it cannot read is an
error naming its chain. Read only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.decode import RawExpr
from nlproxy.nft.dump import (
    dump,
    get_str,
    iterate,
    nftnl,
    parsed,
)
from nlproxy.nft.ir import Chain, Family, Rule, Ruleset, Table
from nlproxy.nft.readback import at_one_generation, raw_expr, read_table_once
from nlproxy.nft.uapi import NFT_MSG_GETRULE

from .kubeproxy import KubeProxyRulesetError
from .xt import XtError, translate

TABLES = ("mangle", "nat", "filter")
"""The iptables tables kube-proxy writes to (mangle holds only its canary chain)."""
MARKER = ("nat", "KUBE-SERVICES")
"""The chain that says kube-proxy runs in iptables mode here (the kubelet's own KUBE-* chains,
present in every mode on older nodes, are not it)."""
IPVS_CHAINS = frozenset({"KUBE-LOAD-BALANCER", "KUBE-IPVS-FILTER", "KUBE-NODE-PORT"})
"""Chains only kube-proxy's IPVS mode makes (it shares ``KUBE-SERVICES`` with iptables mode)."""
NAME = "iptables-nft"
"""The merged ruleset's table name (``Ruleset.table``): what ``compare`` reports as the mode."""


@dataclass(frozen=True, slots=True)
class RawRule:
    """A rule of an iptables-nft table, its expressions as libnftnl parsed them."""

    chain: str
    handle: int
    exprs: tuple[RawExpr, ...]


@dataclass(frozen=True, slots=True)
class RawTable:
    """One iptables-nft table: its chains and rules, in the kernel's order."""

    name: str
    chains: tuple[Chain, ...]
    rules: tuple[RawRule, ...]


def read_kube_proxy_iptables(family: Family, netns: str | None = None) -> Ruleset | None:
    """kube-proxy's iptables-mode rules of ``family`` as one traceable ruleset (None: kube-proxy
    does not run in iptables mode here, or not for this family).

    Raises:
        KubeProxyRulesetError: a rule of kube-proxy's this reader cannot interpret.
        ReadbackError: the ruleset kept changing while it was read.
        ConfigError: the namespace cannot be entered.
    """
    with NetfilterSocket(netns) as s:
        tables = at_one_generation(
            s,
            f"iptables-nft tables of {family}",
            lambda: [t for name in TABLES if (t := _read_table(s, family, name))],
        )
    return merge(family, tables)


def _read_table(s: NetfilterSocket, family: Family, name: str) -> RawTable | None:
    rs = read_table_once(s, family, name)  # its chains; the rules are read raw below
    if rs is None:
        return None
    rules = tuple(dump(s, NFT_MSG_GETRULE, family, name, _raw_rule))
    return RawTable(name=name, chains=tuple(rs.chains.values()), rules=rules)


def _raw_rule(nlh: Any, family: Family) -> tuple[str, RawRule]:
    ffi, lib = nftnl()
    with parsed("rule", nlh) as r:
        table = get_str(lib.nftnl_rule_get_str, r, lib.NFTNL_RULE_TABLE)
        chain = get_str(lib.nftnl_rule_get_str, r, lib.NFTNL_RULE_CHAIN)
        handle = int(lib.nftnl_rule_get_u64(r, lib.NFTNL_RULE_HANDLE))
        iterator = (
            lib.nftnl_expr_iter_create,
            lib.nftnl_expr_iter_next,
            lib.nftnl_expr_iter_destroy,
        )
        n = ffi.new("uint32_t *")
        exprs = tuple(raw_expr(e, n) for e in iterate(*iterator, r))
        return table, RawRule(chain=chain, handle=handle, exprs=exprs)


def is_kube_proxy(chain: str) -> bool:
    return chain.startswith("KUBE-")


def merge(family: Family, tables: Sequence[RawTable]) -> Ruleset | None:
    """kube-proxy's chains and rules of ``tables`` as one ruleset (None without its marker).

    Raises:
        KubeProxyRulesetError: a rule of kube-proxy's that cannot be interpreted.
    """
    if not any((t.name, c.name) == MARKER for t in tables for c in t.chains):
        return None
    ipvs = [f"{t.name}/{c.name}" for t in tables for c in t.chains if c.name in IPVS_CHAINS]
    if ipvs:
        raise KubeProxyRulesetError(
            f"iptables-nft tables of {family}",
            f"kube-proxy runs in IPVS mode ({', '.join(ipvs)}): its Services are IPVS virtual "
            "servers, not rules, and compare reads its nftables and iptables modes only",
        )
    rs = Ruleset(table=Table(family=family, name=NAME))
    for t in tables:
        kept = {c.name for c in t.chains if c.hook is not None or is_kube_proxy(c.name)}
        for c in t.chains:
            if c.name in kept:
                rs.add_chain(Chain(name=f"{t.name}/{c.name}", type=c.type, hook=c.hook,
                                   priority=c.priority, policy=c.policy))  # fmt: skip
        for r in t.rules:
            if r.chain not in kept or not (is_kube_proxy(r.chain) or _jumps_to_kube(r)):
                continue  # a built-in chain's rule of someone else's
            _add(rs, t.name, r, family)
    return rs


def _jumps_to_kube(r: RawRule) -> bool:
    return any(
        e.name == "immediate" and is_kube_proxy(str(e.attrs.get("chain", ""))) for e in r.exprs
    )


def _add(rs: Ruleset, table: str, r: RawRule, family: Family) -> None:
    where = f"chain {family} {table} {r.chain}"
    try:
        done = translate(r.exprs, family, lambda chain: f"{table}/{chain}")
    except XtError as exc:
        raise KubeProxyRulesetError(where, f"rule {r.handle}: {exc}") from exc
    if done is None:
        return  # never matches a new connection
    for s in done.sets:
        if s.name not in rs.sets:
            rs.add_set(s)
    rs.add_rule(Rule(chain=f"{table}/{r.chain}", exprs=done.exprs, handle=r.handle))
