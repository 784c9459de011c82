"""Read one nftables table back from the kernel into the IR (:class:`Ruleset`).

Where it sits: the reconciler seeds its cache of what is programmed from here at start-up and on
every full verification, and ``nlproxy rules`` prints what it returns. It dumps the table, its
chains, sets, elements and rules over a NETLINK_NETFILTER socket with libnftnl (``dump.py``
builds the requests and parses the replies; ``readsets.py`` reads sets and elements);
``decode.py`` turns each rule's parsed expressions into IR expressions. It only reads: it never
changes the kernel, and never reads tables other than the one asked for.

A rule the IR cannot express comes back as an :class:`UndecodedRule` (handle, comment and
libnftnl's text of its expressions), which never compares equal to a planned rule.
"""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from nlproxy.netlink.codec import NFGENMSG, NLM_F_ACK, NLM_F_DUMP, NLMSGHDR, spans
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.decode import RawExpr, SetInfo, UndecodableError, UndecodedRule, decode_rule
from nlproxy.nft.dump import (
    Disturbed,
    Interrupted,
    ReadbackError,
    dump,
    generation,
    get_bytes,
    get_str,
    iterate,
    messages,
    nftnl,
    nlh_of,
    parsed,
    request,
    settle,
)
from nlproxy.nft.dynmap import read_clients
from nlproxy.nft.ir import (
    Chain,
    ChainType,
    Family,
    Hook,
    Map,
    Policy,
    Rule,
    Ruleset,
    Set,
    Table,
)
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.readsets import RawSet, parse_set, read_set_elements
from nlproxy.nft.tables import ReadBack
from nlproxy.nft.uapi import (
    NFT_MSG_GETCHAIN,
    NFT_MSG_GETRULE,
    NFT_MSG_GETSET,
    NFT_MSG_GETTABLE,
    NFT_TABLE_F_OWNER,
    NFT_TABLE_F_PERSIST,
    NFTA_EXPR_NAME,
    NFTA_LIST_ELEM,
    NFTA_SET_EXPR,
    NFTA_SET_EXPRESSIONS,
)
from nlproxy.nft.udata import udata_comment
from nlproxy.nft.values import Addresses

__all__ = [
    "KernelReadBack",
    "ReadbackError",
    "UndecodedRule",
    "raw_expr",
    "read_comments",
    "read_ruleset",
]

_RETRIES = 5
_T = TypeVar("_T")


def read_ruleset(
    family: Family, name: str, *, netns: str | None = None, sock: NetfilterSocket | None = None
) -> Ruleset | None:
    """Dump table ``family name`` with everything in it.

    Retries from the start when the ruleset changed during the dumps (generation id moved or
    the kernel flagged a dump as interrupted), so the result is one consistent snapshot.
    Blocking (about 1.5 s for 100k map elements): call it through ``trio.to_thread.run_sync``
    from async code.

    Args:
        family: the table's family.
        name: the table's name.
        netns: network namespace to open a socket in, when ``sock`` is not given.
        sock: an open socket to use (left open).

    Returns:
        The table's contents, or None if the table does not exist.

    Raises:
        ReadbackError: the dumps kept being interrupted, or the kernel refused one.
        UndecodableError: a set whose type or elements the IR cannot express.
    """
    own = sock is None
    s = NetfilterSocket(netns) if sock is None else sock
    try:
        return at_one_generation(
            s, f"table {family} {name}", functools.partial(read_table_once, s, family, name)
        )
    finally:
        if own:
            s.close()


