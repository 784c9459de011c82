"""Prometheus metrics, with kube-proxy's names, labels, types and buckets where kube-proxy has
the metric (kube-proxy 1.36, nftables mode: ``tests/data/kube-proxy-1.36-metrics.json``).

A :class:`Metrics` owns its metrics in a registry passed in (never the global one), so two
daemons can live in one test process; the registry also carries the process collector
(``process_*``), as kube-proxy's does. :class:`ServiceCounters` (``--service-counters``) is a
collector whose values are read from the kernel at scrape time, in a worker thread, never on
the event loop.

kube-proxy runs one proxier per IP family, each recording its own ``ip_family`` series; nlproxy
programs both tables in one sync, so a sync's duration and outcome are recorded under both
families, while what belongs to one family (conntrack flows, programming latency of a slice,
services without local endpoints) is recorded under that family only.
"""

from __future__ import annotations

import platform
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Set
from typing import Protocol

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from nlproxy import BUILD, __version__
from nlproxy.cluster.model import Service, ServiceKey
from nlproxy.nft.counters import Counts, read_counters
from nlproxy.nft.ir import FAMILIES, DataType, Family, L4Proto, Value
from nlproxy.proxy import naming as n
from nlproxy.proxy.endpoints import externally_accessible
from nlproxy.proxy.fragments import Fragment
from nlproxy.proxy.planner import Plan, PortPart, PortPlan
from nlproxy.proxy.skeleton import counter_sets

# kube-proxy's buckets for sync durations: 1 ms doubling up to ~16 s.
SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))
# kube-proxy's for network programming latency: its bucket merge starts from a 0 bucket, then
# 0.25 s and 0.5 s, every second up to a minute, every 5 s up to 2 minutes, every 30 s up to 5.
PROGRAMMING_BUCKETS = (
    0.0,
    0.25,
    0.5,
    *(float(s) for s in range(1, 60)),
    *(float(s) for s in range(60, 120, 5)),
    *(float(s) for s in range(120, 301, 30)),
)
# client-go's for rest_client_request_duration_seconds (since Kubernetes 1.24).
REST_CLIENT_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
REST_CLIENT_ERROR = "<error>"
"""client-go's ``code`` for a request that got no answer (a refused or timed-out connection)."""
IP_FAMILIES = {Family.IP: "IPv4", Family.IP6: "IPv6"}
"""kube-proxy's ``ip_family`` label values (``v1.IPFamily``)."""
TRAFFIC_POLICIES = ("internal", "external")


