"""Errors that name the object they are about.

Every error nlproxy reports to an operator says which object is wrong and why, in the form
``Service default/web: spec.ports[1].port: 70000 is not in 1..65535`` or
``chain service-ABCD1234-default/web/tcp/http: File exists``, on one line of bounded length:
overlong numbers and names are cut (:func:`shorten`).
"""

from __future__ import annotations

import re

LONGEST_NUMBER = 20
"""Digits of a number shown whole in an error line (a 64-bit value has 20)."""
LONGEST_WORD = 128
"""Characters of a word shown whole: every name Kubernetes allows fits (a namespace/name pair
of 63-character labels has 127); a longer one is invalid anyway and shown by its start."""
_LONG = re.compile(rf"\d{{{LONGEST_NUMBER + 1},}}|[^\s:,]{{{LONGEST_WORD + 1},}}")


def shorten(text: str) -> str:
    """``text`` with each overlong number or word cut, saying how long it was: one line per
    error, however large the values a user wrote (a port of 401 digits, a name of 300)."""
    return _LONG.sub(_cut, text) if len(text) > LONGEST_NUMBER else text


def _cut(match: re.Match[str]) -> str:
    found = match.group()
    if found.isdigit():
        return f"{found[:8]}...({len(found)} digits)"
    return f"{found[:64]}...({len(found)} characters)"


class NlproxyError(Exception):
    """Base class: an error about one named object.

    Args:
        ref: what the error is about, e.g. ``Service default/web`` or ``chain services``.
        reason: what is wrong with it.
        field: the field path inside the object, when there is one.
    """

    def __init__(self, ref: str, reason: str, *, field: str = "") -> None:
        self.ref = ref
        self.field = field
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.field:
            return shorten(f"{self.ref}: {self.field}: {self.reason}")
        return shorten(f"{self.ref}: {self.reason}")


class InvalidObject(NlproxyError):
    """A Kubernetes object (or manifest) that cannot be used; it is left out, the rest goes on."""


class ConfigError(NlproxyError):
    """A flag or configuration field with an invalid value (exit status 2)."""


class InvalidNftObject(NlproxyError):
    """An nftables object that would be rejected by the kernel, caught before anything is sent."""


class KernelError(NlproxyError):
    """The kernel rejected an operation; ``ref`` names the nftables object behind it.

    Attributes:
        errno: the kernel's error number.
        index: position of the failing operation in the transaction, or -1.
        element: when that operation is a packed run of elements, the packed key of the one
            refused (None otherwise).
    """

    def __init__(
        self, ref: str, reason: str, *, errno: int, index: int = -1, element: bytes | None = None
    ) -> None:
        self.errno = errno
        self.index = index
        self.element = element
        super().__init__(ref, reason)
