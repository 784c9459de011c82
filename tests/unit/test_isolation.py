"""The pure parts of leaving rejected services out: substitution, change detection, blame."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from nlproxy.cluster.model import ClusterSnapshot, ServiceKey
from nlproxy.errors import KernelError
from nlproxy.log import get_logger
from nlproxy.sync.isolation import (
    MAX_CHECKS,
    MAX_EXCLUSIONS,
    Isolation,
    attribute,
    bisect_culprit,
    changed_since,
    exclusion,
    substitute,
)
from tests.unit.builders import endpoint, eps_slice, service, snapshot


def key(name: str) -> ServiceKey:
    return ServiceKey(namespace="default", name=name)


A, A2 = service("default", "a", "172.30.0.1"), service("default", "a", "172.30.0.9")
B, C = service("default", "b", "172.30.0.2"), service("default", "c", "172.30.0.3")
SA = eps_slice("default", "a", [endpoint("10.0.0.1")])
SB = eps_slice("default", "b", [endpoint("10.0.0.2")])


def test_substitute_takes_the_last_accepted_objects_or_drops_new_services() -> None:
    good = snapshot([A, B], [SA, SB])
    now = snapshot([A2, B, C], [SB])
    out = substitute(now, [key("a"), key("c")], good)
    assert out.services[key("a")] is A
    assert out.slices[key("a")] == (SA,)
    assert key("c") not in out.services
    assert out.services[key("b")] is B
    assert now.services[key("a")] is A2  # the input is left alone
    assert substitute(now, [], good) is now


def test_substitute_restores_a_deleted_service_and_drops_slices_it_did_not_have() -> None:
    good = snapshot([A, C], [SA])
    now = snapshot([C], [])
    out = substitute(now, [key("a"), key("c")], good)
    assert out.services[key("a")] is A
    assert out.slices[key("a")] == (SA,)
    assert key("c") not in out.slices


def test_changed_since_compares_objects_by_identity() -> None:
    good = snapshot([A, B], [SA, SB])
    assert changed_since(snapshot([A, B], [SA, SB]), good) == []
    sb2 = eps_slice("default", "b", [endpoint("10.0.0.7")])
    now = snapshot([A2, B, C], [SA, sb2])
    assert changed_since(now, good) == [key("a"), key("b"), key("c")]
    assert changed_since(snapshot([B], [SB]), good) == [key("a")]  # deleted
    assert changed_since(now, None) == [key("a"), key("b"), key("c")]


def test_an_exclusion_lasts_until_the_objects_change() -> None:
    now = snapshot([A, B], [SA])
    ex = exclusion(now, key("a"), "rejected")
    assert ex.still_applies(snapshot([A], [SA]), key("a"))
    assert not ex.still_applies(snapshot([A2], [SA]), key("a"))
    sa2 = eps_slice("default", "a", [endpoint("10.0.0.8")])
    assert not ex.still_applies(snapshot([A], [sa2]), key("a"))
    gone = exclusion(snapshot([B], []), key("a"), "delete rejected")
    assert gone.still_applies(snapshot([B], []), key("a"))
    assert not gone.still_applies(snapshot([A], []), key("a"))


def test_attribution_prefers_changed_services() -> None:
    assert attribute([key("a"), key("b")], [key("b"), key("c")]) == [key("b")]
    assert attribute([key("a"), key("b")], [key("c")]) == [key("a"), key("b")]


def _oracle(culprits: set[int]) -> tuple[list[Sequence[int]], object]:
    calls: list[Sequence[int]] = []

    def passes(reverted: Sequence[int]) -> bool:
        calls.append(list(reverted))
        return culprits <= set(reverted)

    return calls, passes


def test_bisection_finds_a_culprit_in_logarithmic_checks() -> None:
    for culprit in (0, 1, 500, 998, 999):
        calls, passes = _oracle({culprit})
        assert bisect_culprit(list(range(1000)), passes) == culprit  # type: ignore[arg-type]
        assert len(calls) <= 11  # the whole, then log2(1000) halvings
    calls, passes = _oracle({3, 700})
    assert bisect_culprit(list(range(1000)), passes) == 3  # type: ignore[arg-type]


def test_bisection_gives_up_when_reverting_everything_does_not_help() -> None:
    calls, passes = _oracle({5000})
    assert bisect_culprit(list(range(10)), passes) is None  # type: ignore[arg-type]
    assert len(calls) == 1
    assert bisect_culprit([], passes) is None  # type: ignore[arg-type]


def _rejected(index: int = -1) -> KernelError:
    return KernelError("set firewall-allow", "File exists", errno=17, index=index)


def test_isolation_leaves_a_service_out_as_last_accepted_until_it_changes() -> None:
    iso = Isolation(get_logger("test"))
    good = snapshot([A, B], [SA, SB])
    iso.start(good)
    assert iso.effective(good) is good
    assert iso.accepted(good) == {}
    now = snapshot([A2, B], [SA, SB])  # a changes; the kernel refuses it
    iso.start(now)
    (culprit,) = iso.culprits(_rejected(), now, [key("a"), key("b")], lambda _: True)
    assert culprit == key("a")  # the changed one of the two holding the refused object
    iso.exclude(now, [culprit], "File exists")
    planned = iso.effective(now)
    assert planned.services[key("a")] is A
    assert iso.accepted(planned) == {key("a"): "File exists"}
    iso.start(now)  # the same objects: still left out
    assert iso.effective(now).services[key("a")] is A
    iso.start(snapshot([A, B], [SA, SB]))  # changed again: tried again
    assert iso.excluded == {}


def test_isolation_bisects_with_kernel_checks_and_gives_up_when_they_are_spent() -> None:
    iso = Isolation(get_logger("test"))
    now = snapshot([A, B, C], [SA, SB])
    iso.start(now)
    checked: list[frozenset[ServiceKey]] = []

    def check(s: ClusterSnapshot) -> bool:  # passes once b is reverted (here: absent)
        checked.append(frozenset(s.services))
        return key("b") not in s.services

    assert iso.culprits(_rejected(), now, [], check) == [key("b")]
    assert checked[0] == frozenset()  # reverting every changed service comes first

    def spend() -> None:  # every call spends checks
        for _ in range(MAX_CHECKS):
            iso.culprits(_rejected(), now, [], check)

    with pytest.raises(KernelError, match="File exists"):
        spend()
    iso.start(now)  # the next sync checks afresh, and may leave out up to MAX_EXCLUSIONS
    assert iso.culprits(_rejected(), now, [], check) == [key("b")]
    iso.exclude(now, [key(f"x{i}") for i in range(MAX_EXCLUSIONS)], "refused")
    assert iso.culprits(_rejected(), now, [key("c")], check) == []
