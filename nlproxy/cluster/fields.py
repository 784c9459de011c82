"""Typed reading of the fields of one raw Kubernetes object, every failure naming the field.

Sits under the parser (``parse.py``, the only code that reads raw Kubernetes objects): it reads
one field at a time from decoded JSON/YAML values and either returns a typed value or raises
``InvalidObject`` naming the object, the field path and what was wrong. It knows no kind of
object and no kube-proxy semantics, and must not do I/O, log, or keep state beyond the object's
name.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Mapping
from typing import Any, NoReturn

from nlproxy.cluster.model import IPAddress, IPNetwork, ObjectRef
from nlproxy.errors import InvalidObject


def quick_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """``text`` as an IPv4 address when it is one in dotted-quad form, else None (then the
    caller takes the slow path, which names the error). About 5x faster than
    ``ipaddress.ip_address``; both reject leading zeros, short forms and out-of-range octets."""
    try:
        packed = socket.inet_pton(socket.AF_INET, text)
    except (OSError, ValueError):
        return None
    return ipaddress.IPv4Address(int.from_bytes(packed))


SHOWN = 40
"""Characters of a value an error message shows."""


def describe(value: object) -> str:
    """A value as JSON for an error message, cut to 40 characters.

    Bounded in time and memory whatever the value: containers are shown from a shallow copy of
    their first items (a YAML alias bomb shares one list thousands of times; serialising it whole
    took seconds and gigabytes), and an integer of thousands of digits by its size.
    """
    try:
        text = json.dumps(_shallow(value, 2))
    except (TypeError, ValueError, RecursionError):
        text = repr(type(value))
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def _shallow(value: object, depth: int) -> object:
    """``value`` with at most a few items per level and ``depth`` levels: enough for 40
    characters."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        return value if value.bit_length() < 128 else f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, str):
        return value[: SHOWN + 1]
    if isinstance(value, list | tuple):
        return [_shallow(v, depth - 1) for v in value[:SHOWN]] if depth > 0 else ["..."]
    if isinstance(value, Mapping):
        items = list(value.items())[:SHOWN]
        return {str(k)[:SHOWN]: _shallow(v, depth - 1) for k, v in items} if depth > 0 else {}
    return repr(type(value))


class FieldReader:
    """Typed access to the fields of one raw object; every failure names the object and field.

    Each reader takes the raw value and its field path (``spec.ports[1].port``); an unset
    (``None``) value reads as empty or ``None``, anything of the wrong type raises
    ``InvalidObject``.
    """

    def __init__(self, ref: ObjectRef) -> None:
        self.ref = str(ref)

    def fail(self, field: str, reason: str) -> NoReturn:
        raise InvalidObject(self.ref, reason, field=field)

    def expect(self, field: str, what: str, value: object) -> NoReturn:
        self.fail(field, f"expected {what}, got {describe(value)}")

    def mapping(self, value: object, field: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.expect(field, "an object", value)
        return value

    def items(self, value: object, field: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.expect(field, "a list", value)
        return value

    def string(self, value: object, field: str) -> str | None:
        if value is None or isinstance(value, str):
            return value
        self.expect(field, "a string", value)

    def indexed(self, value: object, field: str) -> list[tuple[Any, str]]:
        """The items of a list with their field paths: ``(item, "field[i]")``."""
        return [(v, f"{field}[{i}]") for i, v in enumerate(self.items(value, field))]

    def strings(self, value: object, field: str) -> list[str]:
        return [
            self.string(v, f"{field}[{i}]") or "" for i, v in enumerate(self.items(value, field))
        ]

    def string_map(self, value: object, field: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, val in self.mapping(value, field).items():
            out[str(key)] = self.string(val, f"{field}[{key}]") or ""
        return out

    def boolean(self, value: object, field: str) -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        self.expect(field, "true or false", value)

    def integer(self, value: object, field: str, low: int, high: int) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.expect(field, "an integer", value)
        if not low <= value <= high:
            self.fail(field, f"{value} is not in {low}..{high}")
        return value

    def port(self, value: object, field: str, *, zero_ok: bool = False) -> int | None:
        """A port number in 1..65535; ``None`` when unset (or 0, where 0 means "none")."""
        if zero_ok and value == 0 and not isinstance(value, bool):
            return None
        return self.integer(value, field, 1, 65535)

    def choice(self, value: object, field: str, choices: tuple[str, ...], default: str) -> str:
        text = self.string(value, field)
        if not text:
            return default
        if text not in choices:
            self.fail(field, f"{describe(text)} is not one of {', '.join(choices)}")
        return text

    def ip(self, value: object, field: str) -> IPAddress:
        if type(value) is str and (quick := quick_ipv4(value)) is not None:
            return quick
        text = self.string(value, field)
        if text is None:
            self.fail(field, "missing")
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            self.fail(field, f"{describe(text)} is not a valid IP address")
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
            self.fail(field, f"{describe(text)} is not a valid IP address")
        return ip

    def cidr(self, value: object, field: str, *, strict: bool) -> IPNetwork:
        text = self.string(value, field)
        if text is None:
            self.fail(field, "missing")
        if "/" not in text:
            self.fail(field, f"{describe(text)} is not a CIDR (address/prefix length)")
        try:
            return ipaddress.ip_network(text.strip(), strict=strict)
        except ValueError as exc:
            reason = "has host bits set" if "host bits" in str(exc) else "is not a valid CIDR"
            self.fail(field, f"{describe(text)} {reason}")
