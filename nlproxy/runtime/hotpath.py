"""The hot path's memory policy and idioms, in one place; the code that follows them points here.

A cold start at 10k Services x 10 endpoints builds millions of Python objects that live on (the
parsed cluster, its state, the plan, the programmed state) and almost none that are garbage.
CPython's time there goes to building objects and to its cyclic garbage collector walking them,
so the hot path (decode, plan, diff, encode, remember) follows a few rules. Each is given with
what it was measured to cost or save on the 2-CPU development machine (``bench/RESULTS.md``):

* **Values are msgspec Structs, frozen, with ``gc=False``** (``cluster/model.py``,
  ``proxy/planner.py``'s ``Frontend``/``PortPlan``/``PortPart``, ``proxy/endpoints.py``'s
  ``Categorized``, ``nft/ir.py``'s ``Element``). A Struct costs a tenth of a frozen dataclass to
  build (100k endpoints: 0.01 s against 0.12 s) and, holding no cycles, is never tracked by the
  collector (planning 10k x 10 leaves 270,686 objects alive, none of the Structs tracked).
* **A fast twin with a differential test.** Where the plain code is the one that explains what
  is wrong, a compiled or flattened twin does the common case and hands anything unusual back
  to it (``cluster/typed.py`` beside ``cluster/parse.py``; the packed set encoders beside the
  element-by-element ones). A unit test feeds both the same inputs and asserts the same result,
  so the twin can only be faster, never different. 10k x 10 as a JSON List, text to model
  changes: 1.37 s of CPU by the parser alone, 0.77 s with the typed twin (API pages: 1.43 to
  0.58 s).
* **The collector is paused while long-lived objects are built** (:func:`collection_paused`):
  parsing manifests (a third of the load time at 100k endpoints), listing from the API (a relist
  took up to 2.5 times as long at 10k x 10), planning (a full collection mid-plan walks the
  previous plan too: twice the time at 100k endpoints). No cycle is made there, so nothing is
  left for it to find.
* **A cold start pauses it until its first sync** (:func:`pause_collection` at start,
  :func:`resume_collection` after the first plan): about a second of a 10k x 10 cold start went
  to collections triggered by the growth of long-lived objects.
* **What a full sync built is frozen** (:func:`freeze_long_lived`, ``gc.freeze()``): the plan
  and programmed state are then out of every later collection's walk (seconds per full pass at
  10k Services otherwise, stalling event-to-commit). Incremental syncs allocate little and do
  not freeze.
* **Freed pages go back to the system** after a full sync and periodically
  (``daemon/memory.py``'s ``release``, glibc ``malloc_trim(0)``: about a millisecond at 10k
  Services), and the allocator's arenas are capped (``tune_allocator``).
* **Module constants for enum members and bound methods read in loops** (an attribute read
  through a class is a Python call's worth of work per element).

It sits in ``runtime/``, below every stage (``tests/unit/test_layering.py``): every stage from
``cluster/`` and ``proxy/`` up follows it, and ``daemon/``, where the allocator is tuned, is
above the stages that must pause the collector. It holds no state of the daemon's and does no
I/O, so ``proxy/`` may import it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Hold the cyclic collector while the block runs; it runs again when the last of any
    overlapping holders (threads, or trio tasks across an ``await``) ends, if it ran when the
    first began. A collector paused by someone else (a cold start) stays paused."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()


def pause_collection() -> bool:
    """Pause the collector for a cold start; True if it was running (then the caller resumes it
    with :func:`resume_collection` once the first sync has frozen what it built). While a block
    of :func:`collection_paused` holds it, the pause is handed to that block (which then leaves
    it paused when it ends)."""
    global _was_enabled
    with _lock:
        if _holders:
            running, _was_enabled = _was_enabled, False
            return running
        running = gc.isenabled()
        gc.disable()
        return running


def resume_collection() -> None:
    """Let the collector run again after a cold start's pause (unless a block of
    :func:`collection_paused` is running, which then resumes it when it ends)."""
    global _was_enabled
    with _lock:
        if _holders:
            _was_enabled = True
        else:
            gc.enable()


def freeze_long_lived() -> None:
    """Move every object alive now out of the collector's reach (``gc.freeze()``): called after a
    full sync, whose plan and programmed state live until the next one."""
    gc.freeze()
