"""New planner settings taken by a running Syncer and loop (a ``--config`` file applied in place):
the next sync plans afresh and sends only what differs, one batch per family, leaving the table
exactly as a Syncer started with the new settings would have programmed it; the loop syncs at once
and follows new periods. On the fakes (``nft/fake.py``), asserted with the tracer and the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from ipaddress import ip_address, ip_network

import pytest
import trio
import trio.testing

from nlproxy.cluster.model import Change, ClusterSnapshot, LoadBalancing
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import Family, L4Proto
from nlproxy.proxy import naming as n
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.tracer import trace
from nlproxy.sync.loop import SyncLoop
from nlproxy.sync.syncer import Syncer, SyncResult
from tests.unit.builders import service, upsert
from tests.unit.incremental import CONFIG, NODE_ADDRS, state_with_node
from tests.unit.sync_fakes import fake_loop, make, synced_once, text, web_changes, webs

POD = ip_address("10.7.0.5")  # inside CONFIG's cluster CIDR 10.0.0.0/8
VIP = "172.30.0.2"  # a/web1's, served by 10.1.0.2 (sync_fakes.web_changes)
MASQUERADE_ALL = replace(CONFIG, masquerade_all=True)


def masqueraded(nft: FakeNftables) -> bool:
    """Whether a pod's new connection to ``VIP`` leaves masqueraded in the fake's table."""
    rs = nft.ruleset(Family.IP)
    assert rs is not None
    got = trace(rs, POD, L4Proto.TCP, ip_address(VIP), 80, local_addrs=NODE_ADDRS)
    assert set(got.endpoints) == {"10.1.0.2:80"}
    return got.masquerade


def fresh(config: ProxyConfig, snapshot: ClusterSnapshot) -> str:
    """The table a Syncer started with ``config`` programs for ``snapshot``."""
    nft = FakeNftables(n.TABLE)
    Syncer(config, make(nft).kernel).sync(snapshot)
    return text(nft)


@pytest.mark.parametrize(
    "new",
    [
        pytest.param(MASQUERADE_ALL, id="masquerade-all"),
        pytest.param(replace(CONFIG, masquerade_bit=3), id="masquerade-bit"),
        pytest.param(replace(CONFIG, cluster_cidrs=(ip_network("10.7.0.0/16"),)), id="cidrs"),
        pytest.param(replace(CONFIG, load_balancing=LoadBalancing.ROUND_ROBIN), id="round-robin"),
    ],
)
def test_new_settings_are_programmed_as_a_fresh_start_would_in_one_batch_per_family(
    new: ProxyConfig,
) -> None:
    snapshot = webs()
    nft, syncer = synced_once(snapshot)
    assert syncer.sync(snapshot, changed=set()).total_ops == 0
    batches = len(nft.batches)

    assert syncer.reconfigure(new)
    result = syncer.sync(snapshot, changed=set())  # no object changed: the settings did

    assert not result.incremental
    assert result.total_ops > 0
    assert len(nft.batches) - batches <= len(result.ops)  # at most one batch per family
    assert text(nft) == fresh(new, snapshot)
    assert syncer.config is new
    again = syncer.sync(snapshot, changed=set())
    assert again.incremental
    assert again.total_ops == 0


def test_masquerade_all_flips_a_pods_connection_both_ways() -> None:
    snapshot = webs()
    nft, syncer = synced_once(snapshot)
    assert not masqueraded(nft)

    syncer.reconfigure(MASQUERADE_ALL)
    syncer.sync(snapshot, changed=set())
    assert masqueraded(nft)

    syncer.reconfigure(CONFIG)
    syncer.sync(snapshot, changed=set())
    assert not masqueraded(nft)
    assert text(nft) == fresh(CONFIG, snapshot)


def test_the_same_settings_change_nothing() -> None:
    snapshot = webs()
    _, syncer = synced_once(snapshot)
    assert not syncer.reconfigure(replace(CONFIG))  # equal, not the same object
    result = syncer.sync(snapshot, changed=set())
    assert result.incremental
    assert result.total_ops == 0


def test_a_trusted_restart_not_planned_yet_is_compared_with_the_old_settings() -> None:
    """A restart the records vouched for has not planned yet when new settings come: what the
    tables hold is the old settings' plan, and the next sync sends the difference to the new."""
    snapshot = webs()
    nft = FakeNftables(n.TABLE)
    make(nft).sync(snapshot)
    again = make(nft, plan_after_restart=True)
    assert again.sync(snapshot).plan is None  # trusted, not planned

    again.reconfigure(MASQUERADE_ALL)
    result = again.sync(snapshot, changed=set())

    assert result.total_ops > 0
    assert masqueraded(nft)
    assert text(nft) == fresh(MASQUERADE_ALL, snapshot)


