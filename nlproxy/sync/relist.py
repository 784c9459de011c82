"""What a relist leaves unchanged is not planned again.

A relist (after an API server restart, a watch's ``410 Gone``) delivers every object of a kind
anew. The cluster state keeps the object it holds when the listed copy is equal, so Services and
EndpointSlices that did not change keep their identity, and a change to this Node's labels,
taints or deletion alone marks no Service changed (``ClusterState.apply``); but the Node is
part of what every Service's plan depends on (``planner.plan_context``). A restarting API
server's node controller may well taint the Node meanwhile: the whole cluster was then planned
afresh to send nothing but new restart records.

Two narrowings, both on what the planner is given and never on what ``/healthz`` reads (the
loop reports the state's Node itself):

- :func:`for_planning`: the snapshot with its Node reduced to what planning reads (name, zone,
  addresses, pod CIDRs). Labels, taints and deletion only decide ``/healthz``'s
  ``nodeEligible``: a change to them changes no rule and no restart record.
- :func:`narrowed`: of the services reported changed, those whose Service or slice objects are
  not the ones the last plan was made from (by identity, at C speed: ``proxy/changes.py``).
  Applied only when the report would make the planner replan everything anyway, and only when
  nothing every plan depends on changed (else every service is replanned regardless).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Set

from nlproxy.cluster.model import ClusterSnapshot, Node, ServiceKey
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.incremental import REPLAN_SHARE, changed_services
from nlproxy.proxy.planner import Plan, plan_context


def planning_node(node: Node) -> Node:
    """``node`` with only what planning reads; ``node`` itself when it has nothing else."""
    if not node.labels and not node.taint_keys and not node.deleting:
        return node
    return Node(name=node.name, zone=node.zone, addresses=node.addresses, pod_cidrs=node.pod_cidrs)


def for_planning(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """``snapshot`` as the planner and the restart records are to see it (see the module
    docstring); ``snapshot`` itself when its Node has nothing planning does not read."""
    node = snapshot.node
    if node is None:
        return snapshot
    reduced = planning_node(node)
    return snapshot if reduced is node else dataclasses.replace(snapshot, node=reduced)


def narrowed(
    changed: Set[ServiceKey] | None,
    last: Plan | None,
    snapshot: ClusterSnapshot,
    config: ProxyConfig,
) -> Set[ServiceKey] | None:
    """Of ``changed``, the services whose objects are not those ``last`` was planned from;
    ``changed`` itself unless it would replan every service while what every plan depends on
    is the same (see the module docstring)."""
    if changed is None or last is None or last.live is None:
        return changed
    if len(changed) < max(REPLAN_SHARE * len(snapshot.services), 1):
        return changed
    if last.context != plan_context(snapshot, config):
        return changed
    return changed_services(last, snapshot) & changed
