"""The daemon's look for another proxy's rules on the node: when it looks, and what it says.

What another proxy's rules are and how they are found is ``inspect/foreign.py``,
``inspect/ipvs.py`` and ``inspect/foreign_check.py``; this is the daemon's task around them: a
warning when they appear, a gauge, and with ``--replace-kube-proxy`` their removal (after the
first sync, so the node is never without rules).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from nlproxy.errors import NlproxyError
from nlproxy.inspect.foreign import Leftovers, remove_all
from nlproxy.inspect.foreign_check import ForeignCheck
from nlproxy.log import get_logger

if TYPE_CHECKING:
    from nlproxy.config import Settings
    from nlproxy.serve.metrics import Metrics

FOREIGN_CHECK_SECONDS = 60.0
"""The longest time between two looks for another proxy's rules."""


class ForeignWatch:
    """Looks for another proxy's rules in ``check``'s namespace whenever :meth:`ask` is called
    (another process committed) and periodically for what no generation shows (IPVS).

    ``settings`` answers the daemon's settings now (they may change in place); ``period`` the
    sync period. What was reported is kept across the task's restarts, so that a restarted look
    does not report it again.
    """

    def __init__(
        self,
        check: ForeignCheck,
        metrics: Metrics,
        settings: Callable[[], Settings],
    ) -> None:
        self.check = check
        self.metrics = metrics
        self.settings = settings
        self.known: set[str] = set()
        self._asked = trio.Event()
        self.log = get_logger("daemon")

    def ask(self) -> None:
        """Look again soon: another process committed, or a periodic verify woke the loop."""
        self._asked.set()

    async def run(self) -> None:
        """Look, report, wait for :meth:`ask` or the interval; for ever.

        Cancellation: safe at any point (the thread only reads, or sends one atomic batch; it
        is abandoned, so a slow look at a large ruleset on a loaded node cannot hold a stop).
        """
        while True:
            period = self.settings().daemon.sync_period  # may change in place
            interval = period * 1.5 if period <= FOREIGN_CHECK_SECONDS else FOREIGN_CHECK_SECONDS
            self._asked = trio.Event()
            try:
                found = await trio.to_thread.run_sync(self._once, abandon_on_cancel=True)
            except (NlproxyError, OSError) as exc:
                self.log.warning("foreign_proxy.check_failed", error=str(exc))
            else:
                self.known = self._report(found, self.known)
            with trio.move_on_after(interval):
                await self._asked.wait()

    def _report(self, found: Leftovers, known: set[str]) -> set[str]:
        """Log what appeared and went since the last look, set the gauge; what is known now."""
        canary = self.settings().service_proxy_name is not None
        now = {name: (mode, line, chains) for name, mode, line, chains in found.items()}
        for name, (mode, line, chains) in now.items():
            if name in known:
                continue
            if canary:  # expected beside us
                self.log.info("foreign_proxy.beside", table=name, mode=mode, chains=chains)
            else:
                self.log.warning(
                    "foreign_proxy.detected",
                    table=name,
                    mode=mode,
                    chains=chains,
                    error=f"{line}: its rules can win over nlproxy's for new "
                    "connections; stop that proxy, then run 'nlproxy cleanup "
                    "--kube-proxy' (docs/migrating.md)",
                )
        for gone in sorted(known - now.keys()):
            self.log.info("foreign_proxy.gone", table=gone)
        gauge = self.metrics.beside_proxy_tables if canary else self.metrics.foreign_proxy_tables
        self.metrics.foreign_proxy_tables.clear()
        self.metrics.beside_proxy_tables.clear()
        for ft in found.tables:
            gauge.labels(family=ft.family, table=ft.table, mode=ft.mode).set(1)
        return set(now)

    def _once(self) -> Leftovers:
        found = self.check.look()
        if found and self.settings().replace_kube_proxy:
            self.check.forget()
            remove_all(found, self.check.netns)
            for name, mode, line, _ in found.items():
                self.log.warning("foreign_proxy.removed", table=name, mode=mode, what=line)
                self.metrics.foreign_proxy_removals.labels(table=name, mode=mode).inc()
            found = self.check.look()
        return found
