"""Equality-based label and field selectors, as the test API server applies them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Selector:
    """Equality-based label or field selector: ``a``, ``!a``, ``a=b``, ``a==b``, ``a!=b``."""

    def __init__(self, text: str) -> None:
        self.terms: list[tuple[str, str, str]] = []
        for raw in filter(None, (t.strip() for t in text.split(","))):
            if raw.startswith("!"):
                self.terms.append(("!", raw[1:], ""))
            elif "!=" in raw:
                k, v = raw.split("!=", 1)
                self.terms.append(("!=", k, v))
            elif "=" in raw:
                k, v = raw.replace("==", "=").split("=", 1)
                self.terms.append(("=", k, v))
            elif any(c in raw for c in " ()"):
                raise ValueError(f"unsupported selector term {raw!r}")
            else:
                self.terms.append(("exists", raw, ""))

    def matches(self, values: Mapping[str, str]) -> bool:
        for op, k, v in self.terms:
            ok = {
                "!": k not in values,
                "exists": k in values,
                "=": values.get(k) == v,
                "!=": values.get(k) != v,
            }[op]
            if not ok:
                return False
        return True


@dataclass
class Query:
    labels: Selector
    fields: Selector

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", "")}
        return self.labels.matches(meta.get("labels") or {}) and self.fields.matches(fields)
