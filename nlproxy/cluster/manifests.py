"""Manifests source: a directory of YAML/JSON files standing in for the Kubernetes API.

For static nodes, demos and tests. ``load_manifests`` reads every ``*.yaml``, ``*.yml`` and
``*.json`` file (multi-document YAML, ``kind: List`` and ``*List`` objects, JSON arrays) and turns
the Services, EndpointSlices, Nodes and ServiceCIDRs in them into one ``Replace`` per kind, as an
API relist would. Objects of other kinds (Deployments, Pods, Knative Services…) are ignored. It
reads files only; validation is ``cluster/parse.py``'s, and it must not touch the cluster state.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nlproxy.cluster.decode import MAX_FILE_BYTES, FileError
from nlproxy.cluster.fileobjects import Objects, file_objects
from nlproxy.cluster.model import Invalid, ObjectRef, Replace, Skip, Upsert
from nlproxy.cluster.parse import KINDS
from nlproxy.cluster.readdir import Directory, FileRead, Unsettled
from nlproxy.errors import ConfigError, shorten

SUFFIXES = frozenset({".yaml", ".yml", ".json"})
MAX_LOAD_BYTES = 2 * MAX_FILE_BYTES
"""The most one load reads, all files together; a file past it keeps its last good objects
(named)."""
EMPTY_GRACE = 2.0
"""Seconds a file that held objects must stay empty before its objects are deleted: a rewrite
that truncates, then writes (``>`` in a shell, many editors) is not an outage."""


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
    objects = file_objects(Path(name), read.data, mine)
    notes += mine
    return GoodFile(read.digest, objects, tuple(mine))


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
