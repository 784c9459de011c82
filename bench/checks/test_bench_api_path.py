"""``bench_api_path.py`` at a small size: the daemon from the API server and ``run --once`` from
a file program the same cluster, under each condition; the foreign listener is seen on the host;
the profiled daemon leaves profiles that name nlproxy's code."""

from __future__ import annotations

import pstats
from pathlib import Path

from checks.script import run_script

SIZE = ("--services", "60", "--endpoints", "3")


def test_once_and_daemon_program_the_same_cluster_under_each_condition() -> None:
    rows = run_script("bench_api_path.py", *SIZE, "--rounds", "1", "--settle", "1", "--idle", "11")
    assert [(r["run"], r["condition"]) for r in rows] == [
        ("once", "none"),
        ("daemon", "none"),
        ("once", "listener"),
        ("daemon", "listener"),
    ]
    assert [r["error"] for r in rows if "error" in r] == []
    assert len({r["ops"] for r in rows}) == 1  # the same objects both ways
    assert rows[0]["ops"] > 60
    assert all(r["nftables_listeners"] >= 1 for r in rows if r["condition"] == "listener")
    daemon = rows[1]
    assert daemon["rss_first_sync_mb"] > 0
    assert 0 < daemon["to_lists_cpu_s"] <= daemon["cpu_s"]
    assert daemon["idle_s"] >= 11
    assert "idle_cpu_s_per_min" in daemon
    assert "idle_cpu_s_per_min" not in rows[3]  # idle is measured without the listener only


def test_profile_names_the_daemons_code(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    rows = run_script("bench_api_path.py", *SIZE, "--settle", "1", "--idle", "2",
                      "--profile", str(prefix))  # fmt: skip
    assert [r["stage"] for r in rows] == ["first-sync", "idle"]
    first = pstats.Stats(str(tmp_path / "p.first-sync"))
    files = {Path(f).as_posix() for f, _, _ in first.stats}  # type: ignore[attr-defined]
    assert any(f.endswith("nlproxy/sync/syncer.py") for f in files), sorted(files)[:20]
    idle = pstats.Stats(str(tmp_path / "p.idle.since-mark"))
    assert idle.stats  # type: ignore[attr-defined]


def test_make_bench_runs_the_kernel_floor_scripts() -> None:
    import run

    for plan in (run.full_plan(), run.quick_plan()):
        scripts = [s for s, _ in plan.others]
        assert {"bench_api_path.py", "bench_set_size.py"} <= set(scripts)
        assert all((run.BENCH / s).exists() for s in scripts)
    full = dict.fromkeys(run.full_plan().others)
    assert any(s == "bench_listeners.py" and "40000" in a for s, a in full)


def test_a_daemon_with_the_watch_changed_starts_and_idles() -> None:
    for extra in ((), ("--watch-thread",)):
        rows = run_script("bench_api_path.py", *SIZE, "--rounds", "1", "--conditions", "none",
                          "--runs", "daemon", "--settle", "1", "--idle", "2",
                          "--watch-interval", "0.5", *extra)  # fmt: skip
        assert len(rows) == 1
        assert "error" not in rows[0], rows[0]
        assert rows[0]["idle_s"] >= 2


def test_watch_thread_needs_an_interval() -> None:
    import subprocess
    import sys

    from checks.script import BENCH

    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_api_path.py"), "--watch-thread"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--watch-thread" in proc.stderr
