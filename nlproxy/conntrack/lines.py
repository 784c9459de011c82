"""``conntrack -L`` lines straight from ctnetlink's bytes, for ``nlproxy conntrack list``.

Beside :mod:`nlproxy.conntrack.messages`, whose attribute table (``CT_MESSAGE``) it walks to
learn where each value a line shows sits. Pure: no sockets, no clock, no logging.
"""

from __future__ import annotations

import functools
import operator
import string
import struct
from collections.abc import Callable, Iterator
from ipaddress import IPv6Address
from typing import Any

from nlproxy.conntrack.messages import (
    CT_MESSAGE,
    IPCTNL_MSG_CT_NEW,
    IPS_ASSURED,
    IPS_HW_OFFLOAD,
    IPS_OFFLOAD,
    IPS_SEEN_REPLY,
    LINE_PROTO_NAMES,
    NFNL_SUBSYS_CTNETLINK,
    PORT_PROTOS,
    SCTP_STATES,
    TCP_STATES,
    Nest,
    conntrack_line,
    decode_flow,
    state_name,
)
from nlproxy.netlink.codec import NFGENMSG, NLMSGHDR, align, nfnl_type, nlmsghdr, spans_noting

# Decoding every attribute of 100k flows into objects and formatting their addresses through
# ``ipaddress`` cost ~20 µs a flow. The kernel sends nearly every flow of a kind with the same
# attribute layout (the same types and lengths at the same offsets), so the layout is learnt
# once, by walking one message the way :func:`decode_flow` does (and kept only if it then
# writes the line the full decoder writes). A later message with that layout is checked (its
# attribute headers and protocol numbers) and read (its values) in one ``unpack_from``; a
# datagram made only of such messages is checked at once, as one masked integer, and read with
# one ``iter_unpack``. A message with a layout not seen before, or one the walk cannot vouch
# for, goes through :func:`decode_flow` and :func:`conntrack_line`.

_U32 = struct.Struct("=I")
_MAX_LAYOUTS = 64
"""Layouts remembered per formatter; past that, unseen ones are decoded in full."""


class _Unlearnable(Exception):
    """A message whose layout the walk will not stand for (it goes the slow way)."""


def _children(buf: bytes, off: int, end: int, headers: list[int]) -> Iterator[tuple[int, int, int]]:
    """As :func:`~nlproxy.netlink.codec.spans_noting`; a walk that does not end exactly at
    ``end`` (a short or overlong attribute, trailing bytes) is refused."""
    for atype, start, stop in spans_noting(buf, off, end, headers):
        yield atype, start, stop
        off = start - 4 + align(stop - start + 4)
    if off < end:  # the walk stopped early: not what decode_flow was shown
        raise _Unlearnable


def _walk(payload: bytes) -> tuple[list[int], dict[str, tuple[int, str]]]:
    """Where :func:`decode_flow` reads each value a line shows: (offset, struct code) by field
    (a tuple's prefixed ``o``/``r``: ``osrc``), and the offsets of the attribute headers it
    looks at on the way."""
    headers: list[int] = []
    where: dict[str, tuple[int, str]] = {}
    _locate(payload, NFGENMSG.size, len(payload), CT_MESSAGE, "", headers, where)
    return headers, where


def _locate(
    buf: bytes,
    off: int,
    end: int,
    tree: Nest,
    prefix: str,
    headers: list[int],
    where: dict[str, tuple[int, str]],
) -> None:
    children = tree.children
    for atype, start, stop in _children(buf, off, end, headers):
        spec = children.get(atype)
        if spec is None:
            continue
        if isinstance(spec, Nest):
            inner = prefix
            if spec.group:
                inner = spec.group[0]  # orig -> o, reply -> r
                for k in [k for k in where if k[0] == inner]:  # a repeated tuple replaces the first
                    del where[k]
            _locate(buf, start, stop, spec, inner, headers, where)
        elif spec.shown:
            code = spec.code
            if code == "addr":
                if stop - start not in (4, 16):
                    raise _Unlearnable
                code = f"{stop - start}s"
            where[prefix + spec.field] = (start, code)


