"""nftables object model and expression IR: the nouns every other nft module speaks.

Sits between the planner (which builds these values) and the walkers that consume them: the
libnftnl encoder (``encode.py``), the text renderer (``render.py``), the read-back decoder and the
packet tracer. Pure data: no I/O, no kernel, no text parsing. A rule is never a string.

The backend is bound to one table, so objects other than :class:`Table` carry no table name.

Expressions are high level, like nft's syntax, not netlink registers: the encoder lowers
``Cmp(Field.IP_DADDR, addr)`` to payload + cmp, a network to payload + bitwise + cmp, a
concatenation to consecutive 32-bit registers, and so on.
"""

from __future__ import annotations

import enum
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import NamedTuple, TypeAlias, assert_never

import msgspec

from nlproxy.netlink import protocols

IPAddress: TypeAlias = IPv4Address | IPv6Address
IPNetwork: TypeAlias = IPv4Network | IPv6Network
Value: TypeAlias = int | IPv4Address | IPv6Address | IPv4Network | IPv6Network
"""A key or data value. Networks are only valid where an interval or prefix match is meant."""

# ---------------------------------------------------------------------------------------------
# Tables, chains, sets


class Family(enum.StrEnum):
    IP = "ip"
    IP6 = "ip6"
    INET = "inet"

    @property
    def nfproto(self) -> int:
        """NFPROTO_* number (linux/netfilter.h)."""
        return {"ip": 2, "ip6": 10, "inet": 1}[self.value]


class Hook(enum.StrEnum):
    PREROUTING = "prerouting"
    INPUT = "input"
    FORWARD = "forward"
    OUTPUT = "output"
    POSTROUTING = "postrouting"

    @property
    def number(self) -> int:
        """NF_INET_* hook number."""
        return list(Hook).index(self)


FAMILIES: tuple[Family, ...] = (Family.IP, Family.IP6)
"""The families nlproxy programs (a table each), in the order it syncs them."""


class ChainType(enum.StrEnum):
    FILTER = "filter"
    NAT = "nat"
    ROUTE = "route"


class Policy(enum.StrEnum):
    ACCEPT = "accept"
    DROP = "drop"


# Named priorities, as nft spells them (nft's standard priority table).
PRIORITY_RAW = -300
PRIORITY_MANGLE = -150
PRIORITY_DSTNAT = -100
PRIORITY_FILTER = 0
PRIORITY_SECURITY = 50
PRIORITY_SRCNAT = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Table:
    """One table. nlproxy owns ``ip nlproxy`` and ``ip6 nlproxy`` entirely.

    ``owner`` sets NFT_TABLE_F_OWNER (Linux >= 5.12): only the creating socket may change it and
    ``nft flush ruleset`` cannot remove it. ``persist`` adds NFT_TABLE_F_PERSIST (Linux >= 6.9) so
    the table outlives the owning process instead of vanishing with it.
    """

    family: Family
    name: str
    owner: bool = False
    persist: bool = False
    comment: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Chain:
    """A chain; a base chain when ``type`` and ``hook`` are set."""

    name: str
    type: ChainType | None = None
    hook: Hook | None = None
    priority: int = 0
    policy: Policy | None = None
    comment: str = ""


class DataType(enum.Enum):
    """nft datatypes used in set keys and map data: (nft type id, length in bytes).

    The ids are nft's ``enum datatypes``; nft needs them in the set's key type to print elements.
    A concatenated key is encoded as nft does: each part's id shifted left by 6 bits per later part,
    and each part padded to 4 bytes.
    """

    VERDICT = (1, 0)
    IPV4_ADDR = (7, 4)
    IPV6_ADDR = (8, 16)
    INET_PROTO = (12, 1)
    INET_SERVICE = (13, 2)
    MARK = (19, 4)
    """A packet mark (``meta mark``), 32 bits in host byte order."""
    INTEGER = (4, 4)
    """nft's plain 32-bit integer, host byte order: what ``numgen`` yields in a key. nft has no
    name for it in a ``type`` declaration, so a set keyed by it is declared with ``typeof``
    (``udata.typeof_udata``), which is also how ``nft list`` prints it and ``nft -f`` loads it."""

    @property
    def type_id(self) -> int:
        return self.value[0]

    @property
    def length(self) -> int:
        return self.value[1]


