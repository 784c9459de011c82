"""The struct types the compiled decoder of ``typed.py`` reads objects into.

Each holds only the fields the model needs, so msgspec skips everything else
(``managedFields``, ``last-applied-configuration``) without building it. Two families: lenient
for the API, strict for manifests (every other field the schema knows is declared, unused, and
an unknown one is refused, so such an object goes to the parser, which names the field). Nodes
and ServiceCIDRs get reduced decoders of the fields the parser reads. Declarations only: no
I/O, logging or state.
"""

from __future__ import annotations

from typing import Any

import msgspec

from nlproxy.cluster import schema

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
    if tag is None:
        return msgspec.defstruct(
            name, fields, kw_only=True, forbid_unknown_fields=strict, omit_defaults=True
        )
    return msgspec.defstruct(
        name,
        [f for f in fields if f[0] != "kind"],
        kw_only=True,
        forbid_unknown_fields=strict,
        omit_defaults=True,
        tag_field="kind",
        tag=tag,
    )


class _Family:
    """The struct types of one decoding mode (lenient for the API, strict for manifests)."""

    def __init__(self, *, strict: bool) -> None:
        s = strict
        str_map = dict[str, str]
        opt_str = str | None
        meta = _struct(
            "Meta",
            [
                ("name", opt_str, None),
                ("namespace", opt_str, None),
                ("labels", str_map | None, None),
                ("annotations", str_map | None, None),
                ("resourceVersion", opt_str, None),
                ("creationTimestamp", opt_str, None),
                ("uid", opt_str, None),
            ],
            schema.METADATA,
            strict=s,
        )
        port = _struct(
            "ServicePort",
            [
                ("name", opt_str, None),
                ("protocol", opt_str, None),
                ("port", int | None, None),
                ("targetPort", int | str | None, None),
                ("nodePort", int | None, None),
            ],
            schema.SERVICE_PORT,
            strict=s,
        )
        spec_schema = schema.SERVICE["spec"]
        assert spec_schema is not None
        spec = _struct(
            "ServiceSpec",
            [
                ("type", opt_str, None),
                ("clusterIP", opt_str, None),
                ("clusterIPs", list[str] | None, None),
                ("ipFamilies", list[str] | None, None),
                ("ports", list[port] | None, None),  # type: ignore[valid-type]
                ("externalIPs", list[str] | None, None),
                ("externalTrafficPolicy", opt_str, None),
                ("internalTrafficPolicy", opt_str, None),
                ("healthCheckNodePort", int | None, None),
                ("loadBalancerSourceRanges", list[str] | None, None),
                ("sessionAffinity", opt_str, None),
                ("sessionAffinityConfig", object, None),
                ("trafficDistribution", opt_str, None),
            ],
            spec_schema,
            strict=s,
        )
        top = [("apiVersion", object, None), ("kind", object, None), ("metadata", meta, None)]
        service_fields = [*top, ("spec", spec | None, None), ("status", object, None)]
        self.service = _struct("Service", service_fields, schema.SERVICE, strict=s)
        conditions = _struct(
            "Conditions",
            [(k, bool | None, None) for k in ("ready", "serving", "terminating")],
            _mapping(schema.ENDPOINT["conditions"]),
            strict=s,
        )
        endpoint = _struct(
            "Endpoint",
            [
                ("addresses", list[str], msgspec.NODEFAULT),
                ("conditions", conditions | None, None),
                ("nodeName", opt_str, None),
                ("zone", opt_str, None),
                ("hints", object, None),
            ],
            schema.ENDPOINT,
            strict=s,
        )
        slice_port = _struct(
            "EndpointPort",
            [("name", opt_str, None), ("protocol", opt_str, None), ("port", int | None, None)],
            _mapping(schema.ENDPOINT_SLICE["ports"]),
            strict=s,
        )
        slice_fields = [
            *top,
            ("addressType", opt_str, None),
            ("ports", list[slice_port] | None, None),  # type: ignore[valid-type]
            ("endpoints", list[endpoint] | None, None),  # type: ignore[valid-type]
        ]
        self.slice = _struct("EndpointSlice", slice_fields, schema.ENDPOINT_SLICE, strict=s)
        self.json = {
            "Service": msgspec.json.Decoder(self.service),
            "EndpointSlice": msgspec.json.Decoder(self.slice),
        }
        self.types = {"Service": self.service, "EndpointSlice": self.slice}
        # The same structs tagged by kind: an object of either kind in one decode.
        tagged_service = _struct("Service", service_fields, schema.SERVICE, strict=s, tag="Service")
        tagged_slice = _struct(
            "EndpointSlice", slice_fields, schema.ENDPOINT_SLICE, strict=s, tag="EndpointSlice"
        )
        self.kind_of: dict[type[Any], str] = {
            tagged_service: "Service",
            tagged_slice: "EndpointSlice",
        }
        self.either = msgspec.json.Decoder(tagged_service | tagged_slice)


def _reduced(name: str, fields: dict[str, list[str]]) -> msgspec.json.Decoder[Any]:
    """A lenient decoder of the sections ``fields`` names (section: its fields, each decoded as
    any JSON value); absent fields stay out of ``msgspec.to_builtins``' dict."""
    top: _Fields = [("apiVersion", object, msgspec.UNSET), ("kind", object, msgspec.UNSET)]
    for section, names in fields.items():
        struct = msgspec.defstruct(
            f"{name}_{section}", [(f, object, msgspec.UNSET) for f in names], kw_only=True
        )
        top.append((section, struct | None, msgspec.UNSET))
    return msgspec.json.Decoder(msgspec.defstruct(name, top, kw_only=True))


_REDUCED = {
    "Node": _reduced(
        "Node",
        {
            "metadata": ["name", "namespace", "labels", "deletionTimestamp"],
            "spec": ["podCIDR", "podCIDRs", "taints"],
            "status": ["addresses"],
        },
    ),
    "ServiceCIDR": _reduced(
        "ServiceCIDR",
        {"metadata": ["name", "namespace", "labels"], "spec": ["cidrs"]},
    ),
}
"""The fields ``parse.parse_node`` and ``parse.parse_service_cidr`` (and ``object_ref``) read."""


def _mapping(value: schema.Schema | None) -> schema.Schema:
    assert value is not None
    return value


_LENIENT = _Family(strict=False)
_STRICT = _Family(strict=True)