def at_one_generation(s: NetfilterSocket, what: str, read: Callable[[], _T]) -> _T:
    """``read()`` (dumps on ``s``), from the start again until no commit moved the ruleset's
    generation during it and no dump was interrupted: one consistent snapshot.

    A set whose elements came back from a disturbed walk (``readsets.walked``) is read again
    the same way, after a pause (``dump.settle``) for the kernel's work on it to end.

    Raises:
        ReadbackError: naming ``what`` (and the set, when a walk was what kept failing), when
            it kept changing.
    """
    why = "the ruleset changed during the dump"
    for attempt in range(_RETRIES):
        try:
            gen = generation(s)
            out = read()
            if generation(s) == gen:
                return out
            why = "the ruleset changed during the dump"
        except Disturbed as exc:
            why = exc.why
            if attempt + 1 < _RETRIES:
                settle(attempt)
        except Interrupted as exc:
            why = exc.why
    raise ReadbackError(what, f"kept changing during the dump; last: {why}")


def read_table_once(s: NetfilterSocket, family: Family, name: str) -> Ruleset | None:
    """Table ``family name`` in one pass of dumps, not checked for consistency: for a reader
    that holds it and more in one :func:`at_one_generation` (a retry inside a retry would
    multiply the attempts)."""
    table = _read_table(s, family, name)
    if table is None:
        return None
    rs = Ruleset(table=table)
    for chain in dump(s, NFT_MSG_GETCHAIN, family, name, _parse_chain):
        rs.add_chain(chain)
    infos: dict[str, SetInfo] = {}
    addrs: Addresses = {}
    for raw in list(dump(s, NFT_MSG_GETSET, family, name, _parse_set)):
        elements = read_set_elements(s, family, name, raw, addrs)
        if isinstance(elements, PackedElements):  # a named set's plain elements, as bytes
            infos[raw.name] = raw.info([])
            rs.add_set(raw.ir)
            rs.elements[raw.name] = elements
            continue
        infos[raw.name] = raw.info(elements)
        if not raw.anonymous:
            rs.add_set(raw.ir)
            for el in elements:
                rs.add_element(el)
    parse_rule = functools.partial(_parse_rule, infos=infos)
    for rule in dump(s, NFT_MSG_GETRULE, family, name, parse_rule):
        rs.rules.setdefault(rule.chain, []).append(rule)
    return rs


# ---------------------------------------------------------------------------------------------
# Set expressions


def _parse_set(nlh: Any, family: Family) -> tuple[str, RawSet]:
    """``parse_set``, plus the set's expressions: a ``counter`` template makes the IR set's
    ``counter`` true, so a set declared with one compares equal to the planned set."""
    table, raw = parse_set(nlh, family)
    ffi, _ = nftnl()
    names = set_expressions(bytes(ffi.buffer(nlh, nlh.nlmsg_len)))
    if names == ["counter"] and isinstance(raw.ir, Set):
        raw.ir = replace(raw.ir, counter=True)
    elif names:
        raise UndecodableError(f"set {raw.name}", f"expressions {names} are not in the IR")
    return table, raw


def set_expressions(msg: bytes) -> list[str]:
    """The names of the expressions a NEWSET message (with its netlink header) declares for
    every element: one NFTA_SET_EXPR, or a list in NFTA_SET_EXPRESSIONS."""

    def name(lo: int, hi: int) -> str:
        found = [msg[a:b] for t, a, b in spans(msg, lo, hi) if t == NFTA_EXPR_NAME]
        return found[0].split(b"\0", 1)[0].decode() if found else "?"

    out: list[str] = []
    for kind, lo, hi in spans(msg, NLMSGHDR.size + NFGENMSG.size):
        if kind == NFTA_SET_EXPR:
            out.append(name(lo, hi))
        elif kind == NFTA_SET_EXPRESSIONS:
            out += [name(a, b) for t, a, b in spans(msg, lo, hi) if t == NFTA_LIST_ELEM]
    return out


# ---------------------------------------------------------------------------------------------
# Tables and chains


