"""Error lines stay one bounded line whatever a user wrote: a port of 401 digits and a name of
300 characters are cut, saying how long they were; ordinary names and numbers stay whole."""

from __future__ import annotations

from pathlib import Path

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import Invalid
from nlproxy.errors import ConfigError, shorten


def _errors(directory: Path) -> list[str]:
    load = load_manifests(directory)
    return [c.error for r in load.changes for c in r.changes if isinstance(c, Invalid)]


def test_huge_numbers_and_long_names_are_cut(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n"
        f"spec: {{clusterIP: 10.96.0.10, ports: [{{port: {'9' * 401}}}]}}\n"
        "---\n"
        f"apiVersion: v1\nkind: Service\nmetadata: {{name: {'a' * 300}, namespace: default}}\n"
        "spec: {clusterIP: 10.96.0.11, ports: [{port: 80}]}\n"
    )
    port, name = sorted(_errors(tmp_path), key=len)
    assert port == (
        "Service default/web: spec.ports[0].port: 99999999...(401 digits) is not in 1..65535"
    )
    assert name.startswith(f"Service default/{'a' * 56}...(308 characters): metadata.name: ")
    assert len(name) < 300


def test_ordinary_values_are_whole() -> None:
    longest = f"{'n' * 63}/{'s' * 63}"  # the longest namespace/name Kubernetes allows
    text = f"Service {longest}: spec.ports[0].port: 18446744073709551615 is not in 1..65535"
    assert shorten(text) == text
    assert str(ConfigError("--min-sync-period", "x" * 200)).endswith("...(200 characters)")
