"""A census of the daemon's heap, for finding what holds its memory (``bench/bench_daemon.py
--census``).

Off unless ``NLPROXY_CENSUS`` names a file prefix in the daemon's environment: then
:func:`start` begins tracing Python allocations (``tracemalloc``, the frames
``NLPROXY_CENSUS_FRAMES`` deep, default 1; 0 traces nothing) before the source exists, and
the daemon writes a census to ``PREFIX.first_sync.json`` once its first sync is done and to
``PREFIX.N.json`` on every ``SIGUSR1``. Tracing costs time and memory (about 60 bytes per
live allocation), so the RSS of a traced daemon is not its RSS: compare the parts with each
other, and the daemon's RSS with an untraced run.

A census holds the process's RSS and peak (``/proc/self/status``), its threads, what Python's
allocator holds (``sys._debugmallocstats``' totals: arenas, the bytes in used blocks, the free
ones; only while nothing is traced, as tracing wraps that allocator), the traced bytes by
source line and file, and the objects the cyclic GC tracks by type (the frozen ones, what the
first sync built, are not among them). It only reads, but for the moment it takes the
allocator's totals, when stderr (the log) is put aside (:func:`_pymalloc`).

A census that cannot be written (the prefix's directory missing, not writable, full) is
logged by the daemon and does not stop it.
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

ENV = "NLPROXY_CENSUS"
FRAMES_ENV = "NLPROXY_CENSUS_FRAMES"


def prefix() -> str | None:
    """The file prefix censuses are written to, or None when they are off."""
    return os.environ.get(ENV) or None


def start() -> bool:
    """Begin tracing allocations when censuses are on; True if they are."""
    if prefix() is None:
        return False
    import tracemalloc  # here: its imports (pickle among them) cost a daemon without censuses

    frames = frames_wanted()
    if frames > 0 and not tracemalloc.is_tracing():
        tracemalloc.start(frames)
    return True


MAX_FRAMES = 100
"""The deepest traceback traced (``tracemalloc`` takes up to 65535; deeper costs far more)."""


def frames_wanted() -> int:
    """``NLPROXY_CENSUS_FRAMES`` as a number of frames, 0 to ``MAX_FRAMES`` (1 when unset,
    and when it is not such a number: a diagnostic setting never stops the daemon)."""
    raw = os.environ.get(FRAMES_ENV) or "1"
    try:
        frames = int(raw)
    except ValueError:
        return 1
    return frames if 0 <= frames <= MAX_FRAMES else 1


def write(name: str, limit: int = 40) -> Path | None:
    """Write a census to ``PREFIX.name.json`` (nothing when censuses are off); its path."""
    base = prefix()
    if base is None:
        return None
    path = Path(f"{base}.{name}.json")
    path.write_text(json.dumps(take(limit), indent=1))
    return path


def take(limit: int = 40) -> dict[str, Any]:
    """The census (see the module docstring), the ``limit`` largest entries of each table."""
    import tracemalloc

    out: dict[str, Any] = {"status_kb": _status(), "threads": threading.active_count()}
    out["pymalloc"] = {} if tracemalloc.is_tracing() else _pymalloc()
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        out["traced_mb"] = round(current / 1e6, 1)
        out["traced_peak_mb"] = round(peak / 1e6, 1)
        snap = tracemalloc.take_snapshot()
        stats = snap.statistics("lineno")
        out["by_line"] = [
            [str(s.traceback), round(s.size / 1e6, 2), s.count] for s in stats[:limit]
        ]
        files = Counter[str]()
        for s in stats:
            files[s.traceback[0].filename] += s.size
        out["by_file"] = [[f, round(n / 1e6, 2)] for f, n in files.most_common(limit)]
    types = Counter(type(o).__qualname__ for o in gc.get_objects())
    out["gc_objects"] = sum(types.values())
    out["gc_by_type"] = types.most_common(limit)
    return out


def _status() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "VmData"):
            fields[key] = int(value.split()[0])
    return fields


_TOTALS = re.compile(
    r"^#? ?(arenas allocated current|bytes in allocated blocks|bytes in available blocks|"
    r"\d+ unused pools|bytes lost to pool headers|bytes lost to quantization|"
    r"bytes lost to arena alignment|Total)\b[^=]*=\s*([\d,]+)",
    re.MULTILINE,
)


def _pymalloc() -> dict[str, int]:
    """The totals of Python's small-object allocator, as ``sys._debugmallocstats`` prints them
    (to the C library's stderr only, so read through a file put in its place for the call:
    whatever another thread writes to stderr meanwhile goes there too and is lost). Not taken
    while ``tracemalloc`` traces (it prints nothing then)."""
    import tempfile

    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        text = os.pread(tmp.fileno(), 1 << 20, 0).decode(errors="replace")
    out: dict[str, int] = {}
    for m in _TOTALS.finditer(text):
        name = "unused pools" if m[1].endswith("unused pools") else m[1]
        out.setdefault(name, int(m[2].replace(",", "")))  # the first Total: the arenas'
    return out
