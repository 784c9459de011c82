"""``bench_daemon.py`` at a small size: a change written while the daemon repairs drift is
counted as programmed only by the sync that carried it, and the idle window prints its CPU and
every RSS sample."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_verify_change_and_idle_figures() -> None:
    rows = run_script(
        "bench_daemon.py", "--services", "60", "--endpoints", "3", "--changes", "1",
        "--settle", "0.5", "--drift-changes", "2", "--idle", "2", "--rss-every", "0.5",
    )  # fmt: skip
    changes = [r for r in rows if r["what"] == "verify_change"]
    assert [r.get("error") for r in changes] == [None, None]
    assert all(r["seconds"] > 0 and r["ops"] > 0 for r in changes)  # the change's own sync
    assert {r["min_sync_period_s"] for r in changes} == {0.1}
    [idle] = [r for r in rows if r["what"] == "idle_rss"]
    assert len(idle["samples_mb"]) == 5  # at 0, 0.5, 1, 1.5 and 2 s
    assert [r["what"] for r in rows].count("idle_cpu") == 1
