"""Reading the manifests directory without being led astray: the file opened is the file checked.

The daemon reads as root, and whoever may write the directory may swap what a name points at
between the listing and the read. So every file is opened relative to the directory's descriptor
with ``openat2(RESOLVE_BENEATH)``: a symbolic link is followed only while it stays beneath the
directory (a ConfigMap volume's ``name -> ..data/name`` links do), never out of it, whatever it
pointed at when listed. It is opened ``O_NONBLOCK`` (a FIFO swapped in cannot hang the open) and
used only when ``fstat`` of the descriptor says a regular file of at most
:data:`~nlproxy.cluster.decode.MAX_FILE_BYTES`; a file that changes while it is read is
reported unsettled, to be read again.

Knows files only: what they hold is ``decode.py``'s and ``manifests.py``'s.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from nlproxy.cluster.decode import MAX_FILE_BYTES, FileError

SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


class Unsettled(Exception):
    """The file changed while it was read; read it again once it settles."""


@dataclass(frozen=True, slots=True)
class FileRead:
    data: bytes
    changed: float
    """When the file last changed, seconds since the epoch: its ctime, which the kernel sets
    (an mtime can be set to any time by whoever writes the file)."""
    digest: bytes
    """``data``'s BLAKE2b-128, computed once: a reload tells an unchanged file by it, and
    ``run --once``'s files digest is of them."""


class Directory:
    """An open manifests directory; a context manager.

    Raises:
        OSError: the directory cannot be opened (on entering).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> Directory:
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        os.close(self.fd)
        self.fd = -1

    def names(self) -> list[str]:
        """The entries' names, sorted."""
        return sorted(os.listdir(self.fd))

    def read(self, name: str, limit: int = MAX_FILE_BYTES) -> FileRead | None:
        """The whole content of regular file ``name``; None for a directory (skipped).

        Args:
            limit: the most bytes to read (the reload's budget left, at most a file's cap).

        Raises:
            FileError: a link out of the directory, not a regular file, too large, unreadable.
            Unsettled: it changed while it was read.
        """
        try:
            fd = self._open(name)
        except OSError as exc:
            if exc.errno == errno.EXDEV:  # RESOLVE_BENEATH: the path left the directory
                where = os.path.realpath(self.path / name)
                raise FileError(
                    f"{name}: a symbolic link to {where}, outside {self.path}; not read"
                ) from None
            raise FileError(f"{name}: cannot read: {exc.strerror or exc}") from None
        try:
            before = os.fstat(fd)
            if stat.S_ISDIR(before.st_mode):
                return None
            if not stat.S_ISREG(before.st_mode):
                raise FileError(f"{name}: not a regular file; not read")
            size = before.st_size
            if size > MAX_FILE_BYTES:
                raise FileError(
                    f"{name}: {size} bytes, more than a manifest may hold ({MAX_FILE_BYTES})"
                )
            if size > limit:
                raise FileError(
                    f"{name}: not read: {size} bytes, more than is left of one reload's budget "
                    f"({limit})"
                )
            data = _read_all(fd, size + 1)
            after = os.fstat(fd)
        except OSError as exc:
            raise FileError(f"{name}: cannot read: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        if len(data) != size or _version(before) != _version(after):
            raise Unsettled(name)
        return FileRead(data, after.st_ctime, hashlib.blake2b(data, digest_size=16).digest())

    def _open(self, name: str) -> int:
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        how = _OpenHow(flags, 0, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
        fd = _libc.syscall(
            ctypes.c_long(SYS_OPENAT2),
            ctypes.c_int(self.fd),
            ctypes.c_char_p(os.fsencode(name)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.ENOSYS:
            raise OSError(err, os.strerror(err))
        # Before Linux 5.6: the path resolved now must stay inside, and its last step is not
        # followed again (a link swapped in after this look is refused by O_NOFOLLOW).
        real = os.path.realpath(self.path / name)
        if not Path(real).is_relative_to(os.path.realpath(self.path)):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        return os.open(real, flags | os.O_NOFOLLOW)


def _version(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _read_all(fd: int, most: int) -> bytes:
    """Up to ``most`` bytes, until end of file: in one read, as a regular file gives it, into
    one buffer (no copy to join them)."""
    chunks: list[bytes] = []
    left = most
    while left > 0:
        chunk = os.read(fd, left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
