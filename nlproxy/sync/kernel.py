"""What one :class:`~nlproxy.sync.syncer.Syncer` is handed of the kernel: the tables, their
read-back and the conntrack flows, each behind a small interface (``nft/tables.py``,
``conntrack/kernel.py``'s ``Flows``).

The edge (``daemon/``, ``commands/``) hands it the real ones (:func:`real`); unit tests hand it
the fakes (``nft/fake.py``, ``conntrack/fake.py``), so the whole sync runs without a kernel.
The Syncer itself opens no socket.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nlproxy.conntrack.kernel import Flows
from nlproxy.nft.ir import Table
from nlproxy.nft.tables import ReadBack, Tables


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncKernel:
    """The kernel one Syncer syncs.

    Attributes:
        tables: opens one family's table (the ``Table`` carries the family and owner flags);
            called once per family, on first use.
        readback: reads the tables back (verify, restart records, generations).
        flows: the conntrack table (stale flows are deleted there).
    """

    tables: Callable[[Table], Tables]
    readback: ReadBack
    flows: Flows


def real(netns: str | None = None) -> SyncKernel:
    """The kernel of network namespace ``netns`` (None: the current one).

    The nftables backend and read-back are imported here, where they are built: the Syncer and
    the fakes need only the interfaces.
    """
    from nlproxy.conntrack.kernel import Conntrack
    from nlproxy.nft.backend import NftBackend
    from nlproxy.nft.readback import KernelReadBack
    from nlproxy.proxy.naming import TABLE

    return SyncKernel(
        tables=lambda table: NftBackend(table, netns=netns),
        readback=KernelReadBack(TABLE, netns),
        flows=Conntrack(netns),
    )
