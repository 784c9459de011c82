"""The bad-input corpus: one directory per failure mode under ``tests/data/bad/<case>/``.

Each directory holds manifests with one bad object (or file) next to a valid Service ``good``
and its EndpointSlice ``good-1``, and ``expected.txt`` with the exact messages an operator sees:
file-level errors first, then the invalid objects' errors sorted. An empty ``expected.txt``
means the bad object is ignored without an error (as kube-proxy ignores it). In every case the
bad object stays out of the snapshot and the good ones are in it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import ServiceKey
from nlproxy.cluster.state import ClusterState

CORPUS = Path(__file__).parent.parent / "data" / "bad"
CASES = sorted(p for p in CORPUS.iterdir() if p.is_dir())
GOOD = ServiceKey(namespace="default", name="good")


def test_corpus_covers_the_failure_modes() -> None:
    names = {case.name for case in CASES}
    required = {
        "port-out-of-range",
        "bad-protocol",
        "bad-cluster-ip",
        "family-mismatch",
        "duplicate-port-names",
        "bad-target-port-name",
        "bad-external-ip",
        "bad-lb-source-range",
        "affinity-timeout-out-of-range",
        "slice-bad-address",
        "slice-bad-port",
        "slice-missing-service-label",
        "node-bad-address",
        "malformed-yaml",
        "wrong-type-ports",
    }
    assert required <= names, sorted(required - names)
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_case(case: Path) -> None:
    expected = (case / "expected.txt").read_text().splitlines()
    load = load_manifests(case)
    state = ClusterState("node-1")
    changed = state.apply(load.changes)
    assert [*load.errors, *sorted(state.invalid.values())] == expected
    snap = state.snapshot()
    assert GOOD in changed
    assert set(snap.services) == {GOOD}
    assert set(snap.slices) == {GOOD}
    (good_slice,) = snap.slices[GOOD]
    assert good_slice.name == "good-1"
    assert [str(e.ip) for e in good_slice.endpoints] == ["10.244.1.5"]
    assert snap.node is None
    assert snap.service_cidrs == ()