class _Layout:
    """One learnt layout: a check of its headers (and protocol numbers, which the line spells
    out), a reader of its values and the line's text with a ``{n}`` for each of them.

    ``framed``: the layout of whole messages (netlink header, payload, padding), to read a
    datagram of them with ``iter_unpack``; else of payloads.
    """

    __slots__ = (
        "addrs",
        "args",
        "by_status",
        "expected",
        "i_state",
        "i_status",
        "i_zone",
        "key",
        "mask_one",
        "masks",
        "pick",
        "read",
        "read_all",
        "states",
        "template",
        "text",
        "values",
        "want_one",
    )

    # One piece (98 lines): the struct's items, the indices it checks and the line's template
    # all come from one sorted list of items, and each step reads what the one before made.
    def __init__(
        self,
        payload: bytes,
        headers: list[int],
        where: dict[str, tuple[int, str]],
        *,
        framed: bool = False,
    ) -> None:
        if not all(k in where for k in ("osrc", "odst", "rsrc", "rdst")):
            raise _Unlearnable
        family = 4 if where["osrc"][1] == "4s" else 6
        # One struct reads, in the order of their offsets, the attribute headers (whole, as
        # numbers) and the values; the headers and protocol numbers are what is checked.
        # IPv4 addresses are read as four bytes each, which the template joins with dots.
        # Framed, the headers are checked through a mask over the whole datagram instead.
        items = [] if framed else [(off, "I", "") for off in headers]
        for name, (off, code) in where.items():
            if code == "4s":
                items += [(off + k, "B", f"{name}.{k}") for k in range(4)]
            else:
                items.append((off, code, name))
        message = payload
        self.mask_one = self.want_one = b""
        self.masks: dict[int, tuple[int, int]] = {}
        if framed:  # the netlink header's length and type are checked too; seq and pid not
            items = [(off + 16, c, n) for off, c, n in items]
            length = 16 + len(payload)
            head = nlmsghdr(length, nfnl_type(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_NEW), 0, 0)
            message = head + payload + b"\0" * ((4 - length % 4) % 4)
            spans = [(0, 4), (4, 2), *((off + 16, 4) for off in headers)]
            spans += [(where[k][0] + 16, 1) for k in ("oproto", "rproto") if k in where]
            mask = bytearray(len(message))
            for off, width in spans:
                mask[off : off + width] = b"\xff" * width
            self.mask_one = bytes(mask)
            self.want_one = bytes(m & b for m, b in zip(mask, message, strict=True))
        items.sort()
        reader = _packed_at("!", [(off, code) for off, code, _ in items], len(message))
        self.read = reader.unpack_from
        self.read_all = reader.iter_unpack
        at = {name: i for i, (_, _, name) in enumerate(items) if name}
        checked = [i for i, (_, _, name) in enumerate(items) if name in ("", "oproto", "rproto")]
        self.pick = operator.itemgetter(*checked)
        values = self.read(message)
        self.expected = self.pick(values)
        self.addrs = () if family == 4 else tuple(at[k] for k in ("osrc", "odst", "rsrc", "rdst"))
        self.i_status = at.get("status")
        self.i_zone = at.get("zone")
        oproto = values[at["oproto"]] if "oproto" in at else 0
        rproto = values[at["rproto"]] if "rproto" in at else 0
        # The line's text, with {n} for the values it shows; those are picked from what was
        # read (``shown``), then come [UNREPLIED], the flags, zone, state and, for IPv6, the
        # four addresses, made per flow.
        shown: list[str] = [
            k for k in ("timeout", "osport", "odport", "otype", "ocode", "oid", "rsport",
                        "rdport", "rtype", "rcode", "rid", "mark", "use") if k in at
        ]  # fmt: skip
        if family == 4:
            shown += [f"{a}.{k}" for a in ("osrc", "odst", "rsrc", "rdst") for k in range(4)]
        self.values = operator.itemgetter(*[at[k] for k in shown], 0)  # 0: always a tuple
        ix: dict[str, str] = {k: "{" + str(i) + "}" for i, k in enumerate(shown)}
        n = len(shown) + 1
        for i, a in enumerate(("osrc", "odst", "rsrc", "rdst")):
            if family == 4:
                ix[a] = ".".join(ix[f"{a}.{k}"] for k in range(4))
            else:
                ix[a] = f"{{{n + 4 + i}}}"
        proto = LINE_PROTO_NAMES.get(oproto, "unknown")
        parts = [f"{'ipv' + str(family):<8} {2 if family == 4 else 10} {proto:<8} {oproto}"]
        if "timeout" in ix:
            parts.append(ix["timeout"])
        self.i_state: int | None = None
        self.states: tuple[str, ...] = ()
        for name, names in (("tcp_state", TCP_STATES), ("sctp_state", SCTP_STATES)):
            if name in at:
                self.i_state = at[name]
                self.states = tuple(state_name(names, i) for i in range(256))
                parts.append(f"{{{n + 3}}}")
                break
        parts.append(_tuple_template("o", oproto, ix) + f"{{{n}}}")
        parts.append(_tuple_template("r", rproto, ix) + f"{{{n + 1}}}")
        parts.append(f"mark={ix['mark']}" if "mark" in ix else "mark=0")
        text = " ".join(parts) + f"{{{n + 2}}}"
        if "use" in ix:
            text += f" use={ix['use']}"
        self.template = text.format
        self.text, self.args = text, self.values
        self.by_status: dict[tuple[int, ...], str] = {}
        if family == 4:
            # Every value of an IPv4 line is a number: per (status, state, zone), the rest of
            # the line is fixed text, and a "%d" template takes the numbers in the order shown.
            order = [int(f) for _, f, _, _ in string.Formatter().parse(text) if f and int(f) < n]
            self.args = operator.itemgetter(*[at[shown[i]] for i in order])
        # What the fixed text depends on; twice over, so that it is a tuple however many
        keyed = [i for i in (self.i_status, self.i_state, self.i_zone) if i is not None] * 2
        self.key: Callable[[tuple[Any, ...]], tuple[Any, ...]] = (
            operator.itemgetter(*keyed) if keyed else _no_key
        )

    def holds(self, buf: bytes) -> bool:
        """Whether every message of ``buf`` (a whole number of them, framed) has this layout:
        the checked bytes of all of them compared at once, as one masked number."""
        k = len(buf) // len(self.mask_one)
        masks = self.masks.get(k)
        if masks is None:
            masks = (
                int.from_bytes(self.mask_one * k, "little"),
                int.from_bytes(self.want_one * k, "little"),
            )
            if len(self.masks) < 64:
                self.masks[k] = masks
        return int.from_bytes(buf, "little") & masks[0] == masks[1]

    def _extra(self, v: tuple[Any, ...]) -> tuple[str, str, str, str]:
        """[UNREPLIED], the flags, zone and state of a flow, as its line writes them."""
        status = 0 if self.i_status is None else v[self.i_status]
        unreplied, flags = _status_text(status)
        zone = 0 if self.i_zone is None else v[self.i_zone]
        state = "" if self.i_state is None else self.states[v[self.i_state]]
        return unreplied, flags, f" zone={zone}" if zone else "", state

    def line(self, v: tuple[Any, ...]) -> str:
        """The line of a message this layout read (``v``, checked by the caller)."""
        extra = self._extra(v)
        if self.addrs:
            a, b, c, d = self.addrs
            addrs = (_ntop6(v[a]), _ntop6(v[b]), _ntop6(v[c]), _ntop6(v[d]))
            return self.template(*self.values(v), *extra, *addrs)
        key = self.key(v)
        percent = self.by_status.get(key)
        if percent is None:
            percent = _percent(self.text, extra, self.values(v))
            if len(self.by_status) < 1024:
                self.by_status[key] = percent
        text: str = percent % self.args(v)
        return text

    def lines(self, rows: list[tuple[Any, ...]]) -> list[str]:
        """The lines of messages this layout read (checked by the caller)."""
        if self.addrs:
            return [self.line(v) for v in rows]
        key, args, known = self.key, self.args, self.by_status
        try:
            return [known[key(v)] % args(v) for v in rows]
        except KeyError:  # a status, state or zone not met yet: ``line`` learns it
            return [self.line(v) for v in rows]


