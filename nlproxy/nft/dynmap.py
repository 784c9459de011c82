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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import partial

from nlproxy.errors import KernelError, NlproxyError
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.backend import kernel_supports_destroy
from nlproxy.nft.dump import Disturbed, Interrupted, ReadbackError
from nlproxy.nft.ir import Element, Family, Map, Operation, Value, Verb
from nlproxy.nft.readsets import read_pairs
from nlproxy.nft.values import Packer, key_decoder

__all__ = [
    "Clients",
    "Learned",
    "forget_learned",
    "forget_ops",
    "forget_stale",
    "pack_endpoints",
    "read_clients",
    "stale",
]

_RETRIES = 5
"""Dumps interrupted by a commit (or batches refused for a gone element) tried again."""

Clients = Mapping[bytes, bytes]
"""A dynamic map's elements as the kernel holds them: packed client -> packed endpoint."""


def pack_endpoints(m: Map, endpoints: Iterable[Sequence[Value]]) -> frozenset[bytes]:
    """``endpoints`` (``(address, port)``) as map ``m``'s packed data, to compare with
    :func:`read_clients`'s (a map of 40k clients is read without decoding one)."""
    packer = Packer(m.data)
    return frozenset(packer.pack(ep) for ep in endpoints)


def read_clients(sock: NetfilterSocket, family: Family, table: str, m: Map) -> Clients:
    """The elements of dynamic map ``m`` of ``family table`` as the kernel holds them now.

    Returns:
        packed key -> packed data; empty when the map (or table) is gone.

    A map the packet path keeps adding clients to may disturb every walk of it (each then
    lists some clients twice and leaves as many out: ``readsets.walked``): after the retries,
    what the reads listed together is returned. Each of those clients was in the map; a stale
    client every read left out stays mapped until a later forgetting finds it or it times out
    (before, one disturbed read was taken as whole).

    Raises:
        ReadbackError: the kernel refused the dump, or commits kept interrupting it.
    """
    why = "the ruleset changed during the dump"
    seen: dict[bytes, bytes] = {}
    for _ in range(_RETRIES):
        try:
            return read_pairs(sock, family, table, m.name)
        except Disturbed as exc:  # new clients moved the walk (no pause: the packet path, not
            why = exc.why  # a commit's deferred work, moves these maps)
            seen.update(exc.seen or {})
        except Interrupted as exc:  # a commit
            why = exc.why
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return {}
            raise ReadbackError(f"map {family} {table} {m.name}", exc.strerror or "") from exc
    if seen:
        return seen
    raise ReadbackError(
        f"map {family} {table} {m.name}", f"the dump kept being interrupted; last: {why}"
    )


def stale(clients: Clients, keep: Collection[bytes]) -> list[bytes]:
    """The clients (packed keys) whose endpoint (packed data) is not in ``keep``."""
    return [key for key, data in clients.items() if data not in keep]


def forget_ops(m: Map, keys: Sequence[bytes], *, destroy: bool | None = None) -> list[Operation]:
    """Delete the clients ``keys`` of ``m`` (keys only): ``destroy`` where the kernel has it
    (None: ask it). Few, so decoded into IR elements, which validation checks one by one."""
    if destroy is None:
        destroy = kernel_supports_destroy()
    verb = Verb.DESTROY if destroy else Verb.DELETE
    decode = key_decoder(m.key)
    return [Operation(verb, Element(set=m.name, key=decode(k))) for k in keys]


def forget_stale(
    m: Map,
    read: Callable[[], Clients],
    apply: Callable[[Sequence[Operation]], object],
    keep: Collection[bytes],
    *,
    destroy: bool | None = None,
    recheck: bool = True,
) -> int:
    """Delete the clients of ``m`` that ``read()`` gives whose endpoint is not in ``keep``, then
    (``recheck``) read again until none is left.

    Args:
        read: the map's elements now (:func:`read_clients` bound to ``m``).
        apply: commits a batch (``Tables.apply``).
        keep: the port's endpoints as the map's packed data (:func:`pack_endpoints`).
        recheck: read again after deleting. Needed while the endpoints in ``keep`` are not
            yet the only ones the packet path chooses (before that commit has landed: it may
            learn a removed endpoint's client meanwhile); after it, only a connection whose
            DNAT came before it and whose learning after the read (one packet's way through
            the hooks) can, and a read of a large map costs more than that window.

    Returns:
        How many clients were deleted.

    Raises:
        KernelError: the kernel refused a batch for another reason than a gone element, or
            stale clients kept coming back.
    """
    forgotten = 0
    for _ in range(_RETRIES):
        gone = stale(read(), keep)
        if not gone:
            return forgotten
        try:
            apply(forget_ops(m, gone, destroy=destroy))
        except KernelError as exc:
            if exc.errno != errno.ENOENT:  # (delete before 6.3: one timed out meanwhile)
                raise
            continue
        forgotten += len(gone)
        if not recheck:
            return forgotten
    if stale(read(), keep):
        raise KernelError(f"map {m.name}", "stale clients kept coming back", errno=errno.EAGAIN)
    return forgotten


