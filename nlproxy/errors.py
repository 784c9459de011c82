"""Errors that name the object they are about.

Every error nlproxy reports to an operator says which object is wrong and why, in the form
``Service default/web: spec.ports[1].port: 70000 is not in 1..65535`` or
``chain service-ABCD1234-default/web/tcp/http: File exists``.
"""

from __future__ import annotations


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
            return f"{self.ref}: {self.field}: {self.reason}"
        return f"{self.ref}: {self.reason}"


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
