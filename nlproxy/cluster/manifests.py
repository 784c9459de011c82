"""Manifests source: a directory of YAML/JSON files standing in for the Kubernetes API.

For static nodes, demos and tests. ``load_manifests`` reads every ``*.yaml``, ``*.yml`` and
``*.json`` file (multi-document YAML, ``kind: List`` and ``*List`` objects, JSON arrays) and turns
the Services, EndpointSlices, Nodes and ServiceCIDRs in them into one ``Replace`` per kind, as an
API relist would. Objects of other kinds (Deployments, Pods, Knative Services…) are ignored. It
reads files only; validation is ``cluster/parse.py``'s, and it must not touch the cluster state.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nlproxy.cluster.decode import MAX_FILE_BYTES, FileError
from nlproxy.cluster.fileobjects import Entry, Objects, file_objects
from nlproxy.cluster.model import Invalid, ObjectRef, Replace, Skip, Upsert
from nlproxy.cluster.parse import KINDS
from nlproxy.cluster.readdir import Directory, FileRead, Unsettled
from nlproxy.errors import ConfigError, shorten
from nlproxy.runtime import hotpath

SUFFIXES = frozenset({".yaml", ".yml", ".json"})
MAX_LOAD_BYTES = 2 * MAX_FILE_BYTES
"""The most one load reads, all files together; a file past it keeps its last good objects
(named)."""
GRACE = 2.0
"""Seconds a file keeps the objects it lost, from when it lost them (its change time), whatever
it holds now (nothing, comments, ``---``, some of its objects): a rewrite in steps (``>`` in a
shell, then the text; a header first; a Service before its EndpointSlice) is not an outage, and
a real removal lands once the grace is over."""
DEFER_BYTES = 64 << 10
"""A changed file larger than this is parsed apart from the reload that found it, when the
caller asks (``defer``): one large or broken file never holds back the others' changes. (A
broken file costs many times its parse to reject, as the error is looked for line by line: at
this size, some tens of milliseconds.)"""


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
    """Files that changed while read, or still serve objects they lost (``GRACE``): read them
    again soon (their last good objects stand meanwhile)."""
    failed: dict[str, Parsed] = field(default_factory=dict)
    """Each file whose content does not parse, with why (pass it back in ``parsed``): read
    again unchanged, it is not parsed again."""
    deferred: dict[str, FileRead] = field(default_factory=dict)
    """Changed files left to parse apart (``defer``), their last good objects standing
    meanwhile: :func:`parse_file` them and pass the results back in ``parsed``."""
    unread: tuple[str, ...] = ()
    """Files whose objects are not known: they cannot be read or parsed now and no earlier load
    read them, or were found without objects less than ``GRACE`` after they changed (a start in
    the middle of a rewrite). Whatever they held is missing from ``changes``; every ``Replace``
    names them (``Replace.unread``), so what is programmed for them can stay."""


@dataclass(frozen=True, slots=True)
class GoodFile:
    """A file as last read successfully: its content's digest, its objects (as changes), and
    what was noted while parsing them (near-miss kinds), so a file read again unchanged is not
    parsed again."""

    digest: bytes
    objects: Objects
    notes: tuple[str, ...] = ()
    lost: tuple[tuple[float, Entry], ...] = ()
    """Objects the file held and holds no more, each with when it lost them (the file's change
    time): still served until ``GRACE`` after that."""


@dataclass(frozen=True, slots=True)
class Parsed:
    """One content of a file, parsed: its objects and notes, or why it does not parse."""

    digest: bytes
    objects: Objects
    notes: tuple[str, ...] = ()
    error: FileError | None = None


def parse_file(name: str, read: FileRead, proxy_name: str | None = None) -> Parsed:
    """What file ``name``'s content ``read`` holds (no exception: a failure is ``error``);
    ``proxy_name``: this proxy's ``service-proxy-name`` (``sections.not_ours``)."""
    notes: list[str] = []
    with hotpath.collection_paused():
        try:
            objects = file_objects(Path(name), read.data, notes, proxy_name)
        except FileError as exc:
            return Parsed(read.digest, [], (), exc)
    return Parsed(read.digest, objects, tuple(notes))


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
    parsed: Mapping[str, Parsed] | None = None,
    defer: int | None = None,
    proxy_name: str | None = None,
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
            unchanged is not parsed again. A file that lost objects keeps serving them for
            :data:`GRACE` seconds (a rewrite in steps) and is listed in ``unsettled``, as is
            one that changed while it was read.
        now: the time (seconds since the epoch) to measure that grace from; the clock's.
        budget: the most bytes read in all (a file past it keeps its last good objects).
        read: the directory as ``read_manifests`` read it (``run --once`` hashes those bytes
            first); not read again.
        parsed: files' contents already parsed (the ``failed`` of the previous load, and what
            :func:`parse_file` made of ``deferred`` ones): used when the content is the same.
        defer: leave a changed file of more than this many bytes to be parsed apart
            (``deferred``) instead of parsing it now (None: parse every file now).
        proxy_name: this proxy's ``service-proxy-name``: only the Services and slices
            labelled with it are read (None: only those without the label, as kube-proxy);
            the same in every load of one directory, as ``last_good`` and ``parsed`` hold
            what it selected.

    Raises:
        ConfigError: the directory cannot be listed.
    """
    with hotpath.collection_paused():
        loader = _Loader(
            last_good or {}, parsed or {}, defer, time.time() if now is None else now, proxy_name
        )
        if read is not None:
            return loader.load(read.files.items())
        try:
            with Directory(directory) as opened:
                return loader.load(_reads(opened, _names(opened), budget))
        except OSError as exc:
            raise ConfigError(f"manifests {directory}", exc.strerror or str(exc)) from exc


class _Loader:
    """One load: each file's objects in turn (``load``), then what lost objects are kept."""

    def __init__(
        self,
        last_good: dict[str, GoodFile],
        parsed: Mapping[str, Parsed],
        defer: int | None,
        now: float,
        proxy_name: str | None = None,
    ) -> None:
        self.last_good, self.parsed, self.defer, self.now = last_good, parsed, defer, now
        self.proxy_name = proxy_name
        self.by_kind: dict[str, list[Upsert | Skip | Invalid]] = {kind: [] for kind in KINDS}
        self.first_seen: dict[ObjectRef, str] = {}
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.unsettled: list[str] = []
        self.unread: list[str] = []
        self.good: dict[str, GoodFile] = {}
        self.failed: dict[str, Parsed] = {}
        self.deferred: dict[str, FileRead] = {}
        self.held: list[Entry] = []

    def load(self, reads: Iterable[tuple[str, Outcome]]) -> ManifestLoad:
        for name, read in reads:
            if read is not None:  # None: a directory
                self._file(name, read)
        # Lost objects last, and only where no file holds them now: an object moved to another
        # file is no duplicate.
        for where, change, _ in self.held:
            if change.ref not in self.first_seen:
                self.first_seen[change.ref] = where
                self.by_kind[change.ref.kind].append(change)
        unread = tuple(self.unread)
        return ManifestLoad(
            changes=tuple(
                Replace(kind=kind, changes=tuple(self.by_kind[kind]), unread=unread)
                for kind in KINDS
            ),
            errors=tuple(shorten(e) for e in self.errors),
            warnings=tuple(shorten(w) for w in self.warnings),
            good=self.good,
            unsettled=tuple(dict.fromkeys(self.unsettled)),
            failed=self.failed,
            deferred=self.deferred,
            unread=unread,
        )

    def _file(self, name: str, read: FileRead | FileError | Unsettled) -> None:
        """Take one file's objects: as read now, or as last good."""
        kept = self.last_good.get(name)
        if kept is not None:
            kept = _expire(kept, self.now)
        try:
            if isinstance(read, FileError | Unsettled):
                raise read
            try:
                current = self._current(name, read, kept)
            except _Deferred:
                self.deferred[name] = read
                if kept is None:  # nothing known of it until it is parsed apart
                    self.unread.append(name)
                    return
                current = kept
        except Unsettled:
            self.unsettled.append(name)
            if kept is None:
                self.unread.append(name)
                return
            current = kept
        except FileError as exc:
            self.errors.append(f"{exc}; its last good objects are kept" if kept else str(exc))
            if not kept:
                self.unread.append(name)
                return
            current = kept
        self.good[name] = current
        self.errors += current.notes
        by_kind, first_seen = self.by_kind, self.first_seen
        for where, change, unknown in current.objects:
            ref = change.ref
            if ref in first_seen:
                _duplicate(ref, where, change, first_seen, by_kind[ref.kind], self.errors)
                continue
            first_seen[ref] = where
            by_kind[ref.kind].append(change)
            self.warnings += unknown
        if current.lost:
            self.unsettled.append(name)
            self.held += [entry for _, entry in current.lost]

    def _current(self, name: str, read: FileRead, kept: GoodFile | None) -> GoodFile:
        """What a file read now holds.

        Raises:
            FileError: it does not parse.
            _Deferred: it is to be parsed apart.
        """
        if kept is not None and kept.digest == read.digest:
            return kept
        known = self.parsed.get(name)
        if known is None or known.digest != read.digest:
            if self.defer is not None and len(read.data) > self.defer:
                raise _Deferred
            known = parse_file(name, read, self.proxy_name)
        if known.error is not None:
            self.failed[name] = known
            raise known.error
        # A file found without objects just after it changed, with nothing known of it before
        # (the daemon starts in the middle of a rewrite): what it held is not known.
        if kept is None and not known.objects and abs(self.now - read.changed) < GRACE:
            self.unread.append(name)
            self.unsettled.append(name)
        lost = _lost(kept, known.objects, read.changed, self.now)
        return GoodFile(read.digest, known.objects, known.notes, lost)


