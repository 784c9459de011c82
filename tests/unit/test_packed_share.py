"""A packed map's copy shares its original's dictionary until one of them is written.

The programmed state is the last plan's copy (``sync/result.py``'s ``unshare``); the next sync
updates the plan in place and advances the programmed state by its operations, so each must
see only its own writes, whichever writes first, and a map nobody writes stays one dictionary.
"""

from __future__ import annotations

import gc
from copy import copy, deepcopy
from ipaddress import IPv4Address

import pytest

from nlproxy.nft import packed
from nlproxy.nft.ir import DataType, Element, Family, Map, Ruleset
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.reconcile import advance, diff, ops_for_delta
from nlproxy.proxy import naming as n
from nlproxy.proxy.incremental import attach, plan_update
from nlproxy.proxy.planner import plan
from nlproxy.sync.result import as_programmed, unshare
from tests.unit.builders import endpoint, eps_slice, upsert
from tests.unit.incremental import CONFIG, small

MAP = Map(name="m", key=(DataType.IPV4_ADDR, DataType.INTEGER), data=(DataType.INTEGER,))


def _store(*pairs: tuple[str, int, int]) -> PackedElements:
    els = PackedElements(MAP)
    for ip, i, value in pairs:
        key = (IPv4Address(ip), i)
        els[key] = Element(set="m", key=key, value=(value,))
    return els


def _packed(rs: Ruleset) -> dict[str, dict[bytes, bytes]]:
    return {k: dict(els.raw) for k, els in rs.elements.items() if isinstance(els, PackedElements)}


def _values(els: PackedElements) -> dict[tuple[object, ...], object]:
    return {key: el.value for key, el in els.items()}


@pytest.mark.parametrize("writer", ["original", "copy"])
def test_a_write_to_either_leaves_the_other_as_it_was(writer: str) -> None:
    original = _store(("10.0.0.1", 0, 1), ("10.0.0.2", 1, 2))
    other = copy(original)
    assert other == original
    written, kept = (original, other) if writer == "original" else (other, original)
    before = _values(kept)
    key = (IPv4Address("10.0.0.3"), 2)
    written[key] = Element(set="m", key=key, value=(3,))
    del written[(IPv4Address("10.0.0.1"), 0)]
    assert _values(kept) == before
    assert _values(written) == {(IPv4Address("10.0.0.2"), 1): (2,), key: (3,)}


def test_a_copy_that_fails_leaves_the_sharing_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dictionary is copied before the holder lets go of it: had the count dropped first,
    a failed copy would leave two holders that each believe the dictionary is theirs alone."""
    original = _store(("10.0.0.1", 0, 1))
    other = copy(original)

    def no_memory(*_: object) -> dict[bytes, bytes]:
        raise MemoryError

    monkeypatch.setattr(packed, "dict", no_memory, raising=False)
    with pytest.raises(MemoryError):
        original.own()
    monkeypatch.undo()
    key = (IPv4Address("10.0.0.1"), 0)
    other[key] = Element(set="m", key=key, value=(9,))
    assert _values(original) == {key: (1,)}
    assert _values(other) == {key: (9,)}


def test_a_shared_dictionary_cannot_be_written_past_own() -> None:
    original = _store(("10.0.0.1", 0, 1))
    other = copy(original)
    with pytest.raises(TypeError):
        other.raw[b"\x00" * 8] = b"\x00" * 4  # type: ignore[index]
    with pytest.raises(TypeError):
        original.raw[b"\x00" * 8] = b"\x00" * 4  # type: ignore[index]
    assert len(original) == len(other) == 1


def test_the_last_holder_writes_in_place() -> None:
    """Once the other holder wrote (and so copied) or is gone, nothing is copied again."""
    original = _store(("10.0.0.1", 0, 1))
    mine = original.own()
    other = copy(original)
    other.own()[b"\x01" * 8] = b"\x00" * 4  # the copy writes: it takes a dictionary of its own
    assert original.own() is mine
    dropped = copy(original)
    del dropped
    gc.collect()
    assert original.own() is mine


def test_clear_and_deepcopy_keep_the_other_copy() -> None:
    original = _store(("10.0.0.1", 0, 1), ("10.0.0.2", 1, 2))
    other = deepcopy(original)
    other.clear()
    assert not other
    assert len(original) == 2
    third = copy(original)
    original.clear()
    assert len(third) == 2


def test_the_programmed_copy_stays_as_committed_while_the_plan_is_updated() -> None:
    """A sync's order: the plan's maps shared with the programmed state after a commit, then
    copied (``unshare``), the plan updated in place, and the programmed state advanced by the
    operations: it ends equal to the new plan, and before its advance it still held the old."""
    state, _ = small()
    snap = state.snapshot()
    live = plan(snap, CONFIG)
    assert attach(live, snap)
    rs = live.rulesets[Family.IP]
    programmed = as_programmed(rs, share=True)
    assert unshare(programmed, rs) > 0
    committed = _packed(programmed)
    sl = eps_slice("a", "web", [endpoint("10.0.0.1")], [("p80", 8080, "TCP")])
    changed = state.apply([upsert(sl)])
    live, deltas = plan_update(live, state.snapshot(), CONFIG, changed)
    assert deltas is not None
    new = live.rulesets[Family.IP]
    assert new.elements[n.BACKENDS] != programmed.elements[n.BACKENDS]
    assert _packed(programmed) == committed
    ops = ops_for_delta(deltas[Family.IP], programmed)
    assert ops is not None
    advance(programmed, ops)
    assert diff(new, programmed) == []
