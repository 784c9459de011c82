"""Elements held as the kernel holds them: packed key bytes → packed data bytes.

Sits beside the IR. The big maps of a whole-cluster plan (100k backends elements and more) cost
Python several objects per element as :class:`~nlproxy.nft.ir.Element` values: a key tuple, the
element, the operation, the programmed copy. A :class:`PackedElements` keeps one set's elements
as the bytes the kernel is sent and sends back (``values.py``'s packing), so the planner writes
them once, the diff compares them as bytes (two equal maps compare in one C loop), the
programmed copy shares the dictionary (below) and the encoder joins them into its one buffer
per run.

It is also a ``MutableMapping`` of key tuples to elements, as a plain ``Ruleset.elements`` entry
is: whatever reads elements for display or tracing (render, explain, the tracer, the layout
read backwards) gets :class:`~nlproxy.nft.ir.Element` values, decoded one at a time when asked.

Only plain elements are packed: no comment, timeout or interval (:func:`packable` says which
sets qualify). Pure: no I/O.

A copy shares its original's dictionary until one of them is written (:meth:`PackedElements.own`):
the programmed state is the last plan's copy, and at 10k Services x 10 endpoints a dictionary of
the backends or hairpin elements is 5 MB, which a copy made after every sync kept twice while the
daemon idled; now a sync copies only the maps it changes, once. While shared, ``raw`` is a
read-only view, so a write that skips :meth:`~PackedElements.own` fails instead of reaching the
other copy.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from ipaddress import IPv4Address, IPv6Address
from types import MappingProxyType

from nlproxy.nft.ir import (
    DataType,
    Element,
    Map,
    PackedRun,
    Set,
    SetFlag,
    SetLike,
    Value,
    Verb,
)
from nlproxy.nft.values import Packer, _ipv4_int, key_decoder

_NOT_A_KEY = (TypeError, ValueError, OverflowError, struct.error)
"""What packing raises for values out of their type's range."""
_KINDS: dict[DataType, type] = {DataType.IPV4_ADDR: IPv4Address, DataType.IPV6_ADDR: IPv6Address}
"""The Python type of a key part, by data type (int for the others)."""


def packable(s: SetLike) -> bool:
    """Whether ``s``'s elements can be held packed: a plain set or a data map (not a verdict
    map) without intervals, timeouts, counters or dynamic updates."""
    if s.flags & (SetFlag.INTERVAL | SetFlag.EVAL | SetFlag.TIMEOUT) or s.timeout is not None:
        return False
    if isinstance(s, Set) and s.counter:  # each element holds a counter of its own
        return False
    return not (isinstance(s, Map) and s.is_vmap)


class _Holders:
    """How many :class:`PackedElements` hold one shared dictionary. Counted under a lock: a
    holder may be dropped in another thread (a plan read by the daemon's other tasks) while
    one is copied, and a lost count could let a holder write what another still reads. (A
    store is copied and written by one thread at a time; only dropping is free-threaded.)"""

    __slots__ = ("_lock", "count")

    def __init__(self) -> None:
        self.count = 1
        self._lock = threading.Lock()

    def join(self) -> None:
        with self._lock:
            self.count += 1

    def leave(self) -> bool:
        """One holder fewer; True if another still holds the dictionary."""
        with self._lock:
            self.count -= 1
            return self.count > 0

    def leave_owning(self, shared: dict[bytes, bytes]) -> dict[bytes, bytes]:
        """One holder fewer, and the dictionary it may write: ``shared`` itself if no other
        holds it, else a copy, taken before the count drops (a holder that finds itself the
        last one meanwhile writes to ``shared`` only once the copy is whole; a copy that fails
        leaves the count as it was)."""
        with self._lock:
            mine = dict(shared) if self.count > 1 else shared
            self.count -= 1
            return mine


