"""The quick paths of parsing (plain IPv4 addresses, common slice endpoints, libyaml) give
exactly what the field-by-field paths give, and step aside for anything unusual."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nlproxy.cluster import decode, manifests
from nlproxy.cluster.fields import FieldReader, quick_ipv4
from nlproxy.cluster.model import Endpoint, EndpointSlice, Invalid, ObjectRef, Upsert
from nlproxy.cluster.parse import to_change
from nlproxy.errors import InvalidObject


@pytest.mark.parametrize(
    "text", ["10.0.0.1", "0.0.0.0", "255.255.255.255", "192.168.77.1", "1.2.3.4"]
)
def test_quick_ipv4_equals_ipaddress(text: str) -> None:
    assert quick_ipv4(text) == ipaddress.ip_address(text)
    assert type(quick_ipv4(text)) is ipaddress.IPv4Address


@pytest.mark.parametrize(
    "text",
    ["010.0.0.1", "1.2.3", "1.2.3.256", "1.2.3.4 ", " 1.2.3.4", "1.2.3.4/32", "::1", "a.b.c.d",
     "1..2.3", "", "1.2.3.4.5", "१.2.3.4", "1.2.3.4\0"],
)  # fmt: skip
def test_quick_ipv4_steps_aside(text: str) -> None:
    assert quick_ipv4(text) is None
    r = FieldReader(ObjectRef(kind="EndpointSlice", namespace="ns", name="s"))
    if text in ("::1",):
        assert r.ip(text, "f").version == 6
    else:
        with pytest.raises(InvalidObject, match="is not a valid IP address"):
            r.ip(text, "f")


COMMON: list[dict[str, Any]] = [
    {"addresses": ["10.1.0.1"]},
    {"addresses": ["10.1.0.1", "10.1.0.2"], "nodeName": "n1", "zone": "z"},
    {"addresses": ["10.1.0.1"], "conditions": {"ready": False, "serving": True}},
    {"addresses": ["10.1.0.1"], "conditions": {"terminating": True, "ready": None}},
    {"addresses": ["10.1.0.1"], "conditions": None, "nodeName": "", "zone": None},
]


HINTS = {"forZones": [{"name": "z"}]}
"""A hints entry sends an endpoint down the field-by-field path (the quick one takes none)."""


def _parsed(endpoint: object) -> Endpoint | str:
    """The parser's endpoint of a slice holding ``endpoint`` alone, or its error."""
    doc = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "s", "namespace": "ns", "labels": {_SERVICE_NAME: "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "endpoints": [endpoint],
    }
    change = to_change(doc, "EndpointSlice")
    if isinstance(change, Invalid):
        return change.error
    assert isinstance(change, Upsert)
    assert isinstance(change.obj, EndpointSlice)
    (ep,) = change.obj.endpoints
    return ep


_SERVICE_NAME = "kubernetes.io/service-name"


def _checked(raw: dict[str, Any]) -> Endpoint | str:
    """``_parsed`` of ``raw`` down the field-by-field path, its hints aside."""
    got = _parsed({**raw, "hints": raw.get("hints", HINTS)})
    return got if isinstance(got, str) else msgspec.structs.replace(got, hints_zones=None)


@pytest.mark.parametrize("raw", COMMON)
def test_quick_endpoint_equals_the_checked_path(raw: dict[str, Any]) -> None:
    quick = _parsed(raw)
    assert isinstance(quick, Endpoint)
    assert quick.hints_zones is None
    assert quick == _checked(raw)


UNUSUAL: list[object] = [
    "not a mapping",
    {"addresses": []},
    {"addresses": "10.1.0.1"},
    {"addresses": ["10.1.0.1", "fd00::1"]},
    {"addresses": ["fd00::1"]},
    {"addresses": ["010.1.0.1"]},
    {"addresses": [7]},
    {"addresses": ["10.1.0.1"], "conditions": {"ready": "yes"}},
    {"addresses": ["10.1.0.1"], "conditions": []},
    {"addresses": ["10.1.0.1"], "nodeName": 3},
    {"addresses": ["10.1.0.1"], "zone": ["a"]},
    {"addresses": ["10.1.0.1"], "hints": {"forZones": [{"name": "z"}]}},
]


@pytest.mark.parametrize("raw", UNUSUAL)
def test_quick_endpoint_steps_aside(raw: object) -> None:
    """What the quick path does not take gets the field-by-field path's answer: the same
    endpoint, or the same error naming the field."""
    got = _parsed(raw)
    if not isinstance(raw, dict):
        assert got == 'EndpointSlice ns/s: endpoints[0]: expected an object, got "not a mapping"'
    elif isinstance(got, str):
        assert "endpoints[0]" in got
        assert got == _checked(raw)
    else:
        got = msgspec.structs.replace(got, hints_zones=None)
        assert got == _checked(raw)


def test_yaml_uses_libyaml_with_the_same_resolvers() -> None:
    assert decode._FastLoader is not decode._Loader, "PyYAML without libyaml"
    text = "a: 2024-01-01T00:00:00Z\nb: 1\nc: yes\nd: 1.5\ne: ~\n"
    import yaml

    fast = yaml.load(text, Loader=decode._FastLoader)
    slow = yaml.load(text, Loader=decode._Loader)
    assert fast == slow == {"a": "2024-01-01T00:00:00Z", "b": 1, "c": True, "d": 1.5, "e": None}


def test_yaml_error_is_reported_by_the_pure_python_parser(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("a: [1, 2\n")
    loaded = manifests.load_manifests(tmp_path)
    assert loaded.errors == (
        "x.yaml:2: not valid YAML: expected ',' or ']', but got '<stream end>'",
    )


JSON_IN_YAML = [
    '---\n{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "x": [1, -2, 0]}\n',
    '--- {"a": true, "b": false, "c": null, "d": "yes", "e": "1.5", "f": "2024-01-01"}\n---\n[]\n',
    '{"a":\n"b", "big": 123456789012345678901234567890}',
    '---\n---\n{"k": "\u00e9\u4e2d"}\n---\n',
    "",
]
NOT_PLAIN = [
    '{"a": 1.5}',
    '{"a": 1e5}',
    '{"a": "x\\ny"}',
    '{"a":\t1}',
    '{"a": "\x7f"}',
    "a: 1\n",
    '{"a": 1}\n# a comment\n',
    '{"a": 1}\n...\n',
    '--- !!str {"a": 1}\n',
]


@pytest.mark.parametrize("text", JSON_IN_YAML)
def test_json_documents_read_as_yaml_reads_them(text: str) -> None:
    import yaml

    assert decode._json_documents(text) == list(yaml.load_all(text, Loader=decode._Loader))


@pytest.mark.parametrize("text", NOT_PLAIN)
def test_json_documents_step_aside(text: str) -> None:
    assert decode._json_documents(text) is None
