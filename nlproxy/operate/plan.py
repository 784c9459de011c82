"""``nlproxy plan``: what the next sync would change, found by running one without applying it.

The sync is the Syncer of ``run --once`` (``sync/syncer.py``), on the snapshot ``run --once``
would build (``inputs.py``), handed a kernel where nothing applies (:func:`dry_kernel`): the
tables are read back as a sync reads them, each batch the sync would commit is checked by the
kernel (sent without its end, so the kernel aborts it: nft's ``--check``) and kept, and each
conntrack cleanup lists the flows it would delete instead of deleting them. So the plan is not a
second implementation of the diff: it is the sync's own batch, the Syncer's path for a process
that starts (the tables read back, planned with the kernel's backends slots, diffed whole):
exactly what ``run --once`` sends, and a daemon at its start or after a verify. A daemon's
in-place sync between those programs the same tables from its last plan; its batch may group
the same changes otherwise.

A Syncer records each commit's inputs in the tables (the restart record); the plan runs it
without records, so it always reads the tables back and never trusts a record (a sync's batch
also carries its record: the report leaves that bookkeeping out). What the report says of the
batch is ``plan_report.py``'s, its text ``plan_render.py``'s. Read only: the kernel's tables and
flows are as they were.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from nlproxy.cluster.model import Replace, ServiceKey
from nlproxy.config import Settings
from nlproxy.config.api_source import api_source
from nlproxy.conntrack.kernel import Conntrack, Flow, FlowFilter, Flows
from nlproxy.errors import ConfigError, KernelError
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import Family, Map, Operation, Ruleset, Table
from nlproxy.nft.readback import KernelReadBack
from nlproxy.nft.tables import ReadBack, Tables
from nlproxy.nft.validate import validate
from nlproxy.operate.inputs import api_changes, cluster_inputs, local_addresses
from nlproxy.proxy.naming import TABLE
from nlproxy.sync.kernel import SyncKernel

Batch = tuple[Family, list[Operation]]
"""One batch a sync would commit: the family's table and its operations, in order."""


class DryTables:
    """One family's table where nothing applies: :meth:`apply` has the kernel check the batch
    (so a batch the kernel would refuse is refused here too) and keeps it in ``batches``.

    A table owned by another process (a daemon run with ``--owned-table``) refuses every batch
    from this socket, checks included: its batches are then validated as the backend validates
    them before sending, and the family is named in ``unchecked``.
    """

    def __init__(self, real: NftBackend, batches: list[Batch], unchecked: set[Family]) -> None:
        self.real = real
        self.table: Table = real.table
        self.batches = batches
        self.unchecked = unchecked

    def apply(self, ops: Sequence[Operation], known: Ruleset | None = None) -> object:
        self.check(ops, known)
        if ops:
            self.batches.append((self.table.family, list(ops)))
        return None

    def check(self, ops: Sequence[Operation], known: Ruleset | None = None) -> None:
        if self.table.family not in self.unchecked:
            try:
                self.real.check(ops, known)
            except KernelError as exc:
                if exc.errno != errno.EPERM:
                    raise
                self.unchecked.add(self.table.family)
            else:
                return
        validate(self.table, ops, known or self.real.known())

    def known(self) -> Ruleset:
        return self.real.known()

    def forget(self) -> None:
        self.real.forget()

    def close(self) -> None:
        self.real.close()


class KeptReadBack:
    """The tables read back, the first read of each family kept: what the sync diffed."""

    def __init__(self, real: ReadBack) -> None:
        self.real = real
        self.first: dict[Family, Ruleset | None] = {}

    def dump(self, family: Family) -> Ruleset | None:
        rs = self.real.dump(family)
        self.first.setdefault(family, rs)
        return rs

    def comments(self, family: Family, chain: str) -> list[str] | None:
        return self.real.comments(family, chain)

    def generation(self) -> int:
        return self.real.generation()

    def learned(self, family: Family, m: Map) -> dict[bytes, bytes]:
        return self.real.learned(family, m)

    def close(self) -> None:
        self.real.close()


class DryFlows:
    """The conntrack table where nothing is deleted: :meth:`delete` lists, per filter, the
    flows it would delete (``would``)."""

    def __init__(self, real: Conntrack) -> None:
        self.real = real
        self.would: dict[FlowFilter, list[Flow]] = {}

    @property
    def pending(self) -> Sequence[FlowFilter]:
        return ()

    def take_pending(self) -> tuple[FlowFilter, ...]:
        return ()

    def list(self, flt: FlowFilter | None = None) -> Iterator[Flow]:
        return self.real.list(flt)

    def delete(self, filters: Sequence[FlowFilter]) -> int:
        seen: set[tuple[object, ...]] = set()
        for flt in filters:
            flows = self.would.setdefault(flt, list(self.real.list(flt)))
            seen.update((f.orig, f.reply, f.zone) for f in flows)
        return len(seen)


