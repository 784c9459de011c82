"""The compiled YAML path reads every file as PyYAML's YAML 1.1 loader does, or steps aside.

Differential: manifests and tricky scalars go through ``decode`` (JSON-in-YAML, then the
compiled decoder when nothing in the file could read differently, then libyaml) and through
today's pure-Python loader; the documents must be equal, types included (``True`` is not
``1``, ``1.0`` is not ``1``).
"""

from __future__ import annotations

import copy
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.cluster import decode
from tests import objects
from tests.kube import realistic

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import gen  # noqa: E402

# Scalars whose YAML 1.1 and 1.2 readings differ, or that only PyYAML handles, and some that
# read alike (IPs, quantities, quoted forms).
TRICKY = [
    "yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF", "y", "n",
    "true", "True", "FALSE", "null", "Null", "~", "", "0777", "010", "08", "0o17", "0x1F",
    "0b101", "1_000", "1e3", "1E3", "1.0e+3", "1.5e3", "1.5", ".5", "1.", "-1", "+1", "0",
    "1:20", "190:20:30", ".inf", "-.Inf", ".nan", "2001-12-14", "2001-12-14t21:59:43.10-05:00",
    "2026-01-01T00:00:00Z", "10.96.0.1", "10.96.0.0/12", "fd00::1", "2001:db8::1", "1Gi",
    "100m", "'08'", '"yes"', "'on'", '"1e3"', "123456789012345678901234567890",
    "9223372036854775808", "-9223372036854775809", "=", "-.5", "+.5", "-.5e3", "1.e3", "-0",
    "+0", "-0.0", "...", "0x1F-g", "1e3-x", "5de", "7d4b9c8f5e",
    "6b6e1c7a-2e2f-4d1a-9a3b-0242ac120002", "07e7f4f0-d4da-8218-a47b-ae9f4696a860",
    "0777-x", "08.5", "2001-12-14 21:59:43", "'a:'",
]  # fmt: skip


def _typed(value: Any) -> Any:
    """``value`` with every scalar's type beside it, so that ``True != 1`` and ``1.0 != 1``."""
    if isinstance(value, dict):
        return {_typed(k): _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value if value == value else "nan")


def _ours(text: str) -> Any:
    try:
        return _typed(decode._parse(Path("x.yaml"), text))
    except decode.FileError:
        return "FileError"


def _both(text: str) -> tuple[Any, Any]:
    """(``decode``'s documents, the pure-Python loader's), or the errors' types."""
    try:
        ours = _typed(decode._parse(Path("x.yaml"), text))
    except decode.FileError:
        ours = "FileError"
    try:
        today = _typed(list(yaml.load_all(text, Loader=decode._Loader)))
    except yaml.YAMLError:
        today = "FileError"
    return ours, today


def _shapes(scalar: str) -> list[str]:
    return [
        f"k: {scalar}\n",
        f"- {scalar}\n- x\n",
        f"a: [{scalar}, x]\nb: {{k: {scalar}}}\n",
        f"{scalar}: v\n" if scalar else "k: v\n",
        f"---\nspec:\n  ports:\n  - port: {scalar}\n    name: x\n",
        # Flow indicators and a quoted key's ':' right against the scalar.
        f"c: [x,{scalar}]\n",
        f'd: {{"k":{scalar}}}\n',
        f"e: {{k: x,j: {scalar}}}\n",
    ]


@pytest.mark.parametrize("scalar", TRICKY)
def test_tricky_scalars_read_as_today(scalar: str) -> None:
    for text in _shapes(scalar):
        ours, today = _both(text)
        assert ours == today, text


def _dumped() -> list[str]:
    """Block-style YAML of real-looking objects: PyYAML's emitter (as tools write it) and the
    benchmark generator's kubectl style."""
    svc = realistic.dress_service(objects.example_service())
    sl = realistic.dress_slice(objects.example_endpoint_slice())
    texts = [
        yaml.safe_dump_all([svc, sl, objects.example_node(), objects.example_service_cidr()]),
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [copy.deepcopy(svc)]}),
    ]
    lines: list[str] = []
    for doc in [gen.service_doc(gen.Cluster(services=3, endpoints=2), 1), svc, sl]:
        lines += ["---\n", *gen._block(doc, "")]
    texts.append("".join(lines))
    return texts


