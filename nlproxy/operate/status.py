"""``nlproxy status``'s client: ask a running daemon how it is, over its health and metrics ports.

Sits outside the flow, beside the other read-only operator commands: it never touches the kernel
or the cluster, only the daemon's HTTP ports (``/healthz`` on the health port, ``/metrics`` on
the metrics port, kube-proxy's defaults ``0.0.0.0:10256`` and ``127.0.0.1:10249``). A wildcard
bind address is reached on loopback. With a network namespace, the sockets are opened inside it
(where a daemon started with ``ip netns exec`` listens). The metrics are parsed with
``prometheus_client.parser`` and read by sample name, so kube-proxy's labels (``ip_family``) and
series that a daemon does not export (yet) are both fine: what is missing is shown as unknown.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import socket
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from ipaddress import ip_address

from prometheus_client.parser import text_string_to_metric_families

from nlproxy.errors import ConfigError
from nlproxy.netlink import netns as netns_mod

METRICS_PORT = 10249
HEALTHZ_PORT = 10256
DEFAULT_METRICS = f"127.0.0.1:{METRICS_PORT}"
DEFAULT_HEALTHZ = f"0.0.0.0:{HEALTHZ_PORT}"
MAX_BODY = 64 << 20
"""A scrape larger than this is refused (100k services with counters is ~20 MB)."""

Samples = Mapping[str, list[tuple[dict[str, str], float]]]

# Sample names, newest spelling first: kube-proxy 1.36's, then what nlproxy exported before.
LAST_SYNC = ("kubeproxy_sync_proxy_rules_last_timestamp_seconds",)
SYNC_DURATION = ("kubeproxy_sync_proxy_rules_duration_seconds",)
FULL_SYNC_DURATION = ("kubeproxy_sync_full_proxy_rules_duration_seconds",)
PARTIAL_SYNC_DURATION = ("kubeproxy_sync_partial_proxy_rules_duration_seconds",)
SYNC_FAILURES = (
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
    "nlproxy_sync_failures_total",
)
PENDING_SERVICES = ("kubeproxy_sync_proxy_rules_service_changes_pending",)
PENDING_ENDPOINTS = ("kubeproxy_sync_proxy_rules_endpoint_changes_pending",)
REJECTED = ("nlproxy_rejected_services",)
INVALID = ("nlproxy_invalid_objects",)
DRIFT = ("nlproxy_drift_repairs_total",)
UNREACHABLE_TOTAL = ("nlproxy_unreachable_endpoints",)
UNREACHABLE = ("nlproxy_endpoint_unreachable",)
FOREIGN = ("nlproxy_foreign_proxy_tables",)
BESIDE = ("nlproxy_beside_proxy_tables",)
"""A canary's (``--service-proxy-name``) view of kube-proxy's tables: expected beside it, not
foreign. A table in both gauges is the canary's (a daemon may set both)."""
NODEPORT_MISSING = ("nlproxy_nodeport_addresses_missing",)


