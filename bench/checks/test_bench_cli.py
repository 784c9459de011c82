"""``bench_cli.py`` at a small size: each command and its reference run side by side on the
same namespace, and every summary the targets need is printed."""

from __future__ import annotations

from checks.script import run_script


def test_small_run_prints_every_figure() -> None:
    rows = run_script(
        "bench_cli.py", "--flows", "300", "--services", "20", "--endpoints", "2", "--rounds", "1"
    )
    assert [(r["bench"], r["command"]) for r in rows if r["bench"] == "cli-summary"] == [
        ("cli-summary", "version"),
        ("cli-summary", "conntrack list"),
        ("cli-summary", "conntrack flush"),
        ("cli-summary", "conntrack flush, as installed"),
        ("cli-summary", "rules"),
    ]
    assert [r["command"] for r in rows if r["bench"] == "cli-floor"] == ["conntrack flush"]
    variants = {r["variant"] for r in rows if r["bench"] == "cli"}
    assert variants == {
        "nlproxy version",
        "python -c pass",
        "nlproxy conntrack list",
        "conntrack -L",
        "nlproxy conntrack flush",
        "nlproxy conntrack flush (as installed)",
        "conntrack -D",
        "nlproxy rules",
        "nft list ruleset",
    }
    assert all(r["wall_s"] > 0 for r in rows if r["bench"] == "cli")
    assert (
        next(r for r in rows if r["bench"] == "cli" and r["variant"] == "nlproxy rules")["lines"]
        > 20
    )