def _read_table(s: NetfilterSocket, family: Family, name: str) -> Table | None:
    _, lib = nftnl()
    seq = s.next_seq()

    def build(nlh: Any) -> None:
        t = lib.nftnl_table_alloc()
        lib.nftnl_table_set_str(t, lib.NFTNL_TABLE_NAME, name.encode())
        lib.nftnl_table_nlmsg_build_payload(nlh, t)
        lib.nftnl_table_free(t)

    req = request(NFT_MSG_GETTABLE, family, NLM_F_ACK, seq, build)
    try:
        msgs = list(messages(s, req, seq))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise ReadbackError(f"table {family} {name}", exc.strerror or str(exc)) from exc
    for msg in msgs:
        with parsed("table", nlh_of(msg)) as t:
            flags = lib.nftnl_table_get_u32(t, lib.NFTNL_TABLE_FLAGS)
            comment = udata_comment(
                get_bytes(lib.nftnl_table_get_data, t, lib.NFTNL_TABLE_USERDATA)
            )
            return Table(
                family=family,
                name=name,
                owner=bool(flags & NFT_TABLE_F_OWNER),
                persist=bool(flags & NFT_TABLE_F_PERSIST),
                comment=comment,
            )
    return None


_POLICIES = {0: Policy.DROP, 1: Policy.ACCEPT}


def _parse_chain(nlh: Any, family: Family) -> tuple[str, Chain]:
    _, lib = nftnl()
    with parsed("chain", nlh) as c:
        return get_str(lib.nftnl_chain_get_str, c, lib.NFTNL_CHAIN_TABLE), _chain(c)


