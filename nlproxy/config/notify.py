"""When to look at a ``--config`` file again: when the kernel tells of a change where the file
lives (inotify), rather than every few seconds.

A ConfigMap volume changes by renaming its ``..data`` symlink in the file's own directory, an
editor by writing a new file and renaming it over the old one, a package or ``kubectl cp`` by
writing in place, a release script by retargeting a symlink (of the file, or of a directory on
its path): each shows as an event in a directory that holds the path, one of the symlinks met
on the way to the file, or the file itself (:func:`watched_directories`). Which file changed,
and how, is ``ConfigWatcher.check``'s to tell; an event here only says "look now".

:class:`Changes` waits for one. The directories are followed again after each look (the file
may resolve elsewhere now; a directory removed and made again is a new one to watch), on a new
descriptor when they differ, so watches of directories left behind do not pile up. Where the
kernel gives no descriptor or a directory cannot be watched (``fs.inotify.max_user_instances``
reached, a directory gone for now), it looks every :data:`POLL_SECONDS` until it can.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import trio

from nlproxy.runtime.inotify import CHANGES, IN_ONLYDIR, DirectoryEvents

MASK = CHANGES | IN_ONLYDIR
"""What is watched in each directory: its changes, files closed after writing but not each
write (a file half written is not read)."""

POLL_SECONDS = 2.0
"""How often the file is looked at where the kernel cannot tell of a change."""
SETTLE_SECONDS = 0.2
"""How long the directories must be still after an event before the file is read: a
ConfigMap's swap or an editor's rename is several events."""
SETTLE_MAX_SECONDS = 2.0
"""The longest wait for them to be still: a busy neighbour of the file (a log written every
tenth of a second) does not hold the look off."""
SAFETY_SECONDS = 300.0
"""The longest time between two looks all the same: a change inotify cannot see (another
host's write on a network file system) is found within it."""

MAX_SYMLINKS = 40  # as the kernel's own limit on a path's symlinks


def watched_directories(path: Path) -> list[Path]:
    """Where a change to ``path`` shows: the directory holding it, the one holding each symlink
    met while resolving it (a ConfigMap's ``..data``, a retargeted ``current`` directory), and
    the one holding the file it resolves to; those that exist now, in that order, once each."""
    path = Path(os.path.abspath(path))
    found = [path.parent]
    resolved = Path("/")
    todo = list(reversed(path.parts[1:]))
    links = 0
    while todo:
        part = todo.pop()
        if part == "..":
            resolved = resolved.parent
            continue
        candidate = resolved / part
        if candidate.is_symlink() and links < MAX_SYMLINKS:
            links += 1
            found.append(resolved)
            target = Path(os.readlink(candidate))
            if target.is_absolute():
                resolved = Path("/")
            todo.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
        else:
            resolved = candidate
    found.append(resolved.parent)
    unique = list(dict.fromkeys(found))
    return [d for d in unique if d.is_dir()]


def events_for(directories: Iterable[Path]) -> DirectoryEvents:
    """A :class:`DirectoryEvents` watching ``directories``.

    Raises:
        OSError: no descriptor, or a directory that cannot be watched (nothing is left open).
    """
    events = DirectoryEvents(MASK)
    try:
        events.watch(directories)
    except OSError:
        events.close()
        raise
    return events


class Changes:
    """Waits (:meth:`wait`) for a change in the directories last given to :meth:`follow`."""

    def __init__(self) -> None:
        self._events: DirectoryEvents | None = None
        self._dirs: list[Path] = []
        self.polling: OSError | None = None
        """Why the file is looked at every :data:`POLL_SECONDS` now (None: the kernel tells)."""

    def follow(self, directories: list[Path]) -> bool:
        """Watch ``directories`` from now on; True when that cannot be done and it was (so
        the caller says once that it polls, and why: :attr:`polling`)."""
        was = self.polling
        if self._events is None or directories != self._dirs:
            self.close()
            try:
                self._events = events_for(directories)
            except OSError as exc:
                self.polling = exc
            else:
                self._dirs, self.polling = list(directories), None
        else:
            try:  # a directory removed and made again is a new one: watched anew
                self._events.watch(directories)
            except OSError as exc:
                self.close()
                self.polling = exc
        return was is None and self.polling is not None

    async def wait(self) -> None:
        """Return when the file may have changed: an event, once the directories are still
        (or after :data:`SETTLE_MAX_SECONDS`), else after :data:`SAFETY_SECONDS`; every
        :data:`POLL_SECONDS` while :attr:`polling`."""
        events = self._events
        if events is None:
            await trio.sleep(POLL_SECONDS)
            return
        with trio.move_on_after(SAFETY_SECONDS):
            await trio.lowlevel.wait_readable(events.fileno())
            with trio.move_on_after(SETTLE_MAX_SECONDS):
                while True:
                    events.drain()
                    await trio.sleep(SETTLE_SECONDS)
                    if not events.drain():
                        break

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None
            self._dirs = []
