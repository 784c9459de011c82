"""Another service proxy's rules in the node's nftables: found, named, and removed on request.

Beside the pipeline: the daemon asks at start-up and then now and again, ``inspect`` and
``explain`` report what it finds, and ``nlproxy cleanup --kube-proxy`` removes it. kube-proxy
leaves its rules behind when it is replaced without ``--cleanup``, and a leftover DNAT of the
same ClusterIP in another table wins over nlproxy's for new connections.

Found over nfnetlink (no ``nft`` or ``iptables`` is run):

* kube-proxy's nftables mode: the tables ``ip kube-proxy`` and ``ip6 kube-proxy``;
* kube-proxy's iptables and IPVS modes on the iptables-nft backend: their chains
  (``KUBE-SERVICES``, ``KUBE-NODEPORTS``, ``KUBE-SVC-…``, ``KUBE-IPVS-FILTER``, …) in the
  ``nat``, ``filter`` and ``mangle`` tables, by exact name;
* IPVS mode's ipsets, ``kube-ipvs0`` device and virtual servers (``ipvs.py``; :func:`find`
  gathers every mode).

iptables-legacy rules live outside nftables and are not seen here. Chains the kubelet owns
(``KUBE-FIREWALL``, ``KUBE-KUBELET-CANARY``, ``KUBE-IPTABLES-HINT``) are neither reported nor
touched.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from nlproxy.errors import NlproxyError
from nlproxy.inspect import ipvs
from nlproxy.netlink.codec import (
    NFNL_MSG_BATCH_BEGIN,
    NFNL_MSG_BATCH_END,
    NLA_TYPE_MASK,
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    attribute_map,
    attributes,
    be64,
    be64_attr,
    nfnl_attributes,
    nfnl_message,
    nfnl_type,
    str_attr,
    text,
)
from nlproxy.netlink.codec import (
    NLATTR as _NLATTR,
)
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.uapi import (
    NFNL_SUBSYS_NFTABLES,
    NFT_MSG_DELCHAIN,
    NFT_MSG_DELRULE,
    NFT_MSG_DELTABLE,
    NFT_MSG_GETCHAIN,
    NFT_MSG_GETRULE,
    NFT_MSG_GETTABLE,
    NFT_MSG_NEWCHAIN,
    NFT_MSG_NEWRULE,
    NFT_MSG_NEWTABLE,
    NFTA_CHAIN_NAME,
    NFTA_CHAIN_TABLE,
    NFTA_DATA_VERDICT,
    NFTA_EXPR_DATA,
    NFTA_EXPR_NAME,
    NFTA_IMMEDIATE_DATA,
    NFTA_LIST_ELEM,
    NFTA_RULE_CHAIN,
    NFTA_RULE_EXPRESSIONS,
    NFTA_RULE_HANDLE,
    NFTA_RULE_TABLE,
    NFTA_TABLE_NAME,
    NFTA_VERDICT_CHAIN,
)

NFTABLES_TABLE = "kube-proxy"
IPTABLES_TABLES = ("nat", "filter", "mangle")
FAMILIES = {2: "ip", 10: "ip6"}
"""NFPROTO numbers of the families kube-proxy writes, and nft's names for them."""
ALL_FAMILIES = {1: "inet", 3: "arp", 5: "netdev", 7: "bridge", **FAMILIES}
"""Every nftables family by NFPROTO number, as nft names it (other CNIs write ``inet``)."""
RULESET_TABLES = (*IPTABLES_TABLES, "raw")
"""The iptables-nft tables whose chains :func:`names` lists (Cilium's raw chains too)."""
_NFPROTO = {name: number for number, name in FAMILIES.items()}


_KUBE_PROXY_CHAINS = frozenset(
    {
        # iptables mode
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-FORWARD",
        "KUBE-PROXY-FIREWALL",
        "KUBE-PROXY-CANARY",
        # IPVS mode (its KUBE-SERVICES, KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-FORWARD and
        # KUBE-PROXY-FIREWALL are the names above)
        "KUBE-NODE-PORT",
        "KUBE-LOAD-BALANCER",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "KUBE-IPVS-FILTER",
        "KUBE-IPVS-OUT-FILTER",
    }
)
_KUBE_PROXY_HASHED = re.compile(r"KUBE-(?:SVC|SEP|FW|XLB|EXT|SVL)-[A-Z2-7]{16}\Z")
"""A per-service or per-endpoint chain: a role and the first 16 characters of a base32
(RFC 4648: ``A-Z2-7``) SHA-256, exactly as kube-proxy's iptables mode names them. A prefix alone
would take a user's ``KUBE-FW-USER``."""