def _files() -> list[Path]:
    found = [
        *(REPO / "examples").rglob("*.yaml"),
        *(REPO / "deploy").rglob("*.yaml"),
        *(REPO / "tests" / "data").rglob("*.yaml"),
    ]
    return sorted(found)


def test_real_manifests_read_as_today() -> None:
    files = _files()
    assert len(files) > 30
    compiled = 0
    for text in [*(p.read_text() for p in files), *_dumped()]:
        ours, today = _both(text)
        assert ours == today, text[:200]
        compiled += decode.compiled_documents(text) is not None
    assert compiled > 10  # the compiled path is taken, not only the fallbacks


def test_kubectl_style_yaml_takes_the_compiled_path() -> None:
    text = _dumped()[-1]
    assert decode._json_documents(text) is None
    assert decode.compiled_documents(text) is not None


@pytest.mark.parametrize("scalar", ["yes", "0777", "1e3", "1:20", "&a x", "*a", "!!str 1"])
def test_what_reads_differently_takes_pyyaml(scalar: str) -> None:
    assert decode.compiled_documents(f"k: {scalar}\n") is None


def test_errors_still_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(decode.FileError, match=r"^x\.yaml:4: not valid YAML: expected ','"):
        decode._parse(Path("x.yaml"), "a: 1\nb:\n  - [1, 2\n")


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("a: b\n", 0),
        ("a: [1, [2, {c: [3]}]]\n", 4),
        ("a: [1]\nb: [[2]]\n", 2),
        ("[" * 5000 + "]" * 5000, 5000),
        ("a: [ [ [ x ] ] ]", 3),
    ],
)
def test_flow_nesting_is_measured_before_libyaml_reads_it(text: str, depth: int) -> None:
    assert decode._flow_depth(text) == depth