def test_the_records_carry_the_new_settings() -> None:
    """A process started afterwards with the new settings trusts the tables (nothing to
    send); one started with the old settings does not."""
    snapshot = webs()
    nft, syncer = synced_once(snapshot)
    syncer.reconfigure(MASQUERADE_ALL)
    syncer.sync(snapshot, changed=set())

    restarted = Syncer(MASQUERADE_ALL, make(nft).kernel).sync(snapshot)
    assert restarted.restarted
    assert restarted.total_ops == 0
    old = Syncer(CONFIG, make(nft).kernel).sync(snapshot)
    assert not old.restarted
    assert old.total_ops > 0


class Synced:
    """The loop's syncs: their operation counts, and an event set by the next one."""

    def __init__(self) -> None:
        self.ops: list[int] = []
        self.next = trio.Event()

    def __call__(self, result: SyncResult, _: object) -> None:
        self.ops.append(result.total_ops)
        self.next.set()


def _loop(nft: FakeNftables, **kw: object) -> tuple[SyncLoop, Synced]:
    synced = Synced()
    return fake_loop(state_with_node(), make(nft), synced, **kw), synced


async def test_the_loop_syncs_new_settings_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nft = FakeNftables(n.TABLE)
    loop, synced = _loop(nft)
    send, recv = trio.open_memory_channel[Sequence[Change]](10)
    await send.send(web_changes(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        assert not masqueraded(nft)
        synced.next = trio.Event()

        loop.reconfigure(MASQUERADE_ALL)
        with trio.fail_after(60):  # far below the sync period: no verify brings it
            await synced.next.wait()
        assert synced.ops[-1] > 0
        assert masqueraded(nft)
        assert loop.syncer.config is MASQUERADE_ALL
        nursery.cancel_scope.cancel()


async def test_the_loop_learns_new_cluster_cidrs() -> None:
    """The state refuses a ClusterIP inside the new pod range once the settings say so."""
    nft = FakeNftables(n.TABLE)
    loop, _ = _loop(nft)
    odd = service("a", "odd", "10.9.0.1")
    loop.apply_changes([upsert(odd)])
    assert loop.state.snapshot().services.get(odd.key) is not None  # 10.0.0.0/8 is not the state's
    loop.reconfigure(replace(CONFIG, cluster_cidrs=(ip_network("10.9.0.0/16"),)))
    assert loop.state.snapshot().services.get(odd.key) is None
    assert loop.state.refused


async def test_new_periods_reschedule_the_verify(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nft = FakeNftables(n.TABLE)
    verifies: list[float] = []
    first = trio.Event()

    def quiet() -> bool:
        verifies.append(trio.current_time())
        first.set()
        return True  # nothing moved: the verify needs no read-back (then the loop rests)

    loop, _ = _loop(nft, quiet=quiet)
    send, recv = trio.open_memory_channel[Sequence[Change]](10)
    await send.send(web_changes(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run, recv)
        start = trio.current_time()
        assert not verifies
        loop.set_periods(min_interval=0.5, sync_period=30.0)
        with trio.fail_after(300):  # the old period, an hour, would pass this deadline
            await first.wait()
        assert round(verifies[0] - start) == 30
        assert loop.min_interval == 0.5
        nursery.cancel_scope.cancel()