def _percent(text: str, extra: tuple[str, ...], values: tuple[Any, ...]) -> str:
    """``text`` (a ``str.format`` template of an IPv4 line) as a ``%`` template: "%d" for each
    value shown (``values``, in their order there), the ``extra`` strings written in."""
    n = len(values)
    out = []
    for literal, field, _spec, _conv in string.Formatter().parse(text):
        out.append(literal.replace("%", "%%"))
        if field:
            i = int(field)
            out.append("%d" if i < n else extra[i - n].replace("%", "%%"))
    return "".join(out)


def _no_key(_v: tuple[Any, ...]) -> tuple[Any, ...]:
    return ()


def _tuple_template(side: str, proto: int, ix: dict[str, str]) -> str:
    """One tuple as ``_tuple_text`` writes it, with ``ix``'s placeholders for its values."""
    text = f"src={ix[side + 'src']} dst={ix[side + 'dst']}"
    if side + "id" in ix:
        kind, code = ix.get(side + "type", "-1"), ix.get(side + "code", "-1")
        return f"{text} type={kind} code={code} id={ix[side + 'id']}"
    if proto in PORT_PROTOS:
        return f"{text} sport={ix.get(side + 'sport', '0')} dport={ix.get(side + 'dport', '0')}"
    return text


def _ntop6(packed: bytes) -> str:
    return str(IPv6Address(packed))  # not inet_ntop: it writes IPv4-mapped ones differently


