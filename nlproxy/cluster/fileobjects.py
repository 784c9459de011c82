"""A manifest file's bytes to its objects: the Services, EndpointSlices, Nodes and ServiceCIDRs
in it, each parsed (``typed.py`` for the plainly valid common shape, ``parse.py`` for anything
else, which names what is wrong), in file order.

Multi-document YAML, ``kind: List`` and ``*List`` objects and JSON arrays are read; objects of
other kinds (Deployments, Pods, Knative Services…) are ignored, a near-miss of a known kind
(``kind: Servcie``) is named. Knows one file at a time: which files there are, and what a
directory's load makes of them, is ``manifests.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from nlproxy.cluster import typed
from nlproxy.cluster.decode import FileError, Refused, batches, compiled_off, documents
from nlproxy.cluster.model import Invalid, Skip, Upsert
from nlproxy.cluster.parse import KINDS, to_change
from nlproxy.cluster.schema import unknown_fields
from nlproxy.cluster.sections import object_ref

# The API group each kind must come from: a ``kind: Service`` of another group (Knative's
# serving.knative.dev) is someone else's object. A missing apiVersion is taken as the right one.
_GROUPS = {
    "Service": "",
    "EndpointSlice": "discovery.k8s.io",
    "Node": "",
    "ServiceCIDR": ("networking.k8s.io"),
}

Entry = tuple[str, Upsert | Skip | Invalid, tuple[str, ...]]
"""One object of a file, parsed: ``(where, change, warnings)`` (its unknown fields, named)."""
Objects = list[Entry]
"""A file's objects, parsed as they were read (the decoded documents are not kept)."""


def _entry(where: str, obj: dict[str, Any], kind: str, proxy_name: str | None) -> Entry:
    """One decoded object's entry: the typed change when it is plainly valid, else the
    parser's, which names the unknown fields and what is wrong."""
    fast = typed.from_document(obj, kind, proxy_name) if kind in typed.FAST_KINDS else None
    if fast is not None:
        return where, fast, ()
    return _parsed(where, obj, kind, proxy_name)


def _parsed(where: str, obj: dict[str, Any], kind: str, proxy_name: str | None) -> Entry:
    """The parser's entry for an object the typed path did not take (it has an unknown field
    or is not plainly valid)."""
    ref = object_ref(obj, kind)
    unknown = tuple(f"{where}: {ref}: unknown field {f}" for f in unknown_fields(obj, kind))
    return where, to_change(obj, kind, proxy_name), unknown


def file_objects(
    path: Path, data: bytes, notes: list[str], proxy_name: str | None = None
) -> Objects:
    """``(where, change, warnings)`` for each object of a known kind in one file; ``notes``
    gets the objects whose kind looks like a misspelling of one (``kind: Servcie``).
    ``proxy_name``: this proxy's ``service-proxy-name`` (``sections.not_ours``).

    Raises:
        FileError: the file cannot be read or parsed, or holds something that is not an object.
    """
    if path.suffix == ".json" and _FROM_BYTES[0]:
        fast = _json_objects(path.name, data, proxy_name)
        if fast is not None:
            found, mine = fast
            notes += mine
            return found
    return _document_objects(path, data, notes, proxy_name)


_FROM_BYTES = [True]
"""Whether JSON files are read from their bytes (``parser_only``)."""


@contextlib.contextmanager
def parser_only() -> Iterator[None]:
    """Every object read as before typed decoding, to compare the two paths (the benches, the
    tests): each by the field-by-field parser (``typed.FAST_KINDS`` empty), YAML by libyaml
    (``decode.compiled_off``), JSON files as documents. Not for the product (not thread-safe)."""
    kinds, from_bytes = typed.FAST_KINDS, _FROM_BYTES[0]
    typed.FAST_KINDS = frozenset()
    _FROM_BYTES[0] = False
    try:
        with compiled_off():
            yield
    finally:
        typed.FAST_KINDS, _FROM_BYTES[0] = kinds, from_bytes


