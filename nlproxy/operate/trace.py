"""``nlproxy explain --from IP``: trace one source to each frontend through the PROGRAMMED rules.

Sits after read-back and the node's addresses: it runs the packet tracer
(:mod:`nlproxy.proxy.tracer`) over the rulesets read from the kernel, not over a plan, and turns
each outcome into a verdict with a one-line diagnosis when the packet would not reach an
endpoint (no endpoints, source not in ``loadBalancerSourceRanges``, a Local traffic policy
without local endpoints, an unallocated cluster IP…). Pure: no I/O, no logging.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from nlproxy.nft.decode import key_order
from nlproxy.nft.ir import Family, IPAddress, L4Proto, Ruleset
from nlproxy.operate.programmed import FrontendReport
from nlproxy.proxy import naming as n
from nlproxy.proxy.tracer import TraceError, trace


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRow:
    """One frontend traced from the source.

    Attributes:
        dst: the address traced to (a node address for a node port), None when untraceable.
        verdict: ``ACCEPT``, ``DROP``, ``REJECT`` or ``-`` (not traced: other family, no
            address to send a node port to).
        endpoints: ``ip:port`` the packet may be DNAT'd to.
        ok: the packet reaches an endpoint.
        diagnosis: one line; empty when all is well.
    """

    frontend: FrontendReport
    dst: IPAddress | None
    verdict: str
    endpoints: tuple[str, ...] = ()
    masquerade: bool = False
    ok: bool = False
    diagnosis: str = ""


def nodeport_addresses(
    rs: Ruleset | None, family: Family, local_addrs: Sequence[IPAddress]
) -> list[IPAddress]:
    """The addresses that accept node ports: the ``nodeport-ips`` elements, or, when the table
    accepts them on every local address, the node's non-loopback, non-link-local ones."""
    found: list[IPAddress] = []
    if rs is not None:
        for key in sorted(rs.elements.get(n.NODEPORT_IPS, {}), key=key_order):
            addr = key[0]
            if not isinstance(addr, int | IPv4Network | IPv6Network):
                found.append(addr)
    if found:
        return found
    version = 4 if family is Family.IP else 6
    return [
        addr
        for addr in dict.fromkeys(local_addrs)
        if addr.version == version and not (addr.is_loopback or addr.is_link_local)
    ]


def nodeport_destination(
    rs: Ruleset | None, family: Family, local_addrs: Sequence[IPAddress]
) -> IPAddress | None:
    """Where a trace sends a node port: the first of :func:`nodeport_addresses`."""
    return next(iter(nodeport_addresses(rs, family, local_addrs)), None)


def trace_frontends(
    rulesets: Mapping[Family, Ruleset],
    frontends: Sequence[FrontendReport],
    src: IPAddress,
    local_addrs: Collection[IPAddress],
    iifname: str = "",
) -> list[TraceRow]:
    """Trace a new connection from ``src`` to every frontend of the source's family.

    ``iifname``: the interface ``src``'s packets come in on (``inspect.rtnl.interface_towards``),
    which the programmed rules match with the interface detect-local modes (a pod's veth or
    bridge is not masqueraded); "" for none.
    """
    rows = []
    fam = Family.IP if src.version == 4 else Family.IP6
    for fe in frontends:
        if fe.family is not fam:
            rows.append(TraceRow(frontend=fe, dst=None, verdict="-", ok=True, diagnosis=""))
            continue
        rs = rulesets.get(fam)
        dst = fe.address or nodeport_destination(rs, fam, list(local_addrs))
        rows.append(_trace_one(rs, fe, src, dst, local_addrs, iifname))
    return rows


def _trace_one(
    rs: Ruleset | None,
    fe: FrontendReport,
    src: IPAddress,
    dst: IPAddress | None,
    local_addrs: Collection[IPAddress],
    iifname: str,
) -> TraceRow:
    if dst is None:
        return TraceRow(
            frontend=fe, dst=None, verdict="-", diagnosis="no node address to send it to"
        )
    if rs is None:
        why = f"table {fe.family} {n.TABLE} is not programmed: nlproxy does nothing with it"
        return TraceRow(frontend=fe, dst=dst, verdict="ACCEPT", diagnosis=why)
    try:
        result = trace(
            rs, src, L4Proto(fe.proto), dst, fe.port, local_addrs=local_addrs, iifname=iifname
        )
    except TraceError as exc:
        return TraceRow(frontend=fe, dst=dst, verdict="-", diagnosis=f"cannot trace: {exc}")
    endpoints = tuple(sorted(result.endpoints))
    ok = result.verdict == "ACCEPT" and bool(endpoints)
    return TraceRow(
        frontend=fe,
        dst=dst,
        verdict=result.verdict,
        endpoints=endpoints,
        masquerade=result.masquerade,
        ok=ok,
        diagnosis="" if ok else diagnose(rs, fe, src, dst, result.verdict),
    )


def diagnose(rs: Ruleset, fe: FrontendReport, src: IPAddress, dst: IPAddress, verdict: str) -> str:
    """Why a packet from ``src`` to ``fe`` (sent to ``dst``) did not reach an endpoint."""
    if verdict == "ACCEPT":
        return f"not DNAT'd: nothing programmed sends {dst}:{fe.port} to an endpoint"
    if verdict == "REJECT":
        if fe.no_endpoint == "reject":
            return "rejected: the service has no endpoints"
        if fe.dispatch is None and (dst,) in rs.elements.get(n.CLUSTER_IPS, {}):
            return f"rejected: {dst} is a cluster IP, but no service port serves {fe.label}"
        return "rejected by the programmed rules"
    if fe.allowed is not None and not any(src in net for net in fe.allowed):
        ranges = ", ".join(str(r) for r in fe.allowed) or "none"
        return f"dropped: source {src} is not in loadBalancerSourceRanges ({ranges})"
    if fe.no_endpoint == "drop":
        policy = "internalTrafficPolicy" if fe.kind == "cluster-ip" else "externalTrafficPolicy"
        return f"dropped: {policy} Local and no local endpoints on this node"
    if fe.dispatch is None and fe.address is not None and _unallocated(rs, fe.address):
        return f"dropped: {fe.address} is in the service range but unallocated (no cluster IP)"
    return "dropped by the programmed rules"


def _unallocated(rs: Ruleset, addr: IPAddress) -> bool:
    if (addr,) in rs.elements.get(n.CLUSTER_IPS, {}):
        return False
    for key in rs.elements.get(n.SERVICE_CIDRS, {}):
        net = key[0]
        if isinstance(net, IPv4Network | IPv6Network) and addr in net:
            return True
    return False