@functools.cache
def _status_text(status: int) -> tuple[str, str]:
    """What a flow's status adds after each tuple: `` [UNREPLIED]`` and `` [ASSURED]``…"""
    unreplied = "" if status & IPS_SEEN_REPLY else " [UNREPLIED]"
    if status & IPS_HW_OFFLOAD:
        return unreplied, " [HW_OFFLOAD]"
    if status & IPS_OFFLOAD:
        return unreplied, " [OFFLOAD]"
    if status & IPS_ASSURED:
        return unreplied, " [ASSURED]"
    return unreplied, ""


def _packed_at(order: str, items: list[tuple[int, str]], size: int) -> struct.Struct:
    """A struct reading ``items`` (offset, code) of a ``size``-byte message, padding between
    them and to its end."""
    fmt, pos = order, 0
    for off, code in items:
        if off > pos:
            fmt += f"{off - pos}x"
        fmt += code
        pos = off + struct.calcsize(order + code)
    if size > pos:
        fmt += f"{size - pos}x"
    return struct.Struct(fmt)


class LineFormatter:
    """``conntrack_line(decode_flow(payload))`` for the payloads of a dump, at a fraction of
    the cost: see the comment above. ``line(payload)`` writes one message's line;
    ``datagram(buf)`` all those of a datagram, when they all have one learnt layout.

    Raises (from ``line``):
        ValueError: as :func:`decode_flow`, for a message without both tuples.
    """

    def __init__(self) -> None:
        self._layouts: dict[int, list[_Layout]] = {}
        self._framed: dict[int, list[_Layout]] = {}
        self._learnt = 0

    def line(self, payload: bytes) -> str:
        for layout in self._layouts.get(len(payload), ()):
            v = layout.read(payload)
            if layout.pick(v) == layout.expected:
                return layout.line(v)
        text = conntrack_line(decode_flow(payload))
        if self._learnt < _MAX_LAYOUTS:
            self._learn(payload, text)
        return text

    def datagram(self, buf: bytes) -> list[str] | None:
        """The lines of a datagram made only of flow messages of one learnt layout (one
        ``iter_unpack`` reads them all); None for any other datagram."""
        if len(buf) < 4:
            return None
        size = align(_U32.unpack_from(buf)[0])
        for layout in self._framed.get(size, ()) if len(buf) % size == 0 else ():
            if layout.holds(buf):
                return layout.lines(list(layout.read_all(buf)))
        return None

    def _learn(self, payload: bytes, text: str) -> None:
        self._learnt += 1
        try:
            layout = _Layout(payload, *_walk(payload))
            framed = _Layout(payload, *_walk(payload), framed=True)
        except _Unlearnable:
            return
        # Only a layout that gives exactly what the full decoder gave is kept.
        if layout.line(layout.read(payload)) != text:
            return
        self._layouts.setdefault(len(payload), []).append(layout)
        size = align(NLMSGHDR.size + len(payload))
        message = bytes(16) + payload + bytes(size - 16 - len(payload))
        if framed.line(framed.read(message)) == text:
            self._framed.setdefault(size, []).append(framed)