class Metrics:
    """nlproxy's metrics in ``registry``.

    ``slowest_services``: export the last programming latency of that many Services, the
    slowest (``--programming-latency-services``; 0: not at all).
    """

    # One piece: a table of declarations, one per family in the order /metrics lists them.
    def __init__(self, registry: CollectorRegistry, *, slowest_services: int = 0) -> None:
        # kube-proxy (client_golang) exports no ``_created`` series. The switch is
        # prometheus_client's own, process-wide; every registry of this process wants it off.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry
        ProcessCollector(registry=registry)
        fam = ["ip_family"]
        self.sync_duration = Histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            fam,
            buckets=SYNC_BUCKETS,
            registry=registry,
        )
        self.full_sync_duration = Histogram(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "Duration of syncs that planned and compared every service, in seconds",
            fam,
            buckets=SYNC_BUCKETS,
            registry=registry,
        )
        self.partial_sync_duration = Histogram(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "Duration of syncs that updated the changed services only, in seconds",
            fam,
            buckets=SYNC_BUCKETS,
            registry=registry,
        )
        self.last_sync = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            fam,
            registry=registry,
        )
        self.last_queued = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            fam,
            registry=registry,
        )
        self.programming = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            "In-cluster network programming latency in seconds",
            fam,
            buckets=PROGRAMMING_BUCKETS,
            registry=registry,
        )
        self.slowest_services = slowest_services
        self.service_programming: Gauge | None = None
        """Opt-in: one series per Service among the ``slowest_services`` whose last change took
        longest, replaced at each sync, so the label's values stay that few."""
        if slowest_services > 0:
            self.service_programming = Gauge(
                "nlproxy_service_programming_latency_seconds",
                f"How long the last change of each of the {slowest_services} slowest Services "
                "took, from its EndpointSlice's trigger time (or when nlproxy saw the change) to "
                "committed on this node, in seconds",
                ["service", "since"],
                registry=registry,
            )
        self.endpoint_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            registry=registry,
        )
        self.endpoint_changes_total = Counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            registry=registry,
        )
        self.service_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            registry=registry,
        )
        self.service_changes_total = Counter(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            registry=registry,
        )
        self.no_local_endpoints = Gauge(  # a gauge upstream too, despite its name
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Service ports with a Local traffic policy whose endpoints are all on other nodes",
            ["ip_family", "traffic_policy"],
            registry=registry,
        )
        self.nft_sync_failures = Counter(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures",
            "Syncs the kernel refused, by IP family",
            fam,
            registry=registry,
        )
        # Upstream deletes stale chains in a later transaction that can fail on its own;
        # nlproxy deletes them in the sync's own atomic batch, so this stays 0 (kept for
        # dashboards and alerts written for kube-proxy).
        self.nft_cleanup_failures = Counter(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
            "Failed removals of stale nftables objects (none: they go in the sync's own batch)",
            fam,
            registry=registry,
        )
        self.healthz_total = Counter(
            "kubeproxy_proxy_healthz",
            "Answers to /healthz, by HTTP status code",
            ["code"],
            registry=registry,
        )
        self.livez_total = Counter(
            "kubeproxy_proxy_livez",
            "Answers to /livez, by HTTP status code",
            ["code"],
            registry=registry,
        )
        self.conntrack_deleted = Counter(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            fam,
            registry=registry,
        )
        self.conntrack_duration = Histogram(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "Time spent deleting stale conntrack flows after a sync, in seconds",
            fam,
            # The sync buckets: upstream's source for this histogram's buckets was not at hand
            # to check (its name, type and label are from the 1.36 metrics reference).
            buckets=SYNC_BUCKETS,
            registry=registry,
        )
        # Every family's series exist from the start, as soon as upstream's first sync makes
        # them: a query or alert never meets an absent series for a family that is synced.
        for label in IP_FAMILIES.values():
            for m in (
                self.sync_duration,
                self.full_sync_duration,
                self.partial_sync_duration,
                self.last_sync,
                self.last_queued,
                self.programming,
                self.nft_sync_failures,
                self.nft_cleanup_failures,
                self.conntrack_deleted,
                self.conntrack_duration,
            ):
                m.labels(ip_family=label)
            for policy in TRAFFIC_POLICIES:
                self.no_local_endpoints.labels(ip_family=label, traffic_policy=policy)
        # 1 per Kubernetes API kind the source may not read (a refused verb, or a kind the
        # cluster does not serve); an optional kind is synced as absent meanwhile.
        self.source_unavailable = Gauge(
            "nlproxy_source_unavailable_kinds",
            "API kinds the source may not read right now (1 per kind and reason)",
            ["kind", "verb", "reason"],
            registry=registry,
        )
        self.task_restarts = Counter(
            "nlproxy_task_restarts",
            "Restarts of the daemon's report-only tasks (inspector, foreign-check) after an "
            "unexpected failure (each failure is a task.failed line naming the task and the "
            "error; /healthz does not look at it)",
            ["task"],
            registry=registry,
        )
        self.sync_failures = Counter(
            "nlproxy_sync_failures",
            "Syncs the kernel rejected or that failed otherwise",
            registry=registry,
        )
        self.ops = Counter(
            "nlproxy_kernel_operations",
            "nftables operations sent to the kernel",
            ["family"],
            registry=registry,
        )
        self.objects = Gauge(
            "nlproxy_programmed_objects",
            "nftables objects nlproxy has programmed, by kind",
            ["family", "kind"],
            registry=registry,
        )
        self.drift_repairs = Counter(
            "nlproxy_drift_repairs",
            "Repairs after another process changed nlproxy's tables, by writer",
            ["writer"],
            registry=registry,
        )
        self.rejected_services = Gauge(
            "nlproxy_rejected_services",
            "Services left out because the kernel refused their objects (see the log)",
            registry=registry,
        )
        self.lb_defaulted = Gauge(
            "nlproxy_load_balancing_defaulted_services",
            "Services whose nlproxy.io/load-balancing choice is not in effect: an annotation "
            "value nlproxy does not know (the default is kept), or round-robin/consistent-hash "
            "tables past the per-Service or per-node element budget (random choice instead); "
            "see the log and explain",
            ["reason"],
            registry=registry,
        )
        self.invalid_objects = Gauge(
            "nlproxy_invalid_objects",
            "Objects left out because they failed validation",
            registry=registry,
        )
        self.verifies = Counter(
            "nlproxy_verifies",
            "Periodic and drift verifies; read_back=false: the drift monitor had seen every "
            "transaction since the last sync, so the tables were not read back",
            ["read_back"],
            registry=registry,
        )
        self.nodeport_addresses_missing = Gauge(
            "nlproxy_nodeport_addresses_missing",
            "1 when nodePortAddresses selects no address of the family although Services have "
            "node ports there: their NodePorts are refused (see the log)",
            ["ip_family"],
            registry=registry,
        )
        self.refused_frontends = Gauge(
            "nlproxy_refused_service_frontends",
            "Services left out, and external addresses refused, because another Service claims "
            "the frontend or the address is not one a Service may take (see the log)",
            registry=registry,
        )
        self.foreign_proxy_tables = Gauge(
            "nlproxy_foreign_proxy_tables",
            "1 for each table holding another proxy's rules (kube-proxy's nftables table, or "
            "its KUBE-* chains in an iptables-nft table): they can win over nlproxy's",
            ["family", "table", "mode"],
            registry=registry,
        )

        self.beside_proxy_tables = Gauge(
            "nlproxy_beside_proxy_tables",
            "1 for each table of the proxy a canary (--service-proxy-name) runs beside: "
            "expected there, so not counted in nlproxy_foreign_proxy_tables",
            ["family", "table", "mode"],
            registry=registry,
        )

        self.foreign_proxy_removals = Counter(
            "nlproxy_foreign_proxy_removals",
            "Another proxy's tables and IPVS leftovers removed by --replace-kube-proxy: each "
            "removal is a proxy that came back (a kubeadm upgrade re-creating kube-proxy), which "
            "the tables gauge, back to 0 within a second, cannot show a scrape",
            ["table", "mode"],
            registry=registry,
        )

        self.healthcheck_over_budget = Gauge(
            "nlproxy_healthcheck_over_budget",
            "Health-check node ports not served because their listeners do not fit the "
            "descriptor limit (RLIMIT_NOFILE); each Service is named in the log "
            "(healthcheck.over_budget)",
            registry=registry,
        )

        # The Kubernetes client libraries' families, as client-go records them and
        # component-base registers them on every component's /metrics (kube-proxy's included):
        # the stock dashboards and alerts plot them per job. Recorded by the kube source
        # through :meth:`kube_request`; absent with --manifests, as with no API server.
        self.rest_client_requests = Counter(
            "rest_client_requests",
            "HTTP requests to the Kubernetes API, by status code (<error>: no answer), method "
            "and API server host",
            ["code", "method", "host"],
            registry=registry,
        )
        self.rest_client_duration = Histogram(
            "rest_client_request_duration_seconds",
            "Time until the Kubernetes API answered a request (its status and headers), in "
            "seconds, by method and API server host",
            ["verb", "host"],
            buckets=REST_CLIENT_BUCKETS,
            registry=registry,
        )
        self.build_info = Gauge(
            "kubernetes_build_info",
            "1, labelled with the version, build and platform of the running nlproxy (the "
            "labels Kubernetes components carry; go_version and compiler name the Python "
            "runtime)",
            list(BUILD_INFO),
            registry=registry,
        )
        self.build_info.labels(**build_info()).set(1)

    def kube_request(self, method: str, host: str, status: int | None, seconds: float) -> None:
        """Record one request to the Kubernetes API as client-go does: ``method`` (``GET``;
        a watch is a ``GET`` too), ``host`` (the API server's ``host:port``), ``status`` (None:
        no answer, counted as ``<error>``), ``seconds`` until the answer's status came.

        The kube source is handed this method as a plain callable (``cluster/`` imports
        nothing of ``serve/``).
        """
        code = REST_CLIENT_ERROR if status is None else str(status)
        self.rest_client_requests.labels(code=code, method=method, host=host).inc()
        self.rest_client_duration.labels(verb=method, host=host).observe(seconds)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)


