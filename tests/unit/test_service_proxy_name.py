"""``--service-proxy-name``: which Services and slices nlproxy reads, by kube-proxy's
``service.kubernetes.io/service-proxy-name`` convention, the same through the typed decoder, the
field parser and the manifests source; and the flag as the command line checks it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.cli import main
from nlproxy.cluster import parse, sections, typed
from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import Skip, Upsert
from nlproxy.config import Flags, build_settings
from nlproxy.errors import ConfigError
from tests.objects import endpoint, endpoint_slice, service

LABEL = "service.kubernetes.io/service-proxy-name"
HEADLESS = "service.kubernetes.io/headless"

# (labels, served by the default proxy, served by the proxy named "nlproxy")
CASES = [
    pytest.param({}, True, False, id="unlabelled"),
    pytest.param({LABEL: "nlproxy"}, False, True, id="ours"),
    pytest.param({LABEL: "other-proxy"}, False, False, id="another-proxys"),
    pytest.param({LABEL: ""}, False, False, id="empty-name"),
    pytest.param({LABEL: "nlproxy", HEADLESS: ""}, False, False, id="ours-but-headless"),
    pytest.param({"app": "web"}, True, False, id="other-labels"),
]


def _objects(labels: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("Service", service("web", labels=labels or None)),
        ("EndpointSlice", endpoint_slice("web", [endpoint("10.0.0.1", "n")], labels=labels)),
    ]


@pytest.mark.parametrize(("labels", "default", "named"), CASES)
def test_every_path_selects_the_same_objects(
    labels: dict[str, str], default: bool, named: bool
) -> None:
    for kind, obj in _objects(labels):
        raw = json.dumps(obj).encode()
        for proxy_name, served in ((None, default), ("nlproxy", named)):
            expected = Upsert if served else Skip
            assert type(parse.to_change(obj, kind, proxy_name)) is expected, (kind, proxy_name)
            assert type(typed.change(raw, kind, proxy_name)) is expected, (kind, proxy_name)
            doc = typed.from_document(obj, kind, proxy_name)
            assert type(doc) is expected, (kind, proxy_name)
            assert type(typed.from_manifest_json(raw, kind, proxy_name)) is expected
            assert sections.not_ours(labels, proxy_name) is not served


def _publish(directory: Path, labelled: set[str], suffix: str = ".yaml") -> None:
    docs: list[dict[str, Any]] = []
    for i, name in enumerate(("a", "b", "c")):
        labels = {LABEL: "nlproxy"} if name in labelled else None
        docs.append(service(name, cluster_ip=f"10.96.0.{i + 1}", labels=labels))
        docs.append(endpoint_slice(name, [endpoint(f"10.0.0.{i + 1}", "n")], labels=labels or {}))
    path = directory / f"objects{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    else:
        path.write_text(yaml.safe_dump_all(docs))


def _served(directory: Path, proxy_name: str | None, **kw: Any) -> dict[str, set[str]]:
    load = load_manifests(directory, proxy_name=proxy_name, **kw)
    assert not load.errors, load.errors
    return {
        r.kind: {c.ref.name for c in r.changes if isinstance(c, Upsert)}
        for r in load.changes
        if r.kind in ("Service", "EndpointSlice")
    }


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_manifests_select_the_labelled_services_and_relabelling_moves_them(
    tmp_path: Path, suffix: str
) -> None:
    _publish(tmp_path, {"b"}, suffix)
    assert _served(tmp_path, "nlproxy") == {"Service": {"b"}, "EndpointSlice": {"b-ipv4"}}
    assert _served(tmp_path, None) == {"Service": {"a", "c"}, "EndpointSlice": {"a-ipv4", "c-ipv4"}}
    # As a running source loads: the previous load's files are kept, and reread on change.
    first = load_manifests(tmp_path, proxy_name="nlproxy")
    _publish(tmp_path, {"c"}, suffix)
    moved = _served(tmp_path, "nlproxy", last_good=first.good, now=10**10)
    assert moved == {"Service": {"c"}, "EndpointSlice": {"c-ipv4"}}


def test_the_flag_is_a_label_value_and_not_with_replacing_kube_proxy() -> None:
    s = build_settings(Flags(node_name="n", service_proxy_name="nlproxy"))
    assert s.service_proxy_name == "nlproxy"
    assert build_settings(Flags(node_name="n")).service_proxy_name is None
    for bad in ("", "no spaces", "-dash", "x" * 64):
        with pytest.raises(ConfigError, match="--service-proxy-name"):
            build_settings(Flags(node_name="n", service_proxy_name=bad))
    with pytest.raises(ConfigError, match="--replace-kube-proxy"):
        build_settings(Flags(node_name="n", service_proxy_name="nlproxy", replace_kube_proxy=True))


def test_a_bad_name_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--once", "--manifests", str(tmp_path), "--node-name", "n"]
    assert main([*argv, "--service-proxy-name", "not valid"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--service-proxy-name" in err[0]
    assert "Traceback" not in err[0]
    assert main([*argv, "--service-proxy-name", "nlproxy", "--replace-kube-proxy"]) == 2
    assert "--replace-kube-proxy" in capsys.readouterr().err