def test_the_pre_filter_misses_no_flagged_token() -> None:
    """``_reads_as_1_1`` splits and matches only the lines where its pre-filter sees something:
    over texts of tricky scalars in every position, its answer is the whole text's split."""
    rng = random.Random(24)
    pieces = [*TRICKY, "x", "node-1", "10.128.0.16", "k8s", "-", "- ", ": ", ":", ",", "[", "]"]
    pieces += ["{", "}", '"', "'", " ", " ", "\n", "\n  ", "a1", "1a", "v1beta1", "0", "9"]
    for _ in range(4000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        whole = not decode._DOC_END.search(text) and decode._plain_tokens(text)
        assert decode._reads_as_1_1(text) == whole, repr(text)


def test_kubectl_uids_and_timestamps_take_the_compiled_path() -> None:
    text = (
        "apiVersion: v1\nkind: Service\nmetadata:\n"
        '  creationTimestamp: "2026-01-01T00:00:00Z"\n  name: web\n  namespace: default\n'
        '  resourceVersion: "81723"\n  uid: 6b6e1c7a-2e2f-4d1a-9a3b-0242ac120002\n'
        "  ownerReferences:\n  - uid: 02874b57-599e-c4d6-5933-8faa9d720108\n"
        "spec:\n  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n    protocol: TCP\n"
    )
    assert decode.compiled_documents(text) is not None
    assert _both(text)[0] == _both(text)[1]


def _batched(text: str, size: int, most: int) -> Any:
    """``decode.batches``' documents of ``text``, concatenated, or the error's message; a
    later batch refused, the whole file's, as the loader reads it then."""
    path = Path("x.yaml")
    try:
        docs = [d for b in decode.batches(path, text.encode(), size=size, most=most) for d in b]
    except decode.Refused:
        return _whole(text)
    except decode.FileError as exc:
        return f"FileError: {exc}"
    return _typed(docs)


def _whole(text: str) -> Any:
    try:
        return _typed(decode.documents(Path("x.yaml"), text.encode()))
    except decode.FileError as exc:
        return f"FileError: {exc}"


def test_batches_read_as_the_whole_file() -> None:
    """Split at every document start, every few, or not at all: the documents of the whole
    file, in order (empty documents, comments before the first ``---`` and documents without
    one included), for real manifests and tricky scalars."""
    texts = [*(p.read_text() for p in _files()), *_dumped()]
    texts += ["".join(f"---\n{shape}" for shape in _shapes(s)) for s in TRICKY]
    texts += [
        "# only a comment\n---\na: 1\n---\n---\n# c\n---\nb: 2\n",
        "a: 1\n---\nb: 2\n--- \n- c\n---\n",
        "--- {a: 1}\n--- [1]\n--- x\n---\n",
        "k: |\n  ---\n  text\n---\nj: 1\n",
    ]
    batched = 0
    for text in texts:
        whole = _whole(text)
        for size, most in [(1, 1), (1, 2), (64, 3), (1 << 20, 1000)]:
            assert _batched(text, size, most) == whole, (size, most, text[:300])
        if not isinstance(whole, str):
            pieces = decode.batches(Path("x.yaml"), text.encode(), size=1, most=1)
            batched += len(list(pieces)) > 1
    assert batched > 50  # split files, not only single batches


def test_a_later_batch_refused_is_read_whole() -> None:
    text = "a: 1\n---\nb: 2\n---\nc: [1, 2\n"
    pieces = decode.batches(Path("x.yaml"), text.encode(), size=1, most=1)
    assert next(pieces) == [{"a": 1}, {"b": 2}]  # the first batch runs past the first ---
    with pytest.raises(decode.Refused):
        list(pieces)


def test_a_file_with_a_later_bad_document_names_its_line(tmp_path: Path) -> None:
    """Through the loader: the error names the line in the file, not in a batch."""
    from nlproxy.cluster.manifests import load_manifests

    docs = "".join(f"---\nkind: Pod\nmetadata:\n  name: p{i}\n" for i in range(3000))
    (tmp_path / "x.yaml").write_text(docs + "---\nkind: Service\nspec: [1, 2\n")
    (error,) = load_manifests(tmp_path).errors
    assert error.startswith("x.yaml:12004: not valid YAML"), error  # the stream's end


def test_more_documents_than_the_compiled_default_take_the_compiled_path() -> None:
    """fast-yaml refuses more than 100,000 documents by default, which sent such a file to
    PyYAML, five times slower: the limit is raised to its most, and batches stay far below."""
    text = "---\nk: v\n" * 100_001
    docs = decode.compiled_documents(text)
    assert docs is not None
    assert len(docs) == 100_001
    pieces = list(decode.batches(Path("x.yaml"), text.encode()))
    assert len(pieces) == 101
    assert sum(len(p) for p in pieces) == 100_001


@pytest.mark.parametrize(
    "text",
    [
        "",
        "---",
        "--- ",
        "---\n",
        "----\n",
        "---x\n--- a\n",
        "a: 1\n---\nb: 2\n---",
        "a: 1\n--- \n ---\n---\t\n---\r\n--- # c\n",
        "\n---\n\n---",
        "x\n-- -\n---",
    ],
)
def test_document_starts_are_the_pattern_s(text: str) -> None:
    """``batches`` finds ``---`` lines by ``str.find``: where ``_DOC_START`` finds them."""
    assert list(decode._doc_starts(text)) == [m.start() for m in decode._DOC_START.finditer(text)]


def test_document_starts_of_real_manifests_are_the_pattern_s() -> None:
    paths = [*(REPO / "examples").rglob("*.yaml"), *(REPO / "deploy").rglob("*.yaml")]
    assert paths
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        want = [m.start() for m in decode._DOC_START.finditer(text)]
        assert list(decode._doc_starts(text)) == want, path


def _kubectl_objects(count: int) -> str:
    """``count`` objects as kubectl writes them: a quoted timestamp and a plain UID each, so
    that the pre-filter's probe sees many lines and the string values are masked."""
    return "".join(
        f'---\nmetadata:\n  creationTimestamp: "2026-01-0{1 + i % 9}T00:0{i % 10}:00Z"\n'
        f"  name: o{i}\n  uid: {i:08x}-2e2f-4d1a-9a3b-0242ac120002\n"
        for i in range(count)
    )


# Scalars a masked value must not hide: plain and quoted, in block and flow style.
STRING_VALUE_CASES = [
    "2026-01-01T00:00:00Z", "2001-12-14 21:59:43", "yes", "on", "Off", "0777", "010", "1e3",
    "1:20", "6b6e1c7a-2e2f-4d1a-9a3b-0242ac120002", "0e6e1c7a-2e2f-4d1a-9a3b-0242ac120002",
]  # fmt: skip


def _string_value_texts(scalar: str) -> list[str]:
    texts = []
    for form in (scalar, f'"{scalar}"', f"'{scalar}'"):
        texts += [
            f"k: {form}\n",
            f"k: {form}  \nj: {scalar}\n",
            f"- a: {form}\n  b: [{form}, {scalar}]\n",
            f"f: {{a: {form}, b: {scalar}}}\n",
            f"f: [x, {{a: {form}}},\n  {scalar}]\n",
            f"s: 'it: {form}\n  more'\nt: {scalar}\n",
            f's: "it: {form}\n  more"\nt: {scalar}\n',
            f"s: |\n  x: {form}\nt: {scalar}\n",
            f"c: 1 # x: {form}\nd: {scalar}\n",
            # A ': ' that a quoted scalar ends with, the pattern's quotes around what follows.
            f'l: ["a: ", {scalar}, "\n  b"]\n',
            f"l: ['a: ', {scalar}, '\n  b']\n",
            f'"a: ": {scalar} "\n',
        ]
    return texts


@pytest.mark.parametrize("scalar", STRING_VALUE_CASES)
def test_masked_string_values_hide_no_scalar_that_reads_differently(scalar: str) -> None:
    """After many kubectl objects the quoted values and UIDs are masked before the pre-filter:
    every file still reads as the pure-Python loader reads it."""
    prefix = _kubectl_objects(20)
    assert decode._flagged_lines(prefix.encode()[: decode._PROBE_BYTES], decode._FEW_HITS) is None
    for shape in _string_value_texts(scalar):
        text = f"{prefix}---\n{shape}"
        ours, today = _both(text)
        assert ours == today, shape


def test_quoted_timestamps_and_uids_do_not_trip_the_pre_filter() -> None:
    """kubectl's ``creationTimestamp: "..."`` and ``uid: ...`` lines are masked: only the first
    and the last line are split and matched, and the file takes the compiled path."""
    text = _kubectl_objects(500)
    masked = decode._STRING_VALUES.sub(b': ""', text.encode())
    assert decode._flagged_lines(masked) == {(0, 3), (len(masked), len(masked))}
    assert decode.compiled_documents(text) is not None
    # A plain scalar that reads differently still takes PyYAML, after them as before them.
    for scalar in ("yes", "0777", "1e3", "1:20"):
        assert decode.compiled_documents(f"{text}---\nk: {scalar}\n") is None
        assert decode.compiled_documents(f"{text}---\nk: [{scalar}]\n") is None


def test_the_masked_pre_filter_reads_random_texts_as_unmasked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Texts of tricky scalars, quotes and ': ' in every position after many kubectl objects
    (the values masked): each reads as it does with nothing masked (whose readings the tests
    above hold to the pure-Python loader's)."""
    rng = random.Random(2424)
    prefix = _kubectl_objects(20)
    pieces = [*TRICKY, "x", "a1", "k", ": ", ":", ",", "[", "]", "{", "}", '"', "'", '"', "'"]
    pieces += [" ", " ", "\n", "\n  ", "- ", "#", ": '", ': "', "' ", '" ', "\n---\n"]
    pieces += ["6b6e1c7a-2e2f-4d1a-9a3b-0242ac120002", "2026-01-01T00:00:00Z"]
    texts = [
        f"{prefix}---\n{''.join(rng.choice(pieces) for _ in range(rng.randint(1, 10)))}\n"
        for _ in range(1500)
    ]
    masked = [_ours(text) for text in texts]
    monkeypatch.setattr(decode, "_PROBE_BYTES", 0)  # an empty probe: nothing is masked
    assert decode._flagged_lines(b"", decode._FEW_HITS) is not None
    for text, ours in zip(texts, masked, strict=True):
        assert ours == _ours(text), repr(text[len(prefix) :])
