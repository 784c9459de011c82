"""What a one-shot sync plans from: the cluster state of a source's objects, and what is left out.

Shared by ``run --once`` (``once.py``) and ``nlproxy plan`` (``plan.py``), so the plan previews
the very snapshot the sync then programs: the same state, the node's interface addresses when
``--nodeport-addresses`` names ranges, and the same list of objects left out (invalid objects,
orphan slices, Services refused by another's claim, NodePort address gaps). The objects come
from a manifests directory (the loader's changes) or from one list of each kind from the API
server (:func:`api_changes`). No output: the callers print.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nlproxy.cluster.model import ClusterSnapshot, IPAddress, Replace
from nlproxy.config import Settings, external_networks


@dataclass(frozen=True, slots=True, kw_only=True)
class Inputs:
    """A snapshot to plan and what the source said beside it.

    Attributes:
        snapshot: the valid objects, as the state settled them.
        problems: each object left out, named (``run --once`` exits 3 for any).
        warnings: each NodePort address gap (a ``--nodeport-addresses`` range matching nothing).
    """

    snapshot: ClusterSnapshot
    problems: tuple[str, ...]
    warnings: tuple[str, ...]


def local_addresses(s: Settings) -> tuple[IPAddress, ...] | None:
    """The addresses on this node's interfaces when ``--nodeport-addresses`` names ranges
    (NodePorts answer on those in range), else None: not needed.

    Raises:
        ConfigError: the namespace cannot be entered.
    """
    if not (s.proxy.nodeport_cidrs(4) or s.proxy.nodeport_cidrs(6)):
        return None
    from nlproxy.inspect.rtnl import interface_addresses

    return interface_addresses(s.netns)


def cluster_inputs(
    s: Settings,
    changes: Sequence[Replace],
    load_errors: Sequence[str] = (),
    *,
    local: tuple[IPAddress, ...] | None = None,
) -> Inputs:
    """The state of ``changes`` (one ``Replace`` per kind) on this node, as the sync sees it.

    Args:
        s: the settings (node name, service and external ranges, NodePort addresses).
        changes: the source's objects.
        load_errors: file-level problems the loader named.
        local: :func:`local_addresses`.
    """
    from nlproxy.cluster.state import ClusterState
    from nlproxy.proxy.addresses import nodeport_gaps

    cfg, pcfg = s.daemon, s.proxy
    state = ClusterState(
        cfg.node_name,
        external_ip_cidrs=external_networks(cfg),
        service_cidrs=pcfg.service_cidrs,
        cluster_cidrs=pcfg.cluster_cidrs,
        node_port_range=cfg.node_port_range,
    )
    state.apply(changes)
    if local is not None:
        state.set_local_addresses(local)
    gaps = tuple(str(gap) for gap in nodeport_gaps(state.snapshot(), pcfg).values())
    problems = [
        *load_errors,
        *state.invalid.values(),
        *state.orphans().values(),
        *state.refused,
    ]
    return Inputs(snapshot=state.snapshot(), problems=tuple(map(str, problems)), warnings=gaps)


def api_changes(s: Settings) -> list[Replace]:
    """One complete list of each kind the daemon watches (Services, EndpointSlices, this Node,
    ServiceCIDRs), with the daemon's selectors, as one ``Replace`` each.

    An optional kind this identity may not read, or the cluster does not serve, is empty, as
    the daemon starts without it.

    Raises:
        ConfigError: the kubeconfig cannot be loaded.
        KubeApiError: the API server could not be reached or refused a required kind.
    """
    from nlproxy.cluster.kube import api_client_from_config, kinds
    from nlproxy.cluster.kube_http import Forbidden, Http, NotServed, list_kind
    from nlproxy.config.api_source import api_source

    at = api_source(s.daemon)  # run's rule: a file's kubeconfig absent here is skipped
    client = api_client_from_config(at.kubeconfig, server=at.api_server)
    # urllib3 warns of each retry: a command that lists once says what failed in one line.
    pool_log = logging.getLogger("urllib3.connectionpool")
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)
    try:
        http = Http(client)
        out: list[Replace] = []
        for spec in kinds(s.daemon.node_name, s.service_proxy_name):
            try:
                listing = list_kind(http, spec, 500)
            except (Forbidden, NotServed):
                if not spec.optional:
                    raise
                out.append(Replace(kind=spec.kind, changes=()))
                continue
            out.append(Replace(kind=spec.kind, changes=listing.changes))
        return out
    finally:
        pool_log.setLevel(level)
        untyped: Any = client  # the kubernetes package is untyped
        untyped.close()
