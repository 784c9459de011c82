"""The static part of the ruleset and the shared dispatch chains, for one family.

Sits inside the planner: ``skeleton()`` builds the base chains, the top-level regular chains and
the global sets/maps that every plan has (kube-proxy's nftables layout), and ``Dispatch`` adds,
on demand, the few chains shared by all services with the same traffic-policy role and endpoint
count N. Per-service state never lives here: it is elements of the global maps.
Pure: no I/O, clock or logging.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from nlproxy.cluster.model import IPFamily
from nlproxy.nft.ir import (
    DROP,
    PRIORITY_DSTNAT,
    PRIORITY_SRCNAT,
    RETURN,
    Chain,
    ChainType,
    Cmp,
    CtState,
    CtStatus,
    DataType,
    DnatMap,
    Expr,
    Family,
    FibType,
    Field,
    Hook,
    IPNetwork,
    L4Proto,
    Lookup,
    Map,
    MarkSet,
    Masquerade,
    Numgen,
    Op,
    Policy,
    Reject,
    Rule,
    Ruleset,
    Selector,
    Set,
    SetFlag,
    Table,
    VMap,
    jump,
)
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.uapi import LOOPBACK_IFINDEX
from nlproxy.proxy import naming as n
from nlproxy.proxy.fragments import Ensure, Recorder

A4, A6 = DataType.IPV4_ADDR, DataType.IPV6_ADDR
PROTO, SERVICE, INDEX = DataType.INET_PROTO, DataType.INET_SERVICE, DataType.INTEGER
BACKENDS_MAPS = (n.BACKENDS, n.BACKENDS_LOCAL, n.NODEPORT_BACKENDS, n.NODEPORT_BACKENDS_LOCAL)
"""The maps of one element per endpoint and frontend."""
PACKED = (*BACKENDS_MAPS, n.HAIRPIN, n.CLUSTER_IPS, n.NODEPORT_IPS, n.AFFINITY_ENDPOINTS)
"""The sets held as the kernel's bytes (``nft/packed.py``): those whose elements carry no
comment (read-back returns such sets packed too, so an unchanged restart compares bytes)."""


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """What differs between the ``ip`` and ``ip6`` tables."""

    family: Family
    ip_family: IPFamily
    version: int
    saddr: Field
    daddr: Field
    addr: DataType
    loopback: IPNetwork


IPV4 = FamilySpec(
    Family.IP, IPFamily.IPV4, 4, Field.IP_SADDR, Field.IP_DADDR, A4, IPv4Network("127.0.0.0/8")
)
IPV6 = FamilySpec(
    Family.IP6, IPFamily.IPV6, 6, Field.IP6_SADDR, Field.IP6_DADDR, A6, IPv6Network("::1/128")
)


@dataclass(frozen=True, slots=True)
class PodMatch:
    """How a packet from a pod is told apart (kube-proxy's local traffic detector): by its
    source in the ``cluster-cidrs`` set, or by the interface it came in on."""

    is_pod: Expr
    not_pod: Expr


def pod_match(f: FamilySpec, *, cidrs: bool, iifname: str = "") -> PodMatch | None:
    """The detector of one family: ``iifname`` (a bridge's name, or a prefix ending in ``*``)
    when given, else the ``cluster-cidrs`` source match when the family has pod ranges; None
    tells no pod apart (upstream's no-op detector)."""
    if iifname:
        return PodMatch(Cmp(Field.META_IIFNAME, iifname), Cmp(Field.META_IIFNAME, iifname, Op.NE))
    if cidrs:
        return PodMatch(
            Lookup((f.saddr,), n.CLUSTER_CIDRS), Lookup((f.saddr,), n.CLUSTER_CIDRS, negate=True)
        )
    return None


CT_NEW = Cmp(Field.CT_STATE, CtState.NEW)
FIB_SADDR_LOCAL = Cmp(Field.FIB_SADDR_TYPE, FibType.LOCAL)
FIB_DADDR_LOCAL = Cmp(Field.FIB_DADDR_TYPE, FibType.LOCAL)
L4_DPORT: tuple[Selector, ...] = (Field.META_L4PROTO, Field.TH_DPORT)

_BASE_CHAINS = (
    # Filter chains run before DNAT (dstnat - 10) so they see the service address.
    (n.FILTER_PREROUTING, ChainType.FILTER, Hook.PREROUTING, PRIORITY_DSTNAT - 10),
    (n.FILTER_INPUT, ChainType.FILTER, Hook.INPUT, PRIORITY_DSTNAT - 10),
    (n.FILTER_FORWARD, ChainType.FILTER, Hook.FORWARD, PRIORITY_DSTNAT - 10),
    (n.FILTER_OUTPUT, ChainType.FILTER, Hook.OUTPUT, PRIORITY_DSTNAT - 10),
    (n.FILTER_OUTPUT_POST_DNAT, ChainType.FILTER, Hook.OUTPUT, PRIORITY_DSTNAT + 10),
    (n.NAT_PREROUTING, ChainType.NAT, Hook.PREROUTING, PRIORITY_DSTNAT),
    (n.NAT_OUTPUT, ChainType.NAT, Hook.OUTPUT, PRIORITY_DSTNAT),
    (n.NAT_POSTROUTING, ChainType.NAT, Hook.POSTROUTING, PRIORITY_SRCNAT),
)

# (from, to, only for new connections)
_JUMPS = (
    (n.FILTER_INPUT, n.NODEPORT_ENDPOINTS_CHECK, True),
    (n.FILTER_INPUT, n.SERVICE_ENDPOINTS_CHECK, True),
    (n.FILTER_FORWARD, n.SERVICE_ENDPOINTS_CHECK, True),
    (n.FILTER_OUTPUT, n.SERVICE_ENDPOINTS_CHECK, True),
    (n.FILTER_PREROUTING, n.FIREWALL_CHECK, True),
    (n.FILTER_OUTPUT, n.FIREWALL_CHECK, True),
    (n.NAT_OUTPUT, n.SERVICES, False),
    (n.NAT_PREROUTING, n.SERVICES, False),
    (n.NAT_POSTROUTING, n.MASQUERADING, False),
    (n.FILTER_FORWARD, n.CLUSTER_IPS_CHECK, True),
    (n.FILTER_OUTPUT_POST_DNAT, n.CLUSTER_IPS_CHECK, True),
)


def _sets(f: FamilySpec, nodeport_match_all: bool) -> list[Set | Map]:
    a, verdict = f.addr, (DataType.VERDICT,)
    sets: list[Set | Map] = [
        Set(name=n.CLUSTER_IPS, key=(a,), comment="active ClusterIPs"),
        Set(name=n.SERVICE_CIDRS, key=(a,), flags=SetFlag.INTERVAL, comment="service ranges"),
        Set(name=n.CLUSTER_CIDRS, key=(a,), flags=SetFlag.INTERVAL, comment="pod ranges"),
        Map(name=n.SERVICE_IPS, key=(a, PROTO, SERVICE), data=verdict),
        Map(name=n.SERVICE_NODEPORTS, key=(PROTO, SERVICE), data=verdict),
        Map(name=n.NO_ENDPOINT_SERVICES, key=(a, PROTO, SERVICE), data=verdict),
        Map(name=n.NO_ENDPOINT_NODEPORTS, key=(PROTO, SERVICE), data=verdict),
        Set(name=n.FIREWALL_IPS, key=(a, PROTO, SERVICE), comment="loadBalancerSourceRanges"),
        Set(
            name=n.FIREWALL_ALLOW,
            key=(a, PROTO, SERVICE, a),
            flags=SetFlag.INTERVAL,  # the encoder adds CONCAT for a concatenated key
            comment="allowed sources per firewalled destination",
        ),
        Map(name=n.BACKENDS, key=(a, PROTO, SERVICE, INDEX), data=(a, SERVICE)),
        Map(name=n.BACKENDS_LOCAL, key=(a, PROTO, SERVICE, INDEX), data=(a, SERVICE)),
        Map(name=n.NODEPORT_BACKENDS, key=(PROTO, SERVICE, INDEX), data=(a, SERVICE)),
        Map(name=n.NODEPORT_BACKENDS_LOCAL, key=(PROTO, SERVICE, INDEX), data=(a, SERVICE)),
        Map(name=n.EXTERNAL_SHORTCUTS, key=(a, PROTO, SERVICE), data=verdict),
        Map(name=n.NODEPORT_SHORTCUTS, key=(PROTO, SERVICE), data=verdict),
        Set(name=n.HAIRPIN, key=(a, a), comment="endpoint . endpoint: a pod reaching itself"),
    ]
    if not nodeport_match_all:
        sets.append(Set(name=n.NODEPORT_IPS, key=(a,), comment="IPs that accept NodePorts"))
    return sets


# One piece (86 lines): the family's static table as one flat list of its chains, sets and
# rules, each chain's rules in the order they are evaluated (the order is behaviour).
def skeleton(
    f: FamilySpec,
    *,
    mark: int,
    nodeport_match_all: bool,
    service_cidrs: bool,
    counters: bool = False,
    masquerade_all: bool = False,
) -> Ruleset:
    """The static chains, rules and (empty) global sets of one family's table; ``counters``
    adds the per-frontend counting of ``--service-counters`` (:func:`add_counting`);
    ``masquerade_all`` marks every packet to a ClusterIP for masquerade, whatever its source,
    in ``services`` before dispatch (upstream's rule, word for word)."""
    rs = Ruleset(table=Table(family=f.family, name=n.TABLE, comment="rules for nlproxy"))
    for name, ctype, hook, prio in _BASE_CHAINS:
        rs.add_chain(Chain(name=name, type=ctype, hook=hook, priority=prio, policy=Policy.ACCEPT))
    for name in (
        n.SERVICES, n.MASQUERADING, n.MARK_FOR_MASQUERADE, n.FIREWALL_CHECK,
        n.SERVICE_ENDPOINTS_CHECK, n.NODEPORT_ENDPOINTS_CHECK, n.CLUSTER_IPS_CHECK, n.REJECT_CHAIN,
    ):  # fmt: skip
        rs.add_chain(Chain(name=name))
    for s in _sets(f, nodeport_match_all):
        rs.add_set(s)
    for name in PACKED:  # 100k elements and more at scale: held as the kernel's bytes
        if name in rs.sets:
            rs.elements[name] = PackedElements(rs.sets[name])
    for src, dst, new_only in _JUMPS:
        rs.add_rule(Rule(chain=src, exprs=(CT_NEW, jump(dst)) if new_only else (jump(dst),)))
    dpl = (f.daddr, *L4_DPORT)

    def add(chain: str, *exprs: Expr, comment: str = "") -> None:
        rs.add_rule(Rule(chain=chain, exprs=exprs, comment=comment))

    add(n.MARK_FOR_MASQUERADE, MarkSet(mark, "or"))
    add(
        n.MASQUERADING,
        Cmp(Field.CT_STATUS, CtStatus.DNAT),
        Lookup((f.saddr, f.daddr), n.HAIRPIN),
        jump(n.MARK_FOR_MASQUERADE),
        comment="hairpin: a pod DNAT'd to itself",
    )
    add(n.MASQUERADING, Cmp(Field.META_MARK, 0, mask=mark), RETURN)
    add(n.MASQUERADING, MarkSet(mark, "xor"))
    add(n.MASQUERADING, Masquerade(fully_random=True))
    add(n.REJECT_CHAIN, Reject())
    add(n.SERVICE_ENDPOINTS_CHECK, VMap(dpl, n.NO_ENDPOINT_SERVICES))
    add(
        n.FIREWALL_CHECK,
        Lookup(dpl, n.FIREWALL_IPS),
        Lookup((*dpl, f.saddr), n.FIREWALL_ALLOW, negate=True),
        DROP,
        comment="loadBalancerSourceRanges",
    )
    add(
        n.CLUSTER_IPS_CHECK,
        Lookup((f.daddr,), n.CLUSTER_IPS),
        Reject(),
        comment="reject traffic to invalid ports of ClusterIPs",
    )
    if service_cidrs:
        add(
            n.CLUSTER_IPS_CHECK,
            Lookup((f.daddr,), n.SERVICE_CIDRS),
            DROP,
            comment="drop traffic to unallocated ClusterIPs",
        )
    if masquerade_all:
        add(
            n.SERVICES,
            Lookup((f.daddr,), n.CLUSTER_IPS),
            jump(n.MARK_FOR_MASQUERADE),
            comment="masquerade all clusterIP traffic",
        )
    add(n.SERVICES, VMap(dpl, n.SERVICE_IPS))
    if nodeport_match_all:
        not_lo = Cmp(f.daddr, f.loopback, Op.NE)
        add(n.SERVICES, FIB_DADDR_LOCAL, not_lo, VMap(L4_DPORT, n.SERVICE_NODEPORTS))
        add(n.NODEPORT_ENDPOINTS_CHECK, not_lo, VMap(L4_DPORT, n.NO_ENDPOINT_NODEPORTS))
    else:
        in_set = Lookup((f.daddr,), n.NODEPORT_IPS)
        add(n.SERVICES, in_set, VMap(L4_DPORT, n.SERVICE_NODEPORTS))
        add(n.NODEPORT_ENDPOINTS_CHECK, in_set, VMap(L4_DPORT, n.NO_ENDPOINT_NODEPORTS))
    add_affinity_learning(rs, f)
    if counters:
        add_counting(rs, f)
    return rs


AFFINITY_LEARN_PRIORITY = PRIORITY_DSTNAT + 1
"""Right after DNAT: the connection's endpoint is chosen, its first packet not yet routed."""


def add_affinity_learning(rs: Ruleset, f: FamilySpec) -> None:
    """ClientIP affinity's learning (``affinity.py``): after DNAT, a new connection is found by
    its original destination (the packet's is now the endpoint's) in ``affinity-addresses``,
    or for a node port by its original port and its endpoint's address in
    ``affinity-nodeports``, and goes to its port's learning chain, which records ``client ->
    endpoint`` in its port's map. In prerouting and output: pods, outside clients and the node
    itself; a node port's connection only when its endpoint is one of that port's
    (``affinity-endpoints``). nft 1.0.6 types ``ct original proto-dst`` only after a protocol
    match, hence one rule per protocol."""
    original = Field.CT_ORIGINAL_IP6_DADDR if f.version == 6 else Field.CT_ORIGINAL_IP_DADDR
    dport = Field.CT_ORIGINAL_PROTO_DST
    verdict = (DataType.VERDICT,)
    rs.add_set(Map(name=n.AFFINITY_ADDRESSES, key=(f.addr, PROTO, SERVICE), data=verdict))
    rs.add_set(Map(name=n.AFFINITY_NODEPORTS, key=(PROTO, SERVICE), data=verdict))
    rs.add_set(Set(name=n.AFFINITY_ENDPOINTS, key=(PROTO, SERVICE, f.addr)))
    rs.elements[n.AFFINITY_ENDPOINTS] = PackedElements(rs.sets[n.AFFINITY_ENDPOINTS])
    np_endpoint = Lookup((Field.META_L4PROTO, dport, f.daddr), n.AFFINITY_ENDPOINTS)
    lookups = (
        (VMap((original, Field.META_L4PROTO, dport), n.AFFINITY_ADDRESSES),),
        (np_endpoint, VMap((Field.META_L4PROTO, dport), n.AFFINITY_NODEPORTS)),
    )
    for name, hook in ((n.AFFINITY_PREROUTING, Hook.PREROUTING), (n.AFFINITY_OUTPUT, Hook.OUTPUT)):
        rs.add_chain(
            Chain(
                name=name,
                type=ChainType.FILTER,
                hook=hook,
                priority=AFFINITY_LEARN_PRIORITY,
                policy=Policy.ACCEPT,
            )
        )
        for lookup in lookups:
            for proto in COUNTED_PROTOCOLS:
                exprs = (
                    Cmp(Field.META_L4PROTO, proto),
                    CT_NEW,
                    Cmp(Field.CT_STATUS, CtStatus.DNAT),
                    *lookup,
                )
                rs.add_rule(Rule(chain=name, exprs=exprs))


def counter_sets(family: Family) -> dict[str, tuple[DataType, ...]]:
    """The counting sets of ``--service-counters`` and their keys (what to read back)."""
    addr = A6 if family is Family.IP6 else A4
    return {n.SERVICE_COUNTERS: (addr, PROTO, SERVICE), n.NODEPORT_COUNTERS: (PROTO, SERVICE)}


COUNTER_PRIORITY = PRIORITY_DSTNAT + 5
"""Right after DNAT, so the first packet of a connection already has ``ct status dnat``."""
COUNTED_PROTOCOLS = (L4Proto.TCP, L4Proto.UDP, L4Proto.SCTP)


def add_counting(rs: Ruleset, f: FamilySpec) -> None:
    """``--service-counters``: count every packet of DNAT'd connections, both directions, once,
    by the connection's original destination, in the elements of two counter sets.

    Each packet passes prerouting or output once, except loopback traffic, which passes both
    (output, then prerouting on ``lo``), so prerouting skips what comes in on ``lo``. (A source
    address test would not do: a reply looped back has been un-DNAT'd in postrouting, its source
    is the service address.) nft 1.0.6 types ``ct original proto-dst`` only after a protocol
    match, hence one rule per protocol.
    """
    original = Field.CT_ORIGINAL_IP6_DADDR if f.version == 6 else Field.CT_ORIGINAL_IP_DADDR
    dport = Field.CT_ORIGINAL_PROTO_DST
    for name, key in counter_sets(f.family).items():
        rs.add_set(Set(name=name, key=key, counter=True))
    for name, hook in ((n.COUNTERS_PREROUTING, Hook.PREROUTING), (n.COUNTERS_OUTPUT, Hook.OUTPUT)):
        rs.add_chain(
            Chain(
                name=name,
                type=ChainType.FILTER,
                hook=hook,
                priority=COUNTER_PRIORITY,
                policy=Policy.ACCEPT,
            )
        )
    rs.add_chain(Chain(name=n.COUNT_SERVICES))
    dnat = Cmp(Field.CT_STATUS, CtStatus.DNAT)
    not_lo = Cmp(Field.META_IIF, LOOPBACK_IFINDEX, Op.NE)
    rs.add_rule(Rule(chain=n.COUNTERS_PREROUTING, exprs=(dnat, not_lo, jump(n.COUNT_SERVICES))))
    rs.add_rule(Rule(chain=n.COUNTERS_OUTPUT, exprs=(dnat, jump(n.COUNT_SERVICES))))
    lookups = (
        Lookup((original, Field.META_L4PROTO, dport), n.SERVICE_COUNTERS),
        Lookup((Field.META_L4PROTO, dport), n.NODEPORT_COUNTERS),
    )
    for lookup in lookups:
        for proto in COUNTED_PROTOCOLS:
            exprs = (Cmp(Field.META_L4PROTO, proto), lookup, RETURN)
            rs.add_rule(Rule(chain=n.COUNT_SERVICES, exprs=exprs))


class Dispatch:
    """Creates the shared dispatch chains of one table on first use.

    A chain is shared by every service port with the same role and endpoint count N; the
    service's own data (which endpoints) is in the elements of the backends maps.
    """

    def __init__(
        self,
        sink: Recorder,
        f: FamilySpec,
        *,
        pods: PodMatch | None,
        masquerade_all: bool = False,
    ) -> None:
        self._sink = sink
        self._pods = pods
        self._masquerade_all = masquerade_all
        self._saddr = f.saddr
        self._addr_key: tuple[Selector, ...] = (f.daddr, *L4_DPORT)
        # Chains by name: one service port after another asks for the same few chains, and
        # their rules (frozen) and the operation logging them are built once, not once per
        # service port.
        self._ensures: dict[str, Ensure] = {}
        # cluster_ip's, by endpoint count: asked once per service port, so looked up without
        # naming the chain first.
        self._cluster_ips: dict[int, Ensure] = {}

    def _make(self, name: str, *rules: tuple[Expr, ...]) -> str:
        op = self._ensures[name] = Ensure(name, rules)
        return self._sink.ensure_op(op)

    def _known(self, name: str) -> str | None:
        """``name``, ensured again with the rules it was built with, if it was built."""
        op = self._ensures.get(name)
        return None if op is None else self._sink.ensure_op(op)

    def _dnat(self, count: int, backends: str) -> tuple[Expr, ...]:
        return (DnatMap((*self._addr_key, Numgen(count)), backends),)

    def _np_dnat(self, count: int, backends: str) -> tuple[Expr, ...]:
        return (DnatMap((*L4_DPORT, Numgen(count)), backends),)

    def _masq_non_pods(self) -> tuple[tuple[Expr, ...], ...]:
        """ClusterIP traffic from outside the pods is masqueraded (with ``masquerade_all``
        ``services`` already marked all of it)."""
        if self._pods is None or self._masquerade_all:
            return ()
        return ((self._pods.not_pod, jump(n.MARK_FOR_MASQUERADE)),)

    def _shortcuts(self, key: tuple[Selector, ...], vmap: str) -> tuple[tuple[Expr, ...], ...]:
        """eTP=Local: pods and the node itself reach all cluster endpoints (upstream's
        short-circuits); the node's own traffic is masqueraded, as its source is a local IP."""
        pods: tuple[tuple[Expr, ...], ...] = (
            ((self._pods.is_pod, VMap(key, vmap)),) if self._pods is not None else ()
        )
        return (
            *pods,
            (FIB_SADDR_LOCAL, jump(n.MARK_FOR_MASQUERADE)),
            (FIB_SADDR_LOCAL, VMap(key, vmap)),
        )

    def cluster_ip(self, count: int) -> str:
        op = self._cluster_ips.get(count)
        if op is not None:
            return self._sink.ensure_op(op)
        name = n.cluster_ip_chain(count)
        if self._known(name) is None:
            self._make(name, *self._masq_non_pods(), self._dnat(count, n.BACKENDS))
        self._cluster_ips[count] = self._ensures[name]
        return name

    def external(self, count: int) -> str:
        name = n.external_chain(count)
        if (known := self._known(name)) is not None:
            return known
        return self._make(
            name,
            (jump(n.MARK_FOR_MASQUERADE),),
            self._dnat(count, n.BACKENDS),
        )

    def external_local(self, count: int) -> str:
        name = n.external_local_chain(count)
        if (known := self._known(name)) is not None:
            return known
        final = (self._dnat(count, n.BACKENDS_LOCAL),) if count else ()
        short = self._shortcuts(self._addr_key, n.EXTERNAL_SHORTCUTS)
        return self._make(name, *short, *final)

    def dnat(self, count: int) -> str:
        name = n.dnat_chain(count)
        if (known := self._known(name)) is not None:
            return known
        return self._make(name, self._dnat(count, n.BACKENDS))

    def nodeport(self, count: int) -> str:
        name = n.nodeport_chain(count)
        if (known := self._known(name)) is not None:
            return known
        return self._make(
            name,
            (jump(n.MARK_FOR_MASQUERADE),),
            self._np_dnat(count, n.NODEPORT_BACKENDS),
        )

    def nodeport_local(self, count: int) -> str:
        name = n.nodeport_local_chain(count)
        if (known := self._known(name)) is not None:
            return known
        final = (self._np_dnat(count, n.NODEPORT_BACKENDS_LOCAL),) if count else ()
        short = self._shortcuts(L4_DPORT, n.NODEPORT_SHORTCUTS)
        return self._make(name, *short, *final)

    def nodeport_dnat(self, count: int) -> str:
        name = n.nodeport_dnat_chain(count)
        if (known := self._known(name)) is not None:
            return known
        return self._make(name, self._np_dnat(count, n.NODEPORT_BACKENDS))

    def dnat_local(self, count: int) -> str:
        name = n.dnat_local_chain(count)
        if (known := self._known(name)) is not None:
            return known
        return self._make(name, self._dnat(count, n.BACKENDS_LOCAL))

    def nodeport_dnat_local(self, count: int) -> str:
        name = n.nodeport_dnat_local_chain(count)
        if (known := self._known(name)) is not None:
            return known
        return self._make(name, self._np_dnat(count, n.NODEPORT_BACKENDS_LOCAL))
