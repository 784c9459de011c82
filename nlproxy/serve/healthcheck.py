"""Health-check node ports of ``externalTrafficPolicy: Local`` LoadBalancer services.

A cloud load balancer probes ``http://node:healthCheckNodePort/`` and sends traffic only to
nodes answering 200, i.e. nodes with local endpoints; kube-proxy's body and
``X-Load-Balancing-Endpoint-Weight`` header are kept. The daemon updates the set of servers after
every sync; a server starts when its port first appears and stops when it goes away.

Each listener is a descriptor of the daemon's one :class:`DescriptorBudget`. A port that does
not fit waits (``healthcheck.over_budget`` names its Service once, and
``nlproxy_healthcheck_over_budget`` counts the waiting ports) and is served, lowest port first,
as soon as a place frees: a Service goes, or the limit is raised. The ports already served keep
their listeners, so a load balancer's view of a node does not change with others' Services.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import trio

from nlproxy.cluster.model import ServiceKey, ServicePortRef
from nlproxy.log import get_logger
from nlproxy.proxy.planner import PortPlan
from nlproxy.serve.budget import DescriptorBudget
from nlproxy.serve.health import service_health
from nlproxy.serve.http import Response, serve
from nlproxy.serve.metrics import Metrics

BIND_RETRY_SECONDS = 10.0
"""How often a health-check port that could not be bound is tried again."""


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """What one health-check node port answers for."""

    service: ServiceKey
    local_endpoints: int


def health_checks(ports: Mapping[ServicePortRef, PortPlan]) -> dict[int, HealthCheck]:
    """Health-check node port → service and its number of distinct local ready endpoints
    (serving but terminating ones still take traffic, but the check fails, as upstream)."""
    local: dict[ServiceKey, set[object]] = {}
    port_of: dict[ServiceKey, int] = {}
    for plan in ports.values():
        if plan.health_check_node_port is None:
            continue
        key = plan.ref.service
        port_of[key] = plan.health_check_node_port
        local.setdefault(key, set()).update(b.ip for b in plan.local_ready)
    return {port: HealthCheck(key, len(local[key])) for key, port in port_of.items()}


class HealthCheckServers:
    """Runs one HTTP server per health-check node port, on ``host`` in ``netns_name`` (where
    the rules are: load balancers probe the node's address), each listener and connection
    within ``budget`` (the daemon's one descriptor budget); ``metrics`` counts the ports over
    budget."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        host: str = "0.0.0.0",
        netns_name: str | None = None,
        budget: DescriptorBudget | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.nursery = nursery
        self.budget = budget if budget is not None else DescriptorBudget()
        self.metrics = metrics
        self.host = host
        self.netns = netns_name
        self.checks: dict[int, HealthCheck] = {}
        self._scopes: dict[int, trio.CancelScope] = {}
        self.over_budget: dict[int, ServiceKey] = {}
        """Ports not served for want of a descriptor, and the Service each was named for."""
        self.log = get_logger("healthcheck")

    def update(self, checks: Mapping[int, HealthCheck]) -> None:
        """Serve exactly ``checks`` from now on (those that fit the budget)."""
        self.checks = dict(checks)
        for port in list(self._scopes):
            if port not in self.checks:
                self._scopes.pop(port).cancel()  # its place is given back as it unwinds
        self._admit()

    def _admit(self) -> None:
        """Start a server for every port without one that fits, lowest port first; name the
        Services of those that do not."""
        waiting = sorted(port for port in self.checks if port not in self._scopes)
        for port in list(self.over_budget):
            if port not in self.checks:
                del self.over_budget[port]
        for port in waiting:
            service = self.checks[port].service
            if not self.budget.try_listener():
                if self.over_budget.get(port) != service:
                    self.over_budget[port] = service
                    self.log.warning(
                        "healthcheck.over_budget",
                        service=str(service),
                        port=port,
                        listeners=self.budget.listeners,
                        descriptor_limit=self.budget.limit,
                    )
                continue
            if self.over_budget.pop(port, None) is not None:
                self.log.info("healthcheck.within_budget", service=str(service), port=port)
            scope = trio.CancelScope()
            self._scopes[port] = scope
            self.nursery.start_soon(self._serve, port, scope)
        if self.metrics is not None:
            self.metrics.healthcheck_over_budget.set(len(self.over_budget))

    async def _serve(self, port: int, scope: trio.CancelScope) -> None:
        """Serve ``port`` until ``scope`` is cancelled; its listener's place in the budget is
        taken already, and given back here."""
        try:
            with scope:
                await self._serve_bound(port)
        finally:
            self.budget.close_listener()
            if self._scopes.get(port) is scope:  # it ended on its own (it never does)
                del self._scopes[port]
            if not self.nursery.cancel_scope.cancel_called:
                self._admit()  # a place is free: a waiting port may take it

    async def _serve_bound(self, port: int) -> None:
        async def handler(path: str) -> Response:
            del path  # every path answers, as kube-proxy's does
            check = self.checks.get(port)
            if check is None:
                return Response(503, b"{}")
            code, body = service_health(
                check.service.namespace, check.service.name, check.local_endpoints
            )
            weight = (("X-Load-Balancing-Endpoint-Weight", str(check.local_endpoints)),)
            return Response(code, body, headers=weight)

        failed = False
        while True:
            try:
                await serve(
                    f"{self.host}:{port}",
                    handler,
                    netns_name=self.netns,
                    budget=self.budget,
                    listener_taken=True,
                )
            except OSError as exc:
                # Another listener has the port (nlproxy's own /healthz or /metrics, or
                # another program), or the process is out of descriptors all the same: this
                # Service's check is unanswered, nothing else is affected; tried again while
                # the Service asks for the port.
                if not failed:
                    check = self.checks.get(port)
                    self.log.error(  # noqa: TRY400 - the message says all; no traceback
                        "healthcheck.bind_failed",
                        port=port,
                        service=str(check.service) if check else None,
                        error=exc.strerror or str(exc),
                        retry_seconds=BIND_RETRY_SECONDS,
                    )
                failed = True
                await trio.sleep(BIND_RETRY_SECONDS)
            else:
                return