def _chain(c: Any) -> Chain:
    _, lib = nftnl()
    name = get_str(lib.nftnl_chain_get_str, c, lib.NFTNL_CHAIN_NAME)
    comment = udata_comment(get_bytes(lib.nftnl_chain_get_data, c, lib.NFTNL_CHAIN_USERDATA))
    if not lib.nftnl_chain_is_set(c, lib.NFTNL_CHAIN_HOOKNUM):
        return Chain(name=name, comment=comment)
    hooknum = lib.nftnl_chain_get_u32(c, lib.NFTNL_CHAIN_HOOKNUM)
    policy = None
    if lib.nftnl_chain_is_set(c, lib.NFTNL_CHAIN_POLICY):
        policy = _POLICIES.get(lib.nftnl_chain_get_u32(c, lib.NFTNL_CHAIN_POLICY))
    try:
        return Chain(
            name=name,
            type=ChainType(get_str(lib.nftnl_chain_get_str, c, lib.NFTNL_CHAIN_TYPE)),
            hook=list(Hook)[hooknum],
            priority=int(lib.nftnl_chain_get_s32(c, lib.NFTNL_CHAIN_PRIO)),
            policy=policy,
            comment=comment,
        )
    except (ValueError, IndexError) as exc:
        raise UndecodableError(f"chain {name}", f"base chain: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Rules


# Attributes the decoder reads, per expression: "name=NFTNL_EXPR_ suffix", with ":b" for bytes,
# ":s" for a string and ":f" for presence only; the rest are integers.
_ATTRS: dict[str, str] = {
    "payload": "dreg=PAYLOAD_DREG base=PAYLOAD_BASE offset=PAYLOAD_OFFSET len=PAYLOAD_LEN "
    "sreg=PAYLOAD_SREG",
    "meta": "key=META_KEY dreg=META_DREG sreg=META_SREG",
    "ct": "key=CT_KEY dreg=CT_DREG dir=CT_DIR sreg=CT_SREG",
    "fib": "dreg=FIB_DREG result=FIB_RESULT flags=FIB_FLAGS",
    "numgen": "dreg=NG_DREG modulus=NG_MODULUS type=NG_TYPE offset=NG_OFFSET",
    "hash": "sreg=HASH_SREG dreg=HASH_DREG len=HASH_LEN modulus=HASH_MODULUS seed=HASH_SEED "
    "offset=HASH_OFFSET type=HASH_TYPE",
    "bitwise": "sreg=BITWISE_SREG dreg=BITWISE_DREG mask=BITWISE_MASK:b xor=BITWISE_XOR:b "
    "op=BITWISE_OP",
    "immediate": "dreg=IMM_DREG data=IMM_DATA:b verdict=IMM_VERDICT chain=IMM_CHAIN:s",
    "cmp": "sreg=CMP_SREG op=CMP_OP data=CMP_DATA:b",
    "lookup": "sreg=LOOKUP_SREG dreg=LOOKUP_DREG set=LOOKUP_SET:s flags=LOOKUP_FLAGS",
    "nat": "type=NAT_TYPE family=NAT_FAMILY addr_min=NAT_REG_ADDR_MIN addr_max=NAT_REG_ADDR_MAX "
    "proto_min=NAT_REG_PROTO_MIN proto_max=NAT_REG_PROTO_MAX flags=NAT_FLAGS",
    "masq": "flags=MASQ_FLAGS proto_min=MASQ_REG_PROTO_MIN",
    "reject": "type=REJECT_TYPE code=REJECT_CODE",
    "dynset": "sreg_key=DYNSET_SREG_KEY sreg_data=DYNSET_SREG_DATA op=DYNSET_OP "
    "timeout=DYNSET_TIMEOUT set=DYNSET_SET_NAME:s expr=DYNSET_EXPR:f",
    "counter": "",
    # xtables compat (iptables-nft): not part of the IR, read by inspect/xtables.py
    "match": "name=MT_NAME:s rev=MT_REV info=MT_INFO:b",
    "target": "name=TG_NAME:s rev=TG_REV info=TG_INFO:b",
}


@functools.cache
def _attr_specs(name: str) -> tuple[tuple[str, int, str], ...]:
    """(decoder's name, libnftnl attribute number, kind) for each attribute of ``name``."""
    _, lib = nftnl()
    out = []
    for item in _ATTRS.get(name, "").split():
        key, _, rest = item.partition("=")
        attr, _, kind = rest.partition(":")
        out.append((key, int(getattr(lib, "NFTNL_EXPR_" + attr)), kind))
    return tuple(out)


def raw_expr(e: Any, n: Any) -> RawExpr:
    """The attributes of expression ``e`` the decoder reads (``n``: a ``uint32_t *`` to use)."""
    ffi, lib = nftnl()
    name = ffi.string(lib.nftnl_expr_get_str(e, lib.NFTNL_EXPR_NAME)).decode()
    attrs: dict[str, int | bytes | str] = {}
    get, buffer, null = lib.nftnl_expr_get, ffi.buffer, ffi.NULL
    for key, attr, kind in _attr_specs(name):
        ptr = get(e, attr, n)  # NULL when the attribute is absent
        if ptr == null:
            continue
        if kind == "f":
            attrs[key] = 1
            continue
        blob = buffer(ptr, n[0])[:]
        if kind == "b":
            attrs[key] = blob
        elif kind == "s":
            attrs[key] = blob.rstrip(b"\0").decode()
        else:
            attrs[key] = int.from_bytes(blob, sys.byteorder)
    return RawExpr(name, attrs)


def _expr_text(e: Any) -> str:
    """libnftnl's text of one expression, as ``nft --debug=netlink`` shows it."""
    ffi, lib = nftnl()
    name = ffi.string(lib.nftnl_expr_get_str(e, lib.NFTNL_EXPR_NAME)).decode()
    buf = ffi.new("char[]", 1024)
    lib.nftnl_expr_snprintf(buf, 1024, e, lib.NFTNL_OUTPUT_DEFAULT, 0)
    return f"[ {name} {ffi.string(buf).decode().strip()} ]"


def _parse_rule(nlh: Any, family: Family, infos: dict[str, SetInfo]) -> tuple[str, Rule]:
    """One rule, decoded while libnftnl's copy is alive (its text is needed only on failure)."""
    ffi, lib = nftnl()
    with parsed("rule", nlh) as r:
        table = get_str(lib.nftnl_rule_get_str, r, lib.NFTNL_RULE_TABLE)
        chain = get_str(lib.nftnl_rule_get_str, r, lib.NFTNL_RULE_CHAIN)
        comment = udata_comment(get_bytes(lib.nftnl_rule_get_data, r, lib.NFTNL_RULE_USERDATA))
        handle = int(lib.nftnl_rule_get_u64(r, lib.NFTNL_RULE_HANDLE))
        iterator = (
            lib.nftnl_expr_iter_create,
            lib.nftnl_expr_iter_next,
            lib.nftnl_expr_iter_destroy,
        )
        ptrs = iterate(*iterator, r)
        try:
            n = ffi.new("uint32_t *")
            exprs = decode_rule([raw_expr(e, n) for e in ptrs], family, infos)
        except UndecodableError as exc:
            raw = tuple(_expr_text(e) for e in ptrs)
            return table, UndecodedRule(
                chain=chain, exprs=(), comment=comment, handle=handle, raw=raw, reason=str(exc)
            )
        return table, Rule(chain=chain, exprs=tuple(exprs), comment=comment, handle=handle)


# ---------------------------------------------------------------------------------------------
# One chain's rule comments


def read_comments(
    family: Family, name: str, chain: str, *, sock: NetfilterSocket
) -> list[str] | None:
    """The comments of the rules of chain ``chain`` in table ``family name``, in order: one
    rule dump filtered by the kernel to that chain (cheap whatever the table's size).

    Returns:
        None when the table does not exist; empty when the chain does not (or has no rules).

    Raises:
        Interrupted: the ruleset changed during the dump.
        ReadbackError: the kernel refused the dump.
    """
    _, lib = nftnl()
    seq = sock.next_seq()

    def build(nlh: Any) -> None:
        r = lib.nftnl_rule_alloc()
        lib.nftnl_rule_set_str(r, lib.NFTNL_RULE_TABLE, name.encode())
        lib.nftnl_rule_set_str(r, lib.NFTNL_RULE_CHAIN, chain.encode())
        lib.nftnl_rule_nlmsg_build_payload(nlh, r)
        lib.nftnl_rule_free(r)

    req = request(NFT_MSG_GETRULE, family, NLM_F_DUMP, seq, build)
    out: list[str] = []
    try:
        for msg in messages(sock, req, seq):
            with parsed("rule", nlh_of(msg)) as r:
                if get_str(lib.nftnl_rule_get_str, r, lib.NFTNL_RULE_CHAIN) != chain:
                    continue
                udata = get_bytes(lib.nftnl_rule_get_data, r, lib.NFTNL_RULE_USERDATA)
                out.append(udata_comment(udata))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise ReadbackError(f"chain {family} {name} {chain}", exc.strerror or str(exc)) from exc
    return out


class KernelReadBack:
    """The tables named ``name`` in network namespace ``netns``, read back (``tables.ReadBack``).

    :meth:`dump` opens a socket of its own each time, so a verify may read back in a thread
    while a sync commits in another; :meth:`comments` and :meth:`generation` share one socket,
    opened on first use and used by one thread at a time: the sync's, and before the first sync
    the thread of a plan made ahead of it (``sync/ahead.py``), which that sync waits for.
    """

    def __init__(self, name: str, netns: str | None = None) -> None:
        self.name = name
        self.netns = netns
        self._sock: NetfilterSocket | None = None

    @property
    def sock(self) -> NetfilterSocket:
        if self._sock is None:
            self._sock = NetfilterSocket(self.netns)
        return self._sock

    def dump(self, family: Family) -> Ruleset | None:
        return read_ruleset(family, self.name, netns=self.netns)

    def comments(self, family: Family, chain: str) -> list[str] | None:
        return read_comments(family, self.name, chain, sock=self.sock)

    def generation(self) -> int:
        return generation(self.sock)

    def learned(self, family: Family, m: Map) -> dict[bytes, bytes]:
        return dict(read_clients(self.sock, family, self.name, m))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


if TYPE_CHECKING:  # what ``tables.ReadBack`` declares (mypy checks it)
    _readback: ReadBack = KernelReadBack("t")
