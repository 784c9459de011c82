"""``bench_relist.py`` at a small size: every case is printed, and the relists that change no
rule send nothing and replan nothing."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_every_case() -> None:
    rows = run_script("bench_relist.py", "--services", "50", "--endpoints", "3")
    by_case = {r["case"]: r for r in rows}
    assert [r["case"] for r in rows] == [
        "cold",
        "relist-same",
        "relist-one-changed",
        "relist-node-tainted",
        "relist-node-untainted-one-changed",
    ]
    assert by_case["cold"]["ops"] > 0
    assert by_case["relist-same"]["ops"] == 0
    assert by_case["relist-one-changed"]["changed"] == 1
    assert by_case["relist-one-changed"]["ops"] > 0
    tainted = by_case["relist-node-tainted"]
    assert tainted["changed"] == 0  # a taint alone marks no Service in the state...
    assert tainted["ops"] == 0  # ...and nothing is sent
    assert tainted["incremental"]
    assert by_case["relist-node-untainted-one-changed"]["ops"] > 0