def _document_objects(
    path: Path, data: bytes, notes: list[str], proxy_name: str | None = None
) -> Objects:
    """``_objects`` by way of the file's decoded documents (YAML, and JSON that the bytes'
    path does not read).

    Raises:
        FileError: as ``_objects``.
    """
    found: Objects = []
    noted = len(notes)
    try:
        index = 0
        # Batch by batch (YAML for the compiled decoder): each batch's documents are converted
        # and dropped before the next is decoded, so they are never all held at once.
        for batch in batches(path, data):
            for doc in batch:
                index += 1
                _document(path, index, doc, notes, found, proxy_name)
            del batch
    except Refused:
        found.clear()
        del notes[noted:]
        for index, doc in enumerate(documents(path, data), start=1):
            _document(path, index, doc, notes, found, proxy_name)
    return found


def _document(
    path: Path, index: int, doc: object, notes: list[str], found: Objects, proxy_name: str | None
) -> None:
    """Append the objects of a file's ``index``-th document."""
    where = f"{path.name} document {index}" if index > 1 else path.name
    if doc is None:
        return
    for item in doc if isinstance(doc, list) else [doc]:
        _flatten(where, item, None, notes, found, proxy_name)


class _Head(msgspec.Struct):
    """What ``_flatten`` reads of an object before it knows its kind (the rest is skipped)."""

    kind: object = msgspec.UNSET
    apiVersion: object = None
    items: list[msgspec.Raw] | None = None


_HEAD = msgspec.json.Decoder(_Head)
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
_STARTS_ARRAY = re.compile(rb"[ \t\r\n]*\[")


class _Fallback(Exception):
    """The whole file is read the documents' way (which names what is wrong with it)."""


def _json_objects(
    where: str, data: bytes, proxy_name: str | None = None
) -> tuple[Objects, list[str]] | None:
    """A JSON file's objects read from its bytes (``_objects``'s result and notes), the known
    kinds' objects decoded straight into the typed structs: no dict is built for them, nor for
    the other kinds' objects. As ``documents`` and ``_flatten`` read the file, but whatever is
    not the common shape (an item that is not an object, a kind that is not a string, a
    near-miss kind) is decoded alone and goes to ``_flatten``, which reads it as before; None
    when the file is not valid JSON, UTF-8, or beyond what the decoder takes: it is read as
    before, which names what is wrong."""
    if not data.isascii():
        try:
            data.decode("utf-8")  # msgspec does not check strings it skips
        except UnicodeDecodeError:
            return None
    found: Objects = []
    notes: list[str] = []
    try:
        if _STARTS_ARRAY.match(data):
            _raw_members(where, _ARRAY.decode(data), None, notes, found, proxy_name)
        else:
            _raw_members(where, [data], None, notes, found, proxy_name, top=True)
    except (msgspec.DecodeError, _Fallback, ValueError, RecursionError, MemoryError):
        return None
    return found, notes


def _raw_object(
    where: str,
    raw: bytes | msgspec.Raw,
    list_kind: str | None,
    notes: list[str],
    found: Objects,
    proxy_name: str | None,
    *,
    top: bool = False,
) -> None:
    """``_flatten`` of one JSON value, from its bytes.

    Raises:
        _Fallback: a top-level value that is not an object.
        msgspec.DecodeError: not valid JSON.
    """
    try:
        head = _HEAD.decode(raw)
    except msgspec.ValidationError:
        if top:
            raise _Fallback from None  # null, a scalar: as documents() reads it
        _flatten(where, json.loads(bytes(raw).decode()), list_kind, notes, found, proxy_name)
        return
    kind = list_kind if head.kind is msgspec.UNSET else head.kind
    if type(kind) is not str or not kind:
        _flatten(where, json.loads(bytes(raw).decode()), list_kind, notes, found, proxy_name)
    elif kind in KINDS:
        if _right_group(head.apiVersion, kind):
            found.append(_raw_entry(where, raw, kind, proxy_name))
    elif kind == "List" or (kind.endswith("List") and kind[:-4] in KINDS):
        _raw_members(where, head.items or [], kind[:-4] or None, notes, found, proxy_name)
    elif _near_kind(kind) is not None:
        _flatten(where, json.loads(bytes(raw).decode()), list_kind, notes, found, proxy_name)