class SetFlag(enum.IntFlag):
    """NFT_SET_* flags (linux/netfilter/nf_tables.h)."""

    NONE = 0
    ANONYMOUS = 0x1
    CONSTANT = 0x2
    INTERVAL = 0x4
    MAP = 0x8
    TIMEOUT = 0x10
    EVAL = 0x20  # nft calls this "dynamic"
    CONCAT = 0x80


@dataclass(frozen=True, slots=True, kw_only=True)
class Set:
    """A named set. ``timeout`` (seconds) is the default element timeout.

    ``counter``: nft's ``counter`` in the declaration; every element gets its own packet and
    byte counter, which a matching lookup advances. The values are never part of the IR.
    """

    name: str
    key: tuple[DataType, ...]
    flags: SetFlag = SetFlag.NONE
    timeout: int | None = None
    comment: str = ""
    counter: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Map:
    """A named map. ``data == (DataType.VERDICT,)`` makes it a verdict map."""

    name: str
    key: tuple[DataType, ...]
    data: tuple[DataType, ...]
    flags: SetFlag = SetFlag.NONE
    timeout: int | None = None
    comment: str = ""

    @property
    def is_vmap(self) -> bool:
        return self.data == (DataType.VERDICT,)


SetLike: TypeAlias = Set | Map

# ---------------------------------------------------------------------------------------------
# Verdicts


class VerdictKind(enum.StrEnum):
    ACCEPT = "accept"
    DROP = "drop"
    RETURN = "return"
    CONTINUE = "continue"
    JUMP = "jump"
    GOTO = "goto"


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verdict; ``chain`` is required for jump and goto, and forbidden otherwise."""

    kind: VerdictKind
    chain: str | None = None


ACCEPT = Verdict(VerdictKind.ACCEPT)
DROP = Verdict(VerdictKind.DROP)
RETURN = Verdict(VerdictKind.RETURN)


def jump(chain: str) -> Verdict:
    return Verdict(VerdictKind.JUMP, chain)


def goto(chain: str) -> Verdict:
    return Verdict(VerdictKind.GOTO, chain)


# ---------------------------------------------------------------------------------------------
# Selectors: what a rule reads from a packet


class Field(enum.Enum):
    """Packet fields a rule can read: (nft spelling, datatype of the value)."""

    IP_SADDR = ("ip saddr", DataType.IPV4_ADDR)
    IP_DADDR = ("ip daddr", DataType.IPV4_ADDR)
    IP6_SADDR = ("ip6 saddr", DataType.IPV6_ADDR)
    IP6_DADDR = ("ip6 daddr", DataType.IPV6_ADDR)
    TH_SPORT = ("th sport", DataType.INET_SERVICE)
    TH_DPORT = ("th dport", DataType.INET_SERVICE)
    META_L4PROTO = ("meta l4proto", DataType.INET_PROTO)
    META_MARK = ("meta mark", DataType.MARK)
    META_NFPROTO = ("meta nfproto", None)
    CT_STATE = ("ct state", None)
    """Bitmask: ``Cmp(CT_STATE, CtState.NEW)`` means the NEW bit is set, as in nft."""
    CT_STATUS = ("ct status", None)
    """Bitmask, like CT_STATE, with :class:`CtStatus` bits."""
    FIB_DADDR_TYPE = ("fib daddr type", None)
    """Route type of the destination address (:class:`FibType`)."""
    FIB_SADDR_TYPE = ("fib saddr type", None)
    META_IIF = ("iif", None)
    """Index of the interface the packet came in on (1: ``lo`` in every namespace)."""
    META_IIFNAME = ("iifname", None)
    """Name of the interface the packet came in on. Compared with a name (``"cbr0"``) or, with
    a trailing ``*``, a prefix (``"veth*"``): see :func:`iifname_matches`."""
    CT_ORIGINAL_IP_DADDR = ("ct original ip daddr", DataType.IPV4_ADDR)
    """The connection's first destination, before DNAT (also in reply packets)."""
    CT_ORIGINAL_IP6_DADDR = ("ct original ip6 daddr", DataType.IPV6_ADDR)
    CT_ORIGINAL_PROTO_DST = ("ct original proto-dst", DataType.INET_SERVICE)
    """The connection's first destination port, before DNAT."""

    @property
    def text(self) -> str:
        text: str = self.value[0]
        return text

    @property
    def datatype(self) -> DataType | None:
        dt: DataType | None = self.value[1]
        return dt