@dataclass(slots=True)
class DryKernel:
    """A :class:`SyncKernel` of one namespace where nothing applies, and what a sync did on it."""

    netns: str | None
    batches: list[Batch] = field(default_factory=list)
    unchecked: set[Family] = field(default_factory=set)
    readback: KeptReadBack = field(init=False)
    flows: DryFlows = field(init=False)

    def __post_init__(self) -> None:
        self.readback = KeptReadBack(KernelReadBack(TABLE, self.netns))
        self.flows = DryFlows(Conntrack(self.netns))

    def tables(self, table: Table) -> Tables:
        return DryTables(NftBackend(table, netns=self.netns), self.batches, self.unchecked)

    def kernel(self) -> SyncKernel:
        flows: Flows = self.flows
        return SyncKernel(tables=self.tables, readback=self.readback, flows=flows)


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRun:
    """What the next sync would do.

    Attributes:
        batches: each batch it would commit, in order (a rejected service's retry included).
        before: each family's table as read back (None: no table).
        after: each family's table as planned.
        flows: the flows each conntrack filter of the cleanup selects now.
        problems: objects left out, each named (the kernel's refusals included).
        warnings: the source's and the planner's warnings.
        deferred: Services whose round-robin or consistent-hash tables would wait a sync.
        services: how many Services the plan holds.
    """

    batches: tuple[Batch, ...]
    before: dict[Family, Ruleset | None]
    after: dict[Family, Ruleset]
    flows: dict[FlowFilter, list[Flow]]
    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    deferred: frozenset[ServiceKey]
    services: int


def source_changes(s: Settings) -> tuple[list[Replace], tuple[str, ...], tuple[str, ...]]:
    """The objects of ``--manifests`` or of the API server, with the loader's file errors and
    warnings.

    Raises:
        ConfigError: the manifests directory is not one, or there is no way to the API server.
        KubeApiError: the API server could not be reached or refused a required kind.
    """
    if s.manifests is not None:
        from nlproxy.cluster.manifests import load_manifests

        if not s.manifests.is_dir():
            raise ConfigError("--manifests", f"{s.manifests} is not a directory")
        loaded = load_manifests(s.manifests, proxy_name=s.service_proxy_name)
        return list(loaded.changes), loaded.errors, loaded.warnings
    missing = api_source(s.daemon).no_credentials
    if missing:
        raise ConfigError("--kubeconfig", f"{missing}; or give --manifests DIR")
    return api_changes(s), (), ()


def dry_run(s: Settings) -> DryRun:
    """Run the next sync of ``s``'s source on ``s.netns`` without applying anything.

    Raises:
        ConfigError: a bad source (see :func:`source_changes`).
        KubeApiError: the API server could not be reached or refused a required kind.
        KernelError: the kernel would refuse a batch and no Service could be blamed.
    """
    from nlproxy.runtime.hotpath import collection_paused
    from nlproxy.sync.syncer import Syncer

    changes, load_errors, load_warnings = source_changes(s)
    inputs = cluster_inputs(s, changes, load_errors, local=local_addresses(s))
    dry = DryKernel(s.netns)
    # Not the table's owner: a running daemon owns it already, and making this process the
    # owner is no change to the rules.
    syncer = Syncer(s.proxy, dry.kernel(), flush_tcp=s.conntrack_flush_tcp, record=False)
    try:
        with collection_paused():
            result = syncer.sync(inputs.snapshot)
    finally:
        syncer.close()
    assert result.plan is not None, "a sync that reads the tables back plans"
    refused = [
        f"Service {key}: refused by the kernel: {why}" for key, why in result.excluded.items()
    ]
    return DryRun(
        batches=tuple(dry.batches),
        before=dict(dry.readback.first),
        after=dict(result.plan.rulesets),
        flows=dry.flows.would,
        problems=(*inputs.problems, *refused),
        warnings=(
            *load_warnings,
            *inputs.warnings,
            *(
                f"table {family} {TABLE} is owned by another process (--owned-table): its "
                "batch was validated, not checked by the kernel"
                for family in sorted(dry.unchecked)
            ),
            *(
                f"Service {key}: its round-robin or consistent-hash tables wait for a later sync "
                "(past the per-sync quota): this batch keeps it as programmed, or on random "
                "choice when new"
                for key in sorted(result.deferred, key=str)
            ),
        ),
        deferred=frozenset(result.deferred),
        services=len(inputs.snapshot.services),
    )
