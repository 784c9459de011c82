"""The hot path's collector pause: overlapping holders, a pause made by someone else, a resume
asked for while a block holds it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from nlproxy.runtime import hotpath


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_a_block_pauses_and_restores() -> None:
    with hotpath.collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_overlapping_holders_resume_when_the_last_ends() -> None:
    first = hotpath.collection_paused()
    second = hotpath.collection_paused()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # not nested: the first to begin ends first
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_cold_start_pause_outlives_a_block() -> None:
    assert hotpath.pause_collection() is True
    with hotpath.collection_paused():
        pass
    assert not gc.isenabled()
    hotpath.resume_collection()
    assert gc.isenabled()


def test_a_resume_during_a_block_waits_for_its_end() -> None:
    assert hotpath.pause_collection() is True
    with hotpath.collection_paused():
        hotpath.resume_collection()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_threads_holding_it_at_once() -> None:
    inside = threading.Barrier(4)
    leave = threading.Event()

    def hold() -> None:
        with hotpath.collection_paused():
            inside.wait(timeout=60)
            leave.wait(timeout=60)

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    inside.wait(timeout=60)
    assert not gc.isenabled()
    leave.set()
    for t in threads:
        t.join(timeout=60)
    assert gc.isenabled()


def test_an_exception_in_the_block_still_resumes() -> None:
    with pytest.raises(RuntimeError), hotpath.collection_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_cold_start_pause_made_while_a_block_holds_it_outlives_the_block() -> None:
    with hotpath.collection_paused():
        assert hotpath.pause_collection() is True  # it ran before the block paused it
    assert not gc.isenabled()
    hotpath.resume_collection()
    assert gc.isenabled()
