"""Manifests source: a directory of YAML/JSON files standing in for the Kubernetes API.

For static nodes, demos and tests. ``load_manifests`` reads every ``*.yaml``, ``*.yml`` and
``*.json`` file (multi-document YAML, ``kind: List`` and ``*List`` objects, JSON arrays) and turns
the Services, EndpointSlices, Nodes and ServiceCIDRs in them into one ``Replace`` per kind, as an
API relist would. Objects of other kinds (Deployments, Pods, Knative Services…) are ignored. It
reads files only; validation is ``cluster/parse.py``'s, and it must not touch the cluster state.
"""

from __future__ import annotations

import gc
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from nlproxy.cluster import typed
from nlproxy.cluster.decode import MAX_FILE_BYTES, FileError, Refused, batches, documents
from nlproxy.cluster.model import Invalid, ObjectRef, Replace, Skip, Upsert
from nlproxy.cluster.parse import KINDS, object_ref, to_change
from nlproxy.cluster.readdir import Directory, FileRead, Unsettled
from nlproxy.cluster.schema import unknown_fields
from nlproxy.errors import ConfigError, shorten

SUFFIXES = frozenset({".yaml", ".yml", ".json"})
MAX_LOAD_BYTES = 2 * MAX_FILE_BYTES
"""The most one load reads, all files together; a file past it keeps its last good objects
(named)."""
EMPTY_GRACE = 2.0
"""Seconds a file that held objects must stay empty before its objects are deleted: a rewrite
that truncates, then writes (``>`` in a shell, many editors) is not an outage."""
# The API group each kind must come from: a ``kind: Service`` of another group (Knative's
# serving.knative.dev) is someone else's object. A missing apiVersion is taken as the right one.
_GROUPS = {
    "Service": "",
    "EndpointSlice": "discovery.k8s.io",
    "Node": "",
    "ServiceCIDR": ("networking.k8s.io"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestLoad:
    """What a directory holds.

    Attributes:
        changes: one ``Replace`` per kind, for all four kinds (an absent kind deletes all).
        errors: file-level problems (unreadable or unparsable files, documents that are not
            objects, duplicates), each naming the file; such a file contributes nothing and the
            others still load. Invalid objects are ``Invalid`` entries of ``changes``.
    """

    changes: tuple[Replace, ...]
    errors: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    """Unknown fields (``spec.ports[0].targtPort``), named as ``kubectl --validate=strict``
    would: the objects load without them, as the API server would keep them."""
    good: dict[str, GoodFile] = field(default_factory=dict)
    """Each file's objects as last read successfully (pass it back as ``last_good``)."""
    unsettled: tuple[str, ...] = ()
    """Files that changed while read, or were found freshly emptied: read them again soon (their
    last good objects stand meanwhile)."""


Entry = tuple[str, Upsert | Skip | Invalid, tuple[str, ...]]
"""One object of a file, parsed: ``(where, change, warnings)`` (its unknown fields, named)."""
Objects = list[Entry]
"""A file's objects, parsed as they were read (the decoded documents are not kept)."""


@dataclass(frozen=True, slots=True)
class GoodFile:
    """A file as last read successfully: its content's digest, its objects (as changes), and
    what was noted while parsing them (near-miss kinds), so a file read again unchanged is not
    parsed again."""

    digest: bytes
    objects: Objects
    notes: tuple[str, ...] = ()


Outcome = FileRead | FileError | Unsettled | None
"""What reading one file gave: its content, why it was not read, or None for a directory."""


@dataclass(frozen=True, slots=True)
class DirectoryRead:
    """Every manifest file of a directory, read once (``read_manifests``), for a digest of the
    same bytes the loader is then given (``load_manifests(read=...)``)."""

    files: dict[str, Outcome]
    """File name to what reading it gave, in name order."""


def read_manifests(directory: Path, budget: int = MAX_LOAD_BYTES) -> DirectoryRead:
    """Read the files ``load_manifests`` would read, as it reads them (beneath the directory,
    regular files only, ``budget`` bytes at most).

    Raises:
        ConfigError: the directory cannot be listed.
    """
    try:
        with Directory(directory) as opened:
            return DirectoryRead(dict(_reads(opened, _names(opened), budget)))
    except OSError as exc:
        raise ConfigError(f"manifests {directory}", exc.strerror or str(exc)) from exc


def _names(opened: Directory) -> list[str]:
    return [n for n in opened.names() if Path(n).suffix in SUFFIXES and n[0] != "."]


def _reads(directory: Directory, names: list[str], budget: int) -> Iterator[tuple[str, Outcome]]:
    """Each file's outcome, in name order, the budget shared as a load shares it."""
    for name in names:
        try:
            read = directory.read(name, min(budget, MAX_FILE_BYTES))
        except (FileError, Unsettled) as exc:
            yield name, exc
            continue
        if read is not None:
            budget -= len(read.data)
        yield name, read


def load_manifests(
    directory: Path,
    last_good: dict[str, GoodFile] | None = None,
    *,
    now: float | None = None,
    budget: int = MAX_LOAD_BYTES,
    read: DirectoryRead | None = None,
) -> ManifestLoad:
    """Load every manifest file in ``directory`` (not recursive; dotfiles are skipped, which
    also skips the ``..data`` links of a mounted ConfigMap). Files are read in name order and the
    result is deterministic; the first definition of an object wins over later duplicates.

    Files are opened beneath the directory, regular files only (``readdir.py``): a link out of
    it is named and not read. At most ``budget`` bytes are read in one load.

    Args:
        last_good: the ``good`` of the previous load (the daemon passes it): a file that cannot
            be read or parsed now (an editor's typo, a half-written file) keeps the objects it
            had, so a mistake in one file is never an outage of its Services; a file read again
            unchanged is not parsed again. A file that changes while it is read, or that has
            been empty for less than :data:`EMPTY_GRACE` seconds (truncated, to be written
            again), keeps them too and is listed in ``unsettled``.
        now: the time (seconds since the epoch) to measure that grace from; the clock's.
        budget: the most bytes read in all (a file past it keeps its last good objects).
        read: the directory as ``read_manifests`` read it (``run --once`` hashes those bytes
            first); not read again.

    Raises:
        ConfigError: the directory cannot be listed.
    """
    # Parsing allocates millions of objects and creates no cycles: a collection would only
    # walk them again and again (a third of the load time at 100k endpoints).
    enabled = gc.isenabled()
    gc.disable()
    try:
        when = time.time() if now is None else now
        if read is not None:
            return _load(read.files.items(), last_good or {}, when)
        try:
            with Directory(directory) as opened:
                return _load(_reads(opened, _names(opened), budget), last_good or {}, when)
        except OSError as exc:
            raise ConfigError(f"manifests {directory}", exc.strerror or str(exc)) from exc
    finally:
        if enabled:
            gc.enable()


def _load(
    reads: Iterable[tuple[str, Outcome]],
    last_good: dict[str, GoodFile],
    now: float,
) -> ManifestLoad:
    by_kind: dict[str, list[Upsert | Skip | Invalid]] = {kind: [] for kind in KINDS}
    first_seen: dict[ObjectRef, str] = {}
    errors: list[str] = []
    warnings: list[str] = []
    unsettled: list[str] = []
    good: dict[str, GoodFile] = {}
    for name, read in reads:
        notes: list[str] = []
        kept = last_good.get(name)
        try:
            if read is None:
                continue  # a directory
            if isinstance(read, FileError | Unsettled):
                raise read
            current = _current(name, read, kept, now, notes)
        except Unsettled:
            unsettled.append(name)
            if kept is None:
                continue
            current = kept
        except FileError as exc:
            errors.append(f"{exc}; its last good objects are kept" if kept else str(exc))
            if not kept:
                continue
            current = kept
        good[name] = current
        errors += notes
        for where, change, unknown in current.objects:
            ref = change.ref
            if ref in first_seen:
                _duplicate(ref, where, change, first_seen, by_kind[ref.kind], errors)
                continue
            first_seen[ref] = where
            by_kind[ref.kind].append(change)
            warnings += unknown
    changes = tuple(Replace(kind=kind, changes=tuple(by_kind[kind])) for kind in KINDS)
    return ManifestLoad(
        changes=changes,
        errors=tuple(shorten(e) for e in errors),
        warnings=tuple(shorten(w) for w in warnings),
        good=good,
        unsettled=tuple(unsettled),
    )


def _current(
    name: str, read: FileRead, kept: GoodFile | None, now: float, notes: list[str]
) -> GoodFile:
    """What a file read now holds.

    Raises:
        Unsettled: emptied less than EMPTY_GRACE ago, after holding objects.
        FileError: it does not parse.
    """
    # A rewrite truncates first: deleted if it stays empty. (A clock set back by more than the
    # grace does not keep an emptied file's objects for ever.)
    if not read.data and kept and kept.objects and abs(now - read.changed) < EMPTY_GRACE:
        raise Unsettled(name)
    if kept is not None and kept.digest == read.digest:
        notes += kept.notes
        return kept
    mine: list[str] = []
    objects = _objects(Path(name), read.data, mine)
    notes += mine
    return GoodFile(read.digest, objects, tuple(mine))


def _entry(where: str, obj: dict[str, Any], kind: str) -> Entry:
    """One decoded object's entry: the typed change when it is plainly valid, else the
    parser's, which names the unknown fields and what is wrong."""
    fast = typed.from_document(obj, kind) if kind in typed.FAST_KINDS else None
    if fast is not None:
        return where, fast, ()
    return _parsed(where, obj, kind)


def _parsed(where: str, obj: dict[str, Any], kind: str) -> Entry:
    """The parser's entry for an object the typed path did not take (it has an unknown field
    or is not plainly valid)."""
    ref = object_ref(obj, kind)
    unknown = tuple(f"{where}: {ref}: unknown field {f}" for f in unknown_fields(obj, kind))
    return where, to_change(obj, kind), unknown


def _duplicate(
    ref: ObjectRef,
    where: str,
    later: Upsert | Skip | Invalid,
    first_seen: dict[ObjectRef, str],
    changes: list[Upsert | Skip | Invalid],
    errors: list[str],
) -> None:
    """A second definition of ``ref``: named; the first wins unless it is invalid and this one
    is not (an invalid first copy must not shadow a good one)."""
    index = next(i for i, c in enumerate(changes) if c.ref == ref)
    if isinstance(changes[index], Invalid) and not isinstance(later, Invalid):
        errors.append(
            f"{where}: {ref}: defined again (first in {first_seen[ref]}, which is invalid); "
            "this definition is used"
        )
        changes[index] = later
        first_seen[ref] = where
    else:
        errors.append(f"{where}: {ref}: defined again (first in {first_seen[ref]})")


def _objects(path: Path, data: bytes, notes: list[str]) -> Objects:
    """``(where, change, warnings)`` for each object of a known kind in one file; ``notes``
    gets the objects whose kind looks like a misspelling of one (``kind: Servcie``).

    Raises:
        FileError: the file cannot be read or parsed, or holds something that is not an object.
    """
    if path.suffix == ".json":
        fast = _json_objects(path.name, data)
        if fast is not None:
            found, mine = fast
            notes += mine
            return found
    return _document_objects(path, data, notes)


def _document_objects(path: Path, data: bytes, notes: list[str]) -> Objects:
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
                _document(path, index, doc, notes, found)
            del batch
    except Refused:
        found.clear()
        del notes[noted:]
        for index, doc in enumerate(documents(path, data), start=1):
            _document(path, index, doc, notes, found)
    return found


def _document(path: Path, index: int, doc: object, notes: list[str], found: Objects) -> None:
    """Append the objects of a file's ``index``-th document."""
    where = f"{path.name} document {index}" if index > 1 else path.name
    if doc is None:
        return
    for item in doc if isinstance(doc, list) else [doc]:
        _flatten(where, item, None, notes, found)


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


def _json_objects(where: str, data: bytes) -> tuple[Objects, list[str]] | None:
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
            _raw_members(where, _ARRAY.decode(data), None, notes, found)
        else:
            _raw_members(where, [data], None, notes, found, top=True)
    except (msgspec.DecodeError, _Fallback, ValueError, RecursionError, MemoryError):
        return None
    return found, notes


def _raw_object(
    where: str,
    raw: bytes | msgspec.Raw,
    list_kind: str | None,
    notes: list[str],
    found: Objects,
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
        _flatten(where, json.loads(bytes(raw).decode()), list_kind, notes, found)
        return
    kind = list_kind if head.kind is msgspec.UNSET else head.kind
    if type(kind) is not str or not kind:
        _flatten(where, json.loads(bytes(raw).decode()), list_kind, notes, found)
    elif kind in KINDS:
        if _right_group(head.apiVersion, kind):
            found.append(_raw_entry(where, raw, kind))
    elif kind == "List" or (kind.endswith("List") and kind[:-4] in KINDS):
        _raw_members(where, head.items or [], kind[:-4] or None, notes, found)
    elif _near_kind(kind) is not None:
        _flatten(where, json.loads(bytes(raw).decode()), list_kind, notes, found)


def _raw_members(
    where: str,
    members: list[msgspec.Raw] | list[bytes],
    list_kind: str | None,
    notes: list[str],
    found: Objects,
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
                    change = read(obj)
                    if change is None:  # not plainly valid: the parser names what is wrong
                        found.append(_parsed(where, json.loads(bytes(member).decode()), kind))
                    else:
                        found.append((where, change, ()))
                continue
        _raw_object(where, member, list_kind, notes, found, top=top)


def _raw_entry(where: str, raw: bytes | msgspec.Raw, kind: str) -> Entry:
    """``_entry`` of one object's JSON: the typed change, or the parser's of its document."""
    fast = typed.from_manifest_json(raw, kind) if kind in typed.FAST_KINDS else None
    if fast is not None:
        return where, fast, ()
    return _parsed(where, json.loads(bytes(raw).decode()), kind)


def _flatten(
    where: str, item: object, list_kind: str | None, notes: list[str], found: Objects
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
            found.append(_entry(where, item, kind))
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
                    found.append(_entry(where, member, k))
            else:
                _flatten(where, member, member_kind, notes, found)
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
