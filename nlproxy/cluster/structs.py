"""The struct types the compiled decoder of ``typed.py`` reads objects into.

Each holds only the fields the model needs, so msgspec skips everything else
(``managedFields``, ``last-applied-configuration``) without building it. Two families: lenient
for the API, strict for manifests (every other field the schema knows is declared, unused, and
an unknown one is refused, so such an object goes to the parser, which names the field). Nodes
and ServiceCIDRs get reduced decoders of the fields the parser reads. Declarations only: no
I/O, logging or state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from nlproxy.cluster import parse, schema

_Fields = list[tuple[str, Any, Any]]


def _struct(
    name: str, fields: _Fields, known: schema.Schema, *, strict: bool, tag: str | None = None
) -> type[Any]:
    """A struct of ``fields``; ``strict`` (manifests) also declares every other field the
    schema knows (decoded, unused) and refuses the rest, so an unknown field goes to the
    parser's path, which names it. With ``tag`` the struct is tagged by its ``kind`` (which is
    then no field of its own), for a union of kinds decoded in one call."""
    if strict:
        have = {f[0] for f in fields}
        fields = fields + [(k, object, None) for k in known if k not in have]
    # gc=False: a decoded struct holds only what the JSON held (strings, numbers, lists and
    # dicts of them, structs), never itself, so the cycle collector need not track the 100k
    # endpoints of a large list (a tenth of their decoding).
    if tag is None:
        return msgspec.defstruct(
            name, fields, kw_only=True, forbid_unknown_fields=strict, omit_defaults=True, gc=False
        )
    return msgspec.defstruct(
        name,
        [f for f in fields if f[0] != "kind"],
        kw_only=True,
        forbid_unknown_fields=strict,
        omit_defaults=True,
        tag_field="kind",
        tag=tag,
        gc=False,
    )


_OPT_STR = str | None


def _top(strict: bool) -> _Fields:
    """The fields every object has: ``apiVersion``, ``kind`` and the metadata the model reads."""
    str_map = dict[str, str]
    meta = _struct(
        "Meta",
        [
            ("name", _OPT_STR, None),
            ("namespace", _OPT_STR, None),
            ("labels", str_map | None, None),
            ("annotations", str_map | None, None),
            ("resourceVersion", _OPT_STR, None),
            ("creationTimestamp", _OPT_STR, None),
            ("uid", _OPT_STR, None),
        ],
        schema.METADATA,
        strict=strict,
    )
    return [("apiVersion", object, None), ("kind", object, None), ("metadata", meta, None)]


def _service_fields(strict: bool) -> _Fields:
    """A Service's fields: the top ones, its spec (ports included) and its status (any value,
    read by the parser's reader when it is not empty)."""
    port = _struct(
        "ServicePort",
        [
            ("name", _OPT_STR, None),
            ("protocol", _OPT_STR, None),
            ("port", int | None, None),
            ("targetPort", int | str | None, None),
            ("nodePort", int | None, None),
        ],
        schema.SERVICE_PORT,
        strict=strict,
    )
    spec = _struct(
        "ServiceSpec",
        [
            ("type", _OPT_STR, None),
            ("clusterIP", _OPT_STR, None),
            ("clusterIPs", list[str] | None, None),
            ("ipFamilies", list[str] | None, None),
            ("ports", list[port] | None, None),  # type: ignore[valid-type]
            ("externalIPs", list[str] | None, None),
            ("externalTrafficPolicy", _OPT_STR, None),
            ("internalTrafficPolicy", _OPT_STR, None),
            ("healthCheckNodePort", int | None, None),
            ("loadBalancerSourceRanges", list[str] | None, None),
            ("sessionAffinity", _OPT_STR, None),
            ("sessionAffinityConfig", object, None),
            ("trafficDistribution", _OPT_STR, None),
        ],
        _mapping(schema.SERVICE["spec"]),
        strict=strict,
    )
    return [*_top(strict), ("spec", spec | None, None), ("status", object, None)]


