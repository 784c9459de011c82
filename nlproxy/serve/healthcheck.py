"""Health-check node ports of ``externalTrafficPolicy: Local`` LoadBalancer services.

A cloud load balancer probes ``http://node:healthCheckNodePort/`` and sends traffic only to
nodes answering 200, i.e. nodes with local endpoints; kube-proxy's body and
``X-Load-Balancing-Endpoint-Weight`` header are kept. The daemon updates the set of servers after
every sync; a server starts when its port first appears and stops when it goes away.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import trio

from nlproxy.cluster.model import ServiceKey, ServicePortRef
from nlproxy.log import get_logger
from nlproxy.proxy.planner import PortPlan
from nlproxy.serve.health import service_health
from nlproxy.serve.http import ConnectionBudget, Response, serve

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
    the rules are: load balancers probe the node's address), all within ``budget`` (the
    daemon's one connection budget)."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        host: str = "0.0.0.0",
        netns_name: str | None = None,
        budget: ConnectionBudget | None = None,
    ) -> None:
        self.nursery = nursery
        self.budget = budget if budget is not None else ConnectionBudget()
        self.host = host
        self.netns = netns_name
        self.checks: dict[int, HealthCheck] = {}
        self._scopes: dict[int, trio.CancelScope] = {}
        self.log = get_logger("healthcheck")

    def update(self, checks: Mapping[int, HealthCheck]) -> None:
        """Serve exactly ``checks`` from now on."""
        self.checks = dict(checks)
        for port in list(self._scopes):
            if port not in self.checks:
                self._scopes.pop(port).cancel()
        for port in self.checks:
            if port not in self._scopes:
                scope = trio.CancelScope()
                self._scopes[port] = scope
                self.nursery.start_soon(self._serve, port, scope)

    async def _serve(self, port: int, scope: trio.CancelScope) -> None:
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

        with scope:
            failed = False
            while True:
                try:
                    await serve(
                        f"{self.host}:{port}", handler, netns_name=self.netns, budget=self.budget
                    )
                except OSError as exc:
                    # Another listener has the port (nlproxy's own /healthz or /metrics, or
                    # another program): this Service's check is unanswered, nothing else is
                    # affected; tried again while the Service asks for the port.
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
