"""Two smaller ways the manifests directory could mislead the daemon.

An invalid first definition of an object no longer shadows a valid later one, and a symbolic
link pointing out of the directory is not followed (the daemon reads as root): named instead.
A ConfigMap volume's links (``name -> ..data/name``, ``..data -> ..2024_…``) stay inside and are
read as ever.
"""

from __future__ import annotations

from pathlib import Path

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import Invalid, Upsert


def _service(name: str, port: int) -> str:
    return (
        "apiVersion: v1\nkind: Service\n"
        f"metadata: {{name: {name}, namespace: default}}\n"
        f"spec: {{clusterIP: 10.96.0.10, ports: [{{port: {port}}}]}}\n"
    )


def _services(directory: Path) -> dict[str, object]:
    loaded = load_manifests(directory)
    (svcs,) = [r for r in loaded.changes if r.kind == "Service"]
    return {c.ref.name: c for c in svcs.changes}


def test_an_invalid_first_definition_gives_way_to_a_valid_later_one(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(_service("web", 70000))
    (tmp_path / "b.yaml").write_text(_service("web", 80))
    loaded = load_manifests(tmp_path)
    change = _services(tmp_path)["web"]
    assert isinstance(change, Upsert)
    assert loaded.errors == (
        "b.yaml: Service default/web: defined again (first in a.yaml, which is invalid); "
        "this definition is used",
    )


def test_a_valid_first_definition_still_wins(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(_service("web", 80))
    (tmp_path / "b.yaml").write_text(_service("web", 70000))
    (tmp_path / "c.yaml").write_text(_service("web", 81))
    change = _services(tmp_path)["web"]
    assert isinstance(change, Upsert)
    assert change.obj.ports[0].port == 80  # type: ignore[attr-defined]
    errors = load_manifests(tmp_path).errors
    assert errors == (
        "b.yaml: Service default/web: defined again (first in a.yaml)",
        "c.yaml: Service default/web: defined again (first in a.yaml)",
    )


def test_both_invalid_the_first_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(_service("web", 70000))
    (tmp_path / "b.yaml").write_text(_service("web", 0))
    assert isinstance(_services(tmp_path)["web"], Invalid)


def test_a_link_out_of_the_directory_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.yaml").write_text(_service("secret", 80))
    d = tmp_path / "manifests"
    d.mkdir()
    (d / "good.yaml").write_text(_service("good", 80))
    (d / "evil.yaml").symlink_to(outside / "secret.yaml")
    loaded = load_manifests(d)
    assert set(_services(d)) == {"good"}
    assert loaded.errors == (
        f"evil.yaml: a symbolic link to {outside / 'secret.yaml'}, outside {d}; not read",
    )


def test_a_configmap_volumes_links_are_read(tmp_path: Path) -> None:
    d = tmp_path / "volume"
    stamp = d / "..2026_11_25_10_00_00.000000001"
    stamp.mkdir(parents=True)
    (stamp / "web.yaml").write_text(_service("web", 80))
    (d / "..data").symlink_to(stamp.name)
    (d / "web.yaml").symlink_to("..data/web.yaml")
    loaded = load_manifests(d)
    assert set(_services(d)) == {"web"}
    assert loaded.errors == ()
