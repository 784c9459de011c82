"""The set-up the sync tests on the fakes share (``nft/fake.py``, ``conntrack/fake.py``): a
Syncer and a loop on them, where a new connection goes in the fake's table, the table as text,
conntrack flows, and the Services most of them program."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from ipaddress import ip_address
from typing import Any

from prometheus_client import CollectorRegistry

from nlproxy.cluster.model import Change, ClusterSnapshot, EndpointSlice, Service, ServiceKey
from nlproxy.cluster.state import ClusterState
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.conntrack.messages import Flow, FlowTuple
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Family, L4Proto
from nlproxy.nft.render import render_ruleset
from nlproxy.proxy import naming as n
from nlproxy.proxy.tracer import trace
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import Metrics
from nlproxy.sync.fingerprint import take_record
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.loop import SyncLoop
from nlproxy.sync.syncer import Syncer, SyncResult
from tests.unit.builders import endpoint, eps_slice, port, service, upsert
from tests.unit.incremental import CONFIG, NODE_ADDRS, state_with_node

CLIENT = ip_address("10.200.0.9")
LOCAL = (*NODE_ADDRS,)
UDP, TCP = L4Proto.UDP, L4Proto.TCP


def make(
    nft: FakeNftables, flows: FakeConntrack | None = None, quota: int | None = None, **kw: bool
) -> Syncer:
    kernel = SyncKernel(tables=nft.open, readback=nft, flows=flows or FakeConntrack())
    return Syncer(CONFIG, kernel, quota=quota, **kw)


def synced_once(snapshot: ClusterSnapshot) -> tuple[FakeNftables, Syncer]:
    """A fresh fake table, and a Syncer that has programmed ``snapshot`` into it."""
    nft = FakeNftables(n.TABLE)
    syncer = make(nft)
    syncer.sync(snapshot)
    return nft, syncer


def to(nft: FakeNftables, vip: str, dport: int, proto: L4Proto = TCP) -> set[str]:
    """Where a new connection from ``CLIENT`` to ``vip:dport`` goes in the fake's table."""
    rs = nft.ruleset(Family.IP)
    assert rs is not None
    return set(trace(rs, CLIENT, proto, ip_address(vip), dport, local_addrs=LOCAL).endpoints)


def text(nft: FakeNftables) -> str:
    """The fake's IPv4 table as ``nlproxy rules`` prints it, without the restart record."""
    rs = nft.dump(Family.IP)
    take_record(rs)
    assert rs is not None
    return render_ruleset(rs)


def flow(
    vip: str, backend: str, proto: L4Proto = UDP, dport: int | None = None, sport: int = 40000
) -> Flow:
    """``CLIENT``'s flow to ``vip`` that ``backend`` answers; ``dport`` defaults to 53 for UDP
    and 80 for TCP."""
    dport = dport if dport is not None else 53 if proto is UDP else 80
    orig = FlowTuple(src=CLIENT, dst=ip_address(vip), proto=int(proto), sport=sport, dport=dport)
    reply = FlowTuple(
        src=ip_address(backend), dst=CLIENT, proto=int(proto), sport=dport, dport=sport
    )
    return Flow(orig=orig, reply=reply)


def dns(ns: str, name: str, cip: str, **overrides: Any) -> Service:
    """A Service whose one port is ``dns``, 53/UDP."""
    return service(ns, name, cip, ports=[port(ns, name, "dns", 53, "UDP")], **overrides)


def dns_slice(ns: str, name: str, ips: Sequence[str]) -> EndpointSlice:
    return eps_slice(ns, name, [endpoint(ip) for ip in ips], ports=(("dns", 53, "UDP"),))


WEB_ENDPOINTS = ("10.1.0.1", "10.1.0.2", "10.1.0.3")


def web_changes(i: int) -> list[Change]:
    """Service ``a/web{i}`` (172.30.0.{i+1}:80) and its slice of one endpoint,
    ``WEB_ENDPOINTS[i]``."""
    return [
        upsert(service("a", f"web{i}", f"172.30.0.{i + 1}")),
        upsert(eps_slice("a", f"web{i}", [endpoint(WEB_ENDPOINTS[i])])),
    ]


def web_state() -> ClusterState:
    """The node and the three ``web`` Services, in a cluster state."""
    state = state_with_node()
    state.apply([change for i in range(len(WEB_ENDPOINTS)) for change in web_changes(i)])
    return state


def webs() -> ClusterSnapshot:
    """The snapshot of :func:`web_state`."""
    return web_state().snapshot()


async def here(fn: Callable[..., object], *args: object) -> object:
    """The loop's verifier calls, run on the loop (the fakes do no I/O)."""
    return fn(*args)


def fake_loop(
    state: ClusterState,
    syncer: Syncer,
    on_synced: Callable[[SyncResult, set[ServiceKey] | None], None],
    **kw: Any,
) -> SyncLoop:
    """A loop of ``syncer`` over ``state`` as the daemon runs it, on the fakes: at most a sync a
    second, a verify an hour (so none comes unasked), everything on the trio loop."""
    return SyncLoop(
        state,
        syncer,
        health=HealthState(grace_seconds=120),
        metrics=Metrics(CollectorRegistry()),
        min_interval=1.0,
        sync_period=3600.0,
        on_synced=on_synced,
        in_thread=False,
        runner=here,
        **kw,
    )
