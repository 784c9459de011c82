"""The restart by fingerprint, as an object the Syncer owns: each commit's record in the
tables, and the check at start-up that trusts a matching one instead of reading the tables back
(``fingerprint.py`` computes the digests and parses the records).

:class:`RestartRecords` holds what the records need across syncs (the digest of the snapshot
being synced, what the tables' records carry, the generation the next batch will get). It
reads the records and the kernel's generation; it writes nothing: it returns the operations
that write a record, and the Syncer sends them in its batches.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from typing import TYPE_CHECKING

from nlproxy.cluster.model import ClusterSnapshot, ServiceKey
from nlproxy.nft.dump import Interrupted
from nlproxy.nft.ir import FAMILIES, Family, Operation
from nlproxy.nft.tables import ReadBack
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.slots import with_slots
from nlproxy.sync.fingerprint import RECORD_CHAIN, Fingerprint, Record, record_ops, trusted

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


class RestartRecords:
    """The records a Syncer keeps in its tables.

    A sync calls :meth:`take_digest` first; a first sync asks :meth:`matches` whether to trust
    the tables; each family's batch goes through :meth:`recording`, and :meth:`outstanding`
    gives the records of the families that had nothing to send, after which :meth:`written`.

    Args:
        config: the planner's configuration (part of the digest).
        readback: the tables' read-back (the records, the kernel's generation).
        log: where a restart check that does not trust the tables says why.
        enabled: keep records at all (False: every method says "no record").
    """

    def __init__(
        self,
        config: ProxyConfig,
        readback: ReadBack,
        log: FilteringBoundLogger,
        *,
        enabled: bool = True,
    ) -> None:
        self._readback = readback
        self.log = log
        self._fingerprint = Fingerprint(config) if enabled else None
        self._digest: str | None = None  # of the snapshot being synced
        # What the tables' records carry, if current: (digest, files digest).
        self._recorded: tuple[str, str | None] | None = None
        self._expected_gen = 0  # the generation the next batch of this sync will get
        self._with_record: set[Family] = set()
        self._files: str | None = None
        self._all = False  # the next digest must look at every service
        # Services a page changed that :meth:`warm` did not hash (one kind of the two listed
        # so far): the next digest looks at them whatever it is told.
        self._unwarmed: set[ServiceKey] = set()

    @property
    def enabled(self) -> bool:
        """Whether records are kept (and so every table this Syncer committed to has one)."""
        return self._fingerprint is not None

    @property
    def digest(self) -> str | None:
        """The digest of the snapshot being synced (None: no records, or not known)."""
        return self._digest

    @property
    def files_digest(self) -> str | None:
        """``run --once``'s digest of its manifest files and settings, recorded beside the
        snapshot's (``fingerprint.files_digest``); None: none."""
        return self._files

    def use_files(self, files: str | None) -> None:
        """Record ``files`` (or, None, no files digest) from the next record on."""
        self._files = files

    @property
    def recorded_files(self) -> str | None:
        """The files digest of the records a restart check found matching (None: none)."""
        return None if self._recorded is None else self._recorded[1]

    def reconfigure(self, config: ProxyConfig) -> None:
        """Digest with ``config`` from the next record on: the tables' records, of the old
        configuration, no longer match."""
        if self._fingerprint is not None:
            self._fingerprint.reconfigure(config)
        self._recorded = None

    def look_at_all(self) -> None:
        """The next digest looks at every service (the snapshot synced may differ from the last
        one in services its changes do not name: ones left out, or let back in)."""
        self._all = True

    def take_digest(
        self, snapshot: ClusterSnapshot, changed: Set[ServiceKey] | None, *, exact: bool
    ) -> None:
        """Digest ``snapshot``, the one to be synced; ``changed`` names the only services that
        may differ from the last one when ``exact`` (and no :meth:`look_at_all` came since)."""
        fp = self._fingerprint
        if fp is None:
            return
        told = changed if exact and not self._all else None
        if told is not None and self._unwarmed:
            # A first sync is told only of what its plan ahead did not plan (``relist.narrowed``)
            # but a service without a slice, or a slice without its Service (a headless
            # Service's), was planned ahead and never hashed: without them the record would
            # not be the digest a restart takes of the same inputs, and would not be trusted.
            told = {*told, *self._unwarmed}
        self._digest = fp.digest(snapshot, told)
        self._all = False
        self._unwarmed = set()

    def warm(self, snapshot: ClusterSnapshot, changed: Set[ServiceKey]) -> None:
        """Hash the objects of the services ``changed`` names, as ``snapshot`` holds them,
        ahead of the sync that will digest them (a page of an initial list as it arrives): that
        sync's :meth:`take_digest` then finds them hashed (``Fingerprint`` goes by identity)
        and hashes only what changed since. Nothing is recorded or compared here.

        Only the services that have both their Service and a slice are hashed: the two kinds
        are listed apart, and hashing one half would only be done again when the other came
        (what stays without either is hashed by the next :meth:`take_digest`, which looks at
        them whatever it is told)."""
        fp = self._fingerprint
        if fp is None:
            return
        services, slices = snapshot.services, snapshot.slices
        whole = {key for key in changed if key in services and key in slices}
        self._unwarmed.update(changed)
        self._unwarmed -= whole
        if whole:
            fp.digest(snapshot, whole)

    def withhold(self) -> None:
        """This sync's tables are not the plan of its snapshot (``keep.py`` keeps objects of
        Services the snapshot lacks): no record is written, and the one the tables hold is
        not taken as current (it stays true only while nothing is committed)."""
        self._digest = None
        self._recorded = None

    def with_slots(self, token: str) -> None:
        """Fold the plan's slot token into the digest: slots kept across changes are no
        function of the inputs, and a cold plan of the same inputs would fill them otherwise, so
        its restart must not trust the record."""
        if self._digest is not None:
            self._digest = with_slots(self._digest, token)

    def unchanged_since_last_run(self, snapshot: ClusterSnapshot) -> bool:
        """Whether the tables' records show they hold the plan of ``snapshot`` and nobody
        committed since: then there is nothing to do (``run --once`` skips even planning)."""
        fp = self._fingerprint
        if fp is None:
            return False
        self._digest = fp.digest(snapshot)
        return self.matches()

    def files_unchanged(self, files: str) -> bool:
        """Whether the tables' records show they hold what ``run --once`` programmed from the
        same manifest files and settings (``fingerprint.files_digest``), after a run that had
        nothing to warn about, and nobody committed since: nothing to parse or plan."""
        self._digest = None
        return self._fingerprint is not None and self.matches(files)

    def matches(
        self, files: str | None = None, *, take: Callable[[], object] | None = None
    ) -> bool:
        """The restart check: both records carry this sync's digest (or ``files``) and the
        kernel's last two generations (one GETGEN and a one-chain rule dump per family).

        ``take`` (e.g. a :meth:`take_digest`) is called once the records are read, only when
        they could vouch for some inputs: a first start, or tables another process committed
        to since, do not pay for a digest of the inputs at hand.
        """
        if self._digest is None and files is None and take is None:
            return False
        try:
            gen = self._readback.generation()
            records: dict[Family, Record | None] = {}
            for family in FAMILIES:
                comments = self._readback.comments(family, RECORD_CHAIN)
                records[family] = Record.parse(comments[0]) if comments else None
            if self._readback.generation() != gen:
                return False
        except Interrupted:
            return False
        if take is not None:
            last = records[FAMILIES[-1]]
            if last is not None and trusted(records, last.digest, gen, FAMILIES, last.files):
                take()
        digest = self._digest
        if not trusted(records, digest, gen, FAMILIES, files):
            # Why the tables are read back: a first start, other inputs, or another writer.
            self.log.info(
                "sync.restart_read_back",
                digest_matches=all(r is not None and r.digest == digest for r in records.values()),
                recorded_generations=[r.generation if r else None for r in records.values()],
                generation=gen,
            )
            return False
        last = records[FAMILIES[-1]]
        self._recorded = None if last is None else (last.digest, last.files)
        return True

    def read(self, records: dict[Family, Record | None], before: int, after: int) -> None:
        """The tables were read back whole between the generations ``before`` and ``after``,
        their records being ``records``: remember what they carry, if current."""
        self._recorded = current_record(records, before, after)
        self._all = True

    def forget(self) -> None:
        """Someone else's change was repaired: the next sync writes the records again."""
        self._recorded = None

    def recording(
        self, family: Family, ops: list[Operation], claim: int
    ) -> tuple[list[Operation], int]:
        """``ops`` followed by the family's new record, when one is due (any commit, or new
        inputs); the record's operations are not counted (as ``claim``'s are not)."""
        digest = self._digest
        if digest is None or (not ops and self._record_key() == self._recorded):
            return ops, claim
        if not self._with_record:
            self._expected_gen = self._readback.generation() + 1
        self._with_record.add(family)
        extra = record_ops(Record(digest, self._expected_gen, self._files))
        self._expected_gen += 1
        self._recorded = None  # until every family's record is written
        return [*ops, *extra], claim + len(extra)

    def begin(self) -> None:
        """A sync's batches begin: no family has its record yet."""
        self._with_record.clear()

    def outstanding(self) -> list[tuple[Family, list[Operation]]]:
        """When some families' batches carried a record, the record batches of the others, so
        the two records always carry consecutive generations of one sync; send them in order,
        then :meth:`written`."""
        if not self._with_record:
            return []
        return [
            (family, self.recording(family, [], 0)[0])
            for family in FAMILIES
            if family not in self._with_record
        ]

    def rewrite(self) -> list[tuple[Family, list[Operation]]]:
        """Both records' batches anew (e.g. without the files digest once a run turned out to
        have something to report); send them in order, then :meth:`written`."""
        if self._digest is None:
            return []
        self._with_record.clear()
        self._recorded = None
        return [(family, self.recording(family, [], 0)[0]) for family in FAMILIES]

    def written(self) -> None:
        """Every family's record of this sync was committed."""
        if self._with_record:
            self._recorded = self._record_key()

    def _record_key(self) -> tuple[str, str | None] | None:
        return None if self._digest is None else (self._digest, self._files)


def current_record(
    records: dict[Family, Record | None], before: int, after: int
) -> tuple[str, str | None] | None:
    """What the records read back carry when they are current (written by the last commits in
    the namespace, seen at one generation), else None: the next sync writes them."""
    some = next((r for r in records.values() if r is not None), None)
    if some is None or before != after or not trusted(records, some.digest, after, FAMILIES):
        return None
    if any(r is None or r.files != some.files for r in records.values()):
        return None
    return some.digest, some.files
