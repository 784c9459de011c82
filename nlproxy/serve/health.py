"""Health: kube-proxy-compatible ``/healthz`` and ``/livez``, and the
health-check node-port answers of ``externalTrafficPolicy: Local`` services.

``/healthz`` is healthy when the proxy has synced at least once (``/livez`` also while it is
still starting) and no queued change has waited
longer than the grace period without a successful sync (kube-proxy's rule: twice the sync period),
and the source is not blocked (``blocked``: why it cannot read a kind nlproxy needs, such as a
role without ``list`` on Services; reported as ``reason`` in the body). A fault in one of the
daemon's report-only tasks (the inspector, the foreign-proxy check: ``daemon/supervise.py``) does
not fail it: the rules are right meanwhile, and load balancers probing ``/healthz`` would drop
every node at once (kube-proxy fails it only for changes it has not synced). An API server that
does not answer (``unreachable``) is reported as ``reason`` too while ``/healthz`` fails, without
failing it by itself: rules already programmed stay right through an outage, as kube-proxy's.
Time comes from the caller (``trio.current_time()`` in the daemon) so tests can use a fake clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from nlproxy.cluster.model import Node

TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"
"""The cluster autoscaler's taint on a node it is about to remove."""


@dataclass(slots=True)
class HealthState:
    """Updated by the sync loop; read by the HTTP handlers."""

    grace_seconds: float
    node_name: str = ""
    last_updated: float | None = None
    last_updated_wall: datetime | None = None
    oldest_pending: float | None = None
    node_eligible: bool = True
    blocked: str = ""
    unreachable: str = ""

    def node_seen(self, node: Node | None) -> None:
        """The Node object as a sync takes it: whether load balancers may send traffic here."""
        self.node_eligible = node_eligible(node)

    def block(self, reasons: str) -> None:
        """Why ``/healthz`` is unhealthy whatever the syncs do (empty: nothing blocks it)."""
        self.blocked = reasons

    def api_unreachable(self, reason: str | None) -> None:
        """Why the API server does not answer (None: it answers again)."""
        self.unreachable = reason or ""

    def set_grace(self, seconds: float) -> None:
        """How long a change may wait for a sync before ``/healthz`` fails (a changed period)."""
        self.grace_seconds = seconds

    def queued(self, now: float) -> None:
        """A change arrived and waits for a sync."""
        if self.oldest_pending is None:
            self.oldest_pending = now

    def synced(self, now: float) -> None:
        self.last_updated = now
        self.last_updated_wall = datetime.now(UTC)
        self.oldest_pending = None

    def healthy(self, now: float) -> bool:
        if self.last_updated is None or self.blocked:
            return False
        return self.oldest_pending is None or now - self.oldest_pending <= self.grace_seconds

    def body(self, now: float) -> dict[str, object]:
        """The JSON body kube-proxy returns on /healthz."""
        stamp = self.last_updated_wall.isoformat() if self.last_updated_wall else ""
        body: dict[str, object] = {
            "lastUpdated": stamp,
            "currentTime": datetime.now(UTC).isoformat(),
            "nodeEligible": self.node_eligible,
        }
        reasons = [self.blocked] if self.blocked else []
        if self.unreachable and not self.healthy(now):
            reasons.append(self.unreachable)
        if reasons:
            body["reason"] = "; ".join(reasons)
        return body


def node_eligible(node: Node | None) -> bool:
    """kube-proxy's ``nodeEligible``: false while the Node is being deleted or carries the
    autoscaler's to-be-deleted taint, so that load balancers probing ``/healthz`` drain it
    before it goes. Unknown (no Node object seen): eligible."""
    if node is None:
        return True
    return not node.deleting and TO_BE_DELETED_TAINT not in node.taint_keys


def healthz(state: HealthState, now: float, *, live: bool = False) -> tuple[int, bytes]:
    """(status, body) for ``/healthz`` (``live``: ``/livez``): 200 healthy, 503 otherwise.

    ``/healthz`` is also 503 while the node is not eligible (``node_eligible``), as
    kube-proxy's; ``/livez`` ignores that and has no ``nodeEligible`` in its body.

    Before the first sync ``/healthz`` is 503 (not ready: nothing is programmed yet) while
    ``/livez`` is 200 unless the source is blocked: a slow first list must not make a liveness
    probe restart the process, which would only start the list again.
    """
    starting = state.last_updated is None and not state.blocked
    if live:  # liveness is the process's, whatever becomes of the node
        code = 200 if state.healthy(now) or starting else 503
        body = state.body(now)
        body.pop("nodeEligible")
    else:
        code = 200 if state.healthy(now) and state.node_eligible else 503
        body = state.body(now)
    return code, json.dumps(body).encode()


def service_health(namespace: str, name: str, local_endpoints: int) -> tuple[int, bytes]:
    """kube-proxy's answer on a health-check node port: 200 with local endpoints, else 503."""
    body = {
        "service": {"namespace": namespace, "name": name},
        "localEndpoints": local_endpoints,
        "serviceProxyHealthy": True,
    }
    return (200 if local_endpoints > 0 else 503), json.dumps(body).encode()
