"""Services kept as programmed while a source cannot read where they are (``sync/keep.py``),
on the fakes: a restarted Syncer whose snapshot names an unread place keeps the Services the
tables hold and the snapshot lacks (no delete, no conntrack flush, no record saying they are
gone), applies every other change, and deletes what is really gone once the place is read."""

from __future__ import annotations

import dataclasses
from ipaddress import ip_address

import pytest

from nlproxy.cluster.model import ClusterSnapshot, LoadBalancing, Service, ServiceKey
from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.nft.fake import FakeNftables
from nlproxy.nft.ir import FAMILIES, Family
from nlproxy.proxy import naming as n
from nlproxy.sync.keep import Keeper
from nlproxy.sync.syncer import Syncer
from tests.unit.builders import node, snapshot
from tests.unit.sync_fakes import UDP, dns, dns_slice, flow, make, to


def at(*ips: str) -> set[str]:
    """The endpoints a trace names, ``ip:53``."""
    return {f"{ip}:53" for ip in ips}


def cluster(
    unread: tuple[str, ...] = (), **services: tuple[Service, tuple[str, ...]]
) -> ClusterSnapshot:
    snap = snapshot(
        [svc for svc, _ in services.values()],
        [dns_slice("default", name, ips) for name, (_, ips) in services.items()],
        node=node(),
    )
    return dataclasses.replace(snap, unread=unread)


KEPT = {
    "plain": (dns("default", "plain", "10.96.0.10"), ("10.1.0.1", "10.1.0.2")),
    "sticky": (
        dns("default", "sticky", "10.96.0.11", affinity_timeout=600),
        ("10.1.0.3", "10.1.0.4"),
    ),
    "robin": (
        dns("default", "robin", "10.96.0.12", load_balancing=LoadBalancing.ROUND_ROBIN),
        ("10.1.0.5", "10.1.0.6"),
    ),
}
OTHER = {"other": (dns("default", "other", "10.96.0.20"), ("10.1.0.7",))}


@pytest.mark.parametrize("kept", sorted(KEPT), ids=sorted(KEPT))
def test_a_restart_keeps_what_an_unread_place_held(kept: str) -> None:
    nft = FakeNftables(n.TABLE)
    first = make(nft)
    everything = {kept: KEPT[kept], **OTHER}
    first.sync(cluster(**everything))
    vip = str(KEPT[kept][0].cluster_ips[0])
    assert to(nft, vip, 53, UDP) == at(*KEPT[kept][1])

    # Restarted while the file of ``kept`` does not parse: the snapshot lacks it.
    flows = FakeConntrack([flow(vip, KEPT[kept][1][0]), flow("10.96.0.20", "10.1.0.7")])
    second = make(nft, flows)
    moved = {"other": (OTHER["other"][0], ("10.1.0.8",))}
    result = second.sync(cluster(("a.yaml",), **moved))
    assert result.total_ops > 0, "the other Service's change is applied"
    assert to(nft, vip, 53, UDP) == at(*KEPT[kept][1]), "kept as programmed"
    assert to(nft, "10.96.0.20", 53, UDP) == at("10.1.0.8")
    assert [f.orig.dst for f in flows.deleted] == [ip_address("10.96.0.20")]
    assert second.keeper.kept == {f"default/{kept}"}

    # A verify finds no drift in what is kept.
    version = second.version
    assert all(second.repair_ops(f, second.read_back(f), version) == [] for f in FAMILIES)

    # The tables are not the plan of that snapshot: a restart that could read the same
    # snapshot does not trust them, and deletes the Service.
    third = make(nft)
    assert not third.sync(cluster(**moved)).restarted
    assert to(nft, vip, 53, UDP) == set()


def test_once_the_place_is_read_what_it_no_longer_holds_goes() -> None:
    nft = FakeNftables(n.TABLE)
    second = _restarted_keeping(nft)
    assert to(nft, "10.96.0.11", 53, UDP) == at("10.1.0.3", "10.1.0.4")
    # Still unread: a second sync keeps them too (the full path, every time).
    second.sync(cluster(("a.yaml",), **OTHER))
    assert to(nft, "10.96.0.12", 53, UDP) == at("10.1.0.5", "10.1.0.6")

    fixed = {"plain": (KEPT["plain"][0], ("10.1.0.2",)), **OTHER}
    second.sync(cluster(**fixed))
    assert second.keeper.kept == set()
    assert to(nft, "10.96.0.10", 53, UDP) == at("10.1.0.2")
    assert to(nft, "10.96.0.11", 53, UDP) == set()
    assert to(nft, "10.96.0.12", 53, UDP) == set()
    # Only what the plan holds is left: a fresh plan of the same snapshot sends nothing.
    assert make(nft).sync(cluster(**fixed)).total_ops == 0