def is_kube_proxy_chain(name: str) -> bool:
    """One of the chains kube-proxy's iptables or IPVS mode makes (not the kubelet's, and not
    a user's chain that merely starts like one)."""
    return name in _KUBE_PROXY_CHAINS or _KUBE_PROXY_HASHED.match(name) is not None


class ForeignProxyError(NlproxyError):
    """The kernel refused to remove another proxy's rules."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ForeignTable:
    """Another proxy's rules in one table."""

    family: str
    """``ip`` or ``ip6``."""
    table: str
    mode: str
    """``nftables`` (a table of kube-proxy's own) or ``iptables-nft`` (chains in a shared table)."""
    chains: tuple[str, ...]
    """kube-proxy's chains in the table (iptables-nft); empty for a table of its own."""

    def __str__(self) -> str:
        return f"{self.family} {self.table}"

    @property
    def describe(self) -> str:
        if self.mode == "nftables":
            return f"table {self} (kube-proxy, nftables mode)"
        return f"{len(self.chains)} KUBE-* chains in table {self} (kube-proxy, iptables-nft)"


_WATCHED = frozenset(
    nfnl_type(NFNL_SUBSYS_NFTABLES, m)
    for m in (
        NFT_MSG_NEWTABLE,
        NFT_MSG_DELTABLE,
        NFT_MSG_NEWCHAIN,
        NFT_MSG_DELCHAIN,
        NFT_MSG_NEWRULE,
        NFT_MSG_DELRULE,
    )
)
_NAMES = {name.encode() + b"\0" for name in IPTABLES_TABLES}
_OWN_TABLE = NFTABLES_TABLE.encode() + b"\0"


def is_foreign_change(mtype: int, payload: bytes) -> bool:
    """Whether one nftables notification changes what :func:`detect` finds: a table, chain or
    rule added to or deleted from ``ip``/``ip6 kube-proxy``, or a chain of kube-proxy's (or a
    rule in one) added to or deleted from the iptables-nft tables. kube-proxy writing again is
    acted on at once, and a removal (``cleanup --kube-proxy``) clears the gauge ``status``
    reads at once. Cheap on everything else (set elements, the bulk of every sync, are refused
    by their type alone).
    """
    if mtype not in _WATCHED or not payload or payload[0] not in FAMILIES:
        return False
    # The kernel puts the table's name first: most messages (nlproxy's own rules) are
    # refused on it without parsing the rest.
    if len(payload) >= 8 and _NLATTR.unpack_from(payload, 4)[1] & NLA_TYPE_MASK == 1:
        first = payload[8 : 4 + _NLATTR.unpack_from(payload, 4)[0]]
        if first != _OWN_TABLE and first not in _NAMES:
            return False
    attrs = nfnl_attributes(payload)
    table = attrs.get(NFTA_TABLE_NAME)  # NFTA_CHAIN_TABLE and NFTA_RULE_TABLE are 1 too
    if table == _OWN_TABLE:
        return True
    if table not in _NAMES:
        return False
    if mtype & 0xFF in (NFT_MSG_NEWCHAIN, NFT_MSG_DELCHAIN):
        name = attrs.get(NFTA_CHAIN_NAME)
    elif mtype & 0xFF in (NFT_MSG_NEWRULE, NFT_MSG_DELRULE):
        name = attrs.get(NFTA_RULE_CHAIN)
    else:
        name = None
    return name is not None and is_kube_proxy_chain(text(name))


@dataclass(frozen=True, slots=True, kw_only=True)
class Leftovers:
    """Every kube-proxy mode's leftovers nlproxy can see: nftables tables and iptables-nft
    chains (this module), and IPVS mode's ipsets, device and virtual servers (``ipvs.py``)."""

    tables: tuple[ForeignTable, ...] = ()
    ipvs: ipvs.IpvsLeftovers = field(default_factory=ipvs.IpvsLeftovers)

    def __bool__(self) -> bool:
        return bool(self.tables or self.ipvs)

    def items(self) -> list[tuple[str, str, str, int]]:
        """(name, mode, description, chains) per table, then per kind of IPVS leftover."""
        tables = [(str(ft), ft.mode, ft.describe, len(ft.chains)) for ft in self.tables]
        return tables + [(name, "ipvs", line, 0) for name, line in self.ipvs.named()]

    def describe(self) -> list[str]:
        """One line per table, then one per kind of IPVS leftover."""
        return [line for _, _, line, _ in self.items()]


