"""A dynamic map's stale clients: read what the packet path learned, forget what went away.

ClientIP affinity keeps, per Service port, one dynamic map ``client address -> endpoint``
that the packet path fills (``update @map { … }``). The packet path can add an element and
refresh its timeout, but never delete one or change its data: when an endpoint leaves, the
clients the map holds for it would still be sent to it. This module is the control plane's
part: :func:`read_clients` dumps one such map's elements (one dump of that map alone, cheap
whatever the table's size), :func:`stale` picks those whose endpoint is no longer one of the
port's, and :func:`forget_stale` deletes them and reads again until none is left, so a client
learned for a removed endpoint between a read and a commit does not survive either.

Deletions use ``destroy`` (Linux >= 6.3) where the kernel has it: an element that timed out
between the read and the commit is no error. Before 6.3 they use ``delete``, and a batch the
kernel refuses because such an element is gone (ENOENT) is read and sent again. Sits beside
the backend; knows no Kubernetes and no services.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Collection, Sequence

from nlproxy.errors import KernelError
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.backend import kernel_supports_destroy
from nlproxy.nft.dump import Interrupted, ReadbackError
from nlproxy.nft.ir import Element, Family, Map, Operation, SetFlag, Value, Verb
from nlproxy.nft.readsets import RawSet, read_elements
from nlproxy.nft.values import pad4

__all__ = ["forget_ops", "forget_stale", "read_clients", "stale"]

_RETRIES = 5
"""Dumps interrupted by a commit (or batches refused for a gone element) tried again."""


def read_clients(sock: NetfilterSocket, family: Family, table: str, m: Map) -> list[Element]:
    """The elements of dynamic map ``m`` of ``family table`` as the kernel holds them now.

    Returns:
        The elements, their ``timeout`` the map's own; empty when the map (or table) is gone.

    Raises:
        ReadbackError: the kernel refused the dump, or it kept changing under it.
    """
    raw = RawSet(
        name=m.name,
        flags=int(m.flags | SetFlag.MAP),
        key=m.key,
        key_len=m.key[0].length if len(m.key) == 1 else sum(pad4(dt.length) for dt in m.key),
        data=m.data,
        timeout_ms=(m.timeout or 0) * 1000,
        comment=m.comment,
    )
    for _ in range(_RETRIES):
        try:
            return read_elements(sock, family, table, raw)
        except Interrupted:
            continue
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return []
            raise ReadbackError(f"map {family} {table} {m.name}", exc.strerror or "") from exc
    raise ReadbackError(f"map {family} {table} {m.name}", "the dump kept being interrupted")


def stale(clients: Sequence[Element], keep: Collection[tuple[Value, ...]]) -> list[Element]:
    """The clients whose endpoint (the element's data) is not in ``keep``."""
    return [el for el in clients if el.value not in keep]


def forget_ops(clients: Sequence[Element], *, destroy: bool | None = None) -> list[Operation]:
    """Delete ``clients`` (keys only): ``destroy`` where the kernel has it (None: ask it)."""
    if destroy is None:
        destroy = kernel_supports_destroy()
    verb = Verb.DESTROY if destroy else Verb.DELETE
    return [Operation(verb, Element(set=el.set, key=el.key)) for el in clients]


def forget_stale(
    read: Callable[[], list[Element]],
    apply: Callable[[Sequence[Operation]], object],
    keep: Collection[tuple[Value, ...]],
    *,
    destroy: bool | None = None,
) -> int:
    """Delete the clients ``read()`` gives whose endpoint is not in ``keep``, then read again
    until none is left (the packet path may learn one for a removed endpoint until the commit
    that removes it from the choice has landed).

    Args:
        read: the map's elements now (:func:`read_clients` bound to a map).
        apply: commits a batch (``Tables.apply``).
        keep: the port's endpoints as the map's data, ``(address, port)``.

    Returns:
        How many clients were deleted.

    Raises:
        KernelError: the kernel refused a batch for another reason than a gone element, or
            kept refusing it.
    """
    forgotten = 0
    for _ in range(_RETRIES):
        gone = stale(read(), keep)
        if not gone:
            return forgotten
        try:
            apply(forget_ops(gone, destroy=destroy))
        except KernelError as exc:
            if exc.errno != errno.ENOENT:  # (delete before 6.3: one timed out meanwhile)
                raise
            continue
        forgotten += len(gone)
    if left := stale(read(), keep):
        raise KernelError(
            f"map {left[0].set}", "stale clients kept coming back", errno=errno.EAGAIN
        )
    return forgotten
