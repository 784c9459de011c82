"""``nlproxy rules``: what nlproxy has programmed in the kernel, as nft-like text or JSON.

Reads the kernel (not a cache), so it shows the truth on any node, also without API access; the
elements of the counting sets (``--service-counters``) show their packet and byte counts, as nft
prints them. Read only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nlproxy.nft.ir import Family

if TYPE_CHECKING:
    from nlproxy.nft.counters import Counts
    from nlproxy.nft.ir import Ruleset


def programmed(families: Sequence[Family], netns: str | None) -> list[Ruleset]:
    """nlproxy's tables of ``families`` as the kernel holds them (those that exist), each one
    consistent snapshot: the one reader of the programmed tables for every operator command."""
    from nlproxy.nft.readback import read_ruleset
    from nlproxy.proxy.naming import TABLE

    return [rs for f in families if (rs := read_ruleset(f, TABLE, netns=netns))]


def render_text(found: Sequence[Ruleset], netns: str | None) -> str:
    """``found`` nft-like, with the counting sets' counters read from the kernel."""
    from nlproxy.nft.render import render_ruleset

    if not found:
        return "# nlproxy has programmed nothing here\n"
    return "\n".join(render_ruleset(rs, _counters(rs, netns)) for rs in found)


def to_json(found: Sequence[Ruleset]) -> list[dict[str, Any]]:
    from nlproxy.nft.render import ruleset_to_json

    return [ruleset_to_json(rs) for rs in found]


def _counters(rs: Ruleset, netns: str | None) -> dict[str, Counts]:
    """The values of the per-element counters of ``rs``'s counting sets (``--service-counters``)."""
    from nlproxy.nft.counters import read_counters
    from nlproxy.nft.ir import Set

    sets = {name: s.key for name, s in rs.sets.items() if isinstance(s, Set) and s.counter}
    if not sets:
        return {}
    return read_counters(rs.table.family, rs.table.name, sets, netns=netns)
