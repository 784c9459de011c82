"""``config/notify.py``: the kernel tells of a ``--config`` file's change however it is made (a
ConfigMap's ``..data`` swap, an editor's rename, a write in place through a symlink), and of
nothing when nothing changed; a directory that cannot be watched is an error naming it."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from nlproxy.config import Flags
from nlproxy.config.notify import DirectoryEvents, events_for
from nlproxy.config.watch import ConfigWatcher

BOUND = 30.0  # seconds an event may take to be readable on a loaded machine


def readable(events: DirectoryEvents, timeout: float) -> bool:
    return bool(select.select([events.fileno()], [], [], timeout)[0])


def told(events: DirectoryEvents) -> bool:
    """Whether a change was told (then read), waiting for it up to ``BOUND``."""
    return readable(events, BOUND) and events.drain()


def quiet(events: DirectoryEvents) -> bool:
    """Whether nothing is queued now (everything told so far was read)."""
    return not readable(events, 0) and not events.drain()


class Volume:
    """A ConfigMap volume's layout: ``config.conf`` -> ``..data/config.conf``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0
        (root / "config.conf").symlink_to("..data/config.conf")
        self.publish("a: 1\n")

    def publish(self, text: str) -> None:
        self.version += 1
        new = self.root / f"..{self.version}"
        new.mkdir()
        (new / "config.conf").write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(new.name)
        os.replace(tmp, self.root / "..data")


@pytest.fixture
def volume(tmp_path: Path) -> Volume:
    root = tmp_path / "etc-nlproxy"
    root.mkdir()
    return Volume(root)


def test_a_configmap_swap_is_told_and_nothing_else(volume: Volume) -> None:
    watcher = ConfigWatcher(Flags(config=volume.root / "config.conf"), settings=None)  # type: ignore[arg-type]
    assert watcher.directories() == [volume.root, volume.root / "..1"]
    events = events_for(watcher.directories())
    try:
        assert quiet(events)
        volume.publish("a: 2\n")
        assert told(events)
        assert quiet(events)
        events.watch(watcher.directories())  # the file resolves into ..2 now
        assert watcher.directories()[1] == volume.root / "..2"
        with open(volume.root / "..2" / "config.conf", "a") as f:
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
