"""``ClusterState``'s Replace over objects it holds already (``_holds_just``): a list whose pages
were preloaded skips the general path, and ends in what the general path makes, whatever the list
and the state hold (a differential test: every case applied both ways)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nlproxy.cluster.model import Change, Invalid, ObjectRef, Replace, Skip, Upsert
from nlproxy.cluster.parse import to_change
from nlproxy.cluster.state import ClusterState
from tests.objects import example_endpoint_slice as endpoint_slice
from tests.objects import example_node as node
from tests.objects import example_service as service

NODE = "node-a"

Listed = Upsert | Skip | Invalid


def svc(i: int, **fields: Any) -> Listed:
    ip = f"10.96.0.{i + 1}"
    change = to_change(
        service(
            **{"metadata.name": f"s{i}", "spec.clusterIP": ip, "spec.clusterIPs": [ip], **fields}
        )
    )
    assert isinstance(change, Upsert | Skip | Invalid)
    return change


def eps(i: int, name: str = "", ip: str = "") -> Listed:
    doc = endpoint_slice(
        **{
            "metadata.name": name or f"s{i}-a",
            "metadata.labels": {"kubernetes.io/service-name": f"s{i}"},
            "endpoints": [{"addresses": [ip or f"10.1.0.{i + 1}"], "nodeName": NODE}],
        }
    )
    change = to_change(doc)
    assert isinstance(change, Upsert | Skip | Invalid)
    return change


def invalid(kind: str, name: str) -> Invalid:
    ref = ObjectRef(kind=kind, namespace="default", name=name)
    return Invalid(ref=ref, error=f"{kind} default/{name}: bad")


SERVICES = [svc(i) for i in range(6)]
SLICES = [eps(i) for i in range(6)]
EXTERNAL = [*SERVICES[:-1], svc(5, **{"spec.type": "ExternalName"})]  # s5 skipped


def state_of(st: ClusterState) -> tuple[object, ...]:
    snap = st.snapshot()
    return (
        list(snap.services.items()),
        list(snap.slices.items()),
        snap.node,
        dict(st.invalid),
        sorted(map(str, st.refused)),
        st._skipped,
    )


Case = tuple[list[list[Listed]], list[Replace]]
"""The pages preloaded (or applied), then the batch of Replaces."""


def lists(services: list[Listed], slices: list[Listed]) -> list[Replace]:
    return [
        Replace(kind="Service", changes=tuple(services)),
        Replace(kind="EndpointSlice", changes=tuple(slices)),
    ]


CASES: dict[str, Callable[[], Case]] = {
    "preloaded-exactly": lambda: ([SERVICES[:3], SLICES[:4], SERVICES[3:], SLICES[4:]],
                                  lists(SERVICES, SLICES)),
    "listed-in-another-order": lambda: ([SERVICES, SLICES],
                                        lists(SERVICES[::-1], SLICES[2:] + SLICES[:2])),
    "one-gone-from-the-list": lambda: ([SERVICES, SLICES], lists(SERVICES[1:], SLICES[:-1])),
    "one-new-in-the-list": lambda: ([SERVICES[:-1], SLICES[:-1]], lists(SERVICES, SLICES)),
    "an-equal-copy-listed": lambda: ([SERVICES, SLICES],
                                     lists([*SERVICES[:-1], svc(5)], [eps(0), *SLICES[1:]])),
    "a-changed-copy-listed": lambda: ([SERVICES, SLICES],
                                      lists(SERVICES, [eps(0, ip="10.2.0.1"), *SLICES[1:]])),
    "one-listed-twice": lambda: ([SERVICES, SLICES],
                                 lists([*SERVICES[:-1], SERVICES[0]], [*SLICES[:-1], SLICES[0]])),
    "a-skip-listed": lambda: ([EXTERNAL, SLICES], lists(EXTERNAL, SLICES)),
    "a-skip-held": lambda: ([EXTERNAL, SLICES], lists(SERVICES, SLICES)),
    "a-skip-held-then-gone": lambda: ([EXTERNAL, SLICES], lists(SERVICES[:-1], SLICES)),
    "an-invalid-held": lambda: ([SERVICES, SLICES, [invalid("Service", "bad")]],
                                lists(SERVICES, SLICES)),
    "an-invalid-listed": lambda: ([SERVICES, SLICES],
                                  lists([*SERVICES, invalid("Service", "bad")], SLICES)),
    "slices-under-other-names": lambda: ([SERVICES, SLICES],
                                         lists(SERVICES, [eps(i, name=f"s{i}-b")
                                                          for i in range(6)])),
    "empty-lists": lambda: ([SERVICES, SLICES], lists([], [])),
    "nothing-held-nothing-listed": lambda: ([], lists([], [])),
}  # fmt: skip


@pytest.mark.parametrize("make", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("preload", [True, False], ids=["preloaded", "applied"])
def test_a_replace_over_what_the_state_holds_ends_as_the_general_path_ends(
    monkeypatch: pytest.MonkeyPatch, make: Callable[[], Case], preload: bool
) -> None:
    def run() -> tuple[set[object], tuple[object, ...]]:
        st = ClusterState(NODE)
        pages, batch = make()
        put = st.preload if preload else st.apply
        put([to_change(node(**{"metadata.name": NODE}))])
        for page in pages:
            put(page)
        changed = st.apply(list[Change](batch))
        return set(changed), state_of(st)

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(ClusterState, "_holds_just", lambda self, replace: False)
        general = run()
    assert fast == general


def test_the_lists_of_a_cold_start_take_the_short_path() -> None:
    """The case it is for: the lists' Replaces over the pages preloaded, nothing else held."""
    st = ClusterState(NODE)
    st.preload(SERVICES)
    st.preload(SLICES)
    seen = [st._holds_just(r) for r in lists(SERVICES, SLICES)]
    assert seen == [True, True]
    assert not st._holds_just(Replace(kind="Node", changes=()))
