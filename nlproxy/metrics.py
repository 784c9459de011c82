"""Prometheus metrics, with kube-proxy's names where kube-proxy has the metric.

A :class:`Metrics` owns its metrics in a registry passed in (never the global one), so two
daemons can live in one test process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
        self.invalid_objects = Gauge(
            "nlproxy_invalid_objects",
            "Objects left out because they failed validation",
            registry=registry,
        )

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
