"""The daemon's heap census (``nlproxy/daemon/census.py``): off by default, and when on a file
that names what holds the memory."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from nlproxy.daemon import census


def test_off_without_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(census.ENV, raising=False)
    assert not census.start()
    assert census.write("first_sync") is None
    assert list(tmp_path.iterdir()) == []


def test_census_names_the_lines_that_hold_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(census.ENV, str(tmp_path / "c"))
    was_tracing = tracemalloc.is_tracing()
    assert census.start()
    try:
        held = [bytes(1000) + str(i).encode() for i in range(20_000)]  # about 20 MB, one line
        path = census.write("first_sync")
    finally:
        if not was_tracing:
            tracemalloc.stop()
    assert path == tmp_path / "c.first_sync.json"
    data = json.loads(path.read_text())
    assert data["status_kb"]["VmRSS"] > 20_000
    assert data["pymalloc"] == {}  # not while tracing: see the next test
    top_line, mb, count = data["by_line"][0]
    assert top_line.startswith(f"{__file__}:")
    assert mb > 19
    assert count >= 20_000
    assert data["by_file"][0][0] == __file__
    assert len(held) == 20_000
    assert data["gc_objects"] > 0
    assert data["threads"] >= 1


def test_untraced_census_has_the_allocators_totals(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if tracemalloc.is_tracing():
        pytest.fail("tracemalloc runs already: this test needs it off")
    monkeypatch.setenv(census.ENV, str(tmp_path / "c"))
    monkeypatch.setenv(census.FRAMES_ENV, "0")
    assert census.start()
    assert not tracemalloc.is_tracing()
    held = [str(i) * 20 for i in range(100_000)]  # small objects: pymalloc's
    path = census.write("1")
    assert path is not None
    data = json.loads(path.read_text())
    totals = data["pymalloc"]
    assert totals["bytes in allocated blocks"] > 100_000 * 60
    assert totals["Total"] >= totals["arenas allocated current"] << 18
    assert "by_line" not in data
    assert "traced_mb" not in data
    assert len(held) == 100_000


@pytest.mark.parametrize(
    ("raw", "frames"), [("", 1), ("0", 0), ("5", 5), ("x", 1), ("-2", 1), ("70000", 1)]
)
def test_frames_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, frames: int
) -> None:
    monkeypatch.setenv(census.FRAMES_ENV, raw)
    assert census.frames_wanted() == frames
