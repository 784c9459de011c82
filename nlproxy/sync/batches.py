"""The Syncer's batches to the kernel, as an object it owns: one ``Tables`` backend per family,
the batch the kernel refused last, and the tables this process's socket owns
(``--owned-table``).

:class:`Batches` sends what the Syncer hands it and tells the Syncer's
:class:`~nlproxy.sync.verify.Verifier` the generation of each commit (how a read-back and the
drift monitor tell this process's commits from another writer's). It plans nothing and keeps
no programmed state: that is the Syncer's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Set
from typing import TYPE_CHECKING

from nlproxy.cluster.model import ServiceKey
from nlproxy.errors import KernelError
from nlproxy.nft.dynmap import Learned, forget_learned
from nlproxy.nft.ir import Family, Operation, Ruleset, Table, Verb
from nlproxy.nft.reconcile import count_ops, diff
from nlproxy.nft.tables import Tables
from nlproxy.proxy import naming as n
from nlproxy.proxy.affinity import client_maps
from nlproxy.proxy.planner import Plan
from nlproxy.sync.kernel import SyncKernel

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


class Batches:
    """Sends a Syncer's batches, a family's at a time.

    Args:
        kernel: the tables and their read-back (``kernel.py``).
        log: where taking a table over is logged.
        owner: create the tables with NFT_TABLE_F_OWNER (+ PERSIST); see ``nft/backend.py``.
        committed: called with the kernel's generation just before and just after each
            commit that the kernel accepted (``Verifier.committed``).
    """

    def __init__(
        self,
        kernel: SyncKernel,
        log: FilteringBoundLogger,
        *,
        owner: bool,
        committed: Callable[[int, int], None],
    ) -> None:
        self._kernel = kernel
        self.log = log
        self.owner = owner
        self._committed = committed
        self._backends: dict[Family, Tables] = {}
        # The family and operations of the last rejected batch.
        self._failed: tuple[Family, list[Operation]] | None = None
        # Families whose table this process's socket owns (with --owned-table).
        self._claimed: set[Family] = set()
        # Families whose table the batch being made deletes and creates owned (``_claim``).
        self.recreating: set[Family] = set()
        self._clients_checked = False  # see forget_left_clients

    @property
    def failed(self) -> tuple[Family, list[Operation]] | None:
        """The family and operations of the batch the kernel rejected last (None: the last
        commit passed)."""
        return self._failed

    def generation(self) -> int:
        """The kernel's current generation id."""
        return self._kernel.readback.generation()

    def apply(self, family: Family, ops: list[Operation]) -> None:
        """Commit ``ops`` to ``family``'s table; remember them if the kernel rejects them.

        Raises:
            KernelError: the kernel rejected the batch (:attr:`failed` names it).
        """
        self._failed = None
        before = self.generation()
        try:
            self._backend(family).apply(ops)
        except KernelError:
            self._failed = (family, ops)
            raise
        # A verify's read-back and the drift monitor tell this process's commits from
        # others' by their generation.
        self._committed(before, self.generation())

    def apply_staged(
        self,
        firsts: list[tuple[Family, list[Operation]]],
        laters: list[tuple[Family, list[Operation]]],
        each_first: Callable[[], None],
    ) -> int:
        """Commit a staged repair (``verify.staged``): ``firsts``, calling ``each_first`` after
        each, then ``laters``; how many operations were sent. How long traffic waited is logged
        when some batches came later (``drift.repair_traffic``).

        Raises:
            KernelError: the kernel rejected a batch (:attr:`failed` names it).
        """
        sent = 0
        started = time.perf_counter()
        for family, ops in firsts:
            self.apply(family, ops)
            sent += count_ops(ops)
            each_first()
        if laters:
            self.log.info(
                "drift.repair_traffic",
                ops=sent,
                ms=round((time.perf_counter() - started) * 1000, 1),
                later=sum(count_ops(ops) for _, ops in laters),
            )
        for family, ops in laters:
            self.apply(family, ops)
            sent += count_ops(ops)
        return sent

    def check(self, family: Family, ops: list[Operation]) -> None:
        """Whether the kernel would accept ``ops`` for ``family`` (nothing is applied).

        Raises:
            KernelError: it would not.
        """
        self._backend(family).check(ops)

    def forget(self) -> None:
        """The backends validate against their own view of chains and sets; after drift or a
        failed commit that view is stale, so they read it again."""
        for backend in self._backends.values():
            backend.forget()

    def forget_learned(self, family: Family, maps: Iterable[Learned]) -> None:
        """Delete the clients ``maps`` learned for endpoints they may no longer keep
        (``nft/dynmap.py``); a failure is logged, not raised (the flows go all the same)."""
        read = functools.partial(self._kernel.readback.learned, family)
        _, errors = forget_learned(read, self._backend(family).apply, maps)
        for exc in errors:
            self.log.warning("affinity.forget_failed", error=str(exc))

    def forget_clients(self, planned: Plan, changing: Set[ServiceKey] | None) -> None:
        """After a commit of ``planned``, before its flows go: a flow made meanwhile through a
        removed endpoint's client of a Service in ``changing`` (None: any) goes with them. Not
        looked for when nothing changed (a verify's sync) or there is no clients map (no
        ClientIP affinity): ``client_maps`` names every port of the plan (~30 ms at 10k
        Services)."""
        prefix = f"{n.AFFINITY_CLIENTS}-"
        for family, rs in planned.rulesets.items():
            if (changing is not None and not changing) or not any(
                name.startswith(prefix) for name in rs.sets
            ):
                continue
            if maps := client_maps(rs, planned.ports.values(), changing):
                self.forget_learned(family, maps)

    def forget_left_clients(self, planned: Plan | None) -> None:
        """Once per process, at its first sync with a plan of what is programmed (``planned``):
        the ClientIP affinity clients an earlier process left mapped to endpoints the tables no
        longer have go. A stop between a commit that removed an endpoint and the forgetting
        after it (:meth:`forget_clients` runs only after a commit that changed something, not
        at a restart that sends nothing) left them: each packet of such a client went on to
        the removed endpoint, refreshing its entry's timeout, so it never moved. The
        counterpart of the conntrack sweep (``cleanup.py``) for the clients maps, and called
        before it, as after a commit: a flow the sweep deletes would be made again through a
        client still mapped to a removed endpoint, and stay."""
        if self._clients_checked or planned is None:
            return
        self._clients_checked = True
        self.forget_clients(planned, None)

    def claiming(
        self, family: Family, have: Ruleset | None, desired: Ruleset, ops: list[Operation]
    ) -> tuple[list[Operation], int]:
        """``ops`` (making ``have`` into ``desired``) as they are to be sent: led by what makes
        this process's socket the owner of the table the first time (with ``--owned-table``),
        and how many operations that added."""
        self.recreating.discard(family)
        if self.owner and family not in self._claimed:
            return self._claim(family, have, desired, ops)
        return ops, 0

    def claimed(self, family: Family) -> None:
        """``family``'s batch was committed: this process owns its table from now on."""
        self._claimed.add(family)

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()

    def table(self, family: Family) -> Table:
        return Table(family=family, name=n.TABLE, owner=self.owner, persist=self.owner)

    def _backend(self, family: Family) -> Tables:
        if family not in self._backends:
            self._backends[family] = self._kernel.tables(self.table(family))
        return self._backends[family]

    def _claim(
        self,
        family: Family,
        have: Ruleset | None,
        desired: Ruleset,
        ops: list[Operation],
    ) -> tuple[list[Operation], int]:
        """``ops`` led by what makes this process's socket the owner of the table (with
        ``--owned-table``), and how many operations that added.

        The plan's table carries no flags (ownership belongs to the socket, not to the plan).
        A new table is created owned and persistent; an orphaned persistent one (a previous
        nlproxy's) is re-taken by adding it again with the same flags; a table created without
        them cannot gain them (the kernel refuses to change the owner flag), so it is deleted
        and created anew in the same batch: the rules are never absent.
        """
        owned = self.table(family)
        if have is None:
            return [Operation(Verb.ADD, owned), *ops[1:]], 0  # ops[0] adds the plan's table
        if have.table.persist:  # the kernel clears the owner flag when the owner exits
            return [Operation(Verb.ADD, owned), *ops], 1
        self.log.info("table.owned", family=str(family), table=n.TABLE, recreated=True)
        self.recreating.add(family)  # what the old table held besides the plan goes with it
        fresh = diff(desired, None)[1:]
        plain = Table(family=family, name=n.TABLE)
        return [Operation(Verb.DELETE, plain), Operation(Verb.ADD, owned), *fresh], 2
