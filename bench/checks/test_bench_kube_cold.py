"""``bench_kube_cold.py`` at a small size: every figure it promises is printed, and the burst
is counted as programmed only when every changed Service was; a restart with nothing changed
sends nothing."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_every_figure() -> None:
    lines = run_script(
        "bench_kube_cold.py", "--services", "120", "--endpoints", "3", "--bursts", "50,200",
        "--repeat", "1", "--timeout", "60",
    )  # fmt: skip
    by_what: dict[str, list[dict[str, object]]] = {}
    for line in lines:
        by_what.setdefault(str(line["what"]), []).append(line)
    lists = {(x["kind"], x["bodies"]) for x in by_what["list"]}
    assert lists == {(k, b) for k in ("Service", "EndpointSlice") for b in ("realistic", "minimal")}
    assert len(by_what["list_ratio"]) == 2
    [cold] = by_what["cold_start"]
    assert set(cold["list_ms"]) == {"Service", "EndpointSlice", "Node", "ServiceCIDR"}  # type: ignore[arg-type]
    assert 0 < cold["to_lists_s"] <= cold["to_first_commit_s"]  # type: ignore[operator]
    bursts = by_what["burst"]
    assert [b.get("error") for b in bursts] == [None, None]
    assert [b["updates"] for b in bursts] == [50, 120]  # at most one update per Service
    [restart] = by_what["restart"]
    assert restart["first_commit_ops"] == 0
    assert 0 < restart["to_lists_s"] <= restart["to_first_commit_s"]  # type: ignore[operator]
