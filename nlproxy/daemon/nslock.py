"""One nlproxy per network namespace: a lock the kernel keeps for us, that nobody else can take.

Two proxies programming one namespace fight: each repairs what the other "drifted", hundreds of
times a second, flushing UDP flows at every round. The lock is a listening abstract unix socket
in the namespace the rules go to, under the name ``nlproxy/proxy-lock/<pid>.<random>``: abstract
names live per network namespace, the kernel releases one when its holder dies (no stale files,
nothing to clean after ``kill -9``), and it works across containers that share the node's
namespace, where a lock file under ``/run`` would not.

Anyone may bind an abstract name, so no fixed name can be the lock: an unprivileged process
would bind it first and keep nlproxy out. Instead a start binds a name of its own, then lists
the listening unix sockets of the namespace with their owners (``sock_diag``, the kernel's
answer; nothing is connected to, so nothing can make the look block): a socket under the
prefix owned by root or by nlproxy's own user is another nlproxy, and the start is refused
(exit 2); sockets under the prefix owned by anyone else are ignored. Two starts at the same
instant may both be refused; one that comes later finds the survivor.

Being root is not enough either: a process running as uid 0 with every capability dropped (a
host-network container as root with ``drop: [ALL]``) cannot program the rules, so it must not
hold the lock. A lock socket is therefore marked in a way only CAP_NET_ADMIN allows: its receive
buffer is forced (``SO_RCVBUFFORCE``) beyond what ``SO_RCVBUF`` can reach under
``net.core.rmem_max``, and ``sock_diag`` reports each socket's buffer. A socket whose buffer any
process could have set is not a lock, whoever owns it; a start without CAP_NET_ADMIN is refused
(exit 1). (The buffer is a limit, not memory: a listening socket receives no data.) Where the
kernel has no unix socket diagnostics the buffers cannot be seen, and the owner alone decides.

The pid in the refusal is the holder's, read with SO_PEERCRED through a non-blocking connect
(left out when its backlog is full); the holder accepts and closes such probes in a thread, so
they never pile up.

Sits beside ``netns.py``; the daemon and ``run --once`` take it before their first commit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import struct
import threading
from collections.abc import Iterator

from nlproxy.errors import ConfigError, NlproxyError
from nlproxy.netlink import netns
from nlproxy.netlink.codec import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, headers

PREFIX = b"\0nlproxy/proxy-lock"
"""Every lock name starts so (the bare prefix is the name older versions bound)."""
_UCRED = struct.Struct("3i")  # pid, uid, gid

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
TCP_LISTEN = 10
UDIAG_SHOW_NAME = 0x01
UDIAG_SHOW_MEMINFO = 0x20
UDIAG_SHOW_UID = 0x40
UNIX_DIAG_NAME = 0
UNIX_DIAG_MEMINFO = 5
UNIX_DIAG_UID = 7
SK_MEMINFO_RCVBUF = 1
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
LOCK_RCVBUF = 1 << 30
"""Asked of ``SO_RCVBUFFORCE``; the kernel caps any request at INT_MAX / 2, then doubles it."""
_REQUEST_CAP = 0x7FFFFFFF // 2
FORCED_RCVBUF = 2 * min(LOCK_RCVBUF, _REQUEST_CAP)
"""The receive buffer a lock socket has."""
RMEM_MAX = "/proc/sys/net/core/rmem_max"
_UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, ino, show, cookie
_UNIX_DIAG_MSG = struct.Struct("=BBBBIII")  # family, type, state, pad, ino, cookie
_NLMSGHDR = struct.Struct("=IHHII")
_NLATTR = struct.Struct("=HH")


class NamespaceLock:
    """The lock of one network namespace; held until :meth:`release` (or the process ends).

    Raises:
        ConfigError: another nlproxy holds it (naming its pid), or the namespace cannot be
            entered.
    """

    def __init__(self, netns_name: str | None) -> None:
        where = f"network namespace {netns_name}" if netns_name else "this network namespace"
        with netns.entered(netns_name):
            sock = _bind_own()
            own = _name(sock)
            try:
                floor = _unprivileged_ceiling()
                others = [
                    name
                    for name, uid, rcvbuf in _others(PREFIX)
                    if name != own and _trusted(uid) and _forced(rcvbuf, floor)
                ]
            except BaseException:
                sock.close()
                raise
            if others:
                sock.close()
                pid = _holder(others[0])
                who = f"pid {pid}" if pid else "another process"
                raise ConfigError(
                    where, f"nlproxy ({who}) already programs it; two would undo each other's rules"
                )
        self._sock: socket.socket | None = sock
        self._drain = threading.Thread(target=_answer, args=(sock,), name="nslock", daemon=True)
        self._drain.start()

    def release(self) -> None:
        if self._sock is not None:
            # Wakes the thread's accept() (EINVAL), then the name goes with the descriptor.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._drain.join()
            self._sock.close()
            self._sock = None


def _bind_own() -> socket.socket:
    """A socket listening on a fresh name under the prefix, its receive buffer forced (call
    inside the namespace).

    Raises:
        NlproxyError: the process lacks CAP_NET_ADMIN (a runtime failure, exit 1, as the
            kernel's refusal of the first commit would have been).
    """
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, LOCK_RCVBUF)
        except PermissionError as exc:
            sock.close()
            raise NlproxyError(
                "the namespace lock",
                f"{exc.strerror}: programming a network namespace needs CAP_NET_ADMIN "
                "(in the effective set), which this process does not hold",
            ) from None
        name = PREFIX + f"/{os.getpid()}.{secrets.token_hex(8)}".encode()
        try:
            sock.bind(name)
            sock.listen(16)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:  # someone guessed 64 random bits: draw again
                raise
            continue
        return sock


def _name(sock: socket.socket) -> bytes:
    name = sock.getsockname()
    return name if isinstance(name, bytes) else name.encode()


def _trusted(uid: int | None) -> bool:
    """Whether a socket owned by ``uid`` can be an nlproxy: root's or our own user's (anyone
    else cannot program the namespace's rules)."""
    return uid is not None and uid in (0, os.geteuid())


def _unprivileged_ceiling() -> int | None:
    """The largest receive buffer a process without CAP_NET_ADMIN can give a socket
    (``SO_RCVBUF`` takes at most ``rmem_max``, capped at INT_MAX / 2, and doubles it); None
    when it cannot be read."""
    try:
        with open(RMEM_MAX, "rb") as f:
            rmem_max = int(f.read())
    except (OSError, ValueError):
        return None
    return 2 * min(rmem_max, _REQUEST_CAP)


def _forced(rcvbuf: int | None, ceiling: int | None) -> bool:
    """Whether a socket's receive buffer shows it was forced by CAP_NET_ADMIN. Unknown (no
    diagnostics, or ``rmem_max`` so large that SO_RCVBUF reaches as far): the owner decides."""
    if rcvbuf is None or ceiling is None or ceiling >= FORCED_RCVBUF:
        return True
    return rcvbuf > ceiling


def _answer(sock: socket.socket) -> None:
    """Accept and close the probes of refused starts until the socket is shut down."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError as exc:
            if exc.errno in (errno.EINTR, errno.ECONNABORTED, errno.EMFILE, errno.ENFILE):
                continue
            return  # shut down (EINVAL) or closed
        conn.close()


def _others(prefix: bytes) -> list[tuple[bytes, int | None, int | None]]:
    """:func:`listeners`, or where the kernel has no unix socket diagnostics, the names of
    ``/proc/net/unix`` with each owner's uid asked by SO_PEERCRED (None: it did not answer at
    once, and is not counted) and no receive buffer (None: not known)."""
    found: list[tuple[bytes, int | None, int | None]] = []
    try:
        found.extend(listeners(prefix))
    except OSError:
        pass
    else:
        return found
    with open("/proc/thread-self/net/unix", "rb") as table:
        for line in table.read().splitlines()[1:]:
            cols = line.split(maxsplit=7)
            # Flags: __SO_ACCEPTCON (listening); an abstract name shows its NUL as "@".
            if len(cols) == 8 and int(cols[3], 16) & 0x10000 and cols[7].startswith(b"@"):
                name = b"\0" + cols[7][1:]
                if name.startswith(prefix):
                    found.append((name, _creds(name)[1], None))
    return found


def listeners(prefix: bytes) -> Iterator[tuple[bytes, int, int | None]]:
    """(abstract name, owner uid, receive buffer) of each listening unix socket of the current
    network namespace whose name starts with ``prefix``, as the kernel's ``sock_diag`` tells.

    Raises:
        OSError: the kernel has no unix socket diagnostics (CONFIG_UNIX_DIAG).
    """
    with socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
    ) as nl:
        req = _UNIX_DIAG_REQ.pack(
            socket.AF_UNIX,
            0,
            0,
            1 << TCP_LISTEN,
            0,
            UDIAG_SHOW_NAME | UDIAG_SHOW_UID | UDIAG_SHOW_MEMINFO,
            0,
            0,
        )
        size = _NLMSGHDR.size + len(req)
        nl.send(_NLMSGHDR.pack(size, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + req)
        while True:
            buf = nl.recv(1 << 16)
            for mtype, _flags, _seq, start, end in headers(buf):
                if mtype == NLMSG_DONE:
                    return
                if mtype == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", buf, start)[0]
                    raise OSError(code, f"unix socket diagnostics: {os.strerror(code)}")
                if mtype == SOCK_DIAG_BY_FAMILY:
                    found = _entry(buf, start, end)
                    if found is not None and found[0].startswith(prefix):
                        yield found


def _entry(buf: bytes, start: int, end: int) -> tuple[bytes, int, int | None] | None:
    name: bytes | None = None
    uid: int | None = None
    rcvbuf: int | None = None
    off = start + _UNIX_DIAG_MSG.size
    while off + _NLATTR.size <= end:
        length, kind = _NLATTR.unpack_from(buf, off)
        if length < _NLATTR.size:
            break
        value = buf[off + _NLATTR.size : off + length]
        if kind == UNIX_DIAG_NAME:
            name = value
        elif kind == UNIX_DIAG_UID and len(value) >= 4:
            uid = struct.unpack_from("=I", value)[0]
        elif kind == UNIX_DIAG_MEMINFO and len(value) >= 4 * (SK_MEMINFO_RCVBUF + 1):
            rcvbuf = struct.unpack_from("=I", value, 4 * SK_MEMINFO_RCVBUF)[0]
        off += (length + 3) & ~3
    return None if name is None or uid is None else (name, uid, rcvbuf)


def _holder(name: bytes) -> int | None:
    """The pid listening on ``name`` (call inside the namespace); None when it cannot be told
    at once (a full backlog): the look never blocks."""
    return _creds(name)[0]


def _creds(name: bytes) -> tuple[int | None, int | None]:
    """(pid, uid) of the process listening on ``name``; (None, None) when they cannot be told
    at once."""
    with socket.socket(
        socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
    ) as probe:
        try:
            probe.connect(name)
        except OSError:
            return None, None
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, _gid = _UCRED.unpack(creds)
    return pid or None, uid