class PackedElements(MutableMapping[tuple[Value, ...], Element]):
    """The elements of set ``s``: ``raw`` maps packed keys to packed data (``b""`` in a set).

    ``raw`` is for reading; writes go to the dictionary :meth:`own` returns (a copy shares its
    original's until either is written).

    Args:
        s: the set or map (see :func:`packable`).
        raw: packed elements to hold (not copied).
    """

    __slots__ = (
        "_data",
        "_decode_data",
        "_decode_key",
        "_dict",
        "_head",
        "_holders",
        "_key",
        "_kinds",
        "raw",
        "set",
    )

    raw: Mapping[bytes, bytes]
    """The packed elements: the dictionary itself, or a read-only view of it while shared."""

    def __init__(self, s: SetLike, raw: dict[bytes, bytes] | None = None) -> None:
        assert packable(s), f"set {s.name} cannot be held packed"
        self.set = s
        self._dict: dict[bytes, bytes] = {} if raw is None else raw
        self.raw = self._dict
        self._holders: _Holders | None = None
        self._key = Packer(s.key)
        self._kinds = tuple(_KINDS.get(dt, int) for dt in s.key)
        self._data = Packer(s.data) if isinstance(s, Map) else None
        self._decode_key = key_decoder(s.key)
        self._decode_data = key_decoder(s.data) if isinstance(s, Map) else None
        self._head: Packer | None = None

    @property
    def key_size(self) -> int:
        return self._key.size

    @property
    def data_size(self) -> int:
        return 0 if self._data is None else self._data.size

    # -- packing ----------------------------------------------------------------------------

    def pack_key(self, key: Sequence[Value]) -> bytes:
        packer = self._key
        if packer.v4_ints:  # an IPv4 address's int and the integers as they are, as in
            # _pack_each (inline: a frame less per ClusterIP planned)
            try:
                return packer.struct.pack(key[0]._ip, *key[1:])  # type: ignore[union-attr]
            except (AttributeError, struct.error):
                pass
        return packer.pack(key)

    def pack_data(self, el: Element) -> bytes:
        """The packed data of ``el`` (ValueError for what a packed element cannot hold)."""
        if el.comment or el.timeout is not None:
            raise ValueError(f"set {self.set.name}: a packed element has no comment or timeout")
        if self._data is None:
            if el.value is not None:
                raise ValueError(f"set {self.set.name}: an element of a set has no data")
            return b""
        if not isinstance(el.value, tuple):
            raise TypeError(f"map {self.set.name}: element data must be a tuple of values")
        return self._data.pack(el.value)

    def pack_head(self, head: Sequence[Value]) -> bytes:
        """The first bytes of the keys whose leading parts are ``head`` (a backends map's
        frontend, before the index): what ``pack_key`` gives for ``(*head, last)``, less the
        last part's 4 bytes."""
        packer = self._head
        if packer is None or len(packer.convs) != len(head):
            types = self.set.key[: len(head)]
            assert len(types) < len(self.set.key), f"set {self.set.name}: a head is a key's start"
            packer = self._head = Packer(types, concat=True)
        if packer.v4_ints:  # as pack_key (inline: a frame less per backends fill)
            try:
                return packer.struct.pack(head[0]._ip, *head[1:])  # type: ignore[union-attr]
            except (AttributeError, struct.error):
                pass
        return packer.pack(head)

    def pack_rows(self, rows: Sequence[Sequence[Value]]) -> list[bytes]:
        """The packed data of each row of values (a map's; the planner's hot path)."""
        assert self._data is not None, "only a map's elements have data"
        return _pack_each(self._data, rows)

    def pack_port(self, addresses: Sequence[Value], port: int) -> list[bytes]:
        """``pack_rows`` of the rows ``(a, port)`` for each address ``a`` (a map whose data is
        an address and a port: a port's endpoints that all serve it on one number), without a
        row made for each."""
        data = self._data
        assert data is not None, "only a map's elements have data"
        convs = data.convs
        if len(convs) == 2 and convs[0] is _ipv4_int and convs[1] is int:  # as _pack_each's
            pack = data.struct.pack
            try:
                return [pack(a._ip, port) for a in addresses]  # type: ignore[union-attr]
            except (AttributeError, struct.error):
                pass
        return _pack_each(data, [(a, port) for a in addresses])

    def pack_keys(self, rows: Sequence[Sequence[Value]]) -> list[bytes]:
        """The packed key of each row of values (the planner's hot path)."""
        return _pack_each(self._key, rows)

    def pack_pairs(self, addresses: Iterable[int]) -> list[bytes]:
        """The keys ``a . a`` of a set keyed by two addresses of one family (the hairpin
        set's), each address given as its int (the planner's hot path: no converter call)."""
        pack, key = self._key.struct.pack, self.set.key
        if key == (DataType.IPV4_ADDR, DataType.IPV4_ADDR):
            return [pack(a, a) for a in addresses]
        assert key == (DataType.IPV6_ADDR, DataType.IPV6_ADDR), f"{self.set.name}: not a pair"
        return [pack(b, b) for b in (a.to_bytes(16, "big") for a in addresses)]

    def select(self, part: int, value: Value) -> PackedElements:
        """The elements whose key part ``part`` is ``value``, compared as bytes."""
        types = self.set.key
        at = sum((dt.length + 3) & ~3 for dt in types[:part]) if len(types) > 1 else 0
        want = Packer((types[part],)).pack((value,))
        end = at + len(want)
        return PackedElements(self.set, {k: d for k, d in self.raw.items() if k[at:end] == want})

    def element(self, key: bytes, data: bytes) -> Element:
        """The IR element behind one packed pair (decoded now)."""
        value = None if self._decode_data is None else self._decode_data(data)
        return Element(set=self.set.name, key=self._decode_key(key), value=value)

    def decode_key(self, key: bytes) -> tuple[Value, ...]:
        return self._decode_key(key)

    def decode_data(self, data: bytes) -> tuple[Value, ...] | None:
        """A map's data as values (None in a set)."""
        return None if self._decode_data is None else self._decode_data(data)

    def own(self) -> dict[bytes, bytes]:
        """The dictionary to write to: this store's own, copied first if another still
        shares it."""
        holders = self._holders
        if holders is not None:
            self._dict = holders.leave_owning(self._dict)
            self._holders = None
            self.raw = self._dict
        return self._dict

    def copy(self) -> PackedElements:
        """A copy that shares this store's dictionary until either is written (:meth:`own`)."""
        holders = self._holders
        if holders is None:
            holders = self._holders = _Holders()
            self.raw = MappingProxyType(self._dict)
        holders.join()
        out = PackedElements.__new__(PackedElements)
        out.set, out._dict, out.raw, out._holders = self.set, self._dict, self.raw, holders
        out._key, out._kinds, out._data = self._key, self._kinds, self._data
        out._decode_key, out._decode_data, out._head = self._decode_key, self._decode_data, None
        return out

    def __del__(self) -> None:
        holders = getattr(self, "_holders", None)  # (None too when __init__ failed early)
        if holders is not None:
            holders.leave()

    def __copy__(self) -> PackedElements:
        return self.copy()

    def __deepcopy__(self, memo: object) -> PackedElements:
        return self.copy()  # bytes and a frozen set: nothing deeper to copy

    # -- the mapping of key tuples to elements ----------------------------------------------

    def _lookup(self, key: object) -> bytes | None:
        """``key`` packed, or None when it is not a key of this set (a dict of key tuples
        would just not hold it)."""
        if not isinstance(key, tuple) or len(key) != len(self._kinds):
            return None
        if not all(isinstance(v, k) for v, k in zip(key, self._kinds, strict=True)):
            return None
        try:
            return self._key.pack(key)
        except _NOT_A_KEY:  # out of range for its type
            return None

    def key_of(self, key: object) -> bytes | None:
        """``key`` packed, or None when it is not a key of this set (another family's)."""
        return self._lookup(key)

    def __getitem__(self, key: tuple[Value, ...]) -> Element:
        packed = self._lookup(key)
        if packed is None or packed not in self.raw:
            raise KeyError(key)
        return self.element(packed, self.raw[packed])

    def __setitem__(self, key: tuple[Value, ...], el: Element) -> None:
        self.own()[self._key.pack(key)] = self.pack_data(el)

    def __delitem__(self, key: tuple[Value, ...]) -> None:
        del self.own()[self._key.pack(key)]

    def __iter__(self) -> Iterator[tuple[Value, ...]]:
        return map(self._decode_key, self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def __contains__(self, key: object) -> bool:
        packed = self._lookup(key)
        return packed is not None and packed in self.raw

    def clear(self) -> None:
        if self._holders is not None:  # nothing to copy: let go of the shared dictionary
            self._holders.leave()
            self._holders, self._dict = None, {}
            self.raw = self._dict
        self._dict.clear()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedElements):
            return self._dict is other._dict or self.raw == other.raw
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedElements({self.set.name!r}, {len(self.raw)} elements)"


