"""A finding of ``nlproxy preflight``: one line of its screen. Shared by the checks of
:mod:`nlproxy.operate.preflight` and the API server's in :mod:`nlproxy.operate.preflight_api`."""

from __future__ import annotations

import enum
import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class Level(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the screen: which check, how bad, and what to do."""

    check: str
    level: Level
    text: str


def checked(check: str, run: Callable[[], Sequence[Finding] | Finding]) -> list[Finding]:
    """``run``'s findings, or one ``FAIL`` naming the check and why it could not look: a
    report stops at no check (a check's own bug included: it is named, the rest go on)."""
    try:
        out = run()
    except OSError as exc:
        return [Finding(check, Level.FAIL, f"could not be checked: {_os_why(exc)}")]
    except Exception as exc:  # noqa: BLE001 - every check ends in a finding
        why = str(exc) or type(exc).__name__
        return [Finding(check, Level.FAIL, f"could not be checked: {why}")]
    return [out] if isinstance(out, Finding) else list(out)


def _os_why(exc: OSError) -> str:
    """An ``OSError`` as the system says it, not Python's ``[Errno N] ...``; a refusal without
    a file is the kernel's (a netlink socket, a namespace): preflight reads it as root."""
    why = exc.strerror or str(exc)
    if exc.filename:
        return f"{exc.filename}: {why}"
    if exc.errno in (errno.EPERM, errno.EACCES):
        return f"{why} (it reads the kernel's state: run preflight as root)"
    return why
