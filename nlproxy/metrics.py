"""Prometheus metrics, with kube-proxy's names where kube-proxy has the metric.

A :class:`Metrics` owns its metrics in a registry passed in (never the global one), so two
daemons can live in one test process. :class:`ServiceCounters` (``--service-counters``) is a
collector whose values are read from the kernel at scrape time, in a worker thread, never on
the event loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from nlproxy.nft.counters import Counts, read_counters
from nlproxy.nft.ir import Family, L4Proto, Value
from nlproxy.proxy import naming as n
from nlproxy.proxy.planner import PortPlan
from nlproxy.proxy.skeleton import counter_sets

# kube-proxy's buckets for sync durations: 1 ms doubling up to ~16 s.
SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))
PROGRAMMING_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class Metrics:
    """nlproxy's metrics in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.sync_duration = Histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            buckets=SYNC_BUCKETS,
            registry=registry,
        )
        self.last_sync = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            registry=registry,
        )
        self.last_queued = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            registry=registry,
        )
        self.programming = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            "In-cluster network programming latency in seconds",
            buckets=PROGRAMMING_BUCKETS,
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
        self.conntrack_deleted = Counter(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            registry=registry,
        )
        # 1 per Kubernetes API kind the source may not read (a refused verb, or a kind the
        # cluster does not serve); an optional kind is synced as absent meanwhile.
        self.source_unavailable = Gauge(
            "nlproxy_source_unavailable_kinds",
            "API kinds the source may not read right now (1 per kind and reason)",
            ["kind", "verb", "reason"],
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

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)


_FAMILIES = (Family.IP, Family.IP6)


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
    """

    def __init__(self, registry: CollectorRegistry, *, netns: str | None = None) -> None:
        self.netns = netns
        self.totals: dict[str, tuple[int, int]] = {}
        registry.register(self)

    def refresh(self, ports: Iterable[PortPlan]) -> None:
        """Read both families' counters and sum them per service port of ``ports``.

        Raises:
            ReadbackError: the kernel refused a dump.
        """
        readings = {
            family: read_counters(family, n.TABLE, counter_sets(family), netns=self.netns)
            for family in _FAMILIES
        }
        self.totals = service_totals(ports, readings)

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