def _pack_each(packer: Packer, rows: Sequence[Sequence[Value]]) -> list[bytes]:
    pack, convs = packer.struct.pack, packer.convs
    if len(convs) == 2:  # address . port (backends data), address . address (hairpin)
        c0, c1 = convs
        if c0 is _ipv4_int and c1 is int:
            # IPv4 address . port: the address's int and the port as they are, no converter
            # call per value; anything else (a network, an int, a port to convert) fails
            # here and is packed below, as it always was.
            try:
                return [pack(a._ip, b) for a, b in rows]  # type: ignore[union-attr]
            except (AttributeError, struct.error):
                pass
        return [pack(c0(a), c1(b)) for a, b in rows]
    return [pack(*[c(v) for c, v in zip(convs, row, strict=True)]) for row in rows]


_INDEX = Packer((DataType.INTEGER,))
_INDICES = tuple(_INDEX.pack((i,)) for i in range(1024))


def indices(count: int) -> Sequence[bytes]:
    """The packed ``integer`` values 0 .. ``count`` - 1 (what ends a backends key)."""
    if count <= len(_INDICES):
        return _INDICES[:count]
    return [*_INDICES, *(_INDEX.pack((i,)) for i in range(len(_INDICES), count))]


def index_bytes(i: int) -> bytes:
    """The packed ``integer`` value ``i`` (what ends a backends key)."""
    return _INDICES[i] if i < len(_INDICES) else _INDEX.pack((i,))


def unpack_run(run: PackedRun, s: SetLike, verb: Verb = Verb.ADD) -> list[Element]:
    """The run as IR elements (for checks and error messages; decodes every element)."""
    store = PackedElements(s)
    data = run.data if run.data is not None else [b""] * len(run.keys)
    if verb not in (Verb.ADD, Verb.CREATE) or not isinstance(s, Map):
        return [Element(set=s.name, key=store.decode_key(k)) for k in run.keys]
    return [store.element(k, d) for k, d in zip(run.keys, data, strict=True)]