class NumgenKind(enum.StrEnum):
    """``numgen``'s generator (NFT_NG_*): a counter kept by the rule, or a random number."""

    INC = "inc"
    RANDOM = "random"

    @property
    def number(self) -> int:
        """NFT_NG_INCREMENTAL (0) or NFT_NG_RANDOM (1)."""
        return 0 if self is NumgenKind.INC else 1


@dataclass(frozen=True, slots=True)
class Numgen:
    """``numgen random mod N``: a random 32-bit number in [0, N); ``numgen inc mod N``: the
    rule's own counter modulo N, advanced by every packet that evaluates it (round-robin)."""

    modulus: int
    kind: NumgenKind = NumgenKind.RANDOM


@dataclass(frozen=True, slots=True)
class Jhash:
    """``jhash <key> mod M seed S``: the kernel's Jenkins hash of the key's bytes (as loaded in
    registers, each part padded to 4 bytes) scaled into [0, M). The seed is always given: without
    one the kernel draws a random seed per rule, and no two nodes (or restarts) would agree."""

    key: tuple[Field, ...]
    modulus: int
    seed: int


Selector: TypeAlias = Field | Numgen | Jhash


class L4Proto(enum.IntEnum):
    """IPPROTO_* numbers for ``meta l4proto`` (the numbers are ``netlink/protocols.py``'s)."""

    TCP = protocols.IPPROTO_TCP
    UDP = protocols.IPPROTO_UDP
    SCTP = protocols.IPPROTO_SCTP
    ICMP = protocols.IPPROTO_ICMP
    ICMPV6 = protocols.IPPROTO_ICMPV6


class CtState(enum.IntFlag):
    """Conntrack state bits as nft's ``ct state`` sees them."""

    INVALID = 1
    ESTABLISHED = 2
    RELATED = 4
    NEW = 8
    UNTRACKED = 64


class CtStatus(enum.IntFlag):
    """IPS_* bits (linux/netfilter/nf_conntrack_common.h)."""

    EXPECTED = 0x1
    SEEN_REPLY = 0x2
    ASSURED = 0x4
    CONFIRMED = 0x8
    SNAT = 0x10
    DNAT = 0x20


class FibType(enum.IntEnum):
    """RTN_* route types returned by ``fib ... type``."""

    UNICAST = 1
    LOCAL = 2
    BROADCAST = 3
    ANYCAST = 4
    MULTICAST = 5
    BLACKHOLE = 6
    UNREACHABLE = 7
    PROHIBIT = 8


# ---------------------------------------------------------------------------------------------
# Expressions: matches and statements


class Op(enum.StrEnum):
    EQ = "=="
    NE = "!="
    LT = "<"
    GT = ">"
    LE = "<="
    GE = ">="


IFNAMSIZ = 16
"""Bytes the kernel keeps for an interface's name, its terminating NUL included."""


def iifname_matches(pattern: str, name: str) -> bool:
    """Whether interface ``name`` matches ``pattern``: the same name, or with a trailing ``*``
    a name that starts with the rest (nft's ``iifname "veth*"``)."""
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return name == pattern


