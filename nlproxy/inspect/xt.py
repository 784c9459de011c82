"""The xtables compat expressions of kube-proxy's iptables mode, read as IR the tracer walks.

kube-proxy in iptables mode programs through iptables-nft: tables ``ip``/``ip6`` ``nat`` and
``filter`` whose rules mix native expressions (addresses, ports, ``meta l4proto``, marks,
verdicts: ``nft/decode.py`` reads them) with compat expressions, ``match``/``target`` named by
their xtables module and carrying the module's C struct as it is. This module decodes the structs
of what kube-proxy uses (x86-64/arm64 layouts; the kernel's ``linux/netfilter/xt_*.h``) and says
what each means for one new connection:

- ``comment``, ``nfacct``: nothing (a label, a counter).
- ``tcp``/``udp``: ports (none given: any); ``mark``: ``meta mark & mask``; ``addrtype``: source or
  destination ``fib … type local``; ``conntrack --ctstate``: ``ct state`` and the DNAT status bit.
- ``statistic --mode random``: the rule may or may not match. The tracer follows both: the rule's
  verdict becomes ``numgen random mod 2 vmap { 0 : verdict }`` (a miss goes on with the next
  rule), as kube-proxy's chain of falling probabilities reaches every endpoint.
- ``recent``: the list of client addresses is a dynamic set the tracer reads empty, as it reads
  nftables affinity sets (``--rcheck`` looks the address up, ``--set`` adds it).
- targets ``DNAT``, ``MASQUERADE``, ``MARK``, ``REJECT``.

Anything else (another module, an option kube-proxy never sets) raises :class:`XtError`: a
certificate must not guess. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

from nlproxy.errors import NlproxyError
from nlproxy.nft.decode import RawExpr, UndecodableError, decode_rule
from nlproxy.nft.ir import (
    Cmp,
    CtState,
    CtStatus,
    DataType,
    Dnat,
    Expr,
    Family,
    FibType,
    Field,
    InlineVMap,
    IPAddress,
    Lookup,
    MarkSet,
    Masquerade,
    Numgen,
    Op,
    Reject,
    RejectKind,
    Set,
    SetFlag,
    SetUpdate,
    Verdict,
    VerdictKind,
)
from nlproxy.nft.uapi import (
    NF_NAT_RANGE_MAP_IPS,
    NF_NAT_RANGE_PROTO_RANDOM_FULLY,
    NF_NAT_RANGE_PROTO_SPECIFIED,
)


class XtError(NlproxyError):
    """A compat expression (or an option of one) this reader does not interpret."""


@dataclass(frozen=True, slots=True)
class Translated:
    """One rule as IR, and the sets (``recent`` lists) it names."""

    exprs: tuple[Expr, ...]
    sets: tuple[Set, ...] = ()


MAYBE = "maybe"
Match = tuple[tuple[Expr, ...], tuple[Set, ...]] | str | None
"""What a match means for a new connection: expressions to test (and the sets they name),
:data:`MAYBE` (for some packets), or None (for none)."""
_ALWAYS_MATCHES: Match = ((), ())


def translate(
    raw: Sequence[RawExpr], family: Family, chain: Callable[[str], str]
) -> Translated | None:
    """One iptables-nft rule as IR; None when it can never match a new connection.

    ``chain`` maps a chain name a verdict names to the name it has in the merged ruleset.

    Raises:
        XtError: a compat expression or native pattern this reader does not interpret.
    """
    exprs: list[Expr] = []
    sets: list[Set] = []
    native: list[RawExpr] = []
    maybe = False
    for e in raw:
        if e.name not in ("match", "target"):
            native.append(e)
            continue
        exprs += _native(native, family, chain)
        native = []
        name, rev, info = _compat(e)
        if e.name == "target":
            exprs += target(name, rev, info, family)
            continue
        m = match(name, rev, info, family)
        if m is None:
            return None
        if m == MAYBE:
            maybe = True
        elif isinstance(m, tuple):
            exprs += m[0]
            sets += m[1]
    exprs += _native(native, family, chain)
    if maybe:
        exprs = _branch(exprs)
    return Translated(tuple(exprs), tuple(sets))


def _native(raw: list[RawExpr], family: Family, chain: Callable[[str], str]) -> list[Expr]:
    if not raw:
        return []
    try:
        out = decode_rule(raw, family, {})
    except UndecodableError as exc:
        raise XtError(exc.ref, exc.reason) from exc
    return [
        dataclasses.replace(e, chain=chain(e.chain))
        if isinstance(e, Verdict) and e.chain is not None
        else e
        for e in out
    ]


def _compat(e: RawExpr) -> tuple[str, int, bytes]:
    name, info = e.attrs.get("name"), e.attrs.get("info", b"")
    if not isinstance(name, str) or not isinstance(info, bytes):
        raise XtError(f"{e.name} expression", "without a module name")
    return name, e.int("rev", 0), info


def _branch(exprs: list[Expr]) -> list[Expr]:
    """The rule's verdict taken for some packets only: ``numgen random mod 2 vmap {0: v}``."""
    if not exprs or not isinstance(exprs[-1], Verdict) or exprs[-1].kind is VerdictKind.CONTINUE:
        raise XtError("match statistic", "a random match before something other than a verdict")
    return [*exprs[:-1], InlineVMap(key=(Numgen(2),), entries=(((0,), exprs[-1]),))]


