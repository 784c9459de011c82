"""Manifests directory: file formats, ignored files, file-level errors, determinism."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nlproxy.cluster.manifests import ManifestLoad, load_manifests
from nlproxy.cluster.model import EndpointSlice, Invalid, ObjectRef, Service, Skip, Upsert
from nlproxy.errors import ConfigError

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {name: %(name)s, namespace: default}
spec:
  clusterIP: %(ip)s
  ports: [{name: http, port: 80, targetPort: 8080}]
"""

SLICE = """\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %(name)s-1
  namespace: default
  labels: {kubernetes.io/service-name: %(name)s}
  annotations:
    endpoints.kubernetes.io/last-change-trigger-time: 2024-05-01T10:20:30Z
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.1.5]}]
"""

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec: {replicas: 1}
"""


def svc_yaml(name: str, ip: str = "10.96.0.10") -> str:
    return SERVICE % {"name": name, "ip": ip}


def slice_yaml(name: str) -> str:
    return SLICE % {"name": name}


def names(load: ManifestLoad, kind: str) -> list[str]:
    (replace,) = [r for r in load.changes if r.kind == kind]
    return [c.ref.name for c in replace.changes]


def changes_of(load: ManifestLoad, kind: str) -> list[Upsert | Skip | Invalid]:
    (replace,) = [r for r in load.changes if r.kind == kind]
    return list(replace.changes)


def write(directory: Path, name: str, text: str | bytes) -> None:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def test_one_replace_per_kind_even_when_empty(tmp_path: Path) -> None:
    load = load_manifests(tmp_path)
    assert [r.kind for r in load.changes] == ["Service", "EndpointSlice", "Node", "ServiceCIDR"]
    assert all(r.changes == () for r in load.changes)
    assert load.errors == ()


def test_multi_document_yaml(tmp_path: Path) -> None:
    text = "---\n" + svc_yaml("web") + "---\n" + DEPLOYMENT + "---\n---\n" + slice_yaml("web")
    write(tmp_path, "web.yaml", text)
    load = load_manifests(tmp_path)
    assert load.errors == ()
    assert names(load, "Service") == ["web"]
    (change,) = changes_of(load, "EndpointSlice")
    assert isinstance(change, Upsert)
    assert isinstance(change.obj, EndpointSlice)
    # Unquoted timestamps stay strings, as Kubernetes' YAML reader gives them.
    assert change.obj.last_change_trigger_time == datetime(2024, 5, 1, 10, 20, 30, tzinfo=UTC)


def test_list_kinds_and_json(tmp_path: Path) -> None:
    web = {
        "kind": "Service",
        "metadata": {"name": "json-web"},
        "spec": {"clusterIP": "10.96.0.20", "ports": [{"port": 80}]},
    }
    write(tmp_path, "a.json", json.dumps(web))
    write(tmp_path, "b.json", json.dumps([{**web, "metadata": {"name": "json-array"}}]))
    write(
        tmp_path,
        "c.yml",
        "apiVersion: v1\nkind: List\nitems:\n"
        + "".join(
            "- " + svc_yaml(n, f"10.96.0.{i}").replace("\n", "\n  ") + "\n"
            for i, n in enumerate(["list-a", "list-b"], start=30)
        ),
    )
    # API list output: items carry no kind; the list's kind says what they are.
    write(
        tmp_path,
        "d.json",
        json.dumps(
            {
                "kind": "ServiceList",
                "apiVersion": "v1",
                "items": [{**web, "kind": None, "metadata": {"name": "from-servicelist"}}],
            }
        ).replace('"kind": null, ', ""),
    )
    load = load_manifests(tmp_path)
    assert load.errors == ()
    assert names(load, "Service") == [
        "json-web",
        "json-array",
        "list-a",
        "list-b",
        "from-servicelist",
    ]
    assert all(isinstance(c, Upsert) for c in changes_of(load, "Service"))


def test_other_files_and_kinds_ignored(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "kind: Service\n")
    write(tmp_path, "notes.txt", "::: not yaml :::")
    write(tmp_path, ".hidden.yaml", svc_yaml("hidden"))
    write(tmp_path, "sub/nested.yaml", svc_yaml("nested"))
    write(tmp_path, "..data/cm.yaml", svc_yaml("configmap-internal"))
    write(tmp_path, "deploy.yaml", DEPLOYMENT)
    knative = svc_yaml("knative").replace("apiVersion: v1", "apiVersion: serving.knative.dev/v1")
    write(tmp_path, "knative.yaml", knative)
    write(tmp_path, "web.yaml", svc_yaml("web"))
    load = load_manifests(tmp_path)
    assert load.errors == ()
    assert names(load, "Service") == ["web"]


def test_unparsable_file_does_not_stop_the_others(tmp_path: Path) -> None:
    write(tmp_path, "a-web.yaml", svc_yaml("web"))
    # The first document is fine, the second broken: the whole file is left out.
    write(tmp_path, "b-bad.yaml", svc_yaml("db") + "---\nkind: Service\nmetadata: {name: x\n")
    write(tmp_path, "c-bad.json", '{"kind": "Service",\n "metadata": }')
    write(tmp_path, "d-slice.yaml", slice_yaml("web"))
    write(tmp_path, "e-latin1.yaml", b"kind: Service\nmetadata: {name: caf\xe9}\n")
    load = load_manifests(tmp_path)
    assert load.errors == (
        "b-bad.yaml:10: not valid YAML: expected ',' or '}', but got '<stream end>'",
        "c-bad.json:2: not valid JSON: Expecting value",
        "e-latin1.yaml: cannot read: not UTF-8 text",
    )
    assert names(load, "Service") == ["web"]
    assert names(load, "EndpointSlice") == ["web-1"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("- 1\n- 2\n", "x.yaml: expected a Kubernetes object, got 1"),
        ("just a string\n", 'x.yaml: expected a Kubernetes object, got "just a string"'),
        (
            svc_yaml("web") + "---\nmetadata: {name: y}\n",
            "x.yaml document 2: an object without a kind",
        ),
        ("kind: List\nitems: {a: 1}\n", "x.yaml: List: items: expected a list"),
        ("kind: List\nitems: [{metadata: {name: z}}]\n", "x.yaml: an object without a kind"),
    ],
)
def test_documents_that_are_not_objects(tmp_path: Path, text: str, error: str) -> None:
    write(tmp_path, "x.yaml", text)
    write(tmp_path, "y.yaml", svc_yaml("good", "10.96.0.99"))
    load = load_manifests(tmp_path)
    assert load.errors == (error,)
    assert names(load, "Service") == ["good"]


def test_duplicates_first_definition_wins(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", svc_yaml("web", "10.96.0.10"))
    write(tmp_path, "b.yaml", "---\n" + DEPLOYMENT + "---\n" + svc_yaml("web", "10.96.0.11"))
    load = load_manifests(tmp_path)
    assert load.errors == (
        "b.yaml document 2: Service default/web: defined again (first in a.yaml)",
    )
    (change,) = changes_of(load, "Service")
    assert isinstance(change, Upsert)
    assert isinstance(change.obj, Service)
    assert str(change.obj.cluster_ips[0]) == "10.96.0.10"


def test_invalid_and_skipped_objects_are_changes(tmp_path: Path) -> None:
    write(tmp_path, "bad.yaml", svc_yaml("bad", "10.96.0.300"))
    write(tmp_path, "headless.yaml", svc_yaml("headless", "None"))
    load = load_manifests(tmp_path)
    assert load.errors == ()
    bad, headless = changes_of(load, "Service")
    assert bad == Invalid(
        ref=ObjectRef(kind="Service", namespace="default", name="bad"),
        error='Service default/bad: spec.clusterIP: "10.96.0.300" is not a valid IP address',
    )
    assert headless == Skip(ref=ObjectRef(kind="Service", namespace="default", name="headless"))


def test_deterministic(tmp_path: Path) -> None:
    for i in range(20):
        write(tmp_path, f"svc-{19 - i:02}.yaml", svc_yaml(f"s{i}", f"10.96.1.{i}"))
    first = load_manifests(tmp_path)
    assert load_manifests(tmp_path) == first
    assert names(first, "Service") == [f"s{i}" for i in reversed(range(20))]


def test_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_manifests(tmp_path / "nope")
    assert str(info.value) == f"manifests {tmp_path / 'nope'}: No such file or directory"


def test_a_file_that_stops_parsing_keeps_its_last_good_objects(tmp_path: Path) -> None:
    good = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n"
    good += "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n"
    (tmp_path / "web.yaml").write_text(good)
    first = load_manifests(tmp_path)
    assert first.errors == ()
    (tmp_path / "web.yaml").write_text(good + "spec: [oops\n")
    alone = load_manifests(tmp_path)  # without the last load: the file contributes nothing
    services = next(r for r in alone.changes if r.kind == "Service")
    assert services.changes == ()
    kept = load_manifests(tmp_path, first.good)
    services = next(r for r in kept.changes if r.kind == "Service")
    assert [c.ref.name for c in services.changes] == ["web"]
    (err,) = kept.errors
    assert err.startswith("web.yaml:")
    assert err.endswith("its last good objects are kept")
    assert kept.good == first.good  # still the last good, for the next load
    (tmp_path / "web.yaml").unlink()  # a file that is gone takes its objects with it
    gone = load_manifests(tmp_path, kept.good)
    assert next(r for r in gone.changes if r.kind == "Service").changes == ()


@pytest.mark.parametrize(
    ("kind", "named"),
    [("Servcie", True), ("service", True), ("Sevice", True), ("Deployment", False)],
)
def test_misspelt_kinds_are_named_other_kinds_ignored(
    tmp_path: Path, kind: str, named: bool
) -> None:
    (tmp_path / "x.yaml").write_text(f"apiVersion: v1\nkind: {kind}\nmetadata: {{name: x}}\n")
    errors = load_manifests(tmp_path).errors
    assert bool(errors) is named, errors


def test_unknown_fields_are_named_and_the_object_still_loads(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default, lables: {}}\n"
        "spec:\n  clusterIP: 10.96.0.1\n  ports: [{port: 80, targtPort: 8080}]\n"
        "  sessionAfinity: ClientIP\n"
    )
    loaded = load_manifests(tmp_path)
    assert loaded.errors == ()
    assert loaded.warnings == (
        "web.yaml: Service default/web: unknown field metadata.lables",
        "web.yaml: Service default/web: unknown field spec.ports[0].targtPort",
        "web.yaml: Service default/web: unknown field spec.sessionAfinity",
    )
    services = next(r for r in loaded.changes if r.kind == "Service")
    assert [type(c).__name__ for c in services.changes] == ["Upsert"]


def test_the_example_manifests_have_no_unknown_fields() -> None:
    root = Path(__file__).resolve().parents[2]
    loaded = load_manifests(root / "examples/demo")
    assert loaded.warnings == ()
    assert loaded.errors == ()
