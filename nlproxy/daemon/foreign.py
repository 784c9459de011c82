"""The daemon's look for another proxy's rules on the node: when it looks, and what it says.

What another proxy's rules are and how they are found is ``inspect/foreign.py``,
``inspect/ipvs.py`` and ``inspect/foreign_check.py``; this is the daemon's task around them: a
warning when they appear, a gauge, and with ``--replace-kube-proxy`` their removal (after the
first sync, so the node is never without rules).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from nlproxy.errors import NlproxyError
from nlproxy.inspect.foreign import Leftovers, remove_all
from nlproxy.inspect.foreign_check import ForeignCheck
from nlproxy.log import get_logger

if TYPE_CHECKING:
    from prometheus_client import Gauge

    from nlproxy.config import Settings
    from nlproxy.serve.metrics import Metrics

FOREIGN_CHECK_SECONDS = 60.0
"""The longest time between two looks for another proxy's rules."""


class ForeignWatch:
    """Looks for another proxy's rules in ``check``'s namespace whenever :meth:`ask` is called
    (another process committed) and every sync period (at most :data:`FOREIGN_CHECK_SECONDS`)
    for what no generation shows (IPVS).

    The looks are made by one thread of their own, which waits on a :class:`threading.Event`
    between them and reports from there: on an idle node a look wakes neither the event loop
    nor a fresh worker thread (trio lets an idle one go after 10 s, so each periodic look made
    one), and a look that finds what the last one found reports nothing again.

    ``settings`` answers the daemon's settings now (they may change in place). What was
    reported is kept across the task's restarts, so that a restarted look does not report it
    again.
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
        self._last: Leftovers | None = None  # what the last report was of (None: none yet)
        self._labels: set[tuple[Gauge, str, str, str]] = set()  # the gauges' series now
        self._asked = threading.Event()
        self.log = get_logger("daemon")

    def ask(self) -> None:
        """Look again at once (another process committed); from any thread."""
        self._asked.set()

    async def run(self) -> None:
        """Look, report, wait for :meth:`ask` or the interval; for ever, in a thread.

        Raises what a look raises other than a refused dump (which is a warning, tried again
        at the next look): the task's supervisor restarts it.

        Cancellation: at once; the thread is abandoned (it only reads, or sends one atomic
        batch, so a slow look at a large ruleset on a loaded node cannot hold a stop) and ends
        after the look it is in.
        """
        stop = threading.Event()
        try:
            await trio.to_thread.run_sync(self._looking, stop, abandon_on_cancel=True)
        finally:
            stop.set()
            self._asked.set()  # out of its wait now

    def _looking(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._asked.clear()  # an ask from now on is for a look after this one
            try:
                found = self._once()
            except (NlproxyError, OSError) as exc:
                self.log.warning("foreign_proxy.check_failed", error=str(exc))
            else:
                if found != self._last:
                    self.known = self._report(found, self.known)
                    self._last = found
            self._asked.wait(min(self.settings().daemon.sync_period, FOREIGN_CHECK_SECONDS))

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
        # Only what went is removed, never the whole gauge: a scrape reading it meanwhile (on the
        # event loop or its worker) sees every table that is still there.
        gauge = self.metrics.beside_proxy_tables if canary else self.metrics.foreign_proxy_tables
        labels = {(gauge, ft.family, ft.table, ft.mode) for ft in found.tables}
        for old, family, table, mode in self._labels - labels:
            old.remove(family, table, mode)  # the labels' order: family, table, mode
        for _, family, table, mode in labels:
            gauge.labels(family=family, table=table, mode=mode).set(1)
        self._labels = labels
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
