"""Manifest text to documents: the YAML and JSON readers of the manifests source.

``documents`` decodes one file's bytes and returns its parsed documents, all or nothing, or raises
``FileError`` naming the file (and line). It knows no Kubernetes kinds and no model; what the
documents mean is ``cluster/manifests.py``'s and ``cluster/parse.py``'s.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 256 << 20
"""A manifest file larger than this is refused unread (100k Services x 10 endpoints as YAML is
about 130 MiB)."""


class _Loader(yaml.SafeLoader):
    """YAML as the Kubernetes tools read it: timestamps stay strings (they go through JSON)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

# libyaml's parser with the same resolvers and constructors, about 10x faster. Its error texts
# differ from the pure-Python parser's, so a file it rejects is parsed again by ``_Loader`` to
# report the error as always.
_FastLoader: type[Any] = _Loader
if getattr(yaml, "__with_libyaml__", False):

    class _CLoader(yaml.CSafeLoader):
        """``_Loader`` on libyaml."""

    _CLoader.yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers
    _FastLoader = _CLoader


class FileError(Exception):
    """A file that cannot be used as a whole; the message names the file (and line)."""


def documents(path: Path, data: bytes | None = None) -> list[Any]:
    """The parsed documents of one file's ``data``, all or nothing (a half-read file would make
    the ``Replace`` delete the objects after the error); ``path`` names it (and its suffix says
    JSON or YAML). The daemon's reading is ``readdir.py``'s (beneath the directory, regular
    files only); without ``data``, ``path`` is read here (tests, tools)."""
    try:
        if data is None:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                raise FileError(
                    f"{path.name}: {size} bytes, more than a manifest may hold ({MAX_FILE_BYTES})"
                )
            data = path.read_bytes()
    except OSError as exc:
        raise FileError(f"{path.name}: cannot read: {exc.strerror}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileError(f"{path.name}: cannot read: not UTF-8 text") from exc
    try:
        return _parse(path, text)
    except (ValueError, RecursionError, MemoryError) as exc:
        # Beyond what a parser takes: an integer of more than 4300 digits, nesting deeper than
        # the interpreter's stack. The file is refused; the daemon and every other file go on.
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:120]
        raise FileError(f"{path.name}: cannot be read: {what}") from None