def _unpack(fmt: str, info: bytes, what: str) -> tuple[int, ...]:
    need = struct.calcsize(fmt)
    if len(info) < need:
        raise XtError(what, f"{len(info)} bytes of data, {need} expected")
    return struct.unpack_from(fmt, info)


# ---------------------------------------------------------------------------------------------
# Matches

XT_STATISTIC_MODE_RANDOM = 0
XT_STATISTIC_INVERT = 0x1
_ALWAYS = 0x80000000
"""``statistic``'s probability is scaled to 2^31: a random 31-bit number below it matches."""
XT_ADDRTYPE_INVERT_SOURCE = 0x1
XT_ADDRTYPE_INVERT_DEST = 0x2
XT_ADDRTYPE_LOCAL = 1 << 2  # 1 << RTN_LOCAL
XT_RECENT_CHECK, XT_RECENT_SET, XT_RECENT_UPDATE, XT_RECENT_REMOVE = 1, 2, 4, 8
XT_RECENT_TTL, XT_RECENT_REAP = 16, 32
XT_RECENT_DEST = 1
XT_CONNTRACK_STATE = 1 << 0
XT_CONNTRACK_STATE_ALIAS = 1 << 13
# Conntrack state bits (xt_conntrack.h): INVALID, then 1 << (ctinfo + 1) for ESTABLISHED,
# RELATED and NEW, then SNAT, DNAT and UNTRACKED after IP_CT_NUMBER (5).
_XT_STATES = {1: CtState.INVALID, 2: CtState.ESTABLISHED, 4: CtState.RELATED, 8: CtState.NEW,
              256: CtState.UNTRACKED}  # fmt: skip
_XT_STATUS = {64: CtStatus.SNAT, 128: CtStatus.DNAT}
XT_TCP_INV_SRCPT, XT_TCP_INV_DSTPT = 0x1, 0x2
_ANY_PORT = (0, 0xFFFF)


def match(name: str, rev: int, info: bytes, family: Family) -> Match:
    """What match module ``name`` (revision ``rev``, data ``info``) means for a new connection.

    Raises:
        XtError: a module or option this reader does not interpret.
    """
    what = f"match {name} rev {rev}"
    match name:
        case "comment" | "nfacct":
            return _ALWAYS_MATCHES
        case "statistic":
            return _statistic(info, what)
        case "addrtype" if rev == 1:
            return _addrtype(info, what)
        case "conntrack" if rev in (1, 2, 3):
            return _conntrack(info, rev, what), ()
        case "mark" if rev == 1:
            mark, mask, invert = _unpack("=IIB", info, what)
            return (Cmp(Field.META_MARK, mark, Op.NE if invert else Op.EQ, mask),), ()
        case "tcp":
            # struct xt_tcp: spts[2], dpts[2] (u16), option, flg_mask, flg_cmp, invflags (u8)
            v = _unpack("=4H4B", info, what)
            if v[4] or v[5]:
                raise XtError(what, "TCP flags or options are not read")
            return _ports(v[0:2], v[2:4], v[7], what), ()
        case "udp":
            # struct xt_udp: spts[2], dpts[2] (u16), invflags (u8)
            v = _unpack("=4HB", info, what)
            return _ports(v[0:2], v[2:4], v[4], what), ()
        case "recent" if rev == 1:
            return _recent(info, family, what)
        case _:
            raise XtError(what, "not a match kube-proxy's iptables mode uses")