@dataclass(frozen=True, slots=True)
class Cmp:
    """``left [& mask] op right``.

    ``right`` may be a network for an address field (a prefix match) and ``mask`` applies a
    bitwise AND first (``meta mark & 0x4000 == 0``). For bitmask fields (ct state/status) ``EQ``
    means "any of these bits set" and ``NE`` "none set", as nft reads them. For
    ``Field.META_IIFNAME`` ``right`` is a ``str``: an interface's name, or a name prefix ending
    in ``*``.
    """

    left: Field
    right: Value | str
    op: Op = Op.EQ
    mask: int | None = None


@dataclass(frozen=True, slots=True)
class Lookup:
    """``key @set`` (or ``key != @set``); ``key`` is one selector or a concatenation."""

    key: tuple[Selector, ...]
    set: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class VMap:
    """``key vmap @map``: the map's verdict for the key, nothing when the key is absent."""

    key: tuple[Selector, ...]
    map: str


@dataclass(frozen=True, slots=True)
class InlineVMap:
    """``key vmap { v1 : verdict1, ... }``: an anonymous constant verdict map."""

    key: tuple[Selector, ...]
    entries: tuple[tuple[tuple[Value, ...], Verdict], ...]


@dataclass(frozen=True, slots=True)
class Counter:
    """``counter``: packets and bytes."""


@dataclass(frozen=True, slots=True)
class MarkSet:
    """``meta mark set meta mark | value`` (``or``), ``... ^ value`` (``xor``) or ``value``."""

    value: int
    op: str = "or"


@dataclass(frozen=True, slots=True)
class Dnat:
    """``dnat to addr[:port]``; the family comes from the table."""

    addr: IPAddress
    port: int | None = None


@dataclass(frozen=True, slots=True)
class DnatMap:
    """``dnat to key map @map`` where the map's data is ``addr . port``.

    With ``port_map``: ``dnat to key map @map : key map @port_map``, the address from ``map``
    (its data an address alone) and the port from ``port_map`` (its data ``inet_service``),
    both found by the same key. (ClientIP affinity's IPv6 clients: nft 1.0.6 cannot load back
    an update whose data is ``ip6 daddr . th dport``.)
    """

    key: tuple[Selector, ...]
    map: str
    port_map: str | None = None


@dataclass(frozen=True, slots=True)
class Masquerade:
    fully_random: bool = False


class RejectKind(enum.StrEnum):
    ICMP = "icmp"
    ICMPX = "icmpx"
    TCP_RESET = "tcp reset"


@dataclass(frozen=True, slots=True)
class Reject:
    """``reject``: ICMP(v6) port unreachable by default (code 3 for ip, 4 for ip6, 1 for icmpx)."""

    kind: RejectKind = RejectKind.ICMP
    code: int | None = None


@dataclass(frozen=True, slots=True)
class SetUpdate:
    """``update @set { key timeout Ns }``: add the key to a dynamic set, refreshing its timeout.

    With ``data``, ``update @map { key timeout Ns : data }`` on a dynamic map: a new key is added
    with the data the packet gives; a key already there keeps its data (the packet path cannot
    change or delete a map's element) and only its timeout is refreshed.
    """

    set: str
    key: tuple[Selector, ...]
    timeout: int | None = None
    data: tuple[Selector, ...] = ()


Expr: TypeAlias = (
    Cmp
    | Lookup
    | VMap
    | InlineVMap
    | Counter
    | MarkSet
    | Dnat
    | DnatMap
    | Masquerade
    | Reject
    | SetUpdate
    | Verdict
)


class Names(NamedTuple):
    """The chains and the sets (maps included) an expression names, in the order it names them."""

    chains: tuple[str, ...]
    sets: tuple[str, ...]


_NO_NAMES = Names((), ())