Learned = tuple[Map, Iterable[Sequence[Value]]] | tuple[Map, Iterable[Sequence[Value]], Map]
"""A clients map with the endpoints its clients may keep (``address, port``); or an address map
and its port map (a third member: the client's port in a map of its own, data
``inet_service``), which hold one client together and lose it together."""


def _joint(
    m: Map,
    ports: Map,
    read: Callable[[Map], Clients],
    apply: Callable[[Sequence[Operation]], object],
) -> tuple[Callable[[], Clients], Callable[[Sequence[Operation]], object]]:
    """``read`` and ``apply`` of an address map and its port map as one map whose data is the
    address's bytes then the port's: a client in one of them alone is stale too."""
    held: dict[str, Clients] = {}
    port_key = Packer(ports.key)

    def read_both() -> Clients:
        held["a"], held["p"] = read(m), read(ports)
        a, p = held["a"], held["p"]
        return {k: a.get(k, b"") + p.get(k, b"") for k in {*a, *p}}

    def apply_both(ops: Sequence[Operation]) -> object:
        a, p = held.get("a", {}), held.get("p", {})
        mine = [op for op in ops if op.verb is Verb.DESTROY or (
            isinstance(op.obj, Element) and Packer(m.key).pack(op.obj.key) in a)]  # fmt: skip
        theirs = [
            Operation(op.verb, Element(set=ports.name, key=op.obj.key))
            for op in ops
            if isinstance(op.obj, Element)
            and (op.verb is Verb.DESTROY or port_key.pack(op.obj.key) in p)
        ]
        return apply([*mine, *theirs])

    return read_both, apply_both


def _pack_pairs(m: Map, ports: Map, endpoints: Iterable[Sequence[Value]]) -> frozenset[bytes]:
    """``endpoints`` as :func:`_joint`'s data: the address as ``m`` packs it, then the port as
    ``ports`` does."""
    addr, port = Packer(m.data), Packer(ports.data)
    return frozenset(addr.pack(ep[:1]) + port.pack(ep[1:]) for ep in endpoints)


def _first(held: Clients, read: Callable[[], Clients]) -> Callable[[], Clients]:
    """``read``, whose first call gives ``held`` (read already) instead of reading again."""
    pending = [held]

    def again() -> Clients:
        return pending.pop() if pending else read()

    return again


def forget_learned(
    read: Callable[[Map], Clients],
    apply: Callable[[Sequence[Operation]], object],
    maps: Iterable[Learned],
) -> tuple[int, list[NlproxyError]]:
    """:func:`forget_stale` for each map with the endpoints its clients may keep, after the
    commit that made those its only endpoints (so without a recheck).

    A map is read first and the endpoints packed only when it holds clients: a change of a
    Service of 20 ports x 1,000 endpoints packed 40,000 of them for maps mostly empty.
    A map the kernel refuses to read or change is left as it is (its stale clients go at the
    next change of its endpoints, or time out) and named in the errors; the others go on.

    Returns:
        How many clients were deleted, and the errors met.
    """
    forgotten = 0
    errors: list[NlproxyError] = []
    for item in maps:
        m, keep = item[0], item[1]
        read_m: Callable[[], Clients]
        try:
            if len(item) == 3:
                read_m, apply_m = _joint(m, item[2], read, apply)
                pack: Callable[[Iterable[Sequence[Value]]], frozenset[bytes]] = partial(
                    _pack_pairs, m, item[2]
                )
            else:
                read_m, apply_m, pack = partial(read, m), apply, partial(pack_endpoints, m)
            held = read_m()
            if not held:
                continue
            forgotten += forget_stale(m, _first(held, read_m), apply_m, pack(keep), recheck=False)
        except (KernelError, ReadbackError) as exc:
            errors.append(exc)
    return forgotten, errors
