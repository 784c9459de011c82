"""Manifests source for the daemon: a directory, reloaded when inotify says it changed.

Each reload sends the whole directory as one ``Replace`` per kind (``load_manifests``), so added,
changed and removed files all take effect the same way, and the cluster state works out which
services changed. Events are coalesced for ``settle`` seconds, so an editor's write-rename-chmod
sequence causes one reload. Loads run in a worker thread; a file caught changing, or still
serving objects it lost, is read again once it settles (``load_manifests``'s ``unsettled``).

One large or broken file never holds back another file's change: after the first load, a changed
file of more than ``DEFER_BYTES`` is parsed by a task of its own, its last good objects standing
meanwhile, and the directory is sent again once it is parsed; a content that did not parse is
not parsed again while it stays the same.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from collections.abc import Sequence
from pathlib import Path

import trio

from nlproxy.cluster.manifests import (
    DEFER_BYTES,
    GRACE,
    GoodFile,
    Parsed,
    load_manifests,
    parse_file,
)
from nlproxy.cluster.model import Change
from nlproxy.cluster.readdir import FileRead
from nlproxy.errors import ConfigError
from nlproxy.log import get_logger
from nlproxy.runtime.inotify import (
    CHANGES,
    EVENT,
    IN_CLOEXEC,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_NONBLOCK,
    libc,
)

WATCH_MASK = CHANGES | IN_MODIFY

PARENT_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
GONE_POLL = 5.0
"""Seconds between looks for a manifests directory that is gone, besides the parent's events
(rules are kept meanwhile)."""


class ManifestSource:
    """Feeds the manifests in ``directory`` to the daemon, again whenever they change.

    The path is followed, not the directory first found there: publishing a new directory by
    rename (``mv new dir``) or by swapping a symlink (``ln -sfn v2 dir``, as a ConfigMap volume
    does one level down) is picked up, through a second watch on the parent directory for the
    path's own name. A directory that disappears is reported once and waited for; the objects
    last read (and so the rules) stay until it is back.
    """

    def __init__(
        self,
        directory: Path,
        *,
        settle: float = 0.1,
        max_wait: float = 1.0,
        proxy_name: str | None = None,
    ) -> None:
        self.directory = directory
        self.proxy_name = proxy_name
        """Only the objects labelled ``service-proxy-name`` with this are read (None: only
        those without the label, as kube-proxy)."""
        self.settle = settle
        self.max_wait = max_wait
        self.log = get_logger("source")
        self.errors: tuple[str, ...] = ()
        """File-level problems of the last load (the sync loop reports and counts them)."""
        self._good: dict[str, GoodFile] = {}
        self._parsed: dict[str, Parsed] = {}
        """Contents parsed apart, and those that did not parse (``load_manifests``'s
        ``parsed``)."""
        self._defer: int | None = None  # the first load parses every file itself
        self._deferred: dict[str, FileRead] = {}
        self._parsing: tuple[str, bytes] | None = None
        self._deferred_added = trio.Event()
        self._woken = trio.Event()  # a parse apart ended: when to look again may have changed
        self._lock = trio.Lock()  # one load at a time: each starts from the last one's results
        self._unsettled: tuple[str, ...] = ()
        self._warned: set[str] = set()
        self._fd = -1
        self._wd_dir = self._wd_parent = -1
        self._identity: tuple[int, int] | None = None

    def _open(self) -> None:
        fd: int = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._fd = fd
        parent = self.directory.absolute().parent
        self._wd_parent = libc.inotify_add_watch(fd, os.fsencode(parent), PARENT_MASK)
        self._watch_dir()

    def _watch_dir(self) -> bool:
        """Watch what the path names now; False when it is not a directory (gone)."""
        try:
            st = os.stat(self.directory)
        except OSError:
            self._identity = None
            return False
        self._identity = (st.st_dev, st.st_ino)
        wd: int = libc.inotify_add_watch(self._fd, os.fsencode(self.directory), WATCH_MASK)
        self._wd_dir = wd
        return wd >= 0

    def _moved(self) -> bool:
        """Whether the path names another directory than the one watched (or none)."""
        try:
            st = os.stat(self.directory)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._identity

    async def _reload(self, send: trio.MemorySendChannel[Sequence[Change]]) -> None:
        """Send the directory's contents again; if it cannot be listed now (EMFILE, or gone
        between two looks), the objects stay as they are and it is tried again soon.

        Cancellation: safe at any point.
        """
        async with self._lock:
            try:
                changes = await self._load()
            except ConfigError as exc:
                self.log.warning(
                    "source.reload_failed", directory=str(self.directory), error=str(exc)
                )
                self._unsettled = (str(self.directory),)
                return
            await send.send(changes)

    async def _load(self) -> Sequence[Change]:
        """The directory's contents, read in a worker thread: a large file (or a slow file
        system) never keeps the event loop from answering ``/livez`` or repairing the table.

        Raises:
            ConfigError: the directory cannot be listed.

        Cancellation: the thread's reading is abandoned (it only reads).
        """
        # A file that does not parse now keeps the objects it had (see load_manifests).
        loaded = await trio.to_thread.run_sync(
            functools.partial(
                load_manifests,
                self.directory,
                self._good,
                parsed=self._parsed,
                defer=self._defer,
                proxy_name=self.proxy_name,
            ),
            abandon_on_cancel=True,
        )
        self._good = loaded.good
        self._parsed = dict(loaded.failed)
        self._defer = DEFER_BYTES
        self._queue(loaded.deferred)
        self._unsettled = loaded.unsettled
        self.errors = tuple(loaded.errors)
        for warning in sorted(set(loaded.warnings) - self._warned):  # each once
            self.log.warning("manifest.unknown_field", warning=warning)
        self._warned = set(loaded.warnings)
        if loaded.unsettled:
            self.log.debug("source.unsettled", files=list(loaded.unsettled))
        return list(loaded.changes)

    def _queue(self, deferred: dict[str, FileRead]) -> None:
        """Hand the files a load left to parse to :meth:`_parse_deferred` (the newest content
        of each, unless it is being parsed)."""
        added = False
        for name, read in deferred.items():
            if self._parsing != (name, read.digest):
                self._deferred[name] = read
                added = True
        if added:
            self._deferred_added.set()

    async def _parse_deferred(self, send: trio.MemorySendChannel[Sequence[Change]]) -> None:
        """Parse the files loads left to parse, one at a time in a worker thread, and send the
        directory again after each.

        Cancellation: the thread's parsing is abandoned (it only reads).
        """
        while True:
            await self._deferred_added.wait()
            self._deferred_added = trio.Event()
            while self._deferred:
                name = next(iter(self._deferred))
                read = self._deferred.pop(name)
                self._parsing = (name, read.digest)
                self.log.debug("source.parse_apart", file=name, size=len(read.data))
                try:
                    parsed = await trio.to_thread.run_sync(
                        parse_file, name, read, self.proxy_name, abandon_on_cancel=True
                    )
                finally:
                    self._parsing = None
                async with self._lock:
                    self._parsed[name] = parsed
                await self._reload(send)
                # That load may have left objects in their grace (a file that lost some):
                # the watcher, waiting with no deadline, must learn when to read it again.
                self._woken.set()

    async def run(
        self,
        send: trio.MemorySendChannel[Sequence[Change]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Send the directory's contents now and after every change, until cancelled.

        Cancellation: returns at the next wait; the inotify descriptor is closed.
        """
        self._open()
        try:
            async with trio.open_nursery() as nursery:
                async with self._lock:
                    await send.send(await self._load())
                nursery.start_soon(self._parse_deferred, send)
                task_status.started()
                await self._watch(send)
        finally:
            os.close(self._fd)

    async def _watch(self, send: trio.MemorySendChannel[Sequence[Change]]) -> None:
        """Reload whenever the directory changes, until cancelled.

        Cancellation: returns at the next wait.
        """
        while True:
            # A file that changed while read, or still serves objects it lost, is read
            # again once it settles even if nothing else happens.
            with trio.move_on_after(self._recheck()) as waited:
                woken = await self._readable_or_woken()
            if waited.cancelled_caught:
                await self._reload(send)
                continue
            if woken:
                continue  # look again with the deadline the parse apart left
            if not await self._quiet():
                continue  # only the parent's other entries changed
            if self._moved():
                await self._follow()
                await self._quiet()  # let what is published there settle first
            self.log.debug("source.reload", directory=str(self.directory))
            await self._reload(send)

    async def _readable_or_woken(self) -> bool:
        """Wait for an inotify event or for :meth:`_parse_deferred` to end a parse; whether it
        was the latter.

        Cancellation: safe at any point.
        """
        woken = self._woken
        result = False
        async with trio.open_nursery() as nursery:

            async def readable() -> None:
                await trio.lowlevel.wait_readable(self._fd)
                nursery.cancel_scope.cancel()

            async def wake() -> None:
                nonlocal result
                await woken.wait()
                result = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(readable)
            nursery.start_soon(wake)
        if result:
            self._woken = trio.Event()
        return result

    def _recheck(self) -> float:
        """Seconds until the unsettled files are read again (inf: none)."""
        if not self._unsettled:
            return math.inf
        return max(self.settle, GRACE / 4)

    async def _follow(self) -> None:
        """Watch whatever the path names now, waiting for it while it is gone.

        Cancellation: safe at any point.
        """
        if self._wd_dir >= 0:
            libc.inotify_rm_watch(self._fd, self._wd_dir)
            self._wd_dir = -1
        if self._watch_dir():
            self.log.info("source.directory_replaced", directory=str(self.directory))
            return
        self.log.warning(
            "source.directory_missing",
            directory=str(self.directory),
            error="the manifests directory is gone: the rules stay as they are until it is back",
        )
        while not self._watch_dir():
            # The parent's watch sees the name come back; the timeout covers a parent that
            # went too.
            with trio.move_on_after(GONE_POLL):
                await trio.lowlevel.wait_readable(self._fd)
            self._drain()
        self.log.info("source.directory_back", directory=str(self.directory))

    async def _quiet(self) -> bool:
        """Wait until the directory has been quiet for ``settle`` seconds (at most
        ``max_wait``): a file written in pieces (truncate, then write) is read once, whole.

        Returns:
            Whether anything concerning the manifests happened (not just the parent's other
            entries).

        Cancellation: safe at any point.
        """
        deadline = trio.current_time() + self.max_wait
        relevant = self._drain()  # the event that woke us
        while True:
            await trio.sleep(self.settle)
            more = self._drain()
            relevant = relevant or more
            if not more or trio.current_time() >= deadline:
                return relevant

    def _drain(self) -> bool:
        """Read every pending event; whether one concerns the manifests (the directory, or the
        path's own name in its parent)."""
        name = os.fsencode(self.directory.absolute().name)
        relevant = False
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return relevant
            off = 0
            while off + EVENT.size <= len(buf):
                wd, _mask, _cookie, length = EVENT.unpack_from(buf, off)
                entry = buf[off + EVENT.size : off + EVENT.size + length].rstrip(b"\0")
                off += EVENT.size + length
                if wd != self._wd_parent or entry == name:
                    relevant = True
