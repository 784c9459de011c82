"""Keys written twice in one mapping of a ``--config`` file, found on the file's YAML nodes
(the decoded document has kept only the last of each, silently).

kube-proxy decodes its file strictly first; a duplicate key fails that, and a ``v1alpha1``
file is then decoded leniently (the last value wins) with a logged message, while a
``v1alpha2`` file is refused. ``config/kubeproxy.py`` does the same with what this finds.
Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's composer when PyYAML has it: the file was already read whole by the same
parser (``cluster/decode.py``), so nothing here can be deeper or larger than that."""

MERGE = "<<"
"""YAML's merge key: a mapping may hold several, and keys written beside one override it."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A key written again in the same mapping.

    Attributes:
        path: the key's dotted path in the document (``iptables.syncPeriod``).
        line: the 1-based line of the repeat; 0 when unknown (a JSON file YAML cannot read).
        first: the line where the key was first written; 0 when unknown.
    """

    path: str
    line: int
    first: int

    def __str__(self) -> str:
        if not self.line:
            return f"key {self.path} is written more than once"
        return f"line {self.line}: key {self.path} is written again (first on line {self.first})"


def duplicate_keys(text: str) -> list[Duplicate]:
    """Every repeated key of ``text``'s mappings, in the order they are written (a mapping
    reached again through an alias is looked at once)."""
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.YAMLError:
        return _json_duplicates(text)
    out: list[Duplicate] = []
    seen: set[int] = set()
    stack: list[tuple[str, yaml.Node]] = [("", n) for n in reversed(nodes)]
    while stack:
        path, node = stack.pop()
        if id(node) in seen or isinstance(node, yaml.ScalarNode):
            continue
        seen.add(id(node))
        children: list[tuple[str, yaml.Node]] = []
        if isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.value == MERGE:
                    children.append((path, value))
                    continue
                where = f"{path}.{key.value}" if path else str(key.value)
                line = key.start_mark.line + 1
                if key.value in lines:
                    out.append(Duplicate(where, line, lines[key.value]))
                else:
                    lines[key.value] = line
                children.append((where, value))
        elif isinstance(node, yaml.SequenceNode):
            children = [(f"{path}[{i}]", item) for i, item in enumerate(node.value)]
        stack.extend(reversed(children))
    return sorted(out, key=lambda d: d.line)


def _json_duplicates(text: str) -> list[Duplicate]:
    """The repeated keys of a JSON document YAML cannot read (a tab between tokens, say),
    without lines: JSON's parser does not say where an object's keys are."""
    out: list[Duplicate] = []

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        keys = [k for k, _ in items]
        out.extend(Duplicate(k, 0, 0) for i, k in enumerate(keys) if k in keys[:i])
        return dict(items)

    try:
        json.loads(text, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return []
    return out
