"""inotify over ctypes: the kernel tells of changes in a directory (``man 7 inotify``).

The constants are the kernel's (``<sys/inotify.h>``); :class:`DirectoryEvents` is one
descriptor over some directories that only says "something changed" (the ``--config`` file's:
``config/notify.py``); the manifests directory's watch reads the events themselves
(``cluster/watchdir.py``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
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
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

CHANGES = (
    IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
"""What changes a directory's entries or the directory itself: a file made, removed, renamed,
closed after writing, its attributes; the directory removed or moved."""

EVENT = struct.Struct("iIII")
"""``struct inotify_event``: wd, mask, cookie, len (then the name, ``len`` bytes)."""

libc = ctypes.CDLL(None, use_errno=True)


def raise_errno(what: str) -> None:
    """The OSError of the call ``what`` that just failed (its errno, read at once)."""
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


class DirectoryEvents:
    """One inotify descriptor over the directories given to :meth:`watch` (each with
    ``mask``); readable (its :meth:`fileno`) when something changed in one of them.

    Raises:
        OSError: the kernel gave no descriptor (``EMFILE``: the user's
            ``fs.inotify.max_user_instances`` reached; ``ENOSYS``).
    """

    def __init__(self, mask: int) -> None:
        self.mask = mask
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise_errno("inotify_init1")
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
            if libc.inotify_add_watch(fd, os.fsencode(directory), self.mask) < 0:
                raise_errno(f"inotify_add_watch {directory}")

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
