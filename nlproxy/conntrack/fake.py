"""A conntrack table in memory, standing in for :class:`~nlproxy.conntrack.kernel.Conntrack`.

Beside ``kernel.py``: the same :class:`~nlproxy.conntrack.kernel.Flows` interface, over a list
of :class:`~nlproxy.conntrack.messages.Flow` values a test puts there, selected by the filters'
own matching (``FlowFilter.matches``, which re-checks what the kernel pre-selects). A unit test
of the sync reads ``flows`` afterwards to see exactly which flows went. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from nlproxy.conntrack.kernel import ConntrackError
from nlproxy.conntrack.messages import Flow, FlowFilter
from nlproxy.conntrack.plan import plan_passes

if TYPE_CHECKING:
    from nlproxy.conntrack.kernel import Flows


class FakeConntrack:
    """Flows in a list; ``deleted`` keeps those deleted, in order, and ``deletes`` the filters
    of each :meth:`delete` call."""

    def __init__(self, flows: Iterable[Flow] = ()) -> None:
        self.flows: list[Flow] = list(flows)
        self.deleted: list[Flow] = []
        self.deletes: list[list[FlowFilter]] = []
        self.fail_next = False
        """Set: the next :meth:`delete` runs out of file descriptors before any pass, keeping
        every filter pending, as the kernel side does."""
        self._pending: list[FlowFilter] = []

    @property
    def pending(self) -> Sequence[FlowFilter]:
        return tuple(self._pending)

    def take_pending(self) -> tuple[FlowFilter, ...]:
        taken, self._pending = tuple(self._pending), []
        return taken

    def list(self, flt: FlowFilter | None = None) -> Iterator[Flow]:
        flt = flt or FlowFilter()
        return iter([f for f in self.flows if flt.matches(f)])

    def delete(self, filters: Sequence[FlowFilter]) -> int:
        for f in filters:
            if f.is_empty:
                raise ConntrackError(str(f), "refusing to delete every flow")
        filters = list(dict.fromkeys([*self._pending, *filters]))
        if self.fail_next:
            self.fail_next = False
            self._pending = filters
            raise ConntrackError(
                "conntrack cleanup",
                f"Too many open files; {len(filters)} filters kept for the next cleanup",
            )
        self._pending = []
        self.deletes.append(list(filters))
        # Grouped into passes as the kernel side does: a flow selected by any pass goes.
        matchers = [p.matcher() for p in plan_passes(filters)]
        gone = [f for f in self.flows if any(m(f) for m in matchers)]
        self.flows = [f for f in self.flows if not any(m(f) for m in matchers)]
        self.deleted += gone
        return len(gone)


if TYPE_CHECKING:  # the fake stands in for the kernel's (mypy checks it)
    _flows: Flows = FakeConntrack()
