"""``read_manifests`` reads what ``load_manifests`` reads, as it reads it, once: the loader
given those reads gives the same load, and ``run --once``'s files digest is of those bytes, or
None when a file could not be read (the loader names it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nlproxy.cluster.manifests import load_manifests, read_manifests
from nlproxy.config import DaemonConfig, Settings
from nlproxy.operate.run import _manifests_digest
from nlproxy.proxy.config import ProxyConfig


def _service(name: str, vip: str) -> str:
    return (
        "apiVersion: v1\nkind: Service\n"
        f"metadata: {{name: {name}, namespace: default}}\n"
        f"spec: {{clusterIP: {vip}, ports: [{{port: 80}}]}}\n"
    )


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        daemon=DaemonConfig(node_name="n"), proxy=ProxyConfig(node_name="n"), manifests=tmp_path
    )


def _directory(tmp_path: Path) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "a.yaml").write_text(_service("a", "10.96.0.10"))
    (d / "b.json").write_text('{"kind": "Service", "metadata": {"name": "b"}}')
    (d / "sub.yaml").mkdir()
    (d / ".hidden.yaml").write_text(_service("hidden", "10.96.0.11"))
    (d / "notes.txt").write_text("not a manifest")
    return d


def test_the_loader_given_the_reads_loads_the_same(tmp_path: Path) -> None:
    d = _directory(tmp_path)
    outside = tmp_path / "outside.yaml"
    outside.write_text(_service("outside", "10.96.0.12"))
    (d / "link.yaml").symlink_to(outside)
    os.mkfifo(d / "pipe.yaml")
    (d / "z-big.yaml").write_text(_service("big", "10.96.0.13") + "#" * 4000)
    budget = 1000  # a.yaml and b.json fit; z-big.yaml does not
    read = read_manifests(d, budget)
    assert list(read.files) == [
        "a.yaml",
        "b.json",
        "link.yaml",
        "pipe.yaml",
        "sub.yaml",
        "z-big.yaml",
    ]
    once = load_manifests(d, now=0.0, read=read)
    again = load_manifests(d, now=0.0, budget=budget)
    assert once.errors == again.errors
    assert len(once.errors) == 3, once.errors
    assert once.changes == again.changes
    assert once.good.keys() == again.good.keys() == {"a.yaml", "b.json"}


@pytest.mark.parametrize("entry", ["link", "fifo", "over-budget"])
def test_no_digest_when_a_file_cannot_be_read(
    tmp_path: Path, settings: Settings, entry: str
) -> None:
    d = _directory(tmp_path)
    assert _manifests_digest(settings, read_manifests(d), None) is not None
    budget = 1 << 20
    if entry == "link":
        outside = tmp_path / "outside.yaml"
        outside.write_text(_service("outside", "10.96.0.12"))
        (d / "link.yaml").symlink_to(outside)
    elif entry == "fifo":
        os.mkfifo(d / "pipe.yaml")
    else:
        budget = 100  # a.yaml fits, b.json does not
    assert _manifests_digest(settings, read_manifests(d, budget), None) is None


def test_the_digest_is_of_the_bytes_read(tmp_path: Path, settings: Settings) -> None:
    d = _directory(tmp_path)
    first = _manifests_digest(settings, read_manifests(d), None)
    assert first is not None
    assert _manifests_digest(settings, read_manifests(d), None) == first
    (d / "notes.txt").write_text("what the loader does not read does not count")
    (d / ".hidden.yaml").write_text("neither")
    assert _manifests_digest(settings, read_manifests(d), None) == first
    (d / "a.yaml").write_text(_service("a", "10.96.0.20"))
    assert _manifests_digest(settings, read_manifests(d), None) != first
    assert _manifests_digest(settings, read_manifests(d), "other addresses") != first
