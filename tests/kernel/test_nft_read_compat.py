"""nft compatibility: for every IR expression, a rule loaded with ``nft -f`` reads back as the
expected IR, and ``render_rule`` prints exactly what ``nft list`` prints for it.

This also fixes the lowering the write path must produce: the netlink form nft 1.0.6 generates
for each case is what read-back recognises.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nlproxy.nft.ir import (
    Expr,
    Family,
)
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.render import render_rule
from tests.kernel.nft_read_cases import CASES, PRELUDE, TABLE, load_nft, nft_rules


@pytest.mark.parametrize(("family", "rule", "exprs", "printed"), CASES)
def test_rule_reads_back_as_ir_and_renders_as_nft(
    make_netns: Callable[[str], str],
    family: Family,
    rule: str,
    exprs: tuple[Expr, ...],
    printed: str,
) -> None:
    ns = make_netns("compat")
    text = f"table {family} {TABLE} {{\n{PRELUDE[family]}  chain target {{\n  }}\n"
    text += f"  chain c {{\n    {rule}\n  }}\n}}\n"
    load_nft(ns, text)

    rs = read_ruleset(family, TABLE, netns=ns)

    assert rs is not None
    (got,) = rs.rules["c"]
    assert got.exprs == exprs
    assert got.handle is not None
    assert nft_rules(ns, family, "c") == [printed]
    assert render_rule(got, family=family) == printed
