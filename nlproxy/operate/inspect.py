"""The ``nlproxy inspect`` report: every endpoint nlproxy DNATs to, and how this node reaches it.

Reads what is programmed from the kernel (tables ``ip nlproxy`` and ``ip6 nlproxy``, with
:func:`nlproxy.nft.readback.read_ruleset`, decoded by :mod:`nlproxy.proxy.layout`), not from the
API server, and classifies each endpoint with :mod:`nlproxy.inspect.classify`; renders the rows
as a table or JSON. Read only: it never changes the ruleset or routes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nlproxy.errors import ConfigError, NlproxyError
from nlproxy.inspect.classify import Reachability, classify
from nlproxy.nft.ir import FAMILIES, IPAddress, Ruleset
from nlproxy.nft.values import key_order
from nlproxy.operate.programmed import FrontendReport, kernel_frontends
from nlproxy.operate.rules import programmed
from nlproxy.operate.status import Port
from nlproxy.operate.text import printable
from nlproxy.proxy.layout import ADDRESS, FrontKey, UnexpectedElement, keyed, proto_name, targets

Target = tuple[IPAddress, int]


def _default_name(front: FrontKey) -> str:
    proto, daddr, dport = front
    return f"{daddr}:{dport}/{proto_name(proto)}"


def _frontend_name(fe: FrontendReport) -> str:
    if fe.address is not None:
        return _default_name((fe.proto, fe.address, fe.port))
    return f"nodeport:{fe.port}/{proto_name(fe.proto)}"


def _order(front: FrontKey) -> tuple[tuple[int, int, int], ...]:
    proto, daddr, dport = front
    return key_order((daddr, proto, dport))  # type: ignore[arg-type]


def programmed_endpoints(rulesets: Iterable[Ruleset]) -> dict[str, list[Target]]:
    """The endpoints each service port DNATs to, read from programmed ``nlproxy`` tables.

    Keys are service ports as their ``service-ips`` elements' comments name them
    (``default/web:http/TCP``; ``10.96.0.10:53/UDP`` for an element without a comment). Each
    list holds ``(address, port)`` in ``backends`` index order, then those of every other layout
    (Local policy, node ports, round-robin and consistent-hash maps, ClientIP affinity's endpoint
    chains), without duplicates across the service port's addresses (cluster IP, external IPs,
    node ports). A service port without endpoints maps to an empty list.

    Raises:
        NlproxyError: naming an element of ``service-ips`` or ``backends`` of another shape.
    """
    out: dict[str, list[Target]] = {}
    try:
        for rs in rulesets:
            names = {
                front: el.comment or _default_name(front)
                for front, el in keyed(rs, ADDRESS.dispatch, ADDRESS.width, strict=True)
            }
            for name in names.values():
                out.setdefault(name, [])
            groups = targets(rs, ADDRESS.backends, ADDRESS.width, strict=True)
            # Frontends in key order, each one's endpoints in index order.
            for front in sorted(groups, key=_order):
                found = out.setdefault(names.get(front) or _default_name(front), [])
                found += [t for t in groups[front] if t not in found]
            # Every other layout's endpoints, read as explain reads them: the Local-policy
            # maps, node ports, round-robin and consistent-hash ports' own maps, ClientIP
            # affinity's per-endpoint chains (``dnat to addr:port``).
            for fe in kernel_frontends(rs):
                found = out.setdefault(fe.ref or _frontend_name(fe), [])
                found += [t for t in (*fe.endpoints, *fe.local_endpoints) if t not in found]
    except UnexpectedElement as exc:
        el = exc.element
        raise NlproxyError(f"map {el.set} element {el.key}", exc.reason) from exc
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One endpoint of one service port, with how this node reaches it."""

    service: str
    port: str
    address: IPAddress
    target_port: int
    reach: Reachability

    @property
    def endpoint(self) -> str:
        host = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{host}:{self.target_port}"

    def as_json(self) -> dict[str, object]:
        r = self.reach
        return {
            "service": self.service,
            "port": self.port,
            "endpoint": self.endpoint,
            "address": str(self.address),
            "target_port": self.target_port,
            "kind": r.kind,
            "local": r.kind == "local",
            "device": r.device,
            "gateway": None if r.gateway is None else str(r.gateway),
            "state": r.state,
            "route": r.route,
            "reachable": r.reachable,
            "reason": r.reason,
        }


def build_rows(
    endpoints: Mapping[str, list[Target]], reach: Mapping[IPAddress, Reachability]
) -> list[Row]:
    """Join programmed endpoints with their classification, sorted by service port."""
    rows = []
    for svc_port in sorted(endpoints):
        service, _, port = svc_port.partition(":")
        for addr, target_port in endpoints[svc_port]:
            rows.append(
                Row(
                    service=service,
                    port=port,
                    address=addr,
                    target_port=target_port,
                    reach=reach[addr],
                )
            )
    return rows


def render_table(endpoints: Mapping[str, list[Target]], rows: Iterable[Row]) -> str:
    """Human output: one block per service port, one line per endpoint."""
    head = ("ENDPOINT", "KIND", "DEVICE", "GATEWAY", "STATE", "REACHABLE", "REASON")
    by_port: dict[str, list[tuple[str, ...]]] = {name: [] for name in sorted(endpoints)}
    for row in rows:
        r = row.reach
        by_port[f"{row.service}:{row.port}"].append(
            (
                row.endpoint,
                r.kind,
                r.device or "-",
                str(r.gateway or "-"),
                r.state,
                "yes" if r.reachable else "NO",
                r.reason,
            )
        )
    blocks = []
    for name, lines in by_port.items():
        if not lines:
            blocks.append(f"{printable(name)}\n  (no endpoints)")
            continue
        widths = [max(len(x[i]) for x in (head, *lines)) for i in range(len(head) - 1)]
        text = [
            "  "
            + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False))
            + "  "
            + line[-1]
            for line in (head, *lines)
        ]
        blocks.append("\n".join([printable(name), *text]))
    return "\n\n".join(blocks)


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What ``nlproxy inspect`` prints: the programmed endpoints by service port, one row per
    endpoint, and warnings about the node (another proxy's rules)."""

    endpoints: dict[str, list[Target]]
    rows: list[Row]
    warnings: list[str]

    @property
    def reachable(self) -> bool:
        return all(row.reach.reachable for row in self.rows)


def endpoint_report(
    netns: str | None, service: str | None = None, *, metrics: Port | None = None
) -> Report:
    """Read the programmed endpoints (of ``service``, ``ns/name``, when given) and classify them.
    Another proxy's rules are warned about unless the daemon at ``metrics`` says it runs beside
    them as a canary (as ``explain`` asks it).

    Raises:
        ConfigError: ``service`` has nothing programmed (a typo is a usage error, as in explain).
        NlproxyError: the kernel refused a read-back or rtnetlink dump, or a programmed element
            has another shape (each names what it was reading).
    """
    endpoints = programmed_endpoints(programmed(FAMILIES, netns))
    if service is not None:
        endpoints = {k: v for k, v in endpoints.items() if k.partition(":")[0] == service}
        if not endpoints:
            raise ConfigError(f"service {service}", "unknown: nothing is programmed for it")
    addrs = [addr for found in endpoints.values() for addr, _ in found]
    rows = build_rows(endpoints, classify(addrs, netns=netns))
    from nlproxy.operate.explain import foreign_report

    return Report(endpoints=endpoints, rows=rows, warnings=foreign_report(netns, metrics)[0])