def _parse(path: Path, text: str) -> list[Any]:
    if path.suffix == ".json":
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as exc:
            raise FileError(f"{path.name}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
    docs = _json_documents(text)
    if docs is None:
        docs = compiled_documents(text)
    if docs is not None:
        return docs
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        # libyaml's composer recurses in C without a limit: 100k '[' overflow its stack (a
        # segmentation fault with PyYAML 6.0.3), before Python's recursion limit can say so.
        raise RecursionError(f"more than {MAX_FLOW_DEPTH} nested [ or {{")
    try:
        return list(yaml.load_all(text, Loader=_FastLoader))
    except yaml.YAMLError:
        pass  # reported below, outside this handler, so the errors do not chain
    return _yaml_error(path, text)


MAX_FLOW_DEPTH = 1000
"""Flow collections (``[``, ``{``) nested deeper than any Kubernetes object: refused before
libyaml reads them."""
_FLOW = re.compile(r"[\[\]{}]")


def _flow_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in ``text``, quotes not told apart (so at most an
    overestimate): the brackets alone are walked, and only on the slow path's input."""
    depth = deepest = 0
    for match in _FLOW.finditer(text):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(depth - 1, 0)
    return deepest


_DOC_START = re.compile(r"^---(?: |$)", re.MULTILINE)
# What YAML reads differently from JSON, or not at all: escapes, tabs, characters YAML cannot
# hold (its reader's list), and (by the hook below) floats and NaN/Infinity.
_NOT_PLAIN_JSON = re.compile(r"[\\\t\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ufffe\uffff]")


class _NotPlain(Exception):
    """A JSON value whose YAML reading could differ."""


def _not_plain(text: str) -> Any:
    raise _NotPlain(text)


def _json_documents(text: str) -> list[Any] | None:
    """The documents of a YAML file whose every document is one JSON value (as tools that
    emit JSON-in-YAML write them), read with the JSON parser, about 5x faster than libyaml's
    loader; None when any document is not such plain JSON, and the YAML parser reads the file.

    Plain: no backslash escapes, tabs, floats or control characters, for which a YAML reading
    could differ; everything else JSON can say (quoted strings and keys, integers, true, false,
    null, arrays, objects) YAML reads the same.
    """
    if _NOT_PLAIN_JSON.search(text):
        return None
    chunks = _DOC_START.split(text)
    docs: list[Any] = []
    for i, chunk in enumerate(chunks):
        if not chunk.strip():
            if i > 0:
                docs.append(None)  # an explicit empty document
            continue
        try:
            docs.append(json.loads(chunk, parse_float=_not_plain, parse_constant=_not_plain))
        except (ValueError, _NotPlain):
            return None
    return docs


# A word (whitespace-separated, so also inside quoted text: such a file merely takes the slower
# path) that a YAML 1.2 decoder could read differently from PyYAML's YAML 1.1, as the Kubernetes
# tools read it, or that only PyYAML's path handles: 1.1 booleans (yes/no/on/off), octal and
# leading zeros, 0b/0o/0x, sexagesimal 1:20 (and so unquoted timestamps), underscores, exponents
# (1e3 is a string in 1.1), integers beyond 64 bits, tags, anchors and aliases (and their
# bombs), merge keys, directives, document ends and the ``=`` value key.
_NOT_1_2 = re.compile(
    r"[\[{,]*+(?:(?:yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|=)[\]},:]*"
    r"|[-+.]?[0-9].*[_:eEoObBxX].*|[-+]?0[0-9].*|.*[0-9]{19}.*|[!&*%].*|<<.*|\.\.\.)"
)
# Characters besides printable ASCII and line ends: tabs, and what PyYAML's reader refuses or
# reads as a line break (YAML 1.2 does not).
_ASCII_TEXT = bytes(range(0x20, 0x7F)) + b"\n\r"
_NOT_TEXT = re.compile(r"[\t\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ufffe\uffff]")


def _reads_as_1_1(text: str) -> bool:
    """Whether a YAML 1.2 decoder reads ``text`` as PyYAML does (no word of ``_NOT_1_2``,
    no character of ``_NOT_TEXT``)."""
    if text.isascii():
        if text.encode("ascii").translate(None, _ASCII_TEXT):
            return False
    elif _NOT_TEXT.search(text):
        return False
    match = _NOT_1_2.fullmatch
    return not any(match(word) for word in set(text.split()))


@functools.cache
def _compiled() -> Any:
    """The compiled decoder's module, imported at its first use (not by every command); None
    in an installation without it, which reads YAML with libyaml, as before."""
    try:
        import fast_yaml
    except ImportError:
        return None
    return fast_yaml


def compiled_documents(text: str) -> list[Any] | None:
    """The documents of a YAML file read by the compiled decoder (fast-yaml, about 5x faster
    than libyaml's loader; docs/decoding.md), when nothing in it could read differently from
    PyYAML's YAML 1.1; None otherwise, or when the decoder refuses the file, or is not
    installed: then PyYAML reads it (and names the error)."""
    compiled = _compiled()
    if compiled is None or not _reads_as_1_1(text):
        return None
    try:
        return list(compiled.safe_load_all(text))
    except (ValueError, RecursionError, OverflowError):
        return None


def _yaml_error(path: Path, text: str) -> list[Any]:
    """Parse ``text`` with the pure-Python loader: its result if it accepts it (libyaml
    rejected it), else its error, raised as a ``FileError`` naming the file and line."""
    try:
        return list(yaml.load_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise FileError(f"{path.name}{line}: not valid YAML: {exc.problem or exc.context}") from exc
    except yaml.YAMLError as exc:
        raise FileError(f"{path.name}: not valid YAML: {exc}") from exc
