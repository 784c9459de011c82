"""Inputs built to exhaust a parser stay in their file: named, refused, bounded in time and
memory, and every other file still loads (a daemon that died on them would die again at every
restart, with the node's rules frozen)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nlproxy.cluster.manifests import load_manifests

GOOD = """apiVersion: v1
kind: Service
metadata: {name: good, namespace: default}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
"""
# Nine levels of nine aliases: 9**9 ones once expanded, a few hundred bytes written.
LAUGHS = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
]


def _laughs_service() -> str:
    """A Service whose checked ``ports`` field is the top of the alias bomb."""
    head = "apiVersion: v1\nkind: Service\nmetadata:\n  name: boom\n  namespace: default\n"
    annotations = "  annotations:\n" + "".join(f"    {line}\n" for line in LAUGHS)
    return head + annotations + "spec:\n  clusterIP: 10.96.0.11\n  ports: [*i]\n"


BOMBS = {
    "huge-integer-yaml": ("bomb.yaml", GOOD.replace("80", "9" * 5000).replace("good", "x")),
    "huge-integer-json": ("bomb.json", '{"kind": "Service", "x": ' + "9" * 5000 + "}"),
    "deep-nesting": ("bomb.yaml", "[" * 100_000 + "]" * 100_000),
    "billion-laughs": ("bomb.yaml", _laughs_service()),
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_bomb_stays_in_its_file(tmp_path: Path, bomb: str) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    name, text = BOMBS[bomb]
    (tmp_path / name).write_text(text)
    loaded = load_manifests(tmp_path)
    services = next(r for r in loaded.changes if r.kind == "Service")
    assert "good" in {c.ref.name for c in services.changes}, "the other file still loads"
    problems = [*loaded.errors, *(str(getattr(c, "error", "")) for c in services.changes)]
    named = [p for p in problems if p]
    assert named, "the bomb is named"
    assert all(len(p) < 400 for p in named), named
