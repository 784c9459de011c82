"""``/healthz``'s ``nodeEligible`` as kube-proxy computes it: false while the Node is being
deleted or tainted ``ToBeDeletedByClusterAutoscaler``; then ``/healthz`` is 503 (load balancers
drain the node) while ``/livez`` stays 200."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nlproxy.cluster.parse import parse_node
from nlproxy.serve.health import HealthState, healthz, node_eligible


def _node(**extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-1"},
        "spec": {},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]},
    }
    for path, value in extra.items():
        section, key = path.split("__")
        obj[section][key] = value
    return obj


@pytest.mark.parametrize(
    ("obj", "eligible"),
    [
        pytest.param(_node(), True, id="plain"),
        pytest.param(
            _node(
                spec__taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
            ),
            True,
            id="other-taint",
        ),
        pytest.param(
            _node(
                spec__taints=[
                    {
                        "key": "ToBeDeletedByClusterAutoscaler",
                        "value": "1700000000",
                        "effect": "NoSchedule",
                    }
                ]
            ),
            False,
            id="autoscaler-taint",
        ),
        pytest.param(
            _node(metadata__deletionTimestamp="2026-01-01T00:00:00Z"), False, id="being-deleted"
        ),
    ],
)
def test_node_eligible(obj: dict[str, Any], eligible: bool) -> None:
    assert node_eligible(parse_node(obj)) is eligible


def test_unknown_node_is_eligible() -> None:
    assert node_eligible(None)


def test_ineligible_node_fails_healthz_not_livez() -> None:
    state = HealthState(grace_seconds=60)
    state.synced(1.0)
    state.node_eligible = False
    code, body = healthz(state, 2.0)
    assert code == 503
    assert json.loads(body)["nodeEligible"] is False
    code, body = healthz(state, 2.0, live=True)
    assert code == 200
    assert "nodeEligible" not in json.loads(body)
