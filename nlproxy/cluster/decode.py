"""Manifest text to documents: the YAML and JSON readers of the manifests source.

``documents`` decodes one file's bytes and returns its parsed documents, all or nothing, or raises
``FileError`` naming the file (and line). It knows no Kubernetes kinds and no model; what the
documents mean is ``cluster/manifests.py``'s and ``cluster/parse.py``'s.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
from collections.abc import Iterator
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
    text = _text(path, data)
    try:
        return _parse(path, text)
    except (ValueError, RecursionError, MemoryError) as exc:
        # Beyond what a parser takes: an integer of more than 4300 digits, nesting deeper than
        # the interpreter's stack. The file is refused; the daemon and every other file go on.
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:120]
        raise FileError(f"{path.name}: cannot be read: {what}") from None


BATCH_BYTES = 1 << 20
"""About how much YAML text ``batches`` gives the compiled decoder at once."""
BATCH_DOCUMENTS = 1000
"""The most documents ``batches`` gives it at once."""
MAX_DOCUMENTS = 10_000_000
"""The most documents the compiled decoder reads in one call (the most it can be set to; its
default, 100,000, is less than a file of 100k Services holds). Only a file of that many
documents, nearly all empty, could hold more within :data:`MAX_FILE_BYTES`: PyYAML reads it."""


class Refused(Exception):
    """The compiled decoder refused a batch of the file: read the file whole (``documents``),
    which names what is wrong, or reads what the compiled decoder does not."""


def batches(
    path: Path, data: bytes, *, size: int = BATCH_BYTES, most: int = BATCH_DOCUMENTS
) -> Iterator[list[Any]]:
    """``documents(path, data)`` in batches, in order, for a YAML file the compiled decoder
    reads: about ``size`` bytes of text (``most`` documents at most) at a time, split where a
    document starts (a ``---`` line: one within a scalar would end it), so that a caller that
    converts each batch's documents and drops them never holds them all. Any other file is one
    batch, ``documents``'.

    Raises:
        FileError: as ``documents``.
        Refused: a batch after the first was refused (the caller starts again with
            ``documents``; a first batch refused is read so at once).
    """
    text = _text(path, data)
    if not _batched(path, text, data):
        yield documents(path, data)
        return
    compiled = _compiled()
    start = 0
    marks = _doc_starts(text)
    # The first batch runs past the first document start: what precedes it is a document of
    # its own only when it holds more than comments, which only the whole stream tells.
    next(marks, None)
    while start < len(text):
        end = len(text)
        for count, at in enumerate(marks, start=1):
            if at > start and (at - start >= size or count >= most):
                end = at
                break
        try:
            docs = list(compiled.safe_load_all(text[start:end], max_documents=MAX_DOCUMENTS))
        except (ValueError, RecursionError, OverflowError, MemoryError):
            if start:
                raise Refused(path.name) from None
            yield documents(path, data)
            return
        start = end
        yield docs
        del docs  # the caller has converted them: not held while the next batch is decoded


def _doc_starts(text: str) -> Iterator[int]:
    """Where each ``---`` line of ``text`` starts, as ``_DOC_START.finditer`` finds them, by
    ``str.find`` (a regular expression steps through the text character by character: 0.07 s
    against 0.01 for 15 MB)."""
    n = len(text)
    if text.startswith("---") and (n == 3 or text[3] in " \n"):
        yield 0
    at = text.find("\n---")
    while at >= 0:
        after = at + 4
        if after == n or text[after] in " \n":
            yield at + 1
        at = text.find("\n---", after)


def _batched(path: Path, text: str, raw: bytes) -> bool:
    """Whether ``batches`` reads the file in batches: YAML that does not start as JSON (which
    ``documents`` reads with the JSON parser) and that the compiled decoder may read
    (installed, and nothing in it could read differently from YAML 1.1); ``raw`` is its
    UTF-8."""
    if path.suffix == ".json" or _compiled() is None:
        return False
    try:
        if _json_documents(text, first=True):
            return False
    except (ValueError, RecursionError, MemoryError):
        return False  # ``documents`` names it
    return _reads_as_1_1(text, raw)


def _text(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileError(f"{path.name}: cannot read: not UTF-8 text") from exc


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


def _json_documents(text: str, *, first: bool = False) -> list[Any] | None:
    """The documents of a YAML file whose every document is one JSON value (as tools that
    emit JSON-in-YAML write them), read with the JSON parser, about 5x faster than libyaml's
    loader; None when any document is not such plain JSON, and the YAML parser reads the file.

    Plain: no backslash escapes, tabs, floats or control characters, for which a YAML reading
    could differ; everything else JSON can say (quoted strings and keys, integers, true, false,
    null, arrays, objects) YAML reads the same. With ``first``, only the first document is
    read (whether the file starts so).
    """
    docs: list[Any] = []
    start = 0
    # Document by document, so that block-style YAML is told apart at its first document,
    # without a look at the rest.
    for i, mark in enumerate(itertools.chain(_DOC_START.finditer(text), [None])):
        chunk = text[start : len(text) if mark is None else mark.start()]
        if mark is not None:
            start = mark.end()
        if not chunk.strip():
            if i > 0:
                docs.append(None)  # an explicit empty document
            continue
        if _NOT_PLAIN_JSON.search(chunk):
            return None
        try:
            docs.append(json.loads(chunk, parse_float=_not_plain, parse_constant=_not_plain))
        except (ValueError, _NotPlain):
            return None
        if first:
            return docs  # only whether it starts so
    return docs


# A token that a YAML 1.2 decoder could read differently from PyYAML's YAML 1.1, as the
# Kubernetes tools read it, or that only PyYAML's path handles. Tokens: the text split at
# whitespace and flow indicators (and at the ':' after a quoted key, as in {"a":yes}), ':' at
# either end stripped; a plain scalar that resolves to anything but a string is one such token
# (or a few, conservatively, when it also holds flow indicators). Flagged: 1.1 booleans
# (yes/no/on/off); numbers with a leading zero (octal), a sign before the point (-.5 is a
# string in 1.1), 19 digits or more (beyond 64 bits), or with 0b/0o/0x, an exponent (1e3 is a
# string in 1.1), underscores or sexagesimal colons (and so unquoted timestamps), as far as
# the token is shaped like a number (a UID such as 6b6e1c7a-2e2f-... is not); tags, anchors
# and aliases (and their bombs), directives, merge keys and the ``=`` value key. A document
# end ``...`` counts at the start of a line (``_DOC_END``). Quoted text is split alike: a
# quoted ``"turn it on"`` merely takes the slower path.
_NOT_1_2 = re.compile(
    r"yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|=|[!&*%].*|<<.*"
    r"|[-+]?0[0-9][0-9_.]*|[-+]\..*|.*[0-9]{19}.*"
    r"|[-+]?\.?[0-9][0-9.]*[_:eEoObBxX](?:[0-9a-fA-F_:.xXoO]|(?<=[eE])[-+])*"
)
_TOKENS = re.compile(r"""[ \n\r\[\]{},]+|(?<=["']):""")
_DOC_END = re.compile(r"^\.\.\.(?:\s|$)", re.MULTILINE)
# Characters besides printable ASCII and line ends: tabs, and what PyYAML's reader refuses or
# reads as a line break (YAML 1.2 does not).
_NOT_TEXT = re.compile(r"[\t\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\ufffe\uffff]")


def _classes(*groups: tuple[bytes, bytes], rest: bytes) -> bytes:
    """A ``bytes.translate`` table: each group's characters to its class, the others to
    ``rest``."""
    table = bytearray(rest * 256)
    for chars, to in groups:
        for c in chars:
            table[c] = to[0]
    return bytes(table)


# The pre-filter: two translations of the text in which every flagged token shows as one of a
# few fixed byte strings, found in C (a regular expression of literals, ``bytes.find``); only
# the lines where one shows are split into tokens and matched against ``_NOT_1_2``. Any other
# line holds no flagged token.
# _WORDS: separators (and ':' and quotes, so that every token start and end is a space) to
# ' ', the letters of yes/no/on/off to 'b' (so they show as " bb " or " bbb "), the characters
# that start tags, anchors, aliases, directives, merge and value keys, and '0', to '!' (" !"
# is a token starting with one; a leading zero), signs to '-' and the other digits and '.' to
# '1' (" -1", " -!": a signed number).
_LETTERS = bytes(range(ord("a"), ord("z") + 1)) + bytes(range(ord("A"), ord("Z") + 1))
_WORDS = _classes(
    (bytes(range(0x20)) + bytes(range(0x7F, 0x80)), b"\x00"),  # what _NOT_TEXT has of ASCII
    (_LETTERS, b"q"),
    (b"yesnofYESNOF", b"b"),
    (b" \n\r[]{},:\"'", b" "),
    (b"!&*%<=0", b"!"),
    (b"-+", b"-"),
    (b"123456789.", b"1"),
    rest=b"q",
)
_WORD_HITS = re.compile(rb" (?:bbb? |!|-[1!])")  # one pass (five finds cost twice as much)
# _NUMBERS: digits and '.' to '1', the characters of 0b/0o/0x, exponents, underscores and
# colons to 'x': "1x" is in every number-shaped flagged token, 19 '1's in every long one.
_NUMBERS = _classes((b"0123456789.", b"1"), (b"_:eEoObBxX", b"x"), rest=b" ")
_NUMBER_NEEDLES = (b"1x", b"1" * 19)

# A value that is a string in either reading, masked (to ``""``) before the pre-filter when
# it sees more than ``_FEW_HITS`` lines in a file's first ``_PROBE_BYTES``: a quoted value at
# a line's end (a quoted scalar is never a boolean, number or timestamp: only plain ones
# resolve) and a plain UID (8-4-4-4-12 hex digits: no 1.1 or 1.2 number has four dashes), as
# kubectl writes ``creationTimestamp: "2026-01-01T00:00:00Z"`` and ``uid: 6b6e1c7a-...``.
# Safe without knowing where a line starts: ``: `` ends every plain scalar, so it is a mapping
# indicator (the value is what the pattern says), or it lies in a comment, a block scalar or a
# quoted scalar, where what follows to the line's end is text of that comment or scalar, or
# the quote after it closes a quoted scalar ending in ``: ``, and what the pattern masks
# follows that closing quote: without ``,[]{}#`` and quotes, that is a YAML error, or plain
# text up to the masked closing quote, which ends it: a string. The key before ``: `` stays.
_W = rb"[-A-Za-z0-9_.:/+ ]*"
_HEX = rb"[0-9a-f]"
_STRING_VALUES = re.compile(
    rb': (?:"' + _W + rb'"|\'' + _W + rb"'|"
    + _HEX + rb"{8}-" + _HEX + rb"{4}-" + _HEX + rb"{4}-" + _HEX + rb"{4}-" + _HEX + rb"{12}"
    + rb") *$",
    re.MULTILINE,
)  # fmt: skip
_FEW_HITS = 16
_PROBE_BYTES = 1 << 16


class _NotText(Exception):
    """A character of ``_NOT_TEXT``: PyYAML reads the file."""


def _reads_as_1_1(text: str, raw: bytes | None = None) -> bool:
    """Whether a YAML 1.2 decoder reads ``text`` as PyYAML does (no token of ``_NOT_1_2``,
    no document end, no character of ``_NOT_TEXT``); ``raw``: its UTF-8, when at hand."""
    if "..." in text and _DOC_END.search(text):
        return False
    if not text.isascii() and _NOT_TEXT.search(text):
        return False
    if raw is None:
        raw = text.encode("utf-8")  # other characters than ASCII's are token characters
    try:
        # Many lines where the pre-filter sees something, in a probe of the text's start:
        # mask the values that are strings in either reading, then find them in the whole.
        if _flagged_lines(raw[:_PROBE_BYTES], _FEW_HITS) is None:
            raw = _STRING_VALUES.sub(b': ""', raw)
        lines = _flagged_lines(raw)
    except _NotText:
        return False
    assert lines is not None
    # The lines found, split and matched at once.
    return _plain_tokens(b"\n".join(raw[s:e] for s, e in lines).decode("utf-8"))


def _flagged_lines(raw: bytes, most: int | None = None) -> set[tuple[int, int]] | None:
    """The spans of the lines of ``raw`` whose tokens the pre-filter sends to ``_NOT_1_2``:
    the first and the last line (their tokens have no separator before or after them), and
    the lines where a needle shows; None when more than ``most`` needles show.

    Raises:
        _NotText: ``raw`` holds a character of ``_NOT_TEXT`` (of ASCII's).
    """
    lines = {(0, _end(raw, 0)), (raw.rfind(b"\n") + 1, len(raw))}
    budget = len(raw) if most is None else most
    words = raw.translate(_WORDS)
    if 0 in words:
        raise _NotText
    hit = _WORD_HITS.search(words)
    while hit is not None:
        budget -= 1
        if budget < 0:
            return None
        hit = _WORD_HITS.search(words, _line(raw, hit.start(), hit.end(), lines))
    del words, hit  # one translation at a time: a file's size less at the peak
    numbers = raw.translate(_NUMBERS)
    for needle in _NUMBER_NEEDLES:
        at = numbers.find(needle)
        while at >= 0:
            budget -= 1
            if budget < 0:
                return None
            at = numbers.find(needle, _line(raw, at, at + len(needle), lines))
    return lines


def _end(raw: bytes, at: int) -> int:
    """Where the line holding ``raw[at]`` ends."""
    end = raw.find(b"\n", at)
    return len(raw) if end < 0 else end


def _line(raw: bytes, start: int, end: int, lines: set[tuple[int, int]]) -> int:
    """Add to ``lines`` the span of the lines that hold ``raw[start:end]`` (a pre-filter's
    hit; a token never spans two lines) and return where it ends, where the next hit can
    start (a line end is a separator)."""
    last = _end(raw, end - 1)
    lines.add((raw.rfind(b"\n", 0, start) + 1, last))
    return last


def _plain_tokens(text: str) -> bool:
    """Whether no token of ``text`` is one of ``_NOT_1_2``."""
    match = _NOT_1_2.fullmatch
    return not any(match(token.strip(":")) for token in set(_TOKENS.split(text)))


_COMPILED_ON = [True]
"""Whether the compiled decoder is used where it may be (``compiled_off``)."""


def _compiled() -> Any:
    """The compiled decoder's module, imported at its first use (not by every command); None
    in an installation without it, which reads YAML with libyaml, as before, and while
    ``compiled_off``."""
    return _compiled_module() if _COMPILED_ON[0] else None


@contextlib.contextmanager
def compiled_off() -> Iterator[None]:
    """YAML read by libyaml only, as without the compiled decoder, for a bench or a test that
    compares the two (``bench/bench_input.py``); not for the product (not thread-safe)."""
    before = _COMPILED_ON[0]
    _COMPILED_ON[0] = False
    try:
        yield
    finally:
        _COMPILED_ON[0] = before


@functools.cache
def _compiled_module() -> Any:
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
        return list(compiled.safe_load_all(text, max_documents=MAX_DOCUMENTS))
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
