"""The typed decoding (``cluster/typed.py``) gives the parser's model, or steps aside.

Differential: every object, generated or real, goes through both paths; where the typed path
answers, its change equals ``parse.to_change``'s; where the object is not plainly valid it must
answer None (the parser then names what is wrong), never an ``Invalid`` of its own.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nlproxy.cluster import typed
from nlproxy.cluster.decode import FileError, documents
from nlproxy.cluster.model import Invalid, Skip, Upsert
from nlproxy.cluster.parse import to_change
from tests import objects
from tests.kube import realistic

REPO = Path(__file__).resolve().parents[2]

# Values a mutation puts in a field: right and wrong types, edge and odd values.
VALUES: tuple[Any, ...] = (
    None, "", 0, -1, 1, 80, 65535, 65536, 2**70, 1.5, True, False, "80", "http", "HTTP", "dns",
    "tcp", "TCP", "UDP", "SCTP", "a" * 70, "Bad_Name", "web", "None", "Local", "Cluster",
    "ClientIP", "VIP", "Proxy", "IPv4", "IPv6", "FQDN", "ExternalName", "NodePort", "LoadBalancer",
    "10.96.0.10", "10.96.0.11", "10.0.1.5", "fd00::10", "fe80::1%eth0", "010.0.0.1", "1.2.3",
    "0.0.0.0/0", " 10.0.0.0/8 ", "10.0.0.1/8", [], {}, ["10.96.0.10"], ["fd00::10"],
    ["10.96.0.10", "fd00::10"], ["IPv4"], ["IPv6"], ["IPv4", "IPv6"], ["IPv4", "IPv4"], [1],
    {"x": "y"}, {"ready": None}, {"ingress": [{"ip": "192.0.2.9"}]},
    {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "ipMode": "Proxy"}]}},
    {"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}, {"hostname": "lb"}]}},
    {"loadBalancer": {"ingress": ""}}, {"clientIP": {"timeoutSeconds": 30}},
    {"forZones": [{"name": "zone-a"}]}, "2026-09-14T08:21:52Z", "random", "consistent-hash",
    "client-ip-port", "PreferClose",
)  # fmt: skip

SERVICE_PATHS = (
    "metadata.name", "metadata.namespace", "metadata.labels", "metadata.annotations",
    "metadata.labels.service.kubernetes.io/service-proxy-name",
    "metadata.annotations.nlproxy.io/load-balancing",
    "metadata.annotations.nlproxy.io/consistent-hash-key",
    "metadata.annotations.service.beta.kubernetes.io/load-balancer-source-ranges",
    "metadata.creationTimestamp", "metadata.uid", "metadata.resourceVersion", "metadata.bogus",
    "spec", "spec.type", "spec.clusterIP", "spec.clusterIPs", "spec.ipFamilies", "spec.ports",
    "spec.ports.0", "spec.ports.0.name", "spec.ports.0.port", "spec.ports.0.protocol",
    "spec.ports.0.targetPort", "spec.ports.0.nodePort", "spec.ports.1.name", "spec.ports.1.port",
    "spec.ports.1.protocol", "spec.ports.0.bogus", "spec.externalIPs",
    "spec.externalTrafficPolicy", "spec.internalTrafficPolicy", "spec.healthCheckNodePort",
    "spec.loadBalancerSourceRanges", "spec.sessionAffinity", "spec.sessionAffinityConfig",
    "spec.trafficDistribution", "spec.bogus", "status", "status.loadBalancer",
    "status.loadBalancer.ingress", "status.loadBalancer.ingress.0.ipMode", "bogus",
)  # fmt: skip
SLICE_PATHS = (
    "metadata.name", "metadata.namespace", "metadata.labels",
    "metadata.labels.kubernetes.io/service-name", "metadata.labels.service.kubernetes.io/headless",
    "metadata.annotations", "metadata.annotations.endpoints.kubernetes.io/last-change-trigger-time",
    "metadata.resourceVersion", "addressType", "ports", "ports.0", "ports.0.name", "ports.0.port",
    "ports.0.protocol", "ports.1.name", "endpoints", "endpoints.0", "endpoints.0.addresses",
    "endpoints.0.addresses.0", "endpoints.0.addresses.1", "endpoints.0.conditions",
    "endpoints.0.conditions.ready", "endpoints.0.conditions.serving",
    "endpoints.0.conditions.terminating", "endpoints.0.nodeName", "endpoints.0.zone",
    "endpoints.0.hints", "endpoints.0.bogus", "endpoints.1.addresses", "bogus",
)  # fmt: skip


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` (dots; list indexes as numbers; label/annotation keys keep their dots)."""
    node: Any = obj
    parts = path.split(".")
    if parts[0] == "metadata" and len(parts) > 3:
        parts = [*parts[:2], ".".join(parts[2:])]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit():
                return  # a list where the path expects an object: leave it
            index = int(part)
            if index >= len(node):
                node.append(copy.deepcopy(node[-1]) if node and not last else {})
                index = len(node) - 1
            if last:
                node[index] = value
                return
            node = node[index]
        elif isinstance(node, dict):
            if last:
                node[part] = value
                return
            if not isinstance(node.get(part), dict | list):
                node[part] = [] if parts[i + 1].isdigit() else {}
            node = node[part]
        else:
            return  # a scalar on the way: leave the object as it is


