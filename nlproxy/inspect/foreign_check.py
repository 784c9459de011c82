"""The periodic look for another proxy's rules, at what an idle node can afford (the daemon's).

Another proxy's nftables tables and iptables-nft chains (``inspect/foreign.py``) can only come or
go with a commit, and every commit moves the kernel's generation: the nftables part is looked at
again only when the generation moved since the last time it was (one GETGEN answers that; a
dump of every table, its chains and rules, and a namespace entered for it otherwise, every
period of an idle node). IPVS mode's ipsets, device and virtual servers (``inspect/ipvs.py``) are
not nftables: no generation tells when they change, so they are looked at every time.
"""

from __future__ import annotations

from collections.abc import Callable

from nlproxy.errors import NlproxyError
from nlproxy.inspect import ipvs
from nlproxy.inspect.foreign import ForeignTable, Leftovers, detect


class ForeignCheck:
    """Looks for another proxy's rules in ``netns``; ``generation`` answers the kernel's
    nftables generation now (one GETGEN: ``GenerationWatch.current``), or None when it cannot
    be had (every look then dumps the tables)."""

    def __init__(
        self, netns: str | None, generation: Callable[[], int | None] | None = None
    ) -> None:
        self.netns = netns
        self.generation = generation
        self.table_looks = 0
        """Times the nftables part was dumped (the rest are answered by the generation)."""
        self._tables: tuple[ForeignTable, ...] = ()
        self._of: int | None = None  # the generation the tables were dumped at (None: none)

    def look(self) -> Leftovers:
        """What another proxy has in the namespace now.

        Raises:
            NlproxyError, OSError: a dump failed (the next look dumps again).
        """
        gen = self._generation()
        if gen is None or gen != self._of:
            self._of = None  # a dump that fails is not vouched for by this generation
            self._tables = tuple(detect(self.netns))
            self.table_looks += 1
            # Read before the dump: a commit during it moves the generation past this one, and
            # the next look dumps again.
            self._of = gen
        return Leftovers(tables=self._tables, ipvs=ipvs.detect(self.netns))

    def forget(self) -> None:
        """The next look dumps the tables whatever the generation (after a removal)."""
        self._of = None

    def _generation(self) -> int | None:
        if self.generation is None:
            return None
        try:
            return self.generation()
        except (NlproxyError, OSError):  # the watch's socket gone, no answer: dump
            return None