def names(e: Expr) -> Names:
    """Which chains and sets ``e`` names: what must exist while a rule holding it does, and
    what the kernel refuses to delete meanwhile (EBUSY).

    The one answer for every walker that asks (the fake's reference checks, the reconciler's
    users of a recreated set, the layout reader's chains below a dispatch): an inline verdict
    map names the chains of its verdicts as a jump does, and the kernel holds each of them.
    """
    match e:
        case Verdict():
            return _NO_NAMES if e.chain is None else Names((e.chain,), ())
        case InlineVMap():
            return Names(tuple(v.chain for _, v in e.entries if v.chain is not None), ())
        case Lookup() | SetUpdate():
            return Names((), (e.set,))
        case VMap() | DnatMap():
            return Names((), (e.map,))
        case Cmp() | Counter() | MarkSet() | Dnat() | Masquerade() | Reject():
            return _NO_NAMES
        case _:
            assert_never(e)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """A rule: expressions evaluated left to right. ``comment`` is stored in the rule's userdata.

    ``handle`` is the kernel's handle, known only for rules read back; it is not part of equality.
    """

    chain: str
    exprs: tuple[Expr, ...]
    comment: str = ""
    handle: int | None = field(default=None, compare=False)


class Element(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An element of a set or map.

    ``key`` has one value per key part; ``value`` is the map's data (one value per data part) or a
    verdict for a verdict map, and None in a plain set. ``timeout`` in seconds.

    A msgspec Struct (frozen, equal and hashed by value as a frozen dataclass), not a dataclass:
    a plan and a read-back build one per dispatch element (10k Services: 10k and more), and a
    Struct costs a fraction of a frozen dataclass's ``__init__``; it holds no cycles, so the
    collector does not track it (``gc=False``).
    """

    set: str
    key: tuple[Value, ...]
    value: tuple[Value, ...] | Verdict | None = None
    timeout: int | None = None
    comment: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PackedRun:
    """A run of element operations on one set, packed: what the reconciler emits for a
    ``PackedElements`` (``packed.py``) and the encoder sends as it is (one buffer per run).

    ``data`` is the packed data of each key for an add to a map, None otherwise.
    """

    set: str
    keys: Sequence[bytes]
    data: Sequence[bytes] | None = None


ElementMap: TypeAlias = MutableMapping[tuple[Value, ...], Element]
"""One set's elements by key: a dict, or ``packed.PackedElements`` (the same mapping, held as
the kernel's bytes)."""

NftObject: TypeAlias = Table | Chain | Rule | Set | Map | Element | PackedRun

# ---------------------------------------------------------------------------------------------
# Transactions


class Verb(enum.StrEnum):
    """What to do with an object, as knftables and nft name it.

    add: create or leave as is. create: create, fail if it exists. insert: a rule at the start of
    its chain. replace: a rule in place (needs its handle). flush: a chain's rules, a set's
    elements, or a table's contents. delete: fail if absent. destroy: delete if present (Linux >=
    6.3).
    """

    ADD = "add"
    CREATE = "create"
    INSERT = "insert"
    REPLACE = "replace"
    FLUSH = "flush"
    DELETE = "delete"
    DESTROY = "destroy"


@dataclass(frozen=True, slots=True)
class Operation:
    verb: Verb
    obj: NftObject


@dataclass(slots=True)
class Ruleset:
    """The contents of one table: what the planner wants, or what read-back found.

    Rules keep their order within each chain. Elements are keyed by their key tuple.
    """

    table: Table
    chains: dict[str, Chain] = field(default_factory=dict)
    rules: dict[str, list[Rule]] = field(default_factory=dict)
    sets: dict[str, SetLike] = field(default_factory=dict)
    elements: dict[str, ElementMap] = field(default_factory=dict)

    def add_chain(self, chain: Chain) -> None:
        self.chains[chain.name] = chain
        self.rules.setdefault(chain.name, [])

    def add_rule(self, rule: Rule) -> None:
        self.rules[rule.chain].append(rule)

    def add_set(self, s: SetLike) -> None:
        self.sets[s.name] = s
        self.elements.setdefault(s.name, {})

    def add_element(self, el: Element) -> None:
        self.elements[el.set][el.key] = el
