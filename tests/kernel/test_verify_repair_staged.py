"""A deleted table is repaired traffic first: the first batch carries what a packet needs to
reach an endpoint (chains, dispatch and backends maps, firewall, rules), real traffic answers
once it is in, and the elements no packet needs (hairpin, cluster-ips, counters) follow in a
batch of their own."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from ipaddress import ip_network
from pathlib import Path

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import ClusterSnapshot
from nlproxy.cluster.state import ClusterState
from nlproxy.demo.echo import Result
from nlproxy.demo.testbed import Testbed
from nlproxy.nft.ir import Element, Family, Operation, PackedRun, Ruleset, Table, Verb
from nlproxy.nft.reconcile import count_ops
from nlproxy.nft.tables import Tables
from nlproxy.proxy import naming as n
from nlproxy.proxy.config import ProxyConfig
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.syncer import Syncer
from nlproxy.sync.verify import LATER_SETS
from tests.kernel import topo
from tests.kernel.topo import PORTS, SLICE_PORTS, answers, ask, results
from tests.objects import endpoint, endpoint_slice, service

testbed = topo.testbed

VIP = "10.96.0.10"


class Watched:
    """A table's backend that calls ``before`` ahead of each batch it is handed."""

    def __init__(self, inner: Tables, before: Callable[[Sequence[Operation]], None]) -> None:
        self.inner = inner
        self.before = before
        self.table = inner.table

    def apply(self, ops: Sequence[Operation], known: Ruleset | None = None) -> object:
        self.before(ops)
        return self.inner.apply(ops, known)

    def check(self, ops: Sequence[Operation], known: Ruleset | None = None) -> None:
        self.inner.check(ops, known)

    def known(self) -> Ruleset:
        return self.inner.known()

    def forget(self) -> None:
        self.inner.forget()

    def close(self) -> None:
        self.inner.close()


def _snapshot(tb: Testbed, scratch: Path) -> ClusterSnapshot:
    b, r = tb.pod("pod-b"), tb.pod("pod-r")
    eps = [endpoint(str(b.ipv4), b.node), endpoint(str(r.ipv4), r.node)]
    objects = [
        tb.node_manifest(),
        service("web", VIP, PORTS),
        endpoint_slice("web", eps, SLICE_PORTS),
    ]
    state = ClusterState(tb.node.name)
    state.apply(load_manifests(topo.write_manifests(scratch, objects)).changes)
    return state.snapshot()


def _later(ops: Sequence[Operation]) -> bool:
    return all(
        op.verb is Verb.ADD and isinstance(op.obj, Element | PackedRun) and op.obj.set in LATER_SETS
        for op in ops
    )


def _elements(tb: Testbed, name: str, kind: str = "set") -> str:
    text = topo.sh(tb.node.netns, "nft", "list", kind, "ip", n.TABLE, name)
    return text.split("elements = ", 1)[1] if "elements = " in text else ""


def test_a_deleted_table_carries_traffic_after_the_first_batch(
    testbed: Testbed, tmp_path: Path
) -> None:
    config = ProxyConfig(
        node_name=testbed.node.name,
        cluster_cidrs=(ip_network(testbed.cluster_cidr()),),
        service_cidrs=(ip_network(testbed.service_cidr()),),
        service_counters=True,
    )
    batches: list[list[Operation]] = []
    between: dict[str, object] = {}

    def before(ops: Sequence[Operation]) -> None:
        if len(batches) == 1 and _later(ops):  # the first batch is in, the later one is not
            a = testbed.pod("pod-a")
            between["answers"] = answers(ask("tcp", a.netns, VIP, 80, n=8))
            between["hairpin"] = _elements(testbed, n.HAIRPIN)
            between["backends"] = _elements(testbed, n.BACKENDS, "map")
        batches.append(list(ops))

    kernel = real_kernel(testbed.node.netns)

    def tables(table: Table) -> Tables:
        inner = kernel.tables(table)
        return Watched(inner, before) if table.family is Family.IP else inner

    syncer = Syncer(config, dataclasses.replace(kernel, tables=tables))
    snap = _snapshot(testbed, tmp_path / "m")
    try:
        syncer.sync(snap)
        a = testbed.pod("pod-a")
        assert set(answers(ask("tcp", a.netns, VIP, 80, n=8))) <= {"pod-b", "pod-r"}
        topo.sh(testbed.node.netns, "nft", "delete", "table", "ip", n.TABLE)
        assert results(ask("tcp", a.netns, VIP, 80, n=1)) != {Result.ANSWERED}
        batches.clear()

        syncer.repair_stage_at = 1  # this table is small: stage it all the same
        version = syncer.version
        read = {f: syncer.read_back(f) for f in (Family.IP, Family.IP6)}
        assert read[Family.IP] is None
        repairs = {f: syncer.repair_ops(f, rs, version) or [] for f, rs in read.items()}
        prepared = syncer.prepare_repair(read, repairs, version)
        sent = syncer.repair(read, repairs, version, snap, prepared)
    finally:
        syncer.close()

    assert len(batches) == 2, [len(b) for b in batches]
    first, later = batches
    assert sent == count_ops(first) + count_ops(later)
    assert isinstance(first[0].obj, Table)  # self-contained: the table, chains, sets, rules
    assert _later(later)
    assert {op.obj.set for op in later if isinstance(op.obj, Element | PackedRun)} >= {
        n.HAIRPIN,
        n.CLUSTER_IPS,
    }
    assert not any(
        isinstance(op.obj, Element | PackedRun) and op.obj.set in LATER_SETS for op in first
    )
    # Between the batches: real traffic is served, the backends are there, hairpin is not yet.
    served = between["answers"]
    assert isinstance(served, dict)
    assert served
    assert set(served) <= {"pod-b", "pod-r"}
    assert between["backends"]
    assert not between["hairpin"]
    # After: the table is whole again, and a sync finds nothing to send.
    assert str(testbed.pod("pod-b").ipv4) in _elements(testbed, n.HAIRPIN)
    assert set(answers(ask("tcp", a.netns, VIP, 80, n=8))) <= {"pod-b", "pod-r"}