def _raw_members(
    where: str,
    members: list[msgspec.Raw] | list[bytes],
    list_kind: str | None,
    notes: list[str],
    found: Objects,
    proxy_name: str | None,
    *,
    top: bool = False,
) -> None:
    """``_raw_object`` of each of a list's members (or of a file's one object, ``top``): the
    common case, a Service or EndpointSlice that says its kind and has only fields its kind
    knows, in one decode into the typed structs (``typed.MANIFEST_ITEM``) and one call to
    read it; anything else as ``_raw_object`` reads it."""
    decode = typed.MANIFEST_ITEM.decode if typed.FAST_KINDS else None
    readers = typed.MANIFEST_READERS
    for member in members:
        if decode is not None:
            try:
                obj = decode(member)
            except msgspec.ValidationError:
                pass
            else:
                kind, group, read = readers[type(obj)]
                api = obj.apiVersion  # _right_group's test, inline
                if type(api) is not str or not api or api.rpartition("/")[0] == group:
                    change = read(obj, proxy_name)
                    if change is None:  # not plainly valid: the parser names what is wrong
                        doc = json.loads(bytes(member).decode())
                        found.append(_parsed(where, doc, kind, proxy_name))
                    else:
                        found.append((where, change, ()))
                continue
        _raw_object(where, member, list_kind, notes, found, proxy_name, top=top)


def _raw_entry(where: str, raw: bytes | msgspec.Raw, kind: str, proxy_name: str | None) -> Entry:
    """``_entry`` of one object's JSON: the typed change, or the parser's of its document."""
    fast = typed.from_manifest_json(raw, kind, proxy_name) if kind in typed.FAST_KINDS else None
    if fast is not None:
        return where, fast, ()
    return _parsed(where, json.loads(bytes(raw).decode()), kind, proxy_name)


def _flatten(
    where: str,
    item: object,
    list_kind: str | None,
    notes: list[str],
    found: Objects,
    proxy_name: str | None,
) -> None:
    """Append ``item``'s objects of a known kind to ``found`` (a list's, each of its items)."""
    if not isinstance(item, dict):
        shown = json.dumps(item, default=str)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise FileError(f"{where}: expected a Kubernetes object, got {shown}")
    kind = item.get("kind", list_kind)
    if not isinstance(kind, str) or not kind:
        raise FileError(f"{where}: an object without a kind")
    if kind in KINDS:
        if _right_group(item.get("apiVersion"), kind):
            found.append(_entry(where, item, kind, proxy_name))
    elif kind == "List" or (kind.endswith("List") and kind[:-4] in KINDS):
        members = item.get("items")
        if not isinstance(members, list | None):
            raise FileError(f"{where}: {kind}: items: expected a list")
        member_kind = kind[:-4] or None
        for member in members or []:
            # The common case inline: an object of a known kind that says so.
            k = member.get("kind", member_kind) if type(member) is dict else None
            if type(k) is str and k in KINDS:
                if _right_group(member.get("apiVersion"), k):
                    found.append(_entry(where, member, k, proxy_name))
            else:
                _flatten(where, member, member_kind, notes, found, proxy_name)
    elif (near := _near_kind(kind)) is not None and _right_group(item.get("apiVersion"), near):
        # Someone else's kinds (Deployment, Pod, ...) are ignored; a near-miss of ours is a
        # typo to name, as kubectl --validate=strict would.
        meta = item.get("metadata")
        name = meta.get("name", "(unnamed)") if isinstance(meta, dict) else "(unnamed)"
        notes.append(f"{where}: {name}: unknown kind {kind!r} (did you mean {near}?)")


def _near_kind(kind: str) -> str | None:
    """The kind nlproxy reads that ``kind`` is one or two edits away from, if any."""
    for known in KINDS:
        if kind.lower() == known.lower() or _edits(kind.lower(), known.lower()) <= 2:
            return known
    return None


def _edits(a: str, b: str) -> int:
    """Levenshtein distance, with transpositions (short strings only)."""
    if abs(len(a) - len(b)) > 2:
        return 3
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        cur = [i]
        for j, cb in enumerate(b, start=1):
            cost = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, prev2[j - 2] + 1)
            cur.append(cost)
        prev2, prev = prev, cur
    return prev[-1]


def _right_group(api_version: object, kind: str) -> bool:
    if not isinstance(api_version, str) or not api_version:
        return True
    group = api_version.rpartition("/")[0]
    return group == _GROUPS[kind]