class StatusError(Exception):
    """One port could not be asked; the message says which and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Port:
    """Where to ask: the flag it came from, the bind address given, and what is dialled."""

    flag: str
    bind: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_port(flag: str, text: str, default_port: int) -> Port:
    """A daemon's bind address (``0.0.0.0:10256``, ``[::]:10256``, ``:10256``, or a host alone,
    which kube-proxy completes with its default port) as a place to connect to: wildcard and
    empty hosts become loopback of the same family.

    Raises:
        ConfigError: not ``HOST:PORT`` with a port in 1..65535, nor an address alone.
    """
    try:
        alone = ip_address(text.strip("[]"))
    except ValueError:
        host, sep, port = text.rpartition(":")
        host = host.strip("[]")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(flag, f"{text!r} is not HOST:PORT") from None
        number = int(port)
    else:
        host, number = str(alone), default_port
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return Port(flag=flag, bind=text, host=host, port=number)


def fetch(port: Port, path: str, *, netns: str | None, timeout: float) -> tuple[int, str]:
    """GET ``path`` from ``port``: (HTTP status, body).

    Raises:
        ConfigError: ``netns`` does not exist.
        StatusError: nothing answers, or not with HTTP.
    """
    conn = http.client.HTTPConnection(port.host, port.port, timeout=timeout)
    try:
        with netns_mod.entered(netns):
            # The socket belongs to the namespace it is created in; connect() may wait, which is
            # fine here: nothing else runs on this thread.
            conn.sock = socket.create_connection((port.host, port.port), timeout=timeout)
        conn.request("GET", path, headers={"Accept": "text/plain, application/json"})
        resp = conn.getresponse()
        body = resp.read(MAX_BODY + 1)
    except (OSError, http.client.HTTPException) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or "failed"
        raise StatusError(f"{port.flag} {port.address}{path}: {why}") from exc
    finally:
        conn.close()
    if len(body) > MAX_BODY:
        raise StatusError(f"{port.flag} {port.address}{path}: more than {MAX_BODY} bytes")
    return resp.status, body.decode("utf-8", "replace")


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text → sample name → [(labels, value)], for every metric exported.

    Raises:
        ValueError: not the Prometheus text format.
    """
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        # A labelled metric without series yet is exported, and so known: its sample name
        # maps to no samples (the drift repairs of a daemon that repaired nothing).
        out.setdefault(f"{family.name}_total" if family.type == "counter" else family.name, [])
        for s in family.samples:
            out[s.name].append((dict(s.labels), float(s.value)))
    return dict(out)


def _find(samples: Samples, names: Iterable[str]) -> list[tuple[dict[str, str], float]] | None:
    for name in names:
        if name in samples:
            return samples[name]
    return None


def _sum(samples: Samples, names: Iterable[str]) -> float | None:
    found = _find(samples, names)
    return None if found is None else sum(v for _, v in found)


def _max(samples: Samples, names: Iterable[str]) -> float | None:
    found = _find(samples, names)
    return None if not found else max(v for _, v in found)


@dataclass(frozen=True, slots=True, kw_only=True)
class Durations:
    """A duration histogram's count and mean (None: no sync observed yet)."""

    count: int
    mean_seconds: float | None


def _durations(samples: Samples, names: Iterable[str]) -> Durations | None:
    """The count and mean of the ``ip_family`` series with the most observations; None when
    the histogram is not exported. nlproxy records each sync under every family (one sync
    programs both tables), so summing the families would count one sync as two."""
    names = tuple(names)
    counts = _find(samples, [f"{n}_count" for n in names])
    if counts is None:
        return None
    if not counts:
        return Durations(count=0, mean_seconds=None)
    labels, count = max(counts, key=lambda lv: lv[1])
    totals = _find(samples, [f"{n}_sum" for n in names]) or []
    total = next((v for lb, v in totals if lb == labels), None)
    mean = total / count if count and total is not None else None
    return Durations(count=int(count), mean_seconds=mean)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncFacts:
    """What the metrics say about syncing (None: the daemon does not export it).

    ``full``/``partial``: kube-proxy's split of the durations (full syncs verify everything,
    partial ones apply changes), when the daemon exports them.
    """

    last: datetime | None = None
    count: int | None = None
    mean_seconds: float | None = None
    full: Durations | None = None
    partial: Durations | None = None
    failures: int | None = None
    pending_services: int | None = None
    pending_endpoints: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Unreachable:
    service: str
    endpoint: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Programming:
    """One Service's last change: ``seconds`` from ``since`` (``trigger``: its EndpointSlice's
    trigger time; ``seen``: when the daemon saw it) to committed on the node."""

    seconds: float
    service: str
    since: str