def _slice_fields(strict: bool) -> _Fields:
    """An EndpointSlice's fields: the top ones, its address type, ports and endpoints."""
    conditions = _struct(
        "Conditions",
        [(k, bool | None, None) for k in ("ready", "serving", "terminating")],
        _mapping(schema.ENDPOINT["conditions"]),
        strict=strict,
    )
    endpoint = _struct(
        "Endpoint",
        [
            ("addresses", list[str], msgspec.NODEFAULT),
            ("conditions", conditions | None, None),
            ("nodeName", _OPT_STR, None),
            ("zone", _OPT_STR, None),
            ("hints", object, None),
        ],
        schema.ENDPOINT,
        strict=strict,
    )
    slice_port = _struct(
        "EndpointPort",
        [("name", _OPT_STR, None), ("protocol", _OPT_STR, None), ("port", int | None, None)],
        _mapping(schema.ENDPOINT_SLICE["ports"]),
        strict=strict,
    )
    return [
        *_top(strict),
        ("addressType", _OPT_STR, None),
        ("ports", list[slice_port] | None, None),  # type: ignore[valid-type]
        ("endpoints", list[endpoint] | None, None),  # type: ignore[valid-type]
    ]


class Decoders:
    """The struct types and decoders of one mode (lenient for the API, strict for manifests).

    Attributes:
        service, slice: the struct of each kind.
        json: each kind's JSON decoder into its struct.
        types: each kind's struct, for ``msgspec.convert`` of a decoded document.
        either: a JSON decoder of an object of either kind (tagged by ``kind``) in one call.
        kind_of: the kind of each struct ``either`` returns.
    """

    def __init__(self, *, strict: bool) -> None:
        service_fields, slice_fields = _service_fields(strict), _slice_fields(strict)
        self.service = _struct("Service", service_fields, schema.SERVICE, strict=strict)
        self.slice = _struct("EndpointSlice", slice_fields, schema.ENDPOINT_SLICE, strict=strict)
        self.json = {
            "Service": msgspec.json.Decoder(self.service),
            "EndpointSlice": msgspec.json.Decoder(self.slice),
        }
        self.types = {"Service": self.service, "EndpointSlice": self.slice}
        # The same structs tagged by kind: an object of either kind in one decode.
        tagged_service = _struct(
            "Service", service_fields, schema.SERVICE, strict=strict, tag="Service"
        )
        tagged_slice = _struct(
            "EndpointSlice", slice_fields, schema.ENDPOINT_SLICE, strict=strict, tag="EndpointSlice"
        )
        self.kind_of: dict[type[Any], str] = {
            tagged_service: "Service",
            tagged_slice: "EndpointSlice",
        }
        self.either = msgspec.json.Decoder(tagged_service | tagged_slice)


def _reduced(name: str, fields: Mapping[str, list[str]]) -> msgspec.json.Decoder[Any]:
    """A lenient decoder of the sections ``fields`` names (section: its fields, each decoded as
    any JSON value); absent fields stay out of ``msgspec.to_builtins``' dict."""
    top: _Fields = [("apiVersion", object, msgspec.UNSET), ("kind", object, msgspec.UNSET)]
    for section, names in fields.items():
        struct = msgspec.defstruct(
            f"{name}_{section}", [(f, object, msgspec.UNSET) for f in names], kw_only=True
        )
        top.append((section, struct | None, msgspec.UNSET))
    return msgspec.json.Decoder(msgspec.defstruct(name, top, kw_only=True))


REDUCED = {kind: _reduced(kind, fields) for kind, fields in parse.READ_FIELDS.items()}
"""The API's Nodes and ServiceCIDRs, decoded into the fields their parsers read."""


def _mapping(value: schema.Schema | None) -> schema.Schema:
    assert value is not None
    return value


LENIENT = Decoders(strict=False)
"""For the API's objects: a field the struct does not declare is skipped."""
STRICT = Decoders(strict=True)
"""For manifests: an object with a field its kind does not know does not fit (the parser names
the field)."""
