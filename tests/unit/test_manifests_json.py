"""JSON manifests read from their bytes (``fileobjects._json_objects``) as their documents are
read.

The bytes' path decodes the known kinds' objects straight into the typed structs, building no
document for them; whatever it does not read in the common shape goes to the documents' path
(``_document_objects``: ``documents`` and ``_flatten``). Differential: every file below, real or
made up, gives the same entries, notes and errors both ways.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nlproxy.cluster import fileobjects
from nlproxy.cluster.decode import FileError, documents
from tests import objects

REPO = Path(__file__).resolve().parents[2]

SVC = objects.example_service()
SLICE = objects.example_endpoint_slice()
BAD_PORT = objects.example_service(**{"spec.ports": [{"name": "a", "port": 70000}]})
UNKNOWN = objects.example_service(**{"spec.ports": [{"name": "a", "port": 80, "targtPort": 1}]})
NODE = objects.example_node()
CIDR = objects.example_service_cidr()


def _both(data: bytes) -> tuple[object, object]:
    """What the bytes' path and the documents' path give for ``data`` as ``f.json``:
    ``(entries, notes)`` or the ``FileError``'s message; the bytes' path's None (fell back)
    as None."""
    path = Path("f.json")
    try:
        fast: object = fileobjects._json_objects(path.name, data)
    except FileError as exc:
        fast = str(exc)
    notes: list[str] = []
    try:
        slow: object = (fileobjects._document_objects(path, data, notes), notes)
    except FileError as exc:
        slow = str(exc)
    return fast, slow


def _json_of(path: Path) -> list[bytes]:
    """A YAML file's documents written as JSON, each alone and all as a List and an array."""
    try:
        docs = [d for d in documents(path) if d is not None]
    except FileError:
        return []
    out = [json.dumps(d, indent=2).encode() for d in docs]
    out.append(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}).encode())
    out.append(json.dumps(docs).encode())
    return out


REAL = sorted(
    [*(REPO / "examples").rglob("*.yaml"), *(REPO / "tests" / "data" / "bad").rglob("*.yaml")]
)

MADE_UP: list[Any] = [
    SVC,
    {"kind": "List", "items": [SVC, SLICE, BAD_PORT, UNKNOWN]},
    {"kind": "List", "items": [NODE, CIDR, {**NODE, "bogus": 1}, SVC]},
    {"kind": "ServiceList", "apiVersion": "v1", "items": [{**SVC, "kind": None}]},
    {"kind": "ServiceList", "items": [{k: v for k, v in SVC.items() if k != "kind"}]},
    {"kind": "EndpointSliceList", "items": [{k: v for k, v in SLICE.items() if k != "kind"}]},
    {"kind": "List", "items": [{"kind": "List", "items": [SVC, {"kind": "List"}]}]},
    {"kind": "List", "items": None},
    {"kind": "List", "items": "no"},
    {"kind": "List", "items": [SVC, 5]},
    {"kind": "List", "items": [SVC, {"kind": 5}]},
    {"kind": "List", "items": [{"kind": ""}]},
    {"kind": "List", "items": [{"apiVersion": "v1"}]},
    {"kind": "List", "items": [{"kind": "Servcie", "metadata": {"name": "typo"}}]},
    {"kind": "List", "items": [{"kind": "Servcie", "metadata": "x"}, {"kind": "Deployment"}]},
    {"kind": "List", "items": [{**SVC, "apiVersion": "serving.knative.dev/v1"}]},
    {"kind": "List", "items": [{**SVC, "apiVersion": {"a": 1}}]},
    {**SVC, "items": "not a list"},
    {"kind": "List", "items": [{**SVC, "items": 3}, {**SVC, "metadata": {"name": "b" * 70}}]},
    [SVC, SLICE],
    [SVC, [SVC]],
    [],
    {"kind": "Pod"},
    {},
    None,
    5,
    "text",
]

ODD_BYTES = [
    b"",
    b"null",
    b"  [ ]  ",
    b'{"kind": "List", "items": [',
    b'{"kind": "List", "items": [NaN]}',
    b'{"kind": "List", "items": [{"kind": "Service", "x": Infinity}]}',
    b'{"kind": "List", "items": [{"kind": "Service", "metadata": {"name": "\\ud800"}}]}',
    b'{"kind": "List", "items": [{"kind": "Service", "metadata": {"name": "\xff"}}]}',
    b'{"kind": "Service", "kind": "Pod"}',
    b'{"kind": "Pod", "kind": "Service", "metadata": {"name": "a"}}',
    b'\xef\xbb\xbf{"kind": "Service"}',
    b'{"kind": "List", "items": [{"kind": "Service", "spec": {"ports": [{"port": '
    + b"9" * 5000
    + b"}]}}]}",
    b"[" * 5000 + b"]" * 5000,
    b'{"kind": "List", "items": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
    json.dumps({"kind": "List", "items": [{**SVC, "metadata": {"name": "caf\u00e9"}}]}).encode(),
    json.dumps({"kind": "List", "items": [SVC]}, ensure_ascii=False).encode(),
]


@pytest.mark.parametrize("path", REAL, ids=[str(p.relative_to(REPO)) for p in REAL])
def test_real_manifests_as_json_read_as_their_documents(path: Path) -> None:
    for data in _json_of(path):
        fast, slow = _both(data)
        assert fast is not None  # plain JSON: the bytes' path reads it
        assert fast == slow, data[:200]


@pytest.mark.parametrize("doc", MADE_UP, ids=range(len(MADE_UP)))
def test_made_up_files_read_as_their_documents(doc: Any) -> None:
    fast, slow = _both(json.dumps(doc).encode())
    assert fast is None or fast == slow, (fast, slow)


@pytest.mark.parametrize("data", ODD_BYTES, ids=range(len(ODD_BYTES)))
def test_odd_bytes_read_as_their_documents(data: bytes) -> None:
    fast, slow = _both(data)
    assert fast is None or fast == slow, (fast, slow)
    if isinstance(slow, str):
        with pytest.raises(FileError) as raised:
            fileobjects.file_objects(Path("f.json"), data, [])
        assert str(raised.value) == slow


def test_the_common_shapes_take_the_bytes_path() -> None:
    """A List, an array, a single object, other kinds among them, invalid and unknown-field
    objects: read from the bytes (None would mean the documents' path read the file)."""
    assert MADE_UP[17] == {**SVC, "items": "not a list"}  # the documents' path reads it
    for doc in [*MADE_UP[:17], *MADE_UP[18:21]]:
        fast, slow = _both(json.dumps(doc).encode())
        if not isinstance(slow, str):
            assert fast is not None, doc
    read = fileobjects._json_objects("f.json", json.dumps(MADE_UP[1]).encode())
    assert read is not None
    entries, _ = read
    assert [type(change).__name__ for _, change, _ in entries] == [
        "Upsert",
        "Upsert",
        "Invalid",
        "Upsert",
    ]
    assert entries[3][2] == ("f.json: Service default/web: unknown field spec.ports[0].targtPort",)
