"""Which services changed since the last plan, found from the objects themselves.

Sits beside the in-place update (``incremental.py``) for callers that do not pass the changed
services. The cluster state keeps unchanged Service and EndpointSlice objects identical between
snapshots, so "changed" means "another object": compared by identity, never by value (equal
objects compare field by field, in Python). Pure: no I/O, clock or logging.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from itertools import compress, islice
from typing import Any

from nlproxy.cluster.model import ClusterSnapshot, ServiceKey
from nlproxy.proxy.fragments import Fragment


def changed_since(
    frags: Mapping[ServiceKey, Fragment],
    snapshot: ClusterSnapshot,
    *,
    services: Mapping[ServiceKey, object] | None = None,
    slices: Mapping[ServiceKey, object] | None = None,
) -> set[ServiceKey]:
    """Services whose Service or slice objects are not the ones ``frags`` were planned from.

    Args:
        frags: one family's fragments of the last plan, by service.
        snapshot: the cluster objects now.
        services: the ``services`` mapping of the snapshot last planned, when known.
        slices: its ``slices`` mapping, when known.

    Usually at C speed: cluster state copies its mappings in the same key order, so the values
    are compared position by position with the last planned ones (new services come last).
    Otherwise, service by service against the fragments.
    """
    if services is not None and slices is not None:
        moved = _moved(services, snapshot.services)
        regrouped = _moved(slices, snapshot.slices)
        if moved is not None and regrouped is not None:
            return moved | regrouped
    return _compare_each(frags, snapshot)


def _moved(old: Mapping[ServiceKey, Any], new: Mapping[ServiceKey, Any]) -> set[ServiceKey] | None:
    """Keys whose value is another object, when ``old``'s keys start ``new``'s in order (the
    same key objects); None otherwise."""
    if new is old:
        return set()
    if len(new) < len(old) or not all(map(operator.is_, new, old)):
        return None
    out = set(compress(new, map(operator.is_not, new.values(), old.values())))
    out.update(islice(new, len(old), None))
    return out


def _compare_each(
    frags: Mapping[ServiceKey, Fragment], snapshot: ClusterSnapshot
) -> set[ServiceKey]:
    slices = snapshot.slices
    out: set[ServiceKey] = set()
    added = 0
    for key, svc in snapshot.services.items():
        frag = frags.get(key)
        if frag is None:
            added += 1
            out.add(key)
        elif frag.service is not svc:
            out.add(key)
        else:
            mine = slices.get(key, ())
            if frag.slices is not mine and not frag.reusable_for(svc, mine):
                out.add(key)
    if len(frags) + added != len(snapshot.services):  # some were removed
        out.update(k for k in frags if k not in snapshot.services)
    return out
