"""``bench_slow_file.py`` at a small size: the parse costs and each scenario's latencies."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_the_parse_costs_and_every_scenario() -> None:
    rows = run_script(
        "bench_slow_file.py",
        "--services", "300", "--endpoints", "3", "--interval", "0.5",
        "--small-every", "0.3", "--changes", "3", "--parses", "1", "--tail", "30",
    )  # fmt: skip
    costs, *scenarios = rows
    assert costs["bench"] == "slow_file_parse"
    assert costs["accept_cpu_s"] > 0
    assert costs["reject_cpu_s"] > 0
    assert [r["scenario"] for r in scenarios] == ["broken", "broken-same", "valid"]
    for row in scenarios:
        assert row["landed"] + row["superseded_or_late"] == 3
        assert row["landed"] >= 1
        assert row["big_mb"] > 0
