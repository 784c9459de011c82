"""``bench_idle_threads.py`` at a small size: the idle daemon's threads are listed with their
CPU, the event loop's among them, and the process's figure covers theirs."""

from __future__ import annotations

from checks.script import run_script


def test_the_idle_daemons_threads_are_listed() -> None:
    rows = run_script("bench_idle_threads.py", "--services", "60", "--endpoints", "3",
                      "--settle", "1", "--idle", "12", "--every", "0.5")  # fmt: skip
    assert len(rows) == 1
    row = rows[0]
    assert row["every_s"] == 0.5
    threads = row["threads"]
    tids = {t["tid"] for t in threads}
    assert len(tids) >= 3  # the event loop, the generation watch's, the source's...
    assert row["pid"] in tids  # the event loop's (main) thread is among them
    main = next(t for t in threads if t["tid"] == row["pid"])
    assert main["comm"] != "?"
    assert main["waits_in_syscall"] != "?"
    assert sum(t["s_per_min"] for t in threads) > 0  # the watch's looks cost something
    # The generation watch looks twice a second, so some thread runs ~24 times in 12 s; the
    # process's count is the threads' together (a worker gone may add its own).
    assert row["wakeups_per_min"] >= max(t["wakeups_per_min"] for t in threads) >= 60
    rounding = 0.05 * len(threads)
    assert row["wakeups_per_min"] >= sum(t["wakeups_per_min"] for t in threads) - rounding


def test_a_daemon_following_a_config_file_is_not_woken_for_it() -> None:
    """With ``--config`` (a ConfigMap volume's layout, nothing changing it) the event loop is
    not woken to look at the file: the kernel tells of a change (it was looked at every 2 s,
    30 wake-ups a minute and a worker thread's each)."""
    # Settled past the start-up's own wake-ups (a memory release 10 s after the first sync).
    rows = run_script("bench_idle_threads.py", "--services", "60", "--endpoints", "3",
                      "--settle", "15", "--idle", "12", "--every", "0.5", "--config")  # fmt: skip
    (row,) = rows
    assert row["config"] is True
    main = next(t for t in row["threads"] if t["tid"] == row["pid"])
    assert main["wakeups_per_min"] < 15, main
    assert not [t for t in row["threads"] if t["comm"] == "?" and t["wakeups_per_min"] >= 15]