def find(netns: str | None = None) -> Leftovers:
    """Everything of kube-proxy's in ``netns``, every mode."""
    return Leftovers(tables=tuple(detect(netns)), ipvs=ipvs.detect(netns))


def remove_all(found: Leftovers, netns: str | None = None) -> None:
    """Remove what :func:`find` found: the rules first (they reference the ipsets and jump
    to the chains), then IPVS mode's virtual servers, ipsets and device.

    Raises:
        ForeignProxyError, ipvs.IpvsCleanupError: the kernel refused (naming what).
    """
    if found.tables:
        remove(found.tables, netns)
    if found.ipvs:
        ipvs.remove(found.ipvs, netns)


def detect(netns: str | None = None) -> list[ForeignTable]:
    """Another proxy's rules in ``netns``'s nftables, sorted by family and table."""
    with NetfilterSocket(netns, bufsize=4 << 20) as sock:
        tables = [(fam, name) for fam, name in _tables(sock) if fam in FAMILIES]
        found: list[ForeignTable] = []
        shared = {(fam, name) for fam, name in tables if name in IPTABLES_TABLES}
        for fam, name in tables:
            if name == NFTABLES_TABLE:
                found.append(
                    ForeignTable(family=FAMILIES[fam], table=name, mode="nftables", chains=())
                )
        if shared:
            chains: dict[tuple[int, str], list[str]] = {}
            for fam, table, chain in _chains(sock):
                if (fam, table) in shared and is_kube_proxy_chain(chain):
                    chains.setdefault((fam, table), []).append(chain)
            for (fam, table), names in chains.items():
                found.append(
                    ForeignTable(
                        family=FAMILIES[fam],
                        table=table,
                        mode="iptables-nft",
                        chains=tuple(sorted(names)),
                    )
                )
    return sorted(found, key=lambda t: (t.family, t.table))


