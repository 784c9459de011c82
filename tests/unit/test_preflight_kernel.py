"""preflight's kernel check: the running kernel's version against docs/support.md's table."""

from __future__ import annotations

import re
from pathlib import Path

from nlproxy.operate import preflight as pf
from nlproxy.operate.preflight import Level

SUPPORT = Path(__file__).resolve().parents[2] / "docs" / "support.md"


def doc_table() -> set[tuple[str, tuple[int, int]]]:
    """(the last `identifier` of the feature cell, (major, minor)) of each row of the table
    under "Kernel features"."""
    text = SUPPORT.read_text()
    section = text[text.index("Kernel features") :]
    rows = set()
    for line in section.splitlines()[1:]:
        if line.startswith(("|---", "| feature")):
            continue
        if not line.startswith("|"):
            if rows:
                break
            continue
        feature, version = (c.strip() for c in line.strip("|").split("|"))
        ident = re.findall(r"`([^`]+)`", feature)
        m = re.fullmatch(r"≥ (\d+)\.(\d+)", version)
        assert m is not None, line
        rows.add((ident[-1], (int(m[1]), int(m[2]))))
    return rows


def test_the_feature_table_is_the_documented_one() -> None:
    assert {(ident, v) for ident, _, v in pf.KERNEL_FEATURES} == doc_table()


def test_a_kernel_with_every_feature_has_one_finding() -> None:
    assert [(f.level, f.text) for f in pf.kernel("6.18.0-1-amd64", None)] == [
        (Level.OK, "6.18.0-1-amd64: nftables answers over netlink")
    ]


def test_an_older_kernel_names_what_it_lacks() -> None:
    ok, lacks = pf.kernel("6.1.0-18-amd64", None)
    assert ok.level is Level.OK
    assert lacks.level is Level.WARN
    assert lacks.text == (
        "Linux 6.1 lacks 2 feature(s) of docs/support.md's table: "
        "--owned-table tables that outlive the daemon (NFT_TABLE_F_PERSIST, Linux >= 6.9); "
        "destroy (delete if present) in batches (destroy, Linux >= 6.3)"
    )
    (_, lacks) = pf.kernel("5.10.0", None)
    assert "Linux 5.10 lacks 4 feature(s)" in lacks.text
    assert "CTA_FILTER" not in lacks.text  # 5.8 has it
    assert "CTA_STATUS_MASK" in lacks.text
    assert "NFT_TABLE_F_OWNER" in lacks.text


def test_an_unparsable_release_is_said_not_compared() -> None:
    ok, note = pf.kernel("custom", None)
    assert ok.level is Level.OK
    assert (note.level, "not compared" in note.text) == (Level.WARN, True)
    assert pf.kernel_version("5.15.0-91-generic") == (5, 15)
    assert pf.kernel_version("6.x") is None