def test_a_service_seen_since_the_start_is_not_kept_when_it_goes() -> None:
    nft = FakeNftables(n.TABLE)
    second = _restarted_keeping(nft)
    second.sync(cluster(("a.yaml",)))  # "other" deleted from a file that is read
    assert to(nft, "10.96.0.20", 53, UDP) == set()
    assert to(nft, "10.96.0.10", 53, UDP) == at("10.1.0.1", "10.1.0.2")


def _restarted(
    nft: FakeNftables, before: dict[str, tuple[Service, tuple[str, ...]]], now: ClusterSnapshot
) -> Syncer:
    """A Syncer started on the tables a first one programmed for the Services ``before``
    (every place read), after its first sync, of ``now``."""
    make(nft).sync(cluster(**before))
    second = make(nft)
    second.sync(now)
    return second


TAKEN = {"new": (dns("default", "new", "10.96.0.10"), ("10.1.0.9",))}
"""A Service read from a file, at plain's ClusterIP: it takes a kept frontend."""


def _taken(nft: FakeNftables) -> Syncer:
    """A Syncer restarted while the place of every ``KEPT`` Service is unread, whose first
    snapshot gives plain's frontend to ``TAKEN``'s Service: the plan's, not kept."""
    second = _restarted(nft, KEPT, cluster(("a.yaml",), **TAKEN))
    assert to(nft, "10.96.0.10", 53, UDP) == at("10.1.0.9")
    return second


def test_a_frontend_the_plan_gives_another_service_is_the_plans() -> None:
    nft = FakeNftables(n.TABLE)
    second = _taken(nft)
    assert second.keeper.kept == {"default/sticky", "default/robin"}


def test_a_kept_frontend_the_plan_took_does_not_come_back_when_its_taker_goes() -> None:
    """Once a Service that is read takes a kept frontend, the kept Service's objects there
    are gone for good: deleting the taker while the place is still unread leaves the
    frontend empty, not programmed again as it was found at start."""
    nft = FakeNftables(n.TABLE)
    second = _taken(nft)

    second.sync(cluster(("a.yaml",)))  # "new" deleted from a file that is read
    assert to(nft, "10.96.0.10", 53, UDP) == set()
    assert second.keeper.kept == {"default/sticky", "default/robin"}
    assert to(nft, "10.96.0.11", 53, UDP) == at("10.1.0.3", "10.1.0.4")
    # A verify finds what is programmed to be what is wanted (no repair brings it back).
    version = second.version
    assert all(second.repair_ops(f, second.read_back(f), version) == [] for f in FAMILIES)


def test_nothing_is_kept_when_every_place_is_read_from_the_start() -> None:
    nft = FakeNftables(n.TABLE)
    _restarted(nft, KEPT, cluster(**OTHER))
    assert to(nft, "10.96.0.10", 53, UDP) == set()
    keeper = Keeper()
    assert not keeper.active


def _hairpin(nft: FakeNftables) -> set[tuple[str, ...]]:
    rs = nft.ruleset(Family.IP)
    assert rs is not None
    return {tuple(str(v) for v in key) for key in rs.elements.get(n.HAIRPIN, {})}


@pytest.mark.parametrize("lb", [LoadBalancing.ROUND_ROBIN, LoadBalancing.CONSISTENT_HASH], ids=str)
def test_a_kept_balanced_service_keeps_its_hairpin_pairs(lb: LoadBalancing) -> None:
    """A balanced Service's endpoints are in its own map, not in chains: read from there, or
    a pod reaching itself through the kept Service would no longer be masqueraded."""
    nft = FakeNftables(n.TABLE)
    svc = dns("default", "robin", "10.96.0.12", load_balancing=lb)
    make(nft).sync(cluster(robin=(svc, ("10.1.0.5", "10.1.0.6")), **OTHER))
    before = _hairpin(nft)
    assert {("10.1.0.5", "10.1.0.5"), ("10.1.0.6", "10.1.0.6")} <= before
    second = make(nft)
    second.sync(cluster(("a.yaml",), **OTHER))
    assert second.keeper.kept == {"default/robin"}
    assert _hairpin(nft) == before


def _key(name: str) -> ServiceKey:
    return ServiceKey(namespace="default", name=name)