class _Deferred(Exception):
    """A file left to be parsed apart."""


def _expire(kept: GoodFile, now: float) -> GoodFile:
    """``kept`` without the lost objects whose grace is over. (A clock set back by more than
    the grace does not keep them for ever.)"""
    if not kept.lost:
        return kept
    lost = tuple(held for held in kept.lost if abs(now - held[0]) < GRACE)
    return kept if len(lost) == len(kept.lost) else dataclasses.replace(kept, lost=lost)


def _lost(
    kept: GoodFile | None, objects: Objects, when: float, now: float
) -> tuple[tuple[float, Entry], ...]:
    """The objects ``kept`` served (held or lost) that ``objects`` lacks, each with when it was
    first lost (``when`` for those lost now), while their grace lasts."""
    if kept is None or (not kept.objects and not kept.lost):
        return ()
    present = {change.ref for _, change, _ in objects}
    out: dict[ObjectRef, tuple[float, Entry]] = {}
    for since, entry in kept.lost:
        if entry[1].ref not in present:
            out.setdefault(entry[1].ref, (since, entry))
    if abs(now - when) < GRACE:
        for entry in kept.objects:
            if entry[1].ref not in present:
                out.setdefault(entry[1].ref, (when, entry))
    return tuple(held for held in out.values() if abs(now - held[0]) < GRACE)


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
