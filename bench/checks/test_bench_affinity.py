"""bench_affinity.py and affinity_datapath.py on small shapes: they run, and the facts their
figures rest on hold (the map layout's endpoint change is element operations and a rule
rewrite, never a set or chain per endpoint; the map keeps ClientIP affinity's semantics with
real packets)."""

from __future__ import annotations

import json

import pytest

from bench import affinity_datapath, bench_affinity


def test_small_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_affinity.main(["--ports", "2", "--endpoints", "20"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line[:1] == "{"]
    steps = {(r["layout"], r["step"]) for r in rows}
    for layout in bench_affinity.LAYOUTS:
        for step in ("first sync", "one endpoint removed", "unrelated change"):
            assert (layout, step) in steps
    assert ("map", "first sync") in steps
    # nlproxy's map layout: nothing per endpoint to create or change, and the removed
    # endpoint's clients forgotten.
    ops = {(r["layout"], r["step"]): r.get("ops") for r in rows}
    for layout, extra in bench_affinity.LAYOUTS.items():
        if "affinity_timeout" in extra:  # an endpoint's elements, and the choice rules
            assert ops[layout, "one endpoint removed"] < ops[layout, "first sync"] / 4
    assert all(isinstance(r["nftables_listeners"], int) for r in rows if "ops" in r)
    [forgotten] = [r for r in rows if r["step"] == "its clients forgotten"]
    assert forgotten["stale_left"] == 0
    assert forgotten["clients_left"] > 0


def _declared(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith(("add map", "add set", "add chain"))]


def test_map_layout_declares_nothing_per_endpoint() -> None:
    counts = set()
    for eps in (10, 50):
        ips = [f"10.1.0.{i}" for i in range(1, eps + 1)]
        first = [*bench_affinity._map_base(3)]
        for k in range(3):
            first += bench_affinity._map_port(k, ips)
        counts.add(len(_declared(first)))
        assert _declared(list(bench_affinity._map_remove(0, ips, 4))) == []
    assert len(counts) == 1


def test_map_keeps_affinity_semantics() -> None:
    rows = affinity_datapath.run()
    assert [r for r in rows if not r["ok"]] == []
    names = {r["check"] for r in rows}
    assert "each new connection refreshes the timeout" in names
    assert "an idle client is forgotten after the timeout" in names
    assert "a removed endpoint's clients move, and stay" in names
    assert "the node's own connections keep one pod, learned in output" in names
