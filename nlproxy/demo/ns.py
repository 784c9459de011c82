"""Named network namespaces for the test bed: create, delete, sysctls, stale sweep.

Below ``testbed.py`` (which builds the node/pod/client topology on top of these) and beside
``netns.py`` (which enters an existing namespace). Works like ``ip netns add``/``delete`` but with
system calls from this process: it must never exec a program, and it only ever deletes namespaces
whose names it was given (or, in :func:`sweep_stale`, test-bed names of processes that are gone).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import re

from nlproxy.errors import NlproxyError
from nlproxy.netlink import netns

CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 1 << 20
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_counter = itertools.count()
_NAME = re.compile(r"^nlp-(?P<tag>[a-z0-9]+)-(?P<pid>\d+)-\d+-[a-z0-9-]+$")


class TestbedError(NlproxyError):
    """The test bed could not build or use part of its topology (names the namespace or link)."""

    __test__ = False  # not a pytest test class, despite the name


def unique_name(tag: str, role: str) -> str:
    """A namespace name unique to this process and call: ``nlp-<tag>-<pid>-<n>-<role>``."""
    return f"nlp-{tag}-{os.getpid()}-{next(_counter)}-{role}"


def _check(ret: int, name: str, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise TestbedError(f"netns {name}", f"{what}: {os.strerror(err)}")


def _share_run_dir(name: str) -> None:
    """Make the namespace run directory a shared mount, as ``ip netns add`` does.

    A bind-mounted namespace file must show up in other mount namespaces (containers, systemd
    units), so the directory is a shared mount point; the first call may have to bind it onto
    itself before it can be marked shared.
    """
    run_dir = netns.NETNS_RUN_DIR.encode()
    os.makedirs(netns.NETNS_RUN_DIR, exist_ok=True)
    if _libc.mount(b"", run_dir, b"none", MS_SHARED | MS_REC, None) == 0:
        return
    _check(_libc.mount(run_dir, run_dir, b"none", MS_BIND | MS_REC, None), name, "bind run dir")
    _check(_libc.mount(b"", run_dir, b"none", MS_SHARED | MS_REC, None), name, "share run dir")


def create(name: str) -> str:
    """Create network namespace ``name`` (bind-mounted under ``/var/run/netns``) and return it.

    ``unshare(CLONE_NEWNET)`` moves only the calling thread, which returns to its own namespace
    before this function does.

    Raises:
        TestbedError: the namespace exists already or cannot be created.
    """
    _share_run_dir(name)
    path = os.path.join(netns.NETNS_RUN_DIR, name)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444))
    except OSError as exc:
        raise TestbedError(f"netns {name}", f"cannot create {path}: {exc.strerror}") from exc
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.unshare(CLONE_NEWNET), name, "unshare")
        try:
            src = b"/proc/thread-self/ns/net"
            _check(_libc.mount(src, path.encode(), b"none", MS_BIND, None), name, "bind mount")
        finally:
            _check(_libc.setns(home, CLONE_NEWNET), name, "setns back")
    except TestbedError:
        os.unlink(path)
        raise
    finally:
        os.close(home)
    return name


def move_here(name: str) -> None:
    """Move the calling thread into namespace ``name`` for good (for forked children).

    Raises:
        TestbedError: the namespace cannot be opened or entered.
    """
    path = os.path.join(netns.NETNS_RUN_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise TestbedError(f"netns {name}", f"cannot open {path}: {exc.strerror}") from exc
    try:
        _check(_libc.setns(fd, CLONE_NEWNET), name, "setns")
    finally:
        os.close(fd)


def delete(name: str) -> None:
    """Delete namespace ``name``; the kernel frees it once no process or socket holds it.

    A namespace that is already gone is not an error.
    """
    path = os.path.join(netns.NETNS_RUN_DIR, name)
    if _libc.umount2(path.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise TestbedError(f"netns {name}", f"umount: {os.strerror(err)}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def write_sysctl(name: str, key: str, value: str) -> None:
    """Set ``key`` (dotted, e.g. ``net.ipv4.ip_forward``) inside namespace ``name``.

    ``/proc/sys/net`` resolves to the namespace of the thread that opens the file, so the file is
    opened (and written) while this thread is inside ``name``.
    """
    path = "/proc/sys/" + key.replace(".", "/")
    with netns.entered(name):
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(value)
        except OSError as exc:
            raise TestbedError(f"netns {name}", f"sysctl {key}={value}: {exc.strerror}") from exc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(tag: str) -> list[str]:
    """Delete ``nlp-<tag>-<pid>-…`` namespaces left by test-bed processes that no longer exist.

    Only a process killed outright (SIGKILL) leaves namespaces behind; this removes them on the
    next start. Namespaces of live processes are left alone.

    Returns:
        the names deleted.
    """
    try:
        names = os.listdir(netns.NETNS_RUN_DIR)
    except FileNotFoundError:
        return []
    gone = []
    for entry in sorted(names):
        m = _NAME.match(entry)
        if m and m["tag"] == tag and not _alive(int(m["pid"])):
            delete(entry)
            gone.append(entry)
    return gone
