"""The start-up sweep of stale flows (``sync/cleanup.py``'s ``FlowCleanup.sweep``).

A process stopped after a commit and before its conntrack cleanup leaves the flows of the
endpoints that commit removed; the next process finds the tables already without them, so no
before/after comparison of its own names them. Its first sync that knows what is programmed
compares the flows with it instead: a UDP or SCTP flow DNAT'd to one of nlproxy's frontends by
a backend that frontend no longer has goes, and so does a UDP flow to a frontend with backends
that was never DNAT'd; every other flow stays. Fakes only: the kernel test is
``tests/kernel/test_sync_restart_flows.py``.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence
from ipaddress import ip_address

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import Change, Endpoint, EndpointSlice, ObjectRef, Service, Upsert
from nlproxy.cluster.state import ClusterState
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.conntrack.messages import IPS_DST_NAT, Flow, FlowFilter, FlowTuple
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import L4Proto
from nlproxy.proxy import naming as n
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import Metrics
from nlproxy.sync.cleanup import SWEEP_MAX_DUMPS, SWEEP_TRIES, sweep_dumps
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.loop import SyncLoop
from nlproxy.sync.syncer import Syncer
from tests.unit.builders import NODE, endpoint, eps_slice, node, port, service, upsert
from tests.unit.incremental import CONFIG, state_with_node

CLIENT = ip_address("10.200.0.9")
NODE_IP = "192.168.0.2"
VIP, OTHER_VIP = "172.30.0.10", "172.30.0.11"
A, B = "10.1.0.1", "10.1.0.2"


def make(nft: FakeNftables, flows: FakeConntrack, **kw: bool) -> Syncer:
    return Syncer(CONFIG, SyncKernel(tables=nft.open, readback=nft, flows=flows), **kw)


def flow(
    dst: str, backend: str, *, proto: L4Proto = L4Proto.UDP, dport: int = 53, sport: int = 40000
) -> Flow:
    """A flow from ``CLIENT`` to ``dst:dport``, DNAT'd to ``backend:53`` (not DNAT'd when
    ``backend`` is ``dst``)."""
    p = int(proto)
    natted = backend != dst
    orig = FlowTuple(src=CLIENT, dst=ip_address(dst), proto=p, sport=sport, dport=dport)
    reply = FlowTuple(
        src=ip_address(backend), dst=CLIENT, proto=p, sport=53 if natted else dport, dport=sport
    )
    return Flow(orig=orig, reply=reply, status=IPS_DST_NAT if natted else 0)


def dns(name: str, vip: str, proto: str = "UDP", node_port: int | None = None) -> Service:
    return service("a", name, vip, ports=[port("a", name, "dns", 53, proto, node_port=node_port)])


def dns_slice(name: str, ips: Sequence[str], proto: str = "UDP") -> EndpointSlice:
    return eps_slice("a", name, [endpoint(ip) for ip in ips], ports=(("dns", 53, proto),))


def programmed_then_stopped(
    nft: FakeNftables, before: ClusterState, after: Sequence[EndpointSlice]
) -> None:
    """A process that programmed ``before``, then committed ``after`` and was stopped before
    its cleanup (its conntrack table saw none of the flows the test puts in the next's)."""
    gone = make(nft, FakeConntrack())
    gone.sync(before.snapshot())
    changed = before.apply([upsert(s) for s in after])
    assert gone.sync(before.snapshot(), changed=changed).total_ops > 0
    gone.close()


@pytest.mark.parametrize("trusted", [False, True], ids=["read-back", "records-trusted"])
def test_the_next_process_deletes_the_removed_endpoints_flows(trusted: bool) -> None:
    nft = FakeNftables(n.TABLE)
    state = state_with_node()
    state.apply(
        [
            upsert(dns("dns", VIP)),
            upsert(dns_slice("dns", [A, B])),
            upsert(dns("other", OTHER_VIP)),  # pod A serves another Service, still
            upsert(dns_slice("other", [A])),
        ]
    )
    programmed_then_stopped(nft, state, [dns_slice("dns", [B])])

    stale = [
        flow(VIP, A),
        flow(VIP, VIP, sport=40001),  # confirmed while nothing answered: never DNAT'd
    ]
    kept = [
        flow(VIP, B, sport=40002),  # a live backend's
        flow(OTHER_VIP, A, sport=40003),  # the other Service still has pod A
        flow("10.99.0.1", A, sport=40004),  # not nlproxy's frontend
        flow(VIP, A, dport=54, sport=40005),  # not the Service's port
        flow(VIP, A, proto=L4Proto.TCP, sport=40006),  # TCP: only with flush_tcp
    ]
    flows = FakeConntrack([*stale, *kept])
    # The daemon's Syncer: records kept, a trusted restart planned by its second sync.
    syncer = make(nft, flows, plan_after_restart=trusted)
    first = syncer.sync(state.snapshot())
    assert first.total_ops == 0  # the tables already hold that plan
    if trusted:
        assert first.restarted
        assert first.plan is None
        assert flows.flows == [*stale, *kept]  # nothing is known to be programmed yet
        second = syncer.sync(state.snapshot(), changed=set())
        assert second.total_ops == 0
        assert second.conntrack_deleted == len(stale)
    else:
        assert first.conntrack_deleted == len(stale)
    assert sorted(map(str, flows.deleted)) == sorted(map(str, stale))
    assert flows.flows == kept

    # Once per process: the next syncs do not look again.
    late = flow(VIP, A, sport=40007)
    flows.flows.append(late)
    syncer.sync(state.snapshot(), changed=set())
    assert late in flows.flows


def test_node_port_and_sctp_flows_are_swept_too() -> None:
    nft = FakeNftables(n.TABLE)
    state = state_with_node()
    state.apply(
        [
            upsert(dns("np", VIP, node_port=30053)),
            upsert(dns_slice("np", [A, B])),
            upsert(dns("sctp", OTHER_VIP, proto="SCTP")),
            upsert(dns_slice("sctp", [A, B], proto="SCTP")),
        ]
    )
    programmed_then_stopped(nft, state, [dns_slice("np", [B]), dns_slice("sctp", [B], "SCTP")])
    sctp = L4Proto.SCTP
    stale = [
        flow(NODE_IP, A, dport=30053),
        flow(VIP, A, sport=40001),
        flow(OTHER_VIP, A, proto=sctp, sport=40002),
    ]
    kept = [
        flow(NODE_IP, B, dport=30053, sport=40003),
        flow(OTHER_VIP, B, proto=sctp, sport=40004),
        flow("192.168.0.99", A, dport=30053, sport=40005),  # not a node address
    ]
    flows = FakeConntrack([*stale, *kept])
    result = make(nft, flows).sync(state.snapshot())
    assert result.conntrack_deleted == len(stale)
    assert flows.flows == kept


def test_flush_tcp_sweeps_tcp_flows_as_well() -> None:
    nft = FakeNftables(n.TABLE)
    state = state_with_node()
    state.apply([upsert(dns("web", VIP, proto="TCP")), upsert(dns_slice("web", [A, B], "TCP"))])
    programmed_then_stopped(nft, state, [dns_slice("web", [B], "TCP")])
    stale = flow(VIP, A, proto=L4Proto.TCP)
    live = flow(VIP, B, proto=L4Proto.TCP, sport=40001)
    plain = FakeConntrack([stale, live])
    make(nft, plain).sync(state.snapshot())
    assert plain.flows == [stale, live]  # TCP clients see a reset: left alone by default
    flushing = FakeConntrack([stale, live])
    make(nft, flushing, flush_tcp=True).sync(state.snapshot())
    assert flushing.flows == [live]


def test_a_sweep_that_fails_does_not_fail_the_sync() -> None:
    nft = FakeNftables(n.TABLE)
    state = state_with_node()
    state.apply([upsert(dns("dns", VIP)), upsert(dns_slice("dns", [A, B]))])
    programmed_then_stopped(nft, state, [dns_slice("dns", [B])])
    stale = flow(VIP, A)
    flows = FakeConntrack([stale])
    flows.fail_next = True  # out of descriptors: the filters are kept pending
    syncer = make(nft, flows)
    result = syncer.sync(state.snapshot())
    assert result.conntrack_deleted == 0
    assert flows.flows == [stale]
    assert syncer.cleanup.pending
    # The next sync finishes what is still stale.
    assert syncer.sync(state.snapshot(), changed=set()).conntrack_deleted == 1
    assert flows.flows == []


@pytest.mark.parametrize("services", [2, 40], ids=["a-dump-per-frontend", "a-dump-per-protocol"])
def test_the_sweep_dumps_per_frontend_while_they_are_few(services: int) -> None:
    nft = FakeNftables(n.TABLE)
    state = state_with_node()
    vips = [f"172.30.1.{i}" for i in range(services)]
    for i, vip in enumerate(vips):
        state.apply([upsert(dns(f"s{i}", vip)), upsert(dns_slice(f"s{i}", [A, B]))])
    last = f"s{services - 1}"
    programmed_then_stopped(nft, state, [dns_slice(last, [B])])
    stale = flow(vips[-1], A)
    kept = [flow(vips[-1], B, sport=40001), flow(vips[0], A, sport=40002)]
    flows = FakeConntrack([stale, *kept])
    syncer = make(nft, flows)
    assert syncer.sync(state.snapshot()).conntrack_deleted == 1
    assert flows.flows == kept
    tables = [rs for rs in syncer._programmed.values() if rs is not None]
    dumps = sweep_dumps(tables, ("udp", "sctp"))
    if services <= SWEEP_MAX_DUMPS:
        assert sorted(str(d.orig_dst) for d in dumps) == sorted(vips)
        assert {(d.proto, d.orig_dport) for d in dumps} == {("udp", 53)}
    else:
        assert dumps == [FlowFilter(proto="udp"), FlowFilter(proto="sctp")]


class RunsOut(FakeConntrack):
    """The first listing runs out of file descriptors, as a dump's socket can."""

    def __init__(self, flows: Sequence[Flow]) -> None:
        super().__init__(flows)
        self.failures = 1

    def list(self, flt: FlowFilter | None = None) -> Iterator[Flow]:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().list(flt)


def test_a_sweep_that_could_not_list_is_tried_by_the_next_sync() -> None:
    nft = FakeNftables(n.TABLE)
    state = state_with_node()
    state.apply([upsert(dns("dns", VIP)), upsert(dns_slice("dns", [A, B]))])
    programmed_then_stopped(nft, state, [dns_slice("dns", [B])])
    stale, live = flow(VIP, A), flow(VIP, B, sport=40001)
    flows = RunsOut([stale, live])
    syncer = make(nft, flows)
    assert syncer.sync(state.snapshot()).conntrack_deleted == 0
    assert flows.flows == [stale, live]
    assert syncer.sync(state.snapshot(), changed=set()).conntrack_deleted == 1
    assert flows.flows == [live]


@pytest.mark.parametrize("after", [[B], []], ids=["one-left", "none-left"])
def test_a_frontend_that_lost_every_endpoint_is_swept_too(after: list[str]) -> None:
    """The worst case of all: the commit took the frontend's last endpoint, so it is in the
    no-endpoint map, not the dispatch map; its flows to the removed pod go all the same."""
    nft = FakeNftables(n.TABLE)
    state = state_with_node()
    state.apply([upsert(dns("dns", VIP)), upsert(dns_slice("dns", [A, B]))])
    programmed_then_stopped(nft, state, [dns_slice("dns", after)])
    stale = flow(VIP, A)
    flows = FakeConntrack([stale])
    make(nft, flows).sync(state.snapshot())
    assert flows.flows == []


LOCAL, REMOTE, LOCAL_TOO = "10.1.0.1", "10.1.0.2", "10.1.0.3"


def outside_flow(backend: str, sport: int = 4000) -> Flow:
    """A UDP flow from outside the cluster to the node's address, port 30053, DNAT'd to
    ``backend:53``."""
    outside = ip_address("203.0.113.5")
    orig = FlowTuple(src=outside, dst=ip_address(NODE_IP), proto=17, sport=sport, dport=30053)
    reply = FlowTuple(src=ip_address(backend), dst=outside, proto=17, sport=53, dport=sport)
    return Flow(orig=orig, reply=reply, status=IPS_DST_NAT)


def kept_by_the_next_process(nft: FakeNftables, state: ClusterState, flow: Flow) -> bool:
    """A process programs ``state`` and stops; whether the next one's sweep keeps ``flow``."""
    first = make(nft, FakeConntrack())
    first.sync(state.snapshot())
    first.close()
    flows = FakeConntrack([flow])
    make(nft, flows).sync(state.snapshot())
    return flows.flows == [flow]


@pytest.mark.parametrize(
    "local_endpoints",
    [
        # A terminating local endpoint: the Local policy's fallback, not a Cluster endpoint
        # while another node's is ready.
        [endpoint(LOCAL, node=NODE, ready=False, serving=True, terminating=True)],
        # Local endpoints hinted to another zone: Local ignores the hints, Cluster follows them.
        [endpoint(ip, node=NODE, hints_zones=["zone-b"]) for ip in (LOCAL, LOCAL_TOO)],
    ],
    ids=["terminating-local", "hinted-elsewhere"],
)
def test_a_flow_to_an_endpoint_only_the_local_policy_has_stays(
    local_endpoints: list[Endpoint],
) -> None:
    nft = FakeNftables(n.TABLE)
    state = ClusterState(NODE)
    state.apply(
        [Upsert(ref=ObjectRef(kind="Node", namespace="", name=NODE), obj=node(zone="zone-a"))]
    )
    svc = service(
        "a", "dns", VIP, ports=[port("a", "dns", "dns", 53, "UDP", node_port=30053)],
        external_policy_local=True, health_check_node_port=30000,
    )  # fmt: skip
    remote = endpoint(REMOTE, hints_zones=["zone-a"])
    sl = eps_slice("a", "dns", [*local_endpoints, remote], ports=(("dns", 53, "UDP"),))
    state.apply([upsert(svc), upsert(sl)])
    assert kept_by_the_next_process(nft, state, outside_flow(LOCAL))


async def test_an_idle_loop_tries_a_sweep_that_could_not_list_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A periodic verify of an unchanged state plans nothing when no one else committed
    (``loop.py``): a start-up sweep that could not list is a chore it still owes."""
    nft = FakeNftables(n.TABLE)
    prior = state_with_node()
    prior.apply([upsert(dns("dns", VIP)), upsert(dns_slice("dns", [A, B]))])
    programmed_then_stopped(nft, prior, [dns_slice("dns", [B])])
    stale, live = flow(VIP, A), flow(VIP, B, sport=40001)
    flows = RunsOut([stale, live])
    loop = SyncLoop(
        state_with_node(),
        make(nft, flows, record=False),
        health=HealthState(grace_seconds=120),
        metrics=Metrics(CollectorRegistry()),
        min_interval=1.0,
        sync_period=60.0,
        in_thread=False,
        quiet=lambda: True,  # no one else commits
    )
    send, recv = trio.open_memory_channel[Sequence[Change]](10)
    await send.send([upsert(dns("dns", VIP)), upsert(dns_slice("dns", [B]))])
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        await trio.sleep(3 * 60.0)  # three sync periods, nothing changes
        nursery.cancel_scope.cancel()
    assert flows.flows == [live]


def test_a_sweep_that_keeps_running_out_is_tried_a_bounded_number_of_times() -> None:
    """Each try makes an idle node's next verify a sync: after ``SWEEP_TRIES`` the sweep is
    owed no more (the flows it could not list are left to their timeouts)."""
    nft = FakeNftables(n.TABLE)
    state = state_with_node()
    state.apply([upsert(dns("dns", VIP)), upsert(dns_slice("dns", [A, B]))])
    programmed_then_stopped(nft, state, [dns_slice("dns", [B])])
    flows = RunsOut([flow(VIP, A)])
    flows.failures = 100
    syncer = make(nft, flows)
    syncer.sync(state.snapshot())
    for _ in range(SWEEP_TRIES - 1):
        assert syncer.cleanup.owed
        syncer.sync(state.snapshot(), changed=set())
    assert not syncer.cleanup.owed
    assert flows.failures == 100 - SWEEP_TRIES


def test_a_flow_another_frontend_on_the_node_address_serves_stays() -> None:
    """An external IP that is the node's address, on a port that is also another Service's
    NodePort with no endpoints: the flow is the external IP's (it DNATs first), not stale."""
    nft = FakeNftables(n.TABLE)
    state = state_with_node()
    ext = service(
        "a", "ext", VIP, ports=[port("a", "ext", "dns", 30053, "UDP")], external_ips=[NODE_IP]
    )
    state.apply(
        [
            upsert(ext),
            upsert(eps_slice("a", "ext", [endpoint(A)], ports=(("dns", 53, "UDP"),))),
            upsert(dns("np", OTHER_VIP, node_port=30053)),
            upsert(dns_slice("np", [])),
        ]
    )
    assert kept_by_the_next_process(nft, state, outside_flow(A))


@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_a_sync_deletes_the_flows_of_an_endpoint_only_the_local_policy_had(
    incremental: bool,
) -> None:
    """Not the sweep: a sync's own cleanup. A local endpoint hinted to another zone is in the
    Local policy's maps only; when it goes, its flows go, and another local endpoint's stay."""
    nft = FakeNftables(n.TABLE)
    state = ClusterState(NODE)
    zone = node(zone="zone-a")
    state.apply([Upsert(ref=ObjectRef(kind="Node", namespace="", name=NODE), obj=zone)])
    svc = service(
        "a", "dns", VIP, ports=[port("a", "dns", "dns", 53, "UDP", node_port=30053)],
        external_policy_local=True, health_check_node_port=30000,
    )  # fmt: skip

    def slice_of(local: list[str]) -> EndpointSlice:
        eps = [endpoint(ip, node=NODE, hints_zones=["zone-b"]) for ip in local]
        eps.append(endpoint(REMOTE, hints_zones=["zone-a"]))
        return eps_slice("a", "dns", eps, ports=(("dns", 53, "UDP"),))

    state.apply([upsert(svc), upsert(slice_of([LOCAL, LOCAL_TOO]))])
    gone, kept = outside_flow(LOCAL, 4000), outside_flow(LOCAL_TOO, 4001)
    flows = FakeConntrack([gone, kept])
    syncer = make(nft, flows, incremental=incremental)
    syncer.sync(state.snapshot())
    assert flows.flows == [gone, kept]
    changed = state.apply([upsert(slice_of([LOCAL_TOO]))])
    syncer.sync(state.snapshot(), changed=changed)
    assert flows.flows == [kept]
