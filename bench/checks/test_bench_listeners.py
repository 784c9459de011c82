"""``bench_listeners.py`` at a small size, one condition and writer: each commit line gives the
object count and the kernel's time per object, and a condition outside the list is refused."""

from __future__ import annotations

import subprocess
import sys

from checks.script import BENCH, run_script


def test_one_condition_one_writer() -> None:
    rows = run_script("bench_listeners.py", "--services", "40", "--endpoints", "2",
                      "--rounds", "1", "--conditions", "none,listener_other_netns",
                      "--writers", "nlproxy", "--no-extra")  # fmt: skip
    assert [(r["writer"], r["condition"]) for r in rows if r["bench"] == "listener_cost"] == [
        ("nlproxy", "none"),
        ("nlproxy", "listener_other_netns"),
    ]
    costs = [r for r in rows if r["bench"] == "listener_cost"]
    assert all(r["objects"] == costs[0]["objects"] > 120 for r in costs)
    assert all(r["sys_us_per_object"] >= 0 for r in costs)
    assert costs[1]["nftables_listeners"] >= 1
    assert not any(r["bench"] in ("read_back", "getgen") for r in rows)


def test_unknown_condition_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_listeners.py"), "--conditions", "nobody"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--conditions" in proc.stderr
