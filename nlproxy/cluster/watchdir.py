"""Manifests source for the daemon: a directory, reloaded when inotify says it changed.

Each reload sends the whole directory as one ``Replace`` per kind (``load_manifests``), so added,
changed and removed files all take effect the same way, and the cluster state works out which
services changed. Events are coalesced for ``settle`` seconds, so an editor's write-rename-chmod
sequence causes one reload.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import Change
from nlproxy.log import get_logger

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)

_libc = ctypes.CDLL(None, use_errno=True)


class ManifestSource:
    """Feeds the manifests in ``directory`` to the daemon, again whenever they change."""

    def __init__(self, directory: Path, *, settle: float = 0.1, max_wait: float = 1.0) -> None:
        self.directory = directory
        self.settle = settle
        self.max_wait = max_wait
        self.log = get_logger("source")
        self.errors: tuple[str, ...] = ()
        """File-level problems of the last load (the sync loop reports and counts them)."""
        self._good: dict[str, Any] = {}
        self._warned: set[str] = set()

    def _inotify(self) -> int:
        fd: int = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if _libc.inotify_add_watch(fd, os.fsencode(self.directory), WATCH_MASK) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {self.directory}")
        return fd

    def _load(self) -> Sequence[Change]:
        # A file that does not parse now keeps the objects it had (see load_manifests).
        loaded = load_manifests(self.directory, self._good)
        self._good = loaded.good
        self.errors = tuple(loaded.errors)
        for warning in sorted(set(loaded.warnings) - self._warned):  # each once
            self.log.warning("manifest.unknown_field", warning=warning)
        self._warned = set(loaded.warnings)
        return list(loaded.changes)

    async def run(
        self,
        send: trio.MemorySendChannel[Sequence[Change]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Send the directory's contents now and after every change, until cancelled.

        Cancellation: returns at the next wait; the inotify descriptor is closed.
        """
        fd = self._inotify()
        try:
            await send.send(self._load())
            task_status.started()
            while True:
                await trio.lowlevel.wait_readable(fd)
                await self._quiet(fd)
                self.log.debug("source.reload", directory=str(self.directory))
                await send.send(self._load())
        finally:
            os.close(fd)

    async def _quiet(self, fd: int) -> None:
        """Wait until the directory has been quiet for ``settle`` seconds (at most
        ``max_wait``): a file written in pieces (truncate, then write) is read once, whole.

        Cancellation: safe at any point.
        """
        deadline = trio.current_time() + self.max_wait
        self._drain(fd)  # the event that woke us
        while True:
            await trio.sleep(self.settle)
            if not self._drain(fd) or trio.current_time() >= deadline:
                return

    @staticmethod
    def _drain(fd: int) -> bool:
        """Read every pending event; whether there were any."""
        got = False
        while True:
            try:
                buf = os.read(fd, 65536)
            except BlockingIOError:
                return got
            got = True
            if len(buf) < struct.calcsize("iIII"):
                return got