def _restarted_keeping(nft: FakeNftables, other: tuple[str, ...] = ("10.1.0.7",)) -> Syncer:
    """A Syncer restarted while the place of every ``KEPT`` Service is unread."""
    read = {"other": (OTHER["other"][0], other)}
    second = _restarted(nft, {**KEPT, **read}, cluster(("a.yaml",), **read))
    assert second.keeper.kept == {f"default/{name}" for name in KEPT}
    return second


def _kept_as_found(nft: FakeNftables, syncer: Syncer, *names: str) -> None:
    for name in names:
        svc, ips = KEPT[name]
        assert to(nft, str(svc.cluster_ips[0]), 53, UDP) == at(*ips), name
    version = syncer.version
    assert all(syncer.repair_ops(f, syncer.read_back(f), version) == [] for f in FAMILIES)


def test_a_change_nothing_kept_depends_on_is_sent_alone() -> None:
    """While a place is unread, another Service's change is an incremental sync (its own
    operations, not a comparison of whole tables) and what is kept stays as it was."""
    nft = FakeNftables(n.TABLE)
    second = _restarted_keeping(nft)
    for ips in (("10.1.0.8",), ("10.1.0.9",)):
        moved = cluster(("a.yaml",), other=(OTHER["other"][0], ips))
        result = second.sync(moved, changed={_key("other")})
        assert result.incremental, ips
        assert to(nft, "10.96.0.20", 53, UDP) == at(*ips)
        _kept_as_found(nft, second, *KEPT)
    # The tables are still not the plan of that snapshot: no record says they are.
    assert not make(nft).sync(cluster(other=(OTHER["other"][0], ("10.1.0.9",)))).restarted


@pytest.mark.parametrize(
    ("now", "changed", "endpoints"),
    [
        pytest.param(TAKEN, "new", ("10.1.0.9",), id="a-change-that-takes-a-kept-frontend"),
        pytest.param(
            {"plain": (KEPT["plain"][0], ("10.1.0.2",))},
            "plain",
            ("10.1.0.2",),
            id="a-kept-service-read-again",
        ),
    ],
)
def test_a_change_at_a_kept_frontend_is_planned_comparing_everything(
    now: dict[str, tuple[Service, tuple[str, ...]]], changed: str, endpoints: tuple[str, ...]
) -> None:
    """Another Service that takes a kept frontend, or the kept Service read again: not an
    incremental sync but a comparison of the whole table; the frontend is the plan's, and the
    other kept Services stay as they were found."""
    nft = FakeNftables(n.TABLE)
    second = _restarted_keeping(nft)
    result = second.sync(cluster(("a.yaml",), **now, **OTHER), changed={_key(changed)})
    assert not result.incremental
    assert to(nft, "10.96.0.10", 53, UDP) == at(*endpoints)
    assert second.keeper.kept == {"default/sticky", "default/robin"}
    _kept_as_found(nft, second, "sticky", "robin")


def test_a_hairpin_pair_a_kept_service_shares_stays_when_the_other_drops_it() -> None:
    """Another Service read from a file shares an endpoint with a kept one; when it drops
    that endpoint, the pair stays in ``hairpin`` for the kept Service."""
    nft = FakeNftables(n.TABLE)
    second = _restarted_keeping(nft, other=("10.1.0.7", "10.1.0.1"))
    assert ("10.1.0.1", "10.1.0.1") in _hairpin(nft)
    dropped = cluster(("a.yaml",), other=(OTHER["other"][0], ("10.1.0.7", "10.1.0.8")))
    second.sync(dropped, changed={_key("other")})
    assert to(nft, "10.96.0.20", 53, UDP) == at("10.1.0.7", "10.1.0.8")
    assert ("10.1.0.1", "10.1.0.1") in _hairpin(nft)
    _kept_as_found(nft, second, *KEPT)


def test_an_incremental_sync_that_falls_back_to_the_whole_table_keeps_what_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delta that cannot be sent alone is sent as a comparison of the whole table: the table
    as kept (the plan with the kept Services), not the plan alone, which would delete them."""
    import nlproxy.sync.syncer as syncer_module

    nft = FakeNftables(n.TABLE)
    second = _restarted_keeping(nft)
    monkeypatch.setattr(syncer_module, "ops_for_delta", lambda delta, programmed: None)
    moved = cluster(("a.yaml",), other=(OTHER["other"][0], ("10.1.0.8",)))
    result = second.sync(moved, changed={_key("other")})
    assert result.incremental
    assert to(nft, str(OTHER["other"][0].cluster_ips[0]), 53, UDP) == at("10.1.0.8")
    _kept_as_found(nft, second, *KEPT)
