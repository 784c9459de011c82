"""Every IR expression programmed through NftBackend lowers exactly as nft lowers the same text.

Each case loads a rule as text with ``nft -f`` into table ``ref`` and the same rule as IR through
:class:`NftBackend` into table ``t`` of the same fresh namespace, then compares what the kernel
holds: the netlink expressions (``nft --debug=netlink list chain``, registers and all), the
``nft -j`` JSON and the ``nft list`` text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import (
    Expr,
    Family,
    Operation,
    Rule,
    Table,
    Verb,
)
from tests.kernel.nft_write_cases import CASES, COMMENTS, nft, prelude
from tests.netns import sh


def _netlink_of(ns: str, family: Family, table: str, chain: str) -> list[str]:
    out = nft(ns, "--debug=netlink", "list", "chain", family.value, table, chain)
    lines = []
    for line in out.splitlines():
        if line.startswith((f"{family.value} {table} ", "\t", "table", "}")) or not line.strip():
            continue
        line = re.sub(r"__map\d+", "__map", line)
        lines.append(line.replace(f" set {table} ", " set T "))
    return lines


def _rule_json(ns: str, family: Family, table: str, chain: str) -> list[Any]:
    doc = json.loads(nft(ns, "-j", "list", "chain", family.value, table, chain))
    return [item["rule"]["expr"] for item in doc["nftables"] if "rule" in item]


@pytest.mark.parametrize(
    ("family", "chain", "text", "exprs"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_lowered_like_nft(
    make_netns: Callable[[str], str], family: Family, chain: str, text: str, exprs: tuple[Expr, ...]
) -> None:
    ns = make_netns("nftw")
    ptext, pops = prelude(family)
    comment = next((c for k, c in COMMENTS.items() if f'comment "{c}"' in text), "")
    sh(
        "sh",
        "-c",
        f"nft -f - <<'EOF'\ntable {family} ref {{ {ptext}\n}}\n"
        f"add rule {family} ref {chain} {text}\nEOF",
        ns=ns,
    )
    table = Table(family=family, name="t")
    rule = Rule(chain=chain, exprs=exprs, comment=comment)
    with NftBackend(table, netns=ns) as backend:
        backend.apply([Operation(Verb.ADD, table), *pops, Operation(Verb.ADD, rule)])
    want = _netlink_of(ns, family, "ref", chain)
    got = _netlink_of(ns, family, "t", chain)
    assert got == want
    assert got  # the rule is there at all
    assert _rule_json(ns, family, "t", chain) == _rule_json(ns, family, "ref", chain)
    listed = nft(ns, "list", "chain", family.value, "t", chain)
    assert listed == nft(ns, "list", "chain", family.value, "ref", chain).replace(" ref ", " t ")