def parse_programming(text: str) -> tuple[Programming, ...] | None:
    """The daemon's ``/programming`` answer, slowest first; None when it is not one. Pure."""
    services = _json_object(text).get("services")
    if not isinstance(services, dict):
        return None
    out = []
    for name, entry in services.items():
        if isinstance(entry, dict) and isinstance(entry.get("seconds"), int | float):
            since = entry.get("since")
            try:
                seconds = float(entry["seconds"])
            except OverflowError:  # an integer too large for a float: not the daemon's
                continue
            if math.isfinite(seconds):
                out.append(Programming(seconds=seconds, service=str(name), since=str(since or "")))
    return tuple(sorted(out, reverse=True))


def programming(
    metrics: Port, *, netns: str | None, timeout: float, service: str | None = None
) -> tuple[Programming, ...] | None:
    """The slowest Services' last programming latency (with ``service``, ``namespace/name``:
    that one's), from the daemon's metrics port; None when it does not answer
    ``/programming`` (an older daemon, or none).

    Raises:
        ConfigError: ``netns`` does not exist.
    """
    path = "/programming" if service is None else f"/programming/{service}"
    try:
        code, text = fetch(metrics, path, netns=netns, timeout=timeout)
    except StatusError:
        return None
    return parse_programming(text) if code == 200 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonStatus:
    """The answer of both ports; an ``*_error`` says why a port gave none."""

    metrics_port: Port
    healthz_port: Port
    healthz_code: int | None = None
    healthz: Mapping[str, object] = field(default_factory=dict)
    healthz_error: str | None = None
    metrics_error: str | None = None
    sync: SyncFacts = SyncFacts()
    rejected_services: int | None = None
    invalid_objects: int | None = None
    drift_repairs: Mapping[str, int] | None = None
    unreachable_count: int | None = None
    unreachable: tuple[Unreachable, ...] = ()
    foreign_tables: tuple[tuple[str, str], ...] | None = None
    """Another service proxy's tables, ``(family, table)``, that should not be there."""
    beside_tables: tuple[tuple[str, str], ...] | None = None
    """The tables of the proxy a canary runs beside: expected (None: not a canary, or a daemon
    that does not say)."""
    nodeport_missing: tuple[str, ...] | None = None
    """IP families (``IPv4``) whose NodePorts are refused: nodePortAddresses selects no address."""
    programming: tuple[Programming, ...] | None = None
    """Each Service's last programming latency, slowest first (None: not answered)."""

    @property
    def up(self) -> bool:
        """Something answered as nlproxy on either port."""
        return self.healthz_code is not None or self.metrics_error is None

    @property
    def ready(self) -> bool:
        return self.healthz_code == 200

    @property
    def ok(self) -> bool:
        """Up, ready, and both ports answered (exit 0)."""
        return self.ready and self.metrics_error is None

    def _why(self) -> str:
        """What a 503 from ``/healthz`` means, from its body (kube-proxy's fields)."""
        if self.healthz_code != 503:
            return ""
        reason = self.healthz.get("reason")
        if isinstance(reason, str) and reason:  # nlproxy says why (an unreachable API server...)
            return f" ({reason})"
        if self.healthz.get("nodeEligible") is False:
            return " (the Node is being deleted or drained: load balancers should not use it)"
        if not self.healthz.get("lastUpdated"):
            return " (no successful sync yet)"
        return " (a change has waited longer than the grace period without a successful sync)"

    @property
    def problem(self) -> str | None:
        """Why the status is not ok, in one line; None when it is."""
        if not self.up:
            return f"not reachable: {self.healthz_error}; {self.metrics_error}"
        if self.healthz_error is not None:
            return f"health port not reachable: {self.healthz_error}"
        if not self.ready:
            return f"not ready: {self.healthz_port.flag} answered {self.healthz_code}{self._why()}"
        if self.metrics_error is not None:
            return f"metrics port not reachable: {self.metrics_error}"
        return None