def names(netns: str | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """Every (family, table) in ``netns``'s nftables, and every chain name of the iptables-nft
    tables: what ``preflight`` looks for other proxies in."""
    with NetfilterSocket(netns, bufsize=4 << 20) as sock:
        tables = [(ALL_FAMILIES.get(fam, str(fam)), name) for fam, name in _tables(sock)]
        chains = sorted(
            {c for fam, t, c in _chains(sock) if fam in FAMILIES and t in RULESET_TABLES}
        )
    return tables, chains


def remove(found: Sequence[ForeignTable], netns: str | None = None) -> int:
    """Remove what :func:`detect` found, in one atomic batch: kube-proxy's own tables, and in
    shared tables the rules that jump to kube-proxy's chains, then those chains.

    Returns:
        the number of netlink operations sent.

    Raises:
        ForeignProxyError: the kernel refused the batch (nothing of it was applied).
    """
    with NetfilterSocket(netns, bufsize=16 << 20) as sock:
        ops: list[tuple[int, int, bytes]] = []
        for ft in found:
            fam = _NFPROTO[ft.family]
            if ft.mode == "nftables":
                ops.append((NFT_MSG_DELTABLE, fam, str_attr(NFTA_TABLE_NAME, ft.table)))
                continue
            ours = set(ft.chains)
            for chain, handle, targets in _rules(sock, fam, ft.table):
                if chain not in ours and targets & ours:
                    attrs = str_attr(NFTA_RULE_TABLE, ft.table) + str_attr(NFTA_RULE_CHAIN, chain)
                    attrs += be64_attr(NFTA_RULE_HANDLE, handle)
                    ops.append((NFT_MSG_DELRULE, fam, attrs))
            # Flush every chain first: they jump to one another.
            table = str_attr(NFTA_RULE_TABLE, ft.table)
            ops += [(NFT_MSG_DELRULE, fam, table + str_attr(NFTA_RULE_CHAIN, c)) for c in ft.chains]
            table = str_attr(NFTA_CHAIN_TABLE, ft.table)
            ops += [
                (NFT_MSG_DELCHAIN, fam, table + str_attr(NFTA_CHAIN_NAME, c)) for c in ft.chains
            ]
        if ops:
            _commit(sock, ops)
        return len(ops)


# -- netlink ---------------------------------------------------------------------------------


def _nft(msg: int) -> int:
    return nfnl_type(NFNL_SUBSYS_NFTABLES, msg)


def _dump(
    sock: NetfilterSocket, msg: int, family: int, attrs: bytes = b""
) -> Iterator[tuple[int, dict[int, bytes]]]:
    """(family, attributes) of each object a dump returns; nothing when the kernel has none."""
    seq = sock.next_seq()
    req = nfnl_message(_nft(msg), NLM_F_REQUEST | NLM_F_DUMP, seq, family, attrs)
    try:
        for reply in sock.dump(req, seq):
            yield reply.payload[0], nfnl_attributes(reply.payload)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def _tables(sock: NetfilterSocket) -> Iterator[tuple[int, str]]:
    for fam, a in _dump(sock, NFT_MSG_GETTABLE, 0):
        if NFTA_TABLE_NAME in a:
            yield fam, text(a[NFTA_TABLE_NAME])


def _chains(sock: NetfilterSocket) -> Iterator[tuple[int, str, str]]:
    for fam, a in _dump(sock, NFT_MSG_GETCHAIN, 0):
        if NFTA_CHAIN_TABLE in a and NFTA_CHAIN_NAME in a:
            yield fam, text(a[NFTA_CHAIN_TABLE]), text(a[NFTA_CHAIN_NAME])


def _rules(sock: NetfilterSocket, family: int, table: str) -> Iterator[tuple[str, int, set[str]]]:
    """(chain, handle, chains it jumps or goes to) of each rule in ``table``."""
    for _, a in _dump(sock, NFT_MSG_GETRULE, family, str_attr(NFTA_RULE_TABLE, table)):
        if text(a.get(NFTA_RULE_TABLE, b"")) != table or NFTA_RULE_HANDLE not in a:
            continue
        targets = set(_verdict_chains(a.get(NFTA_RULE_EXPRESSIONS, b"")))
        yield text(a[NFTA_RULE_CHAIN]), be64(a[NFTA_RULE_HANDLE]), targets


def _verdict_chains(expressions: bytes) -> Iterator[str]:
    """Chains named by the ``immediate`` verdicts (jump/goto) of a rule's expressions."""
    for kind, elem in attributes(expressions):
        if kind != NFTA_LIST_ELEM:
            continue
        expr = attribute_map(elem)
        if text(expr.get(NFTA_EXPR_NAME, b"")) != "immediate":
            continue
        data = attribute_map(expr.get(NFTA_EXPR_DATA, b""))
        value = attribute_map(data.get(NFTA_IMMEDIATE_DATA, b""))
        verdict = attribute_map(value.get(NFTA_DATA_VERDICT, b""))
        if NFTA_VERDICT_CHAIN in verdict:
            yield text(verdict[NFTA_VERDICT_CHAIN])


def _commit(sock: NetfilterSocket, ops: Sequence[tuple[int, int, bytes]]) -> None:
    first = sock.next_seq(len(ops) + 2)
    sock.skip_to(first + len(ops) + 1)
    begin = (NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, first, 0, b"", NFNL_SUBSYS_NFTABLES)
    parts = [nfnl_message(*begin)]
    pending: set[int] = set()
    for i, (msg, fam, attrs) in enumerate(ops, start=1):
        seq = first + i
        parts.append(nfnl_message(_nft(msg), NLM_F_REQUEST | NLM_F_ACK, seq, fam, attrs))
        pending.add(seq)
    end = first + len(ops) + 1
    parts.append(nfnl_message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, b"", NFNL_SUBSYS_NFTABLES))
    data = b"".join(parts)
    sock.ensure_sndbuf(len(data))
    sock.send(data)
    failures: list[str] = []
    while pending:
        try:
            replies = sock.recv(timeout=10.0)
        except TimeoutError:
            break
        for reply in replies:
            if reply.type != NLMSG_ERROR or reply.error_seq not in pending:
                continue
            pending.discard(reply.error_seq)
            if reply.error:
                why, _ = reply.ext_ack()
                failures.append(f"{errno.errorcode.get(reply.error, reply.error)} {why}".strip())
    if failures:
        raise ForeignProxyError("cleanup --kube-proxy", f"the kernel refused: {failures[0]}")
