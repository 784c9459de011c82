"""``metadata.creationTimestamp`` as the model keeps it: UTC to the second, so its text sorts as
its instant, and ``""`` for what is not a timestamp (``"0"``), which sorts after the others.
Both readers (the typed structs and the field parser) keep it so, and the node budget, which
orders Services by that text, then admits the older first whatever offset a manifest wrote."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from nlproxy.cluster.manifests import load_manifests
from nlproxy.cluster.model import LoadBalancing, Service, ServiceKey, ServiceType, Upsert
from nlproxy.cluster.sections import created_text
from nlproxy.proxy.budget import NODE_BUDGET, admit


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        pytest.param("2024-05-01T10:00:00Z", "2024-05-01T10:00:00Z", id="the-apis-form"),
        pytest.param("2024-05-01T11:00:00+01:00", "2024-05-01T10:00:00Z", id="an-offset"),
        pytest.param("2024-05-01T09:30:00-01:00", "2024-05-01T10:30:00Z", id="a-negative-offset"),
        pytest.param("2024-05-01T10:00:00.750000Z", "2024-05-01T10:00:00Z", id="a-fraction"),
        pytest.param("2024-05-01T10:00:00", "2024-05-01T10:00:00Z", id="no-offset-is-utc"),
        pytest.param("2024-05-01t10:00:00z", "2024-05-01T10:00:00Z", id="lower-case"),
        pytest.param(
            datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=2))),
            "2024-05-01T10:00:00Z",
            id="a-yaml-datetime",
        ),
        pytest.param("0", "", id="zero"),
        pytest.param("yesterday", "", id="a-word"),
        pytest.param("2024-13-01T10:00:00+01:00", "", id="no-such-month"),
        pytest.param(None, "", id="missing"),
        pytest.param(17, "", id="a-number"),
    ],
)
def test_created_text(written: object, kept: str) -> None:
    assert created_text(written) == kept


def _manifest(name: str, created: str, extra: bool) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "ns", "creationTimestamp": created}
    if extra:  # not the typed structs' plain shape: the field parser reads it
        meta["annotations"] = {"nlproxy.io/load-balancing": "consistent-hash", "x": "y"}
        meta["someUnknownField"] = 1
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"clusterIP": f"10.96.0.{len(name) + 10}", "ports": [{"port": 80}]},
    }


@pytest.mark.parametrize("extra", [False, True], ids=["typed", "parser"])
def test_both_readers_keep_it_in_one_form(tmp_path: Path, extra: bool) -> None:
    written = {"a": "0", "bb": "2024-05-01T11:00:00+01:00", "ccc": "2024-05-01T10:30:00Z"}
    items = [_manifest(name, created, extra) for name, created in written.items()]
    (tmp_path / "s.json").write_text(json.dumps({"kind": "List", "items": items}))
    (services,) = [r for r in load_manifests(tmp_path).changes if r.kind == "Service"]
    created = {
        c.ref.name: c.obj.created  # type: ignore[union-attr]
        for c in services.changes
        if isinstance(c, Upsert)
    }
    assert created == {"a": "", "bb": "2024-05-01T10:00:00Z", "ccc": "2024-05-01T10:30:00Z"}


def test_the_node_budget_admits_the_older_whatever_offset_or_odd_text() -> None:
    """Nine Services that each take an eighth of the node budget: the youngest falls back,
    not the one whose timestamp sorted last (or first) as written."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    written: dict[str, object] = {
        # Oldest by far, written with a far offset: as text, it sorted after the rest.
        "far-east": (base - timedelta(days=5)).astimezone(timezone(timedelta(hours=14))),
        # "0" sorted first as text, so it was admitted ahead of every real one.
        "zero": "0",
    }
    for i in range(7):
        written[f"s{i}"] = (base + timedelta(days=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
    services = {
        ServiceKey(namespace="ns", name=name): Service(
            key=ServiceKey(namespace="ns", name=name),
            type=ServiceType.CLUSTER_IP,
            cluster_ips=(),
            ports=(),
            created=created_text(when.isoformat() if isinstance(when, datetime) else when),
        )
        for name, when in written.items()
    }
    each = NODE_BUDGET // 8
    demands = dict.fromkeys(services, (LoadBalancing.CONSISTENT_HASH, each))
    out = admit(services, demands)
    assert {key.name for key in out} == {"zero"}  # no age: after every real one
    assert out[ServiceKey(namespace="ns", name="zero")].reason == "node budget"