def _bases() -> list[tuple[str, dict[str, Any]]]:
    svc = objects.example_service()
    sl = objects.example_endpoint_slice()
    six = objects.endpoint_slice(
        "web", [objects.endpoint("fd00::5", "n1")], family="IPv6", name="web-six"
    )
    return [
        ("Service", svc),
        ("Service", realistic.dress_service(svc)),
        ("Service", objects.service("one", "10.96.0.1")),
        ("Service", objects.service("dual", ["10.96.0.2", "fd00::2"])),
        ("EndpointSlice", sl),
        ("EndpointSlice", realistic.dress_slice(sl)),
        ("EndpointSlice", six),
    ]


def _generated(count: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    bases = _bases()
    out = list(bases)
    for _ in range(count):
        kind, base = rng.choice(bases)
        obj = copy.deepcopy(base)
        paths = SERVICE_PATHS if kind == "Service" else SLICE_PATHS
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            _set(obj, rng.choice(paths), copy.deepcopy(rng.choice(VALUES)))
        out.append((kind, obj))
    return out


def _check(kind: str, obj: dict[str, Any]) -> tuple[bool, Upsert | Skip | Invalid]:
    """Both typed entries agree with the parser; returns (typed answered, the change)."""
    want = to_change(obj, kind)
    doc = typed.from_document(obj, kind)
    assert doc is None or doc == want, (obj, doc, want)
    # A manifest's JSON straight from its bytes: as its document, taken or refused alike.
    assert typed.from_manifest_json(json.dumps(obj).encode(), kind) == doc, obj
    assert typed.change(json.dumps(obj).encode(), kind) == want, obj
    # A list member that says its kind: decoded in one call into the tagged structs.
    try:
        item = typed.MANIFEST_ITEM.decode(json.dumps({**obj, "kind": kind}).encode())
    except msgspec.ValidationError:
        tagged = None
    else:
        read_kind, _group, read = typed.MANIFEST_READERS[type(item)]
        assert read_kind == kind
        tagged = read(item)
    assert tagged == doc, obj
    return doc is not None, want


def test_generated_objects_read_as_the_parser_reads_them() -> None:
    answered = invalid = 0
    for kind, obj in _generated(4000, seed=24):
        fast, want = _check(kind, obj)
        answered += fast
        invalid += isinstance(want, Invalid)
    # Both sides are exercised: many objects take the typed path, many are refused by it.
    assert answered > 1000
    assert invalid > 1000


def test_the_memos_check_each_string_once_and_stay_bounded() -> None:
    """Namespaces, port names and target port names are checked once per distinct string; a
    memo that fills up starts again, and an invalid string is never taken from it."""
    svc = objects.example_service()
    bad = objects.with_fields(svc, **{"metadata.namespace": "Bad_NS"})
    remembered = False
    for i in range(typed.MEMO_LIMIT + 10):
        obj = objects.with_fields(
            svc,
            **{
                "metadata.namespace": f"ns-{i}",
                "spec.ports": [{"name": f"p-{i}", "port": 80, "targetPort": f"t{i}"}],
            },
        )
        assert typed.from_document(obj, "Service") == to_change(obj, "Service")
        sizes = typed.memo_sizes()
        assert max(sizes) <= typed.MEMO_LIMIT
        remembered = remembered or min(sizes) > 100  # they do hold what they checked
        if i % 1000 == 0:
            assert typed.from_document(bad, "Service") is None
    assert typed.from_document(bad, "Service") is None
    assert isinstance(to_change(bad, "Service"), Invalid)
    assert remembered


def test_unknown_fields_leave_manifests_to_the_parser() -> None:
    obj = objects.example_service(**{"spec.ports": [{"name": "a", "port": 80, "targtPort": 1}]})
    assert typed.from_document(obj, "Service") is None
    # The API's objects carry fields nlproxy does not read: the typed path skips them.
    assert isinstance(typed.change(json.dumps(obj).encode(), "Service"), Upsert)


def _real_documents() -> list[tuple[str, dict[str, Any]]]:
    paths = [
        *(REPO / "examples").rglob("*.yaml"),
        *(REPO / "deploy").rglob("*.yaml"),
        *(REPO / "tests" / "data" / "bad").rglob("*.yaml"),
    ]
    out = []
    for path in sorted(paths):
        try:
            docs = documents(path)
        except FileError:
            continue  # the malformed files of the bad corpus
        for doc in docs:
            items = doc.get("items") or [doc] if isinstance(doc, dict) else []
            out += [
                (item["kind"], item)
                for item in items
                if isinstance(item, dict) and item.get("kind") in typed.FAST_KINDS
            ]
    return out


def test_real_objects_read_as_the_parser_reads_them() -> None:
    real = _real_documents()
    assert len(real) > 40
    answered = sum(_check(kind, obj)[0] for kind, obj in real)
    assert answered >= 10


@pytest.mark.parametrize("kind", ["Service", "EndpointSlice"])
def test_api_bodies_read_as_the_parser_reads_them(kind: str) -> None:
    """The in-repo API server's realistic bodies (managedFields, last-applied-configuration)."""
    if kind == "Service":
        obj = realistic.dress_service(objects.example_service())
    else:
        obj = realistic.dress_slice(objects.example_endpoint_slice())
    fast = typed.from_json(json.dumps(obj).encode(), kind)
    assert fast is not None
    assert fast == to_change(obj, kind)


def test_not_json_is_an_invalid_object() -> None:
    change = typed.change(b"[1, 2]", "Service")
    assert isinstance(change, Invalid)
    assert change.error == "Service (unnamed): not a JSON object"


_NODE_VARIANTS: list[dict[str, Any]] = [
    {},
    {"status.addresses[0].address": "10.0.0.300"},
    {"status.addresses": "10.0.0.1"},
    {"status": None},
    {"status": "up"},
    {"spec.podCIDRs": ["10.244.1.0/24", "10.244.1.0/23"]},
    {"spec.podCIDR": "10.244.1.1/24", "spec.podCIDRs": None},
    {"spec.taints": [{"key": "a", "effect": "NoSchedule"}, {"key": 7}]},
    {"metadata.name": "Bad_Name"},
    {"metadata.name": None},
    {"metadata.deletionTimestamp": "2026-01-01T00:00:00Z"},
    {"metadata.labels": {"topology.kubernetes.io/zone": 3}},
    {"metadata": []},
]
_CIDR_VARIANTS: list[dict[str, Any]] = [
    {},
    {"spec.cidrs": ["10.96.0.0/16", "10.97.0.0/16"]},
    {"spec.cidrs": ["10.96.0.1/16"]},
    {"spec.cidrs": []},
    {"spec": None},
    {"spec": {"cidrs": "10.96.0.0/16"}},
    {"metadata.name": ""},
]


@pytest.mark.parametrize(
    ("kind", "fields"),
    [("Node", f) for f in _NODE_VARIANTS] + [("ServiceCIDR", f) for f in _CIDR_VARIANTS],
)
def test_nodes_and_service_cidrs_from_the_api_read_as_the_parser_reads_them(
    kind: str, fields: dict[str, Any]
) -> None:
    """Decoded into the few fields the parser reads (a Node's images and managedFields are
    skipped), they give the parser's model and message, valid or not."""
    base = objects.example_node() if kind == "Node" else objects.example_service_cidr()
    obj = objects.with_fields(base, **fields)
    obj["status"] = obj.get("status", {}) if kind == "ServiceCIDR" else obj.get("status")
    if kind == "Node" and isinstance(obj.get("status"), dict):
        obj["status"]["images"] = [
            {"names": [f"registry/image-{i}"], "sizeBytes": i} for i in range(50)
        ]
    obj.setdefault("metadata", {})
    if isinstance(obj["metadata"], dict):
        obj["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    assert typed.change(json.dumps(obj).encode(), kind) == to_change(obj, kind)
