"""The element budget of the load-balancing opt-ins: which Services may have their own tables.

Sits before the planner: the Syncer (and ``explain``) run :func:`admit` over a snapshot and
plan the Services it turns down with random choice, as kube-proxy's. Random choice shares
its chains and costs one element per endpoint; a round-robin port costs one element per
endpoint in a map of its own, and a consistent-hash port a whole table (4096 slots or more,
``hashring.py``) per endpoint list. Any Service owner can set ``nlproxy.io/load-balancing``,
so that cost is bounded twice:

* per Service, :data:`SERVICE_BUDGET` elements: one Service's sync stays well under a second
  (about 6 µs an element from plan to kernel, bench/bench_lb.py), so no other Service's change
  waits long behind it;
* per node, :data:`NODE_BUDGET` elements over every opted-in Service, admitted oldest first
  (``creationTimestamp``, then namespace/name), so a new Service cannot push out an older one.

A Service past either keeps working, with random choice; the Syncer warns once and counts it.
And the daemon builds at most :data:`SYNC_QUOTA` elements of tables per sync: a burst of
opted-in Services is spread over consecutive syncs (a new one starts on random choice, a
changed one keeps its old tables a moment), so a change of any other Service joins the next.
The count is an upper bound made from the objects alone (every endpoint of the port's slices,
ready or not; a Local map counted whenever a policy is Local), so it does not depend on the
node and is the same for ``explain``. ClientIP affinity is not an opt-in here: its layout plans
what random choice plans (an element per endpoint and frontend in the backends maps), plus an
element per endpoint address of a node port (``affinity-endpoints``) and per local endpoint of
a Local policy, and what the packet path learns (a clients map per port) the kernel bounds at
65535 clients a map. Pure: no I/O, clock or logging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nlproxy.cluster.model import (
    EndpointSlice,
    IPFamily,
    LoadBalancing,
    Service,
    ServiceKey,
)
from nlproxy.proxy.hashring import table_size

SERVICE_BUDGET = 16384
"""Most elements of one Service's round-robin or consistent-hash maps (both families): four
consistent-hash ports of up to 128 endpoints (4096 slots each), or one of up to 512."""
NODE_BUDGET = 131072
"""Most elements of every opted-in Service's maps together on one node."""
SYNC_QUOTA = SERVICE_BUDGET
"""Most elements of tables the daemon's one sync builds or rebuilds: more (a burst of new
opted-in Services, or the first sync) is left for the following syncs, oldest first."""


@dataclass(frozen=True, slots=True)
class Fallback:
    """A Service planned with random choice although it asked for ``asked``."""

    asked: LoadBalancing
    elements: int
    reason: str
    """``service budget`` or ``node budget``."""

    def __str__(self) -> str:
        limit = SERVICE_BUDGET if self.reason == "service budget" else NODE_BUDGET
        where = "per Service" if self.reason == "service budget" else "for the node"
        return (
            f"{self.asked} needs {self.elements} elements, past the budget of {limit} {where}: "
            "random choice instead"
        )


def choice(svc: Service, default: LoadBalancing) -> LoadBalancing:
    """The choice ``svc`` asks for; ClientIP affinity wins over it (as in the planner)."""
    if svc.affinity_timeout is not None:
        return LoadBalancing.RANDOM
    return svc.load_balancing or default


def demand(svc: Service, slices: Sequence[EndpointSlice], algorithm: LoadBalancing) -> int:
    """The elements ``svc``'s own maps would hold with ``algorithm`` (an upper bound)."""
    if algorithm is LoadBalancing.RANDOM:
        return 0
    lists = 2 if svc.internal_policy_local or svc.external_policy_local else 1
    total = 0
    for family in {IPFamily.IPV4 if ip.version == 4 else IPFamily.IPV6 for ip in svc.cluster_ips}:
        for sp in svc.ports:
            name, proto = sp.ref.port_name, sp.ref.protocol
            count = sum(
                len(sl.endpoints)
                for sl in slices
                if sl.family is family
                and any(p.name == name and p.protocol is proto for p in sl.ports)
            )
            if count:
                per_list = (
                    table_size(count) if algorithm is LoadBalancing.CONSISTENT_HASH else count
                )
                total += lists * per_list
    return total


def admit(
    services: Mapping[ServiceKey, Service],
    demands: Mapping[ServiceKey, tuple[LoadBalancing, int]],
) -> dict[ServiceKey, Fallback]:
    """The opted-in Services to plan with random choice instead.

    Args:
        services: every Service (their creation time orders the node budget).
        demands: each opted-in Service's choice and :func:`demand`.
    """
    out: dict[ServiceKey, Fallback] = {}
    used = 0

    def age(key: ServiceKey) -> tuple[bool, str, ServiceKey]:
        created = services[key].created
        return (not created, created, key)  # without a timestamp: after those with one

    for key in sorted(demands, key=age):
        asked, elements = demands[key]
        if elements > SERVICE_BUDGET:
            out[key] = Fallback(asked, elements, "service budget")
        elif used + elements > NODE_BUDGET:
            out[key] = Fallback(asked, elements, "node budget")
        else:
            used += elements
    return out
