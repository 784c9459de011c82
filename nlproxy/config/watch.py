"""A changed ``--config`` file, noticed and turned into what changed: the daemon applies it in
place, or exits so that the kubelet restarts it (kube-proxy exits on any change).

A ConfigMap mounted as a volume changes by a symlink swap (``config.conf`` → ``..data/config.conf``,
``..data`` → a new timestamped directory), so the file is known by what its path resolves to and
that file's identity (device, inode, size, modification time), not by an inotify watch on one
inode. :meth:`ConfigWatcher.check` stats (and, when the identity moved, reads) the file; the
daemon calls it when something changed in :meth:`ConfigWatcher.directories` (``notify.py``), or
every few seconds where the kernel gives no inotify descriptor. The settings are built again
the way the command line built them (the same flags over the new file), so a flag still
overrides the file.

Only the I/O of reading the file happens here: no clock, no logging, no threads. The daemon
calls ``check`` on its schedule, logs each change (:attr:`Reload.changes`, old and new values),
hands the new planner configuration to the sync loop (one plan, one atomic batch of only what
differs) and exits when :attr:`Reload.restart` is not empty.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

from nlproxy.config import Flags, Settings, build_settings
from nlproxy.config.notify import watched_directories
from nlproxy.errors import ConfigError

RESTART_FIELDS = frozenset(
    {
        "node_name",
        "kubeconfig",
        "kubeconfig_from_file",
        "api_server",
        "healthz_bind_address",
        "metrics_bind_address",
        "kube_api_qps",
        "kube_api_burst",
        "external_ip_cidrs",
        "node_port_range",
        "oom_score_adj",
    }
)
"""Daemon settings that cannot change in place: the servers' sockets, the API client, what the
sources and the state were started with, and the process's own OOM score (set at start). A
change to one of them asks for a restart, as kube-proxy does for any change. Every other
setting is applied in place by the daemon: the planner's (``proxy.*``, and the daemon fields
they are made from), the sync periods and the conntrack sysctls."""


@dataclass(frozen=True, slots=True)
class Change:
    """One setting that differs: ``name`` as ``daemon.<field>`` or ``proxy.<field>``."""

    name: str
    old: object
    new: object

    def __str__(self) -> str:
        return f"{self.name}: {self.old!r} -> {self.new!r}"


@dataclass(frozen=True, slots=True)
class Reload:
    """What a changed file means.

    Attributes:
        settings: the new settings; the old ones when ``error`` is set.
        changes: every setting that differs, in a stable order (empty: the file changed but
            says the same).
        restart: the changes that cannot be applied in place (the daemon should exit).
        error: why the new file was refused (the old settings stay); None when it was read.
        warnings: the new file's warnings that the old one did not have.
    """

    settings: Settings
    changes: tuple[Change, ...] = ()
    restart: tuple[Change, ...] = ()
    error: str | None = None
    warnings: tuple[str, ...] = ()


def differences(old: Settings, new: Settings) -> tuple[Change, ...]:
    """The settings of ``daemon`` and ``proxy`` that differ (warnings aside). The planner's
    settings are made from the daemon's: one the daemon's already named, with the same values,
    is not named twice (``masqueradeAll`` is one change, not two)."""
    out: list[Change] = []
    named: set[tuple[str, object, object]] = set()
    for part in ("daemon", "proxy"):
        a, b = getattr(old, part), getattr(new, part)
        for f in fields(a):
            if f.name == "warnings":
                continue
            before, after = getattr(a, f.name), getattr(b, f.name)
            if before != after and (f.name, repr(before), repr(after)) not in named:
                named.add((f.name, repr(before), repr(after)))
                out.append(Change(f"{part}.{f.name}", before, after))
    return tuple(out)


_Identity = tuple[str, int, int, int, int]


class ConfigWatcher:
    """Follows one ``--config`` file for a running daemon.

    Args:
        flags: the command line the daemon was started with (``flags.config`` is the file).
        settings: the settings it runs with now.
    """

    def __init__(self, flags: Flags, settings: Settings) -> None:
        if flags.config is None:
            raise ValueError("no --config file to watch")
        self.path: Path = flags.config
        self._flags = flags
        self.settings = settings
        self._seen = self._identity()

    def _identity(self) -> _Identity | None:
        """What the path resolves to and that file's identity; None while it cannot be read
        (mid-swap, or removed: the old settings stay)."""
        try:
            real = os.path.realpath(self.path)
            st = os.stat(real)
        except OSError:
            return None
        return (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def directories(self) -> list[Path]:
        """Where a change to the file shows (``notify.watched_directories``)."""
        return watched_directories(self.path)

    def check(self) -> Reload | None:
        """None when the file is as last seen (or unreadable for now); else what changed.

        An invalid new file keeps the current settings (``Reload.error`` says why) and is not
        read again until it changes once more.
        """
        seen = self._identity()
        if seen is None or seen == self._seen:
            return None
        self._seen = seen
        try:
            new = build_settings(self._flags)
        except ConfigError as exc:
            return Reload(settings=self.settings, error=str(exc))
        old = self.settings
        changes = differences(old, new)
        restart = tuple(c for c in changes if c.name.removeprefix("daemon.") in RESTART_FIELDS)
        warnings = tuple(w for w in new.daemon.warnings if w not in old.daemon.warnings)
        if not restart:
            self.settings = new
        return Reload(settings=new, changes=changes, restart=restart, warnings=warnings)
