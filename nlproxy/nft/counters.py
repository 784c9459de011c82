"""Read the values of per-element counters: what ``--service-counters`` counted, per frontend.

Sits beside the read-back, after the kernel: the daemon's ``/metrics`` handler and ``nlproxy
explain`` call :func:`read_counters`. Read-back (``readback.py``) deliberately leaves counter
values out of the IR, so that an element compares equal however much traffic it counted; this
module is the one place that reads them. Each set costs one GETSETELEM dump (the request
read-back sends), and each element's key and counter are parsed straight from the netlink
attributes (no library call per element).
It only reads: it never changes the kernel and never decides what is counted.

A counter lives in its element: it starts at zero when the element is created and is lost when
the element is deleted (for the service counters: the Service deleted and added again).
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterator, Mapping
from typing import TypeAlias

from nlproxy.netlink.codec import NFGENMSG, spans
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.dump import Disturbed, Interrupted, ReadbackError, messages, settle
from nlproxy.nft.ir import DataType, Family, Value
from nlproxy.nft.readsets import elements_request, walked
from nlproxy.nft.uapi import (
    NFTA_COUNTER_BYTES,
    NFTA_COUNTER_PACKETS,
    NFTA_DATA_VALUE,
    NFTA_EXPR_DATA,
    NFTA_EXPR_NAME,
    NFTA_LIST_ELEM,
    NFTA_SET_ELEM_EXPR,
    NFTA_SET_ELEM_EXPRESSIONS,
    NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS,
)
from nlproxy.nft.values import key_decoder

Counts: TypeAlias = dict[tuple[Value, ...], tuple[int, int]]
"""Element key -> (packets, bytes)."""

_RETRIES = 5
_BE64 = struct.Struct(">Q")


def read_counters(
    family: Family,
    table: str,
    sets: Mapping[str, tuple[DataType, ...]],
    *,
    netns: str | None = None,
    sock: NetfilterSocket | None = None,
) -> dict[str, Counts]:
    """Dump the elements of ``sets`` (name -> key types) of table ``family table``, with their
    counters. Blocking: from async code, call it through ``trio.to_thread.run_sync``.

    Returns:
        Per set that exists, each element's key -> (packets, bytes); elements without a
        counter are left out, as are sets that do not exist (counting is off).

    Raises:
        ReadbackError: the kernel refused a dump, or the set kept changing during it.
    """
    own = sock is None
    s = NetfilterSocket(netns) if sock is None else sock
    try:
        out: dict[str, Counts] = {}
        for name, key in sets.items():
            counts = _read_set(s, family, table, name, key)
            if counts is not None:
                out[name] = counts
        return out
    finally:
        if own:
            s.close()


def _read_set(
    s: NetfilterSocket, family: Family, table: str, name: str, key: tuple[DataType, ...]
) -> Counts | None:
    decode = key_decoder(key)
    why = "the ruleset changed during the dump"
    for attempt in range(_RETRIES):
        seq = s.next_seq()
        out: Counts = {}
        listed = 0
        try:
            for msg in messages(s, elements_request(family, table, name, seq), seq):
                for raw_key, counter in _elements(msg.payload):
                    out[decode(raw_key)] = counter
                    listed += 1
            walked(name, listed, len(out))  # else some elements' counts are missing
        except Disturbed as exc:
            why = exc.why
            if attempt + 1 < _RETRIES:
                settle(attempt)
            continue
        except Interrupted as exc:
            why = exc.why
            continue
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise ReadbackError(f"set {family} {table} {name}", str(exc)) from exc
        return out
    raise ReadbackError(f"set {family} {table} {name}", f"kept changing during the dump; {why}")


def _elements(payload: bytes) -> Iterator[tuple[bytes, tuple[int, int]]]:
    """(key bytes, (packets, bytes)) of each element with a counter in one NEWSETELEM reply
    (``payload``: after the netlink header)."""
    for kind, lo, hi in spans(payload, NFGENMSG.size):
        if kind != NFTA_SET_ELEM_LIST_ELEMENTS:
            continue
        for ekind, elo, ehi in spans(payload, lo, hi):
            if ekind != NFTA_LIST_ELEM:
                continue
            key, counter = None, None
            for akind, alo, ahi in spans(payload, elo, ehi):
                if akind == NFTA_SET_ELEM_KEY:
                    key = next((payload[a:b] for t, a, b in spans(payload, alo, ahi)
                                if t == NFTA_DATA_VALUE), None)  # fmt: skip
                elif akind == NFTA_SET_ELEM_EXPR:
                    counter = _counter(payload, alo, ahi)
                elif akind == NFTA_SET_ELEM_EXPRESSIONS:
                    found = (_counter(payload, a, b) for t, a, b in spans(payload, alo, ahi)
                             if t == NFTA_LIST_ELEM)  # fmt: skip
                    counter = next((c for c in found if c is not None), None)
            if key is not None and counter is not None:
                yield key, counter


def _counter(buf: bytes, lo: int, hi: int) -> tuple[int, int] | None:
    """(packets, bytes) of one expression nest, when it is a counter."""
    name, data = b"", None
    for kind, a, b in spans(buf, lo, hi):
        if kind == NFTA_EXPR_NAME:
            name = buf[a:b].split(b"\0", 1)[0]
        elif kind == NFTA_EXPR_DATA:
            data = (a, b)
    if name != b"counter" or data is None:
        return None
    values = {
        kind: _BE64.unpack_from(buf, a)[0]
        for kind, a, b in spans(buf, *data)
        if kind in (NFTA_COUNTER_PACKETS, NFTA_COUNTER_BYTES) and b - a == _BE64.size
    }
    return values.get(NFTA_COUNTER_PACKETS, 0), values.get(NFTA_COUNTER_BYTES, 0)
