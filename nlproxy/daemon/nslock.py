"""One nlproxy per network namespace: a lock the kernel keeps for us.

Two proxies programming one namespace fight: each repairs what the other "drifted", hundreds of
times a second, flushing UDP flows at every round. The lock is an abstract unix socket bound in
the namespace the rules go to: abstract names live per network namespace, the kernel releases it
when the holder dies (no stale files, nothing to clean after ``kill -9``), and it works across
containers that share the node's namespace, where a lock file under ``/run`` would not. A second
process learns the holder's pid from the listening socket's credentials (SO_PEERCRED).

Sits beside ``netns.py``; the daemon and ``run --once`` take it before their first commit.
"""

from __future__ import annotations

import errno
import socket
import struct

from nlproxy.errors import ConfigError
from nlproxy.netlink import netns

LOCK_NAME = b"\0nlproxy/proxy-lock"
_UCRED = struct.Struct("3i")  # pid, uid, gid


class NamespaceLock:
    """The lock of one network namespace; held until :meth:`release` (or the process ends).

    Raises:
        ConfigError: another process holds it (naming its pid), or the namespace cannot be
            entered.
    """

    def __init__(self, netns_name: str | None) -> None:
        where = f"network namespace {netns_name}" if netns_name else "this network namespace"
        with netns.entered(netns_name):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.bind(LOCK_NAME)
                sock.listen(1)
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE:
                    raise
                holder = _holder()
                who = f"pid {holder}" if holder else "another process"
                raise ConfigError(
                    where, f"nlproxy ({who}) already programs it; two would undo each other's rules"
                ) from None
        self._sock: socket.socket | None = sock

    def release(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _holder() -> int | None:
    """The pid of the process listening on the lock (call inside the namespace)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
        try:
            probe.connect(LOCK_NAME)
        except OSError:
            return None
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, _uid, _gid = _UCRED.unpack(creds)
    return pid or None
