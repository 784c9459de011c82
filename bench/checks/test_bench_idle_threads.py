"""``bench_idle_threads.py`` at a small size: the idle daemon's threads are listed with their
CPU, the event loop's among them, and the process's figure covers theirs."""

from __future__ import annotations

from checks.script import run_script


def test_the_idle_daemons_threads_are_listed() -> None:
    rows = run_script("bench_idle_threads.py", "--services", "60", "--endpoints", "3",
                      "--settle", "1", "--idle", "12", "--every", "0.5")  # fmt: skip
    assert len(rows) == 1
    row = rows[0]
    assert row["idle_s"] >= 12
    threads = row["threads"]
    assert len(threads) >= 3  # the event loop, the generation watch's, the source's...
    assert all(t["s_per_min"] >= 0 for t in threads)
    assert "232" in {t["waits_in_syscall"] for t in threads}  # the loop in epoll_wait
    # The watch's thread looks every 0.5 s: it ran in most readings.
    assert max(t["active_ticks"] for t in threads) >= 12
    assert row["idle_cpu_s_per_min"] >= 0
    assert row["idle_worst_window_s_per_min"] >= 0
