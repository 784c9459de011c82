"""Enter a named network namespace for the calling thread, to open sockets there.

A netlink socket stays bound to the namespace it was created in, so nlproxy opens its sockets
inside ``with entered(name):`` and uses them anywhere afterwards. ``setns(2)`` switches only the
calling thread; the block must not hand control to other code (trio checkpoints included).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from nlproxy.errors import ConfigError

if TYPE_CHECKING:
    import ctypes

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = "/var/run/netns"


@functools.cache
def _libc() -> ctypes.CDLL:
    """libc, loaded on the first switch: a command run without ``--netns`` never loads ctypes
    (Python 3.11 has no ``os.setns``)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, name: str) -> None:
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise ConfigError(f"netns {name}", f"setns: {os.strerror(err)}")


@contextmanager
def entered(name: str | None) -> Iterator[None]:
    """Run the block inside network namespace ``name`` (``None``: stay where we are).

    Raises:
        ConfigError: the namespace does not exist or cannot be entered.
    """
    if name is None:
        yield
        return
    path = name if name.startswith("/") else os.path.join(NETNS_RUN_DIR, name)
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"netns {name}", f"cannot open {path}: {exc.strerror}") from exc
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target, name)
        try:
            yield
        finally:
            _setns(home, "(own)")
    finally:
        os.close(target)
        os.close(home)
