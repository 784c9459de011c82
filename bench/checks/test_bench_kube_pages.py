"""``bench_kube_pages.py`` at a small size: both ways listed for both kinds, and the ratio."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_both_ways_and_the_ratio() -> None:
    lines = run_script("bench_kube_pages.py", "--services", "120", "--rounds", "1")
    ways = {(x["kind"], x["next_page_ahead"]) for x in lines if "next_page_ahead" in x}
    assert ways == {(k, a) for k in ("Service", "EndpointSlice") for a in (False, True)}
    ratios = [x for x in lines if "ahead_over_one_by_one" in x]
    assert [x["kind"] for x in ratios] == ["Service", "EndpointSlice"]
    assert all(x["ahead_over_one_by_one"] > 0 for x in ratios)