def _statistic(info: bytes, what: str) -> Match:
    mode, flags, probability = _unpack("=HHI", info, what)
    if mode != XT_STATISTIC_MODE_RANDOM:
        raise XtError(what, f"mode {mode} (only random is read)")
    invert = bool(flags & XT_STATISTIC_INVERT)
    if probability == 0:
        return _ALWAYS_MATCHES if invert else None
    if probability >= _ALWAYS:
        return None if invert else _ALWAYS_MATCHES
    return MAYBE


def _addrtype(info: bytes, what: str) -> Match:
    source, dest, flags = _unpack("=HHI", info, what)
    if flags & ~(XT_ADDRTYPE_INVERT_SOURCE | XT_ADDRTYPE_INVERT_DEST):
        raise XtError(what, f"flags {flags:#x} (interface limits are not read)")
    out: list[Expr] = []
    for mask, fld, inv in (
        (source, Field.FIB_SADDR_TYPE, flags & XT_ADDRTYPE_INVERT_SOURCE),
        (dest, Field.FIB_DADDR_TYPE, flags & XT_ADDRTYPE_INVERT_DEST),
    ):
        if not mask:
            continue
        if mask != XT_ADDRTYPE_LOCAL:
            raise XtError(what, f"address types {mask:#x} (only LOCAL is read)")
        out.append(Cmp(fld, int(FibType.LOCAL), Op.NE if inv else Op.EQ))
    return tuple(out), ()


def _conntrack(info: bytes, rev: int, what: str) -> tuple[Expr, ...]:
    # struct xt_conntrack_mtinfo1..3: eight 16-byte addresses and masks, expires_min/max, then
    # l4proto and four ports (u16 each), match_flags and invert_flags, state_mask and
    # status_mask (u8 in revision 1, u16 from 2).
    match_flags, invert_flags = _unpack("=HH", info[146:], what)
    state_mask = _unpack("=B" if rev == 1 else "=H", info[150:], what)[0]
    if match_flags & ~(XT_CONNTRACK_STATE | XT_CONNTRACK_STATE_ALIAS):
        raise XtError(what, f"match flags {match_flags:#x} (only --ctstate is read)")
    if not match_flags & XT_CONNTRACK_STATE:
        return ()
    states, status, rest = CtState(0), CtStatus(0), state_mask
    for bit, flag in _XT_STATES.items():
        if state_mask & bit:
            states |= flag
            rest &= ~bit
    for bit, st in _XT_STATUS.items():
        if state_mask & bit:
            status |= st
            rest &= ~bit
    if rest:
        raise XtError(what, f"state bits {rest:#x}")
    # (state & mask) != 0, inverted or not: "any of" is one comparison per kind of bit only
    # when the other kind is absent; inverted, "none of" is both comparisons.
    if invert_flags & XT_CONNTRACK_STATE:
        out: list[Expr] = []
        if states:
            out.append(Cmp(Field.CT_STATE, int(states), Op.NE))
        if status:
            out.append(Cmp(Field.CT_STATUS, int(status), Op.NE))
        return tuple(out)
    if states and status:
        raise XtError(what, "--ctstate with both states and SNAT/DNAT, not inverted")
    if status:
        return (Cmp(Field.CT_STATUS, int(status)),)
    return (Cmp(Field.CT_STATE, int(states)),)


def _ports(spts: tuple[int, ...], dpts: tuple[int, ...], inv: int, what: str) -> tuple[Expr, ...]:
    out: list[Expr] = []
    for (lo, hi), fld, inverted in (
        (spts, Field.TH_SPORT, inv & XT_TCP_INV_SRCPT),
        (dpts, Field.TH_DPORT, inv & XT_TCP_INV_DSTPT),
    ):
        if (lo, hi) == _ANY_PORT and not inverted:  # no port given
            continue
        if lo == hi:
            out.append(Cmp(fld, lo, Op.NE if inverted else Op.EQ))
        elif inverted:
            raise XtError(what, f"an inverted port range {lo}:{hi}")
        else:
            out += [Cmp(fld, lo, Op.GE), Cmp(fld, hi, Op.LE)]
    return tuple(out)


def recent_set(name: str, family: Family) -> str:
    """The name the ruleset gives ``recent`` list ``name``."""
    return f"xt_recent {family} {name}"


