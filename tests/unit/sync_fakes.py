"""The set-up the sync tests on the fakes share (``nft/fake.py``, ``conntrack/fake.py``): a
Syncer on them, where a new connection goes in the fake's table, the table as text, conntrack
flows, and the loop's runner."""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import ip_address

from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.conntrack.messages import Flow, FlowTuple
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Family, L4Proto
from nlproxy.nft.render import render_ruleset
from nlproxy.proxy.tracer import trace
from nlproxy.sync.fingerprint import take_record
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.syncer import Syncer
from tests.unit.incremental import CONFIG, NODE_ADDRS

CLIENT = ip_address("10.200.0.9")
LOCAL = (*NODE_ADDRS,)


def make(
    nft: FakeNftables, flows: FakeConntrack | None = None, quota: int | None = None, **kw: bool
) -> Syncer:
    kernel = SyncKernel(tables=nft.open, readback=nft, flows=flows or FakeConntrack())
    return Syncer(CONFIG, kernel, quota=quota, **kw)


def to(nft: FakeNftables, vip: str, dport: int, proto: L4Proto = L4Proto.TCP) -> set[str]:
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


def udp_flow(vip: str, backend: str, dport: int = 53, sport: int = 40000) -> Flow:
    orig = FlowTuple(
        src=CLIENT, dst=ip_address(vip), proto=int(L4Proto.UDP), sport=sport, dport=dport
    )
    reply = FlowTuple(
        src=ip_address(backend), dst=CLIENT, proto=int(L4Proto.UDP), sport=dport, dport=sport
    )
    return Flow(orig=orig, reply=reply)


async def here(fn: Callable[..., object], *args: object) -> object:
    """The loop's verifier calls, run on the loop (the fakes do no I/O)."""
    return fn(*args)


def tcp_flow(vip: str, backend: str, dport: int = 80, sport: int = 40000) -> Flow:
    orig = FlowTuple(
        src=CLIENT, dst=ip_address(vip), proto=int(L4Proto.TCP), sport=sport, dport=dport
    )
    reply = FlowTuple(
        src=ip_address(backend), dst=CLIENT, proto=int(L4Proto.TCP), sport=dport, dport=sport
    )
    return Flow(orig=orig, reply=reply)
