"""``docs/cli.md`` documents every flag of every command: it is what the parser says now."""

from __future__ import annotations

from pathlib import Path

from tests.cli_reference import reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_reference_matches_the_parser() -> None:
    assert DOC.read_text() == reference(), (
        "docs/cli.md is out of date: python -m tests.cli_reference > docs/cli.md"
    )


def test_every_flag_is_in_it() -> None:
    text = DOC.read_text()
    for flag in (
        "--external-ip-cidrs",
        "--replace-kube-proxy",
        "--kube-proxy",
        "--conntrack-min",
        "--owned-table",
        "--netns",
        "--all-stale",
        "--metrics-address",
    ):
        assert f"`{flag}`" in text, flag