BUILD_INFO = (
    "major",
    "minor",
    "git_version",
    "git_commit",
    "git_tree_state",
    "build_date",
    "go_version",
    "compiler",
    "platform",
)
"""``kubernetes_build_info``'s labels, in component-base's order."""
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386", "i386": "386"}


def build_info(version: str = __version__) -> dict[str, str]:
    """``kubernetes_build_info``'s labels for this nlproxy: its own version (``major``,
    ``minor``, ``git_version`` as ``v``-prefixed semver, as Kubernetes writes its own), the
    Python runtime where Kubernetes names Go's (``go_version``: ``python3.11.7``; ``compiler``:
    ``cpython``) and the platform as Go spells it (``linux/amd64``). A commit, tree state and
    build date are what the build stamped (nlproxy.BUILD); empty for a checkout installed in
    place, as an unstamped Kubernetes build's are."""
    major, _, rest = version.partition(".")
    minor = rest.partition(".")[0]
    machine = platform.machine()
    return {
        "major": major,
        "minor": minor,
        "git_version": f"v{version}",
        **BUILD,
        "go_version": f"python{platform.python_version()}",
        "compiler": sys.implementation.name,
        "platform": f"{sys.platform}/{_GOARCH.get(machine, machine.lower())}",
    }


class NoLocalEndpoints:
    """``kubeproxy_sync_proxy_rules_no_local_endpoints_total``: per family, the service ports
    that have endpoints but none on this node for a Local policy (their traffic under that
    policy is dropped), counted as upstream: ``internal`` for ``internalTrafficPolicy: Local``,
    ``external`` for ``externalTrafficPolicy: Local`` on an externally accessible port. A port
    without any endpoint is rejected, not counted.

    Kept per service, so a sync that changed a few services costs a few services.
    """

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._by_service: dict[ServiceKey, dict[tuple[str, str], int]] = {}
        self._totals = self._zero()

    @staticmethod
    def _zero() -> dict[tuple[str, str], int]:
        return dict.fromkeys(((f, p) for f in IP_FAMILIES.values() for p in TRAFFIC_POLICIES), 0)

    def update(self, plan: Plan, changed: Set[ServiceKey] | None) -> None:
        """Recount the ``changed`` services (None: all) from ``plan`` and set the gauge."""
        if changed is None:
            self._by_service.clear()
            self._totals = self._zero()
            for family, frags in plan.fragments.items():
                for key, frag in frags.items():
                    self._add(key, family, frag)
        else:
            for key in changed:
                for label, count in self._by_service.pop(key, {}).items():
                    self._totals[label] -= count
                for family, frags in plan.fragments.items():
                    found = frags.get(key)
                    if found is not None:
                        self._add(key, family, found)
        for (fam, policy), total in self._totals.items():
            self.gauge.labels(ip_family=fam, traffic_policy=policy).set(total)

    def _add(self, key: ServiceKey, family: Family, frag: Fragment) -> None:
        svc: Service = frag.service
        if not (svc.internal_policy_local or svc.external_policy_local):
            return  # most services: nothing to count
        label = IP_FAMILIES[family]
        for part in frag.pieces:
            if not isinstance(part, PortPart) or not part.cat.has_any or part.cat.local:
                continue
            counts = self._by_service.setdefault(key, {})
            policies = []
            if svc.internal_policy_local:
                policies.append("internal")
            sp = next((sp for sp in svc.ports if sp.ref == part.ref), None)
            if svc.external_policy_local and sp is not None and externally_accessible(svc, sp):
                policies.append("external")
            for policy in policies:
                counts[label, policy] = counts.get((label, policy), 0) + 1
                self._totals[label, policy] += 1


