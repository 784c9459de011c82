"""A large repair is sent traffic first (``verify.staged``), on the fakes: the first batch is
whole by itself (the fake refuses a reference to what does not exist), every frontend is served
as the full table serves it, the firewall's sources are dropped as they are by the full table,
and only elements no packet needs (hairpin, cluster-ips, counters) come later."""

from __future__ import annotations

import dataclasses
from ipaddress import ip_address, ip_network

import pytest

from nlproxy.cluster.model import IPAddress, ServiceType
from nlproxy.cluster.state import ClusterState
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.conntrack.plan import programmed_frontends, stale_flow_filters
from nlproxy.nft import fake
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Element, Family, L4Proto, Operation, PackedRun, Ruleset, Table, Verb
from nlproxy.proxy.tracer import trace
from nlproxy.sync.fingerprint import take_record
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.result import as_programmed
from nlproxy.sync.syncer import Syncer
from nlproxy.sync.verify import LATER_SETS, STAGE_REPAIR_AT, staged, traffic_first
from tests.unit.builders import NODE, endpoint, eps_slice, port, service, upsert
from tests.unit.incremental import CONFIG, NODE_ADDRS, World, state_with_node

INSIDE = ip_address("10.200.0.9")  # in the LoadBalancer's source ranges
OUTSIDE = ip_address("10.201.0.9")  # not
LB = "192.168.99.1"
LOCAL = (*NODE_ADDRS,)


def _state() -> ClusterState:
    state = state_with_node()
    lb = service(
        "a",
        "lb",
        "172.30.0.1",
        ports=[port("a", "lb", "p80", 80, node_port=30080)],
        type=ServiceType.LOAD_BALANCER,
        load_balancer_ips=(ip_address(LB),),
        load_balancer_source_ranges=(ip_network("10.200.0.0/16"),),
    )
    sticky = service("a", "sticky", "172.30.0.2", affinity_timeout=600)
    plain = service("a", "plain", "172.30.0.3")
    state.apply(
        [
            upsert(lb),
            upsert(eps_slice("a", "lb", [endpoint("10.0.0.1", NODE), endpoint("10.0.0.2")])),
            upsert(sticky),
            upsert(eps_slice("a", "sticky", [endpoint("10.0.1.1", NODE)])),
            upsert(plain),
            upsert(eps_slice("a", "plain", [endpoint("10.0.2.1"), endpoint("10.0.2.2")])),
        ]
    )
    return state


def _to(rs: Ruleset, src: IPAddress, dst: str, dport: int) -> tuple[str, frozenset[str]]:
    got = trace(rs, src, L4Proto.TCP, ip_address(dst), dport, local_addrs=LOCAL)
    return str(got.verdict), got.endpoints


FRONTENDS = [("172.30.0.1", 80), (LB, 80), ("172.30.0.2", 80), ("172.30.0.3", 80)]


def test_the_first_batch_of_a_deleted_table_serves_as_the_whole_table() -> None:
    config = dataclasses.replace(CONFIG, service_counters=True)
    nft = FakeNftables("n")
    syncer = Syncer(config, SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack()))
    state = _state()
    snap = state.snapshot()
    syncer.sync(snap)
    whole = nft.dump(Family.IP)
    take_record(whole)  # the restart record: written again by the next sync, not the repair
    assert whole is not None
    served = {(src, f): _to(whole, src, *f) for f in FRONTENDS for src in (INSIDE, OUTSIDE)}
    assert served[(OUTSIDE, (LB, 80))][0] == "DROP"  # the firewall is in force
    assert served[(INSIDE, (LB, 80))][1]  # and lets the ranges through

    del nft.tables[Family.IP]  # another writer deleted the table
    syncer.repair_stage_at = 1
    version = syncer.version
    read = {f: syncer.read_back(f) for f in (Family.IP, Family.IP6)}
    repairs = {f: syncer.repair_ops(f, rs, version) or [] for f, rs in read.items()}
    first, later = traffic_first(repairs[Family.IP])
    assert first
    assert later
    assert isinstance(first[0].obj, Table)
    assert all(
        op.verb is Verb.ADD and isinstance(op.obj, Element | PackedRun) and op.obj.set in LATER_SETS
        for op in later
    )

    # The first batch alone: the fake refuses any reference to what is not there yet.
    alone = fake.apply(None, first)
    for (src, f), want in served.items():
        assert _to(alone, src, *f) == want, (src, f)

    nft.batches.clear()
    sent = syncer.repair(read, repairs, version, snap)
    assert [ops for _, ops in nft.batches] == [first, later]
    assert sent == sum(
        len(op.obj.keys) if isinstance(op.obj, PackedRun) else 1 for op in first + later
    )
    repaired = nft.dump(Family.IP)
    take_record(repaired)
    assert repaired == whole
    assert syncer.sync(snap, changed=set()).total_ops == 0  # the cache is the plan again


def test_a_small_repair_stays_one_batch() -> None:
    ops: list[Operation] = [
        Operation(Verb.ADD, Element(set="hairpin", key=(ip_address("10.0.0.1"),) * 2)),
        Operation(Verb.ADD, Element(set="cluster-ips", key=(ip_address("172.30.0.1"),))),
    ]
    assert staged({Family.IP: ops}) == ([(Family.IP, ops)], [])
    assert len(ops) < STAGE_REPAIR_AT
    firsts, laters = staged({Family.IP: ops, Family.IP6: []}, at=2)
    assert firsts == []
    assert laters == [(Family.IP, ops)]


@pytest.mark.parametrize("seed", range(4))
def test_a_deleted_tables_repair_cleans_up_the_flows_a_whole_pass_would(seed: int) -> None:
    """Preparing the repair of a deleted table reads only the UDP frontends it serves again
    (``cleanup.udp_part``), and finds the same stale flows as a pass over the whole plan."""
    nft = FakeNftables("n")
    syncer = Syncer(CONFIG, SyncKernel(tables=nft.open, readback=nft, flows=FakeConntrack()))
    world = World(seed, size=12)
    state = state_with_node()
    for _ in range(60):
        state.apply(world.step())
    snap = state.snapshot()
    result = syncer.sync(snap)
    assert result.plan is not None
    del nft.tables[Family.IP]
    version = syncer.version
    read = {f: syncer.read_back(f) for f in (Family.IP, Family.IP6)}
    repairs = {f: syncer.repair_ops(f, rs, version) or [] for f, rs in read.items()}
    prepared = syncer.prepare_repair(read, repairs, version)
    assert prepared is not None
    assert prepared.frontends is not None
    old, new = prepared.frontends
    whole = programmed_frontends([as_programmed(result.plan.rulesets[Family.IP])])
    addrs = NODE_ADDRS
    assert stale_flow_filters(old, new, node_addrs=addrs) == stale_flow_filters(
        programmed_frontends([]), whole, node_addrs=addrs
    )
    assert len(new) < len(whole)  # the TCP frontends were not gone through
