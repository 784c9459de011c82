"""What the sync needs from nftables, as two small interfaces: a table to write, a read-back.

:class:`Tables` is one family's table: validate and commit a batch (``apply``), have the kernel
check one without applying it (``check``), and the view of chains and sets validation uses
(``known``, ``forget``). :class:`ReadBack` reads the tables of one name back: all of one
(``dump``), one chain's rule comments (``comments``, the restart records) and the ruleset's
generation id. The real ones send netlink (``backend.NftBackend``, ``readback.KernelReadBack``);
the fakes beside them (``fake.FakeTables``, ``fake.FakeNftables``) hold the tables in memory and
answer as the kernel does (``tests/kernel/test_nft_fake.py`` sends both the same batches).
Declarations only: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from nlproxy.nft.ir import Family, Map, Operation, Ruleset, Table


class Tables(Protocol):
    """One family's table: every batch is atomic, all of it or (on a refusal) none."""

    table: Table

    def apply(self, ops: Sequence[Operation], known: Ruleset | None = None) -> object:
        """Validate and commit ``ops``.

        Raises:
            InvalidNftObject: an operation is invalid; nothing was sent.
            KernelError: the kernel refused the batch (``index`` names the operation).
        """
        ...

    def check(self, ops: Sequence[Operation], known: Ruleset | None = None) -> None:
        """Raise as :meth:`apply` would, applying nothing."""
        ...

    def known(self) -> Ruleset:
        """The chains and sets the table holds, as validation sees them."""
        ...

    def forget(self) -> None:
        """Drop the view :meth:`known` keeps: someone else may have changed the table."""
        ...

    def close(self) -> None: ...


class ReadBack(Protocol):
    """Reads the tables back. Every method may run in a thread beside :meth:`Tables.apply`."""

    def dump(self, family: Family) -> Ruleset | None:
        """Everything in ``family``'s table (None: there is no such table)."""
        ...

    def comments(self, family: Family, chain: str) -> list[str] | None:
        """The comments of ``chain``'s rules in order (None: no table; empty: no chain).

        Raises:
            Interrupted: the ruleset changed during the read.
        """
        ...

    def generation(self) -> int:
        """The ruleset's generation id: it moves by one with every commit, anyone's."""
        ...

    def learned(self, family: Family, m: Map) -> dict[bytes, bytes]:
        """The elements the packet path put in dynamic map ``m``, as the kernel's bytes (key
        -> data; empty: no such map). One dump of that map (``dynmap.py``).

        Raises:
            ReadbackError: the kernel refused the dump, or it kept changing under it.
        """
        ...

    def close(self) -> None: ...