def _recent(info: bytes, family: Family, what: str) -> Match:
    _, hit_count, check_set, invert = _unpack("=IIBB", info, what)
    name = info[10:210].split(b"\0", 1)[0].decode(errors="replace")
    side = info[210] if len(info) > 210 else 0
    addr = Field.IP_DADDR if side == XT_RECENT_DEST else Field.IP_SADDR
    if family is Family.IP6:
        addr = Field.IP6_DADDR if side == XT_RECENT_DEST else Field.IP6_SADDR
    key = DataType.IPV4_ADDR if family is Family.IP else DataType.IPV6_ADDR
    decl = Set(
        name=recent_set(name, family),
        key=(key,),
        flags=SetFlag.TIMEOUT | SetFlag.EVAL,
        comment="xt_recent list, read as empty (its entries are not on netlink)",
    )
    action = check_set & ~(XT_RECENT_TTL | XT_RECENT_REAP)
    if action == XT_RECENT_SET and not invert:
        return (SetUpdate(set=decl.name, key=(addr,)),), (decl,)
    if action in (XT_RECENT_CHECK, XT_RECENT_UPDATE, XT_RECENT_REMOVE) and not hit_count:
        return (Lookup(key=(addr,), set=decl.name, negate=bool(invert)),), (decl,)
    raise XtError(what, f"options {check_set:#x}, invert {invert}, hit count {hit_count}")


# ---------------------------------------------------------------------------------------------
# Targets

XT_MARK_ALL = 0xFFFFFFFF
IPT_ICMP_PORT_UNREACHABLE, IPT_TCP_RESET = 3, 7
IP6T_ICMP6_PORT_UNREACH, IP6T_TCP_RESET = 4, 6


def target(name: str, rev: int, info: bytes, family: Family) -> tuple[Expr, ...]:
    """What target module ``name`` does to a new connection.

    Raises:
        XtError: a module or option this reader does not interpret.
    """
    what = f"target {name} rev {rev}"
    match name:
        case "MARK" if rev == 2:
            # struct xt_mark_tginfo2: mark = (mark & ~mask) ^ value; XT_CONTINUE after.
            value, mask = _unpack("=II", info, what)
            if mask == 0:
                return (MarkSet(value, "xor"),)
            if value == mask:
                return (MarkSet(value, "or"),)
            if mask == XT_MARK_ALL:
                return (MarkSet(value, "set"),)
            raise XtError(what, f"--set-xmark {value:#x}/{mask:#x}")
        case "MASQUERADE" if rev == 0:
            # ipv4: struct nf_nat_ipv4_multi_range_compat (rangesize, then the range's flags);
            # ipv6: struct nf_nat_range (flags first).
            flags = _unpack("=I", info[4:] if family is Family.IP else info, what)[0]
            return (Masquerade(fully_random=bool(flags & NF_NAT_RANGE_PROTO_RANDOM_FULLY)),)
        case "DNAT":
            return (_dnat(info, rev, family, what),)
        case "REJECT" if rev == 0:
            (with_,) = _unpack("=I", info, what)
            reset = IPT_TCP_RESET if family is Family.IP else IP6T_TCP_RESET
            port = IPT_ICMP_PORT_UNREACHABLE if family is Family.IP else IP6T_ICMP6_PORT_UNREACH
            if with_ == reset:
                return (Reject(RejectKind.TCP_RESET),)
            return (Reject(RejectKind.ICMP, None if with_ == port else with_),)
        case _:
            raise XtError(what, "not a target kube-proxy's iptables mode uses")


def _dnat(info: bytes, rev: int, family: Family, what: str) -> Dnat:
    if rev == 0 and family is Family.IP:
        # struct nf_nat_ipv4_multi_range_compat: rangesize, flags, min_ip, max_ip, ports.
        _, flags = _unpack("=II", info, what)
        lo_addr, hi_addr, ports = info[8:12], info[12:16], info[16:20]
    elif rev in (1, 2):
        # struct nf_nat_range(2): flags, min_addr, max_addr (16 bytes each), min/max port.
        (flags,) = _unpack("=I", info, what)
        size = 4 if family is Family.IP else 16
        lo_addr, hi_addr, ports = info[4 : 4 + size], info[20 : 20 + size], info[36:40]
    else:
        raise XtError(what, "revision not read")
    lo_port, hi_port = _unpack(">HH", ports, what)
    if not flags & NF_NAT_RANGE_MAP_IPS or lo_addr != hi_addr:
        raise XtError(what, "not one --to-destination address")
    addr: IPAddress = IPv4Address(lo_addr) if family is Family.IP else IPv6Address(lo_addr)
    if not flags & NF_NAT_RANGE_PROTO_SPECIFIED:
        return Dnat(addr)
    if lo_port != hi_port:
        raise XtError(what, f"a port range {lo_port}-{hi_port}")
    return Dnat(addr, lo_port)
