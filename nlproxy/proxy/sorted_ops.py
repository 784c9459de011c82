"""The operations of many fragments sorted by kind, as an in-place update (``incremental.py``)
undoes, checks and applies them: each kind in one pass, ``Fill`` s concatenated per map.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import cast

from nlproxy.nft.ir import Chain, Element, Map, Rule
from nlproxy.nft.ir import Set as NftSet
from nlproxy.proxy.fragments import Ensure, Fill, Fragment


class SortedOps:
    """The operations of many fragments, sorted by kind in one pass (each kind in order), with
    the index of the fragment that wrote each one."""

    __slots__ = ("chains", "elements", "ensures", "fills", "rules", "sets")

    def __init__(self, frags: Sequence[Fragment]) -> None:
        self.fills: Fills = {}
        self.elements: list[tuple[Element, int]] = []
        self.ensures: list[tuple[Ensure, int]] = []
        self.chains: list[tuple[Chain, int]] = []
        self.sets: list[tuple[NftSet | Map, int]] = []
        self.rules: list[tuple[Rule, int]] = []
        fills = self.fills
        for i, frag in enumerate(frags):
            for op in frag.ops:
                t = type(op)  # the common kinds first; no match statement (a burst's hot loop)
                if t is Fill:
                    fill = cast(Fill, op)
                    entry = fills.get(fill.set)
                    if entry is None:
                        entry = fills[fill.set] = ([], [], [])
                    entry[0].extend(fill.keys)
                    entry[1].extend(fill.data)
                    entry[2].extend(repeat(i, len(fill.keys)))
                elif t is Element:
                    self.elements.append((cast(Element, op), i))
                elif t is Ensure:
                    self.ensures.append((cast(Ensure, op), i))
                elif t is Rule:
                    self.rules.append((cast(Rule, op), i))
                elif t is Chain:
                    self.chains.append((cast(Chain, op), i))
                else:
                    self.sets.append((cast(NftSet | Map, op), i))


Fills = dict[str, tuple[list[bytes], list[bytes], list[int]]]
"""Per packed map, the keys, data and writer (index of its fragment) of many ``Fill`` s."""
