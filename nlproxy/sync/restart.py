"""The Syncer's restart by fingerprint: each commit's record in the tables, and the check at
start-up that trusts a matching one instead of reading the tables back (``fingerprint.py``
computes the digests and parses the records)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from nlproxy.cluster.model import ClusterSnapshot
from nlproxy.nft.dump import Interrupted
from nlproxy.nft.ir import Family, Operation, Ruleset
from nlproxy.proxy.config import ProxyConfig
from nlproxy.proxy.planner import Plan
from nlproxy.sync.fingerprint import RECORD_CHAIN, Fingerprint, Record, record_ops, trusted
from nlproxy.sync.kernel import SyncKernel
from nlproxy.sync.result import FAMILIES


class RestartRecords:
    """The records :class:`~nlproxy.sync.syncer.Syncer` keeps in its tables; the attributes
    are the Syncer's own (``syncer.py``)."""

    kernel: SyncKernel
    log: FilteringBoundLogger
    files_digest: str | None
    own_generations: deque[int]
    _fingerprint: Fingerprint | None
    _digest: str | None
    _recorded: tuple[str, str | None] | None
    _expected_gen: int
    _with_record: set[Family]
    _programmed: dict[Family, Ruleset | None]
    _seeded: bool
    _unplanned: ClusterSnapshot | None
    _last_plan: Plan | None
    _in_step: bool
    config: ProxyConfig
    incremental: bool

    _apply: Callable[[Family, list[Operation]], None]

    def unchanged_since_last_run(self, snapshot: ClusterSnapshot) -> bool:
        """Whether the tables' records show they hold the plan of ``snapshot`` and nobody
        committed since: then there is nothing to do (``run --once`` skips even planning)."""
        fp = self._fingerprint
        if fp is None:
            return False
        self._digest = fp.digest(snapshot)
        return self._records_match()

    def files_unchanged(self, files: str) -> bool:
        """Whether the tables' records show they hold what ``run --once`` programmed from the
        same manifest files and settings (``fingerprint.files_digest``), after a run that had
        nothing to warn about, and nobody committed since: nothing to parse or plan."""
        self._digest = None
        return self._fingerprint is not None and self._records_match(files)

    @property
    def recorded_files(self) -> str | None:
        """The files digest of the records a restart check found matching (None: none)."""
        return None if self._recorded is None else self._recorded[1]

    def rewrite_records(self) -> None:
        """Write both records again now (a batch each), e.g. without ``files_digest`` once
        a run turned out to have something to report."""
        if self._digest is None:
            return
        self._with_record.clear()
        self._recorded = None
        for family in FAMILIES:
            ops, _ = self._recording(family, [], 0)
            self._apply(family, ops)
        self._recorded = self._record_key()

    def _records_match(self, files: str | None = None) -> bool:
        """The restart check: both records carry this sync's digest (or ``files``) and the
        kernel's last two generations (one GETGEN and a one-chain rule dump per family)."""
        digest = self._digest
        if digest is None and files is None:
            return False
        try:
            gen = self._generation()
            records: dict[Family, Record | None] = {}
            for family in FAMILIES:
                comments = self.kernel.readback.comments(family, RECORD_CHAIN)
                records[family] = Record.parse(comments[0]) if comments else None
            if self._generation() != gen:
                return False
        except Interrupted:
            return False
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

    def _generation(self) -> int:
        return self.kernel.readback.generation()

    def _note_generation(self, before: int) -> None:
        """Remember the generation of the commit just made, when nobody else's came between
        (``before`` was read just ahead of it): a verify's read-back and the drift monitor
        tell this process's commits from others' by it."""
        after = self._generation()
        if after == (before + 1) & 0xFFFFFFFF:
            self.own_generations.append(after)

    def _recording(
        self, family: Family, ops: list[Operation], claim: int
    ) -> tuple[list[Operation], int]:
        """``ops`` followed by the family's new record, when one is due (any commit, or new
        inputs); the record's operations are not counted (as ``claim``'s are not)."""
        digest = self._digest
        if digest is None or (not ops and self._record_key() == self._recorded):
            return ops, claim
        if not self._with_record:
            self._expected_gen = self._generation() + 1
        self._with_record.add(family)
        extra = record_ops(Record(digest, self._expected_gen, self.files_digest))
        self._expected_gen += 1
        self._recorded = None  # until every family's record is written
        return [*ops, *extra], claim + len(extra)

    def _complete_records(self) -> None:
        """Records were written to some families only: the others' get a batch of their own,
        so the two records always carry consecutive generations of one sync."""
        if not self._with_record:
            return
        for family in FAMILIES:
            if family not in self._with_record:
                ops, _ = self._recording(family, [], 0)
                self._apply(family, ops)
        self._recorded = self._record_key()

    def _record_key(self) -> tuple[str, str | None] | None:
        return None if self._digest is None else (self._digest, self.files_digest)


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