def query(
    metrics: Port, healthz: Port, *, netns: str | None = None, timeout: float = 5.0
) -> DaemonStatus:
    """Ask both ports of the daemon.

    Raises:
        ConfigError: ``netns`` does not exist.
    """
    code, body, herr = None, {}, None
    try:
        code, text = fetch(healthz, "/healthz", netns=netns, timeout=timeout)
        body = _json_object(text)
    except StatusError as exc:
        herr = str(exc)
    try:
        samples = scrape(metrics, netns=netns, timeout=timeout)
    except StatusError as exc:
        return DaemonStatus(
            metrics_port=metrics,
            healthz_port=healthz,
            healthz_code=code,
            healthz=body,
            healthz_error=herr,
            metrics_error=str(exc),
        )
    st = from_samples(samples, metrics, healthz, code=code, body=body, healthz_error=herr)
    latencies = programming(metrics, netns=netns, timeout=timeout)
    return dataclasses.replace(st, programming=latencies)


def scrape(metrics: Port, *, netns: str | None, timeout: float) -> Samples:
    """The daemon's ``/metrics``, parsed.

    Raises:
        ConfigError: ``netns`` does not exist.
        StatusError: nothing answers, not with 200, or not with the Prometheus text format.
    """
    where = f"{metrics.flag} {metrics.address}/metrics"
    status, text = fetch(metrics, "/metrics", netns=netns, timeout=timeout)
    if status != 200:
        raise StatusError(f"{where}: HTTP {status}")
    try:
        return parse_metrics(text)
    except ValueError as exc:
        raise StatusError(f"{where}: not Prometheus text: {exc}") from exc


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def from_samples(
    samples: Samples,
    metrics: Port,
    healthz: Port,
    *,
    code: int | None,
    body: Mapping[str, object],
    healthz_error: str | None = None,
) -> DaemonStatus:
    """Join the health answer and the parsed metrics into one status. Pure."""
    last = _max(samples, LAST_SYNC)
    every = _durations(samples, SYNC_DURATION)
    drift = _find(samples, DRIFT)
    beside = _tables(_find(samples, BESIDE))
    foreign = _tables(_find(samples, FOREIGN))
    if foreign is not None and beside:
        foreign = tuple(t for t in foreign if t not in beside)
    unreachable = _find(samples, UNREACHABLE) or []
    missing = _find(samples, NODEPORT_MISSING)
    return DaemonStatus(
        metrics_port=metrics,
        healthz_port=healthz,
        healthz_code=code,
        healthz=body,
        healthz_error=healthz_error,
        sync=SyncFacts(
            last=datetime.fromtimestamp(last, UTC) if last else None,
            count=None if every is None else every.count,
            mean_seconds=None if every is None else every.mean_seconds,
            full=_durations(samples, FULL_SYNC_DURATION),
            partial=_durations(samples, PARTIAL_SYNC_DURATION),
            failures=_int(_max(samples, SYNC_FAILURES)),  # per family, as the durations
            pending_services=_int(_sum(samples, PENDING_SERVICES)),
            pending_endpoints=_int(_sum(samples, PENDING_ENDPOINTS)),
        ),
        rejected_services=_int(_sum(samples, REJECTED)),
        invalid_objects=_int(_sum(samples, INVALID)),
        drift_repairs=None
        if drift is None
        else {labels.get("writer", "unknown"): int(v) for labels, v in drift},
        unreachable_count=_int(_sum(samples, UNREACHABLE_TOTAL)),
        unreachable=tuple(
            sorted(
                Unreachable(
                    service=labels.get("service", ""),
                    endpoint=labels.get("endpoint", ""),
                    reason=labels.get("reason", ""),
                )
                for labels, v in unreachable
                if v
            )
        ),
        nodeport_missing=None
        if missing is None
        else tuple(sorted(lb.get("ip_family", "") for lb, v in missing if v)),
        foreign_tables=foreign,
        beside_tables=beside,
    )


def _tables(
    samples: list[tuple[dict[str, str], float]] | None,
) -> tuple[tuple[str, str], ...] | None:
    """A table gauge's tables set to 1, ``(family, table)``, sorted; None when not exported."""
    if samples is None:
        return None
    return tuple(sorted({(lb.get("family", ""), lb.get("table", "")) for lb, v in samples if v}))
