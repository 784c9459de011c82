"""A relist after an API server restart, through the real source, plans only what changed.

The source relists every kind from the in-repo API server (its history compacted meanwhile)
and decodes every object anew; the cluster state keeps the objects it holds when the copies are
equal, and the Syncer (on the fakes) replans only the Services whose objects changed, even
though this Node was tainted meanwhile: a taint alone marks no Service changed in the state
(``cluster/state.py``), and the planner is given the Node without it (``sync/relist.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import ip_network
from typing import Any

import pytest
import trio

from nlproxy.cluster.model import Change, Replace, ServiceKey
from nlproxy.cluster.state import ClusterState
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Family
from nlproxy.proxy import naming as n
from nlproxy.proxy.config import ProxyConfig
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.syncer import Syncer
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import NODE, eventually, populate, start_source
from tests.objects import endpoint, endpoint_slice, node

CONFIG = ProxyConfig(
    node_name=NODE,
    cluster_cidrs=(ip_network("10.0.0.0/8"),),
    service_cidrs=(ip_network("10.96.0.0/12"),),
)
KINDS = {"Service", "EndpointSlice", "Node", "ServiceCIDR"}


@pytest.mark.parametrize("moved", [False, True], ids=["nothing-changed", "one-slice-changed"])
async def test_a_relist_replans_only_the_services_that_changed(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery, moved: bool
) -> None:
    populate(apiserver, services=5)
    feed, _ = await start_source(nursery, api_client)
    state = ClusterState(NODE)
    syncer = Syncer(CONFIG, SyncKernel(tables=(nft := FakeNftables(n.TABLE)).open, readback=nft,
                                       flows=FakeConntrack()))  # fmt: skip
    listed = state.apply(feed.batches[0])
    first = syncer.sync(state.snapshot(), changed=listed)
    assert first.plan is not None
    assert len(first.plan.fragments[Family.IP]) == 5
    before = dict(first.plan.fragments[Family.IP])
    await eventually(lambda: apiserver.active_watches == 4)

    apiserver.stop()
    tainted = node(NODE)
    tainted["spec"]["taints"] = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]
    apiserver.store.put("nodes", tainted)
    if moved:
        slice_ = endpoint_slice("svc-2", [endpoint("10.0.0.9", "node-a")], name="svc-2-abc")
        apiserver.store.put("endpointslices", slice_)
    apiserver.store.compact()
    apiserver.start()

    changed: set[ServiceKey] = set()
    relisted: set[str] = set()
    with trio.fail_after(60):
        while relisted != KINDS:
            batch: Sequence[Change] = await feed.batch()
            relisted |= {c.kind for c in batch if isinstance(c, Replace)}
            changed |= state.apply(batch)
    svc_2 = ServiceKey(namespace="default", name="svc-2")
    assert changed == ({svc_2} if moved else set())  # the taint alone marks no Service
    this = state.snapshot().node
    assert this is not None
    assert this.taint_keys == ("node.kubernetes.io/unreachable",)

    result = syncer.sync(state.snapshot(), changed=changed)

    assert result.incremental
    assert (result.total_ops > 0) == moved
    assert result.plan is not None
    after = result.plan.fragments[Family.IP]
    replanned = {k for k in after if after[k] is not before[k]}
    assert replanned == ({svc_2} if moved else set())
