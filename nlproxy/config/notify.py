"""Changes in a few directories, told by the kernel (inotify): what the daemon waits on for its
``--config`` file instead of looking at it every few seconds.

A ConfigMap volume changes by renaming its ``..data`` symlink in the file's own directory, an
editor by writing a new file and renaming it over the old one, ``kubectl cp`` or a package by
writing in place: each shows as an event in the directory that holds the path or in the one
that holds the file it resolves to, so both are watched (again after each change: the target
may have moved). Which file changed, and how, is for ``ConfigWatcher.check`` to tell; an event
here only says "look now". Only the I/O of the inotify descriptor happens here.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterable
from pathlib import Path

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_ONLYDIR = 0x01000000

MASK = (
    IN_CLOSE_WRITE
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
"""What is watched in each directory: files closed after writing (not each write: a file
half written is not read), renamed, made, removed, their attributes; the directory itself
removed or moved. ``IN_MODIFY`` is left out for the same reason as each write."""


class DirectoryEvents:
    """One inotify descriptor over the directories given to :meth:`watch`; readable (its
    :meth:`fileno`) when something changed in one of them.

    Raises:
        OSError: the kernel gave no descriptor (``EMFILE``: the user's
            ``fs.inotify.max_user_instances`` reached; ``ENOSYS``).
    """

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            _raise("inotify_init1")
        self._fd: int | None = fd

    def fileno(self) -> int:
        if self._fd is None:
            raise OSError(errno.EBADF, "the inotify descriptor is closed")
        return self._fd

    def watch(self, directories: Iterable[Path]) -> None:
        """Watch each of ``directories`` (one already watched keeps its watch).

        Raises:
            OSError: a directory cannot be watched (gone, not a directory, or the user's
                ``fs.inotify.max_user_watches`` reached).
        """
        fd = self.fileno()
        for directory in directories:
            if self._libc.inotify_add_watch(fd, os.fsencode(directory), MASK) < 0:
                _raise(f"inotify_add_watch {directory}")

    def drain(self) -> bool:
        """Read every event queued; whether there was any."""
        fd = self.fileno()
        any_read = False
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                return any_read
            if not data:
                return any_read
            any_read = True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def events_for(directories: Iterable[Path]) -> DirectoryEvents:
    """A :class:`DirectoryEvents` watching ``directories``.

    Raises:
        OSError: no descriptor, or a directory that cannot be watched (nothing is left open).
    """
    events = DirectoryEvents()
    try:
        events.watch(directories)
    except OSError:
        events.close()
        raise
    return events


def _raise(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")
