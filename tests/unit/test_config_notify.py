"""``config/notify.py``: the kernel tells of a ``--config`` file's change however it is made (a
ConfigMap's ``..data`` swap, an editor's rename, a write in place through a symlink), and of
nothing when nothing changed; a directory that cannot be watched is an error naming it."""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path

import pytest
import trio

from nlproxy.config import Flags
from nlproxy.config.notify import (
    SETTLE_MAX_SECONDS,
    Changes,
    DirectoryEvents,
    events_for,
    watched_directories,
)
from nlproxy.config.watch import ConfigWatcher
from tests.unit.test_config_watch import ConfigMapVolume

BOUND = 30.0  # seconds an event may take to be readable on a loaded machine


def readable(events: DirectoryEvents, timeout: float) -> bool:
    return bool(select.select([events.fileno()], [], [], timeout)[0])


def told(events: DirectoryEvents) -> bool:
    """Whether a change was told (then read), waiting for it up to ``BOUND``."""
    return readable(events, BOUND) and events.drain()


def quiet(events: DirectoryEvents) -> bool:
    """Whether nothing is queued now (everything told so far was read)."""
    return not readable(events, 0) and not events.drain()


@pytest.fixture
def volume(tmp_path: Path) -> ConfigMapVolume:
    root = tmp_path / "etc-nlproxy"
    root.mkdir()
    return ConfigMapVolume(root, "a: 1\n")


def test_a_configmap_swap_is_told_and_nothing_else(volume: ConfigMapVolume) -> None:
    watcher = ConfigWatcher(Flags(config=volume.root / "config.conf"), settings=None)  # type: ignore[arg-type]
    assert watcher.directories() == [volume.root, volume.root / "..2026_11_28_12_00_01"]
    events = events_for(watcher.directories())
    try:
        assert quiet(events)
        volume.update("a: 2\n")
        assert told(events)
        assert quiet(events)
        events.watch(watcher.directories())  # the file resolves into ..2 now
        data = volume.root / "..2026_11_28_12_00_02"
        assert watcher.directories()[1] == data
        with open(data / "config.conf", "a") as f:
            f.write("b: 1\n")
        assert told(events)
    finally:
        events.close()


def test_an_editors_rename_and_a_write_in_place_through_a_symlink_are_told(
    tmp_path: Path,
) -> None:
    etc, srv = tmp_path / "etc", tmp_path / "srv"
    etc.mkdir()
    srv.mkdir()
    (srv / "config.yaml").write_text("a: 1\n")
    (etc / "config.yaml").symlink_to(srv / "config.yaml")
    watcher = ConfigWatcher(Flags(config=etc / "config.yaml"), settings=None)  # type: ignore[arg-type]
    assert watcher.directories() == [etc, srv]
    events = events_for(watcher.directories())
    try:
        with open(srv / "config.yaml", "w") as f:  # in place, in the target's directory
            f.write("a: 2\n")
        assert told(events)
        (srv / "config.yaml.new").write_text("a: 3\n")
        os.replace(srv / "config.yaml.new", srv / "config.yaml")  # an editor's save
        assert told(events)
        assert quiet(events)
    finally:
        events.close()


def test_a_directory_that_cannot_be_watched_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    with pytest.raises(FileNotFoundError, match="No such file or directory") as raised:
        events_for([tmp_path, missing])
    assert str(missing) in str(raised.value)


def test_a_symlink_met_on_the_way_is_watched_where_it_lives(tmp_path: Path) -> None:
    """A release layout: ``etc/current`` -> ``releases/v1`` (a directory), and the file's
    path through it; a chain of file symlinks. Each symlink's own directory is watched, so
    retargeting one is told."""
    etc, releases = tmp_path / "etc", tmp_path / "releases"
    for v in ("v1", "v2"):
        (releases / v).mkdir(parents=True)
        (releases / v / "config.yaml").write_text(f"{v}: 1\n")
    etc.mkdir()
    (etc / "current").symlink_to(releases / "v1")
    path = etc / "current" / "config.yaml"
    assert watched_directories(path) == [etc / "current", etc, releases / "v1"]
    events = events_for(watched_directories(path))
    try:
        (etc / "next").symlink_to(releases / "v2")
        os.replace(etc / "next", etc / "current")  # the release switched
        assert told(events)
    finally:
        events.close()
    links = tmp_path / "links"
    links.mkdir()
    (links / "middle").symlink_to(releases / "v1" / "config.yaml")
    (etc / "chained.yaml").symlink_to(links / "middle")
    assert watched_directories(etc / "chained.yaml") == [etc, links, releases / "v1"]


def test_changes_wait_for_a_still_moment_but_not_for_ever(tmp_path: Path) -> None:
    """A neighbour written every 50 ms never leaves the directory still: the wait returns
    all the same, :data:`SETTLE_MAX_SECONDS` after the first event, not at the safety look."""
    (tmp_path / "config.yaml").write_text("a: 1\n")
    stop = threading.Event()

    def busy() -> None:
        while not stop.wait(0.05):
            (tmp_path / "app.log").write_text(str(time.monotonic()))

    async def main() -> float:
        changes = Changes()
        assert not changes.follow([tmp_path])
        writer = threading.Thread(target=busy)
        writer.start()
        try:
            started = time.monotonic()
            with trio.fail_after(BOUND):  # the safety look would be minutes away
                await changes.wait()
            return time.monotonic() - started
        finally:
            stop.set()
            writer.join()
            changes.close()

    waited = trio.run(main)
    assert waited >= SETTLE_MAX_SECONDS * 0.9


def test_changes_poll_while_a_directory_is_gone_and_watch_again_once_it_is_back(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    changes = Changes()
    try:
        assert not changes.follow([conf])
        assert changes.polling is None
        conf.rmdir()
        assert changes.follow([conf])  # polls from now on: said once
        assert isinstance(changes.polling, FileNotFoundError)
        assert not changes.follow([conf])  # still polling: not said again
        conf.mkdir()
        assert not changes.follow([conf])
        assert changes.polling is None

        async def main() -> None:
            with trio.fail_after(BOUND):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(changes.wait)
                    await trio.sleep(0.1)
                    (conf / "config.yaml").write_text("a: 1\n")  # in the directory made again

        trio.run(main)
    finally:
        changes.close()


def test_changes_drop_the_directories_left_behind(tmp_path: Path) -> None:
    """Following other directories takes a new descriptor: a write where the file no longer
    resolves does not wake the daemon (nor do such watches pile up)."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    changes = Changes()
    try:
        changes.follow([old])
        changes.follow([new])
        (old / "x").write_text("1\n")

        async def main() -> bool:
            with trio.move_on_after(SETTLE_MAX_SECONDS + 1):
                await changes.wait()
                return True
            return False

        assert not trio.run(main)
    finally:
        changes.close()
