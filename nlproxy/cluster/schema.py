"""The fields of the objects nlproxy reads, to name the unknown ones in hand-written manifests.

The API server drops (or, with strict validation, refuses) a field it does not know, so a
misspelt ``targtPort`` never reaches a proxy through the API; in a manifests directory it would
silently mean "no targetPort". ``unknown_fields`` names such fields as ``kubectl
--validate=strict`` does. Pure: it reads the raw object and nothing else; only the manifests
source calls it (the API source's objects come from the API server).

The tables follow the v1 API's field names for Service, EndpointSlice, Node (its top level)
and ServiceCIDR; a ``None`` value accepts anything below (free-form maps such as labels).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

Schema: TypeAlias = Mapping[str, "Schema | None"]

_FREE = None  # any value: labels, annotations, selectors, status sections nlproxy ignores

METADATA: Schema = dict.fromkeys(
    (
        "name", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation",
        "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences",
        "finalizers", "managedFields", "generateName", "selfLink",
    ),
    _FREE,
)  # fmt: skip
_TOP = {"apiVersion": _FREE, "kind": _FREE, "metadata": METADATA}

SERVICE_PORT: Schema = dict.fromkeys(
    ("name", "protocol", "appProtocol", "port", "targetPort", "nodePort"), _FREE
)
SERVICE: Schema = {
    **_TOP,
    "spec": {
        "ports": SERVICE_PORT,
        **dict.fromkeys(
            (
                "selector", "clusterIP", "clusterIPs", "type", "externalIPs", "sessionAffinity",
                "loadBalancerIP", "loadBalancerSourceRanges", "externalName",
                "externalTrafficPolicy", "healthCheckNodePort", "publishNotReadyAddresses",
                "sessionAffinityConfig", "ipFamilies", "ipFamilyPolicy",
                "allocateLoadBalancerNodePorts", "loadBalancerClass", "internalTrafficPolicy",
                "trafficDistribution",
            ),
            _FREE,
        ),
    },
    "status": _FREE,
}  # fmt: skip
ENDPOINT: Schema = {
    "addresses": _FREE,
    "conditions": dict.fromkeys(("ready", "serving", "terminating"), _FREE),
    "hints": dict.fromkeys(("forZones", "forNodes"), _FREE),
    **dict.fromkeys(("hostname", "targetRef", "deprecatedTopology", "nodeName", "zone"), _FREE),
}
ENDPOINT_SLICE: Schema = {
    **_TOP,
    "addressType": _FREE,
    "endpoints": ENDPOINT,
    "ports": dict.fromkeys(("name", "protocol", "port", "appProtocol"), _FREE),
}
NODE: Schema = {**_TOP, "spec": _FREE, "status": _FREE}
SERVICE_CIDR: Schema = {**_TOP, "spec": dict.fromkeys(("cidrs",), _FREE), "status": _FREE}

SCHEMAS: Mapping[str, Schema] = {
    "Service": SERVICE,
    "EndpointSlice": ENDPOINT_SLICE,
    "Node": NODE,
    "ServiceCIDR": SERVICE_CIDR,
}


def unknown_fields(obj: Mapping[str, Any], kind: str) -> list[str]:
    """The paths of the fields of ``obj`` that a ``kind`` does not have, e.g.
    ``spec.ports[0].targtPort``; lists of objects are checked item by item."""
    out: list[str] = []
    _walk(obj, SCHEMAS[kind], "", out)
    return out


def _walk(value: object, schema: Schema | None, path: str, out: list[str]) -> None:
    if schema is None:
        return
    if isinstance(value, list):
        # Only the objects of a list: a list inside a list is a type error for the parser to
        # name, and following nested lists would expand a YAML alias bomb.
        for i, item in enumerate(value):
            if isinstance(item, Mapping):
                _walk(item, schema, f"{path}[{i}]", out)
        return
    if not isinstance(value, Mapping):
        return  # a wrong type is the parser's to report, with its message
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in schema:
            out.append(where)
        else:
            _walk(item, schema[key], where, out)