class ReadCounters(Protocol):
    """:func:`nlproxy.nft.counters.read_counters`'s shape."""

    def __call__(
        self,
        family: Family,
        table: str,
        sets: Mapping[str, tuple[DataType, ...]],
        *,
        netns: str | None = None,
    ) -> dict[str, Counts]: ...


class ServiceCounters(Collector):
    """``nlproxy_service_packets_total`` and ``nlproxy_service_bytes_total``: what the
    ``service-counters`` and ``nodeport-counters`` elements counted, one series per service port
    (label ``service``: ``ns/name:port/PROTO``, as ``nlproxy_endpoint_unreachable``), the sum of
    its frontends over both families.

    :meth:`refresh` reads the kernel (blocking: run it in a worker thread); :meth:`collect`
    reports the last reading. A counter counts from its element's creation: it resets when the
    element is recreated (the Service deleted and added again), which Prometheus' ``rate()``
    handles as any counter reset. A frontend whose element is not in the plan given to
    :meth:`refresh` (a scrape during a sync) is skipped, and a service port without any element
    read has no series.

    One reading at a time: scrapes that come while the kernel is read wait for that reading and
    report it, so however many scrapes there are, the counters hold one netlink socket (a
    descriptor of the part the budget keeps for the daemon's netlink sockets).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        netns: str | None = None,
        read: ReadCounters = read_counters,
    ) -> None:
        self.netns = netns
        self.read = read
        self.totals: dict[str, tuple[int, int]] = {}
        self.readings = 0
        """Readings done."""
        self._lock = threading.Lock()
        registry.register(self)

    def refresh(self, ports: Iterable[PortPlan]) -> None:
        """Read both families' counters and sum them per service port of ``ports`` (or, if
        another thread's reading ended while this one waited for it, keep that one).

        Raises:
            ReadbackError: the kernel refused a dump.
        """
        before = self.readings
        with self._lock:
            if self.readings != before:
                return  # read while this scrape waited: as fresh as this scrape asks
            readings = {
                family: self.read(family, n.TABLE, counter_sets(family), netns=self.netns)
                for family in FAMILIES
            }
            self.totals = service_totals(ports, readings)
            self.readings += 1

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[CounterMetricFamily]:
        packets, octets = self._families()
        for service, (p, b) in sorted(self.totals.items()):
            packets.add_metric([service], p)
            octets.add_metric([service], b)
        return iter((packets, octets))

    def _families(self) -> tuple[CounterMetricFamily, CounterMetricFamily]:
        return (
            CounterMetricFamily(
                "nlproxy_service_packets",
                "Packets of DNAT'd connections to a service port, both directions",
                labels=["service"],
            ),
            CounterMetricFamily(
                "nlproxy_service_bytes",
                "Bytes (IP headers included) of DNAT'd connections to a service port, both "
                "directions",
                labels=["service"],
            ),
        )


def service_totals(
    ports: Iterable[PortPlan], readings: Mapping[Family, Mapping[str, Counts]]
) -> dict[str, tuple[int, int]]:
    """(packets, bytes) per service port (``str(ref)``): the sum of its frontends' elements."""
    out: dict[str, tuple[int, int]] = {}
    for port in ports:
        found, packets, octets = False, 0, 0
        for fe in port.frontends:
            sets = readings.get(fe.family, {})
            l4 = int(L4Proto[fe.protocol.value])
            key: tuple[Value, ...]
            if fe.address is None:
                name, key = n.NODEPORT_COUNTERS, (l4, fe.port)
            else:
                name, key = n.SERVICE_COUNTERS, (fe.address, l4, fe.port)
            counts = sets.get(name, {}).get(key)
            if counts is not None:
                found, packets, octets = True, packets + counts[0], octets + counts[1]
        if found:
            out[str(port.ref)] = (packets, octets)
    return out
