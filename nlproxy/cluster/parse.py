"""Parsing and validation of raw Kubernetes objects into the typed cluster model.

The field-by-field reader of raw Kubernetes objects (dicts decoded from JSON or YAML), and with
the section readers it shares with the fast decoder (``sections.py``) the only code that names
what is wrong in one. Both sources (the API watch and the manifests directory) call it, so the
rules are the same for both; ``typed.py`` skips it for plainly valid objects only. It either
returns model values or raises ``InvalidObject`` naming the object and the field; it never lets a
``KeyError``/``TypeError`` out for bad content (field-by-field reading is ``fields.py``'s). It
must not do I/O, log, or keep state.

Semantics follow kube-proxy: headless, ``ExternalName`` and other proxies' Services are skipped
(``None``), FQDN EndpointSlices and slices without a Service are skipped, only the first address
of a slice endpoint is proxied, and unset endpoint conditions mean ready, serving, not terminating.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from nlproxy.cluster import sections
from nlproxy.cluster.fields import FieldReader, describe, quick_ipv4
from nlproxy.cluster.model import (
    ClusterObject,
    Endpoint,
    EndpointPort,
    EndpointSlice,
    Invalid,
    IPAddress,
    IPFamily,
    Node,
    Protocol,
    Service,
    ServiceCIDR,
    ServiceKey,
    ServicePort,
    ServicePortRef,
    ServiceType,
    Skip,
    Upsert,
)
from nlproxy.cluster.sections import (
    DNS_LABEL,
    IANA_SVC_NAME,
    PROTOCOLS,
    SERVICE_NAME_LABEL,
    TRIGGER_TIME_ANNOTATION,
    ZONE_LABEL,
    family_of,
    not_ours,
    object_ref,
    shared,
)
from nlproxy.errors import InvalidObject


def parse_service(obj: Mapping[str, Any], proxy_name: str | None = None) -> Service | None:
    """A v1 Service, or ``None`` when kube-proxy would not proxy it.

    Skipped: ``type: ExternalName``, headless (``clusterIP: None``), Services labelled
    ``.../headless``, and those whose ``service.kubernetes.io/service-proxy-name`` label is
    not ``proxy_name`` (another proxy's; ``not_ours``).

    Raises:
        InvalidObject: naming the field, e.g. ``spec.ports[1].port: 70000 is not in 1..65535``.
    """
    ref = object_ref(obj, "Service")
    r = FieldReader(ref)
    meta, labels = sections.metadata(r, obj, "Service")
    if not_ours(labels, proxy_name):
        return None
    spec = r.mapping(obj.get("spec"), "spec")
    kind = r.choice(spec.get("type"), "spec.type", sections.SERVICE_TYPES, "ClusterIP")
    if kind == "ExternalName":
        return None
    cluster_ips = sections.cluster_ips(r, spec)
    if cluster_ips is None:
        return None
    key = ServiceKey(namespace=ref.namespace, name=ref.name)
    svc_type = ServiceType(kind)
    external_ips = tuple(
        r.ip(v, f) for v, f in r.indexed(spec.get("externalIPs"), "spec.externalIPs")
    )
    # Like upstream's ExternallyAccessible/ExternalPolicyLocal/NeedsHealthCheck: NodePorts,
    # LoadBalancers and ClusterIPs with externalIPs accept external traffic through the node, and
    # only LoadBalancers get a health check node port.
    ext_local = sections.policy_local(r, spec, "externalTrafficPolicy") and (
        svc_type in (ServiceType.NODE_PORT, ServiceType.LOAD_BALANCER) or bool(external_ips)
    )
    health = r.port(spec.get("healthCheckNodePort"), "spec.healthCheckNodePort", zero_ok=True)
    annotations = r.string_map(meta.get("annotations"), "metadata.annotations")
    return Service(
        key=key,
        type=svc_type,
        cluster_ips=cluster_ips,
        ports=_service_ports(r, key, spec),
        external_ips=external_ips,
        load_balancer_ips=sections.load_balancer_ips(r, obj),
        load_balancer_source_ranges=sections.source_ranges(r, spec, annotations),
        external_policy_local=ext_local,
        internal_policy_local=sections.policy_local(r, spec, "internalTrafficPolicy"),
        affinity_timeout=sections.affinity_timeout(r, spec),
        health_check_node_port=health
        if ext_local and svc_type is ServiceType.LOAD_BALANCER
        else None,
        traffic_distribution=r.string(spec.get("trafficDistribution"), "spec.trafficDistribution")
        or None,
        created=sections.created(r, meta),
        **sections.load_balancing(r, annotations),
        uid=r.string(meta.get("uid"), "metadata.uid") or "",
    )


def _service_ports(
    r: FieldReader, key: ServiceKey, spec: Mapping[str, Any]
) -> tuple[ServicePort, ...]:
    raw_ports = r.items(spec.get("ports"), "spec.ports")
    if not raw_ports:
        r.fail("spec.ports", "missing (a Service that is not headless needs at least one port)")
    names: dict[str, str] = {}
    numbers: dict[tuple[int, Protocol], str] = {}
    ports: list[ServicePort] = []
    for i, raw in enumerate(raw_ports):
        f = f"spec.ports[{i}]"
        entry = r.mapping(raw, f)
        if len(raw_ports) > 1 and not r.string(entry.get("name"), f"{f}.name"):
            r.fail(f"{f}.name", "missing (required when a Service has more than one port)")
        name, protocol = _port_name(r, entry, f, names)
        port = r.port(entry.get("port"), f"{f}.port")
        if port is None:
            r.fail(f"{f}.port", "missing")
        if (port, protocol) in numbers:
            r.fail(f"{f}.port", f"{port}/{protocol.value} is also {numbers[port, protocol]}")
        numbers[port, protocol] = f
        ref = ServicePortRef(
            namespace=key.namespace, name=key.name, port_name=name, protocol=protocol
        )
        ports.append(
            ServicePort(
                ref=ref,
                port=port,
                target_port=_target_port(r, entry.get("targetPort"), f"{f}.targetPort", port),
                node_port=r.port(entry.get("nodePort"), f"{f}.nodePort", zero_ok=True),
            )
        )
    return tuple(ports)


def _port_name(
    r: FieldReader, entry: Mapping[str, Any], f: str, seen: dict[str, str]
) -> tuple[str, Protocol]:
    """A port entry's name (a DNS label, unique within the object; ``seen`` maps names to the
    entries that used them) and protocol (TCP by default)."""
    name = shared(r.string(entry.get("name"), f"{f}.name")) or ""
    if name and not DNS_LABEL.fullmatch(name):
        r.fail(f"{f}.name", f"{describe(name)} is not a valid port name (a DNS label)")
    if name in seen:
        r.fail(f"{f}.name", f"duplicate port name {describe(name)} (also {seen[name]})")
    seen[name] = f
    return name, Protocol(r.choice(entry.get("protocol"), f"{f}.protocol", PROTOCOLS, "TCP"))


def _target_port(r: FieldReader, value: object, field: str, port: int) -> int | str:
    """``targetPort``: a number, or a container port name (IANA_SVC_NAME); unset, 0 or "" mean
    the service port, as the API server defaults it."""
    if isinstance(value, str):
        if not value:
            return port
        if not IANA_SVC_NAME.fullmatch(value):
            r.fail(
                field,
                f"{describe(value)} is not a valid port name (at most 15 lowercase letters, "
                "digits and single hyphens, with at least one letter)",
            )
        return value
    number = r.port(value, field, zero_ok=True)
    return port if number is None else number


def parse_endpoint_slice(
    obj: Mapping[str, Any], proxy_name: str | None = None
) -> EndpointSlice | None:
    """A discovery.k8s.io/v1 EndpointSlice, or ``None`` when kube-proxy would ignore it.

    Skipped: ``addressType: FQDN``, slices without the ``kubernetes.io/service-name`` label, and
    slices whose labels are not ``proxy_name``'s (``not_ours``), as their Services are skipped.

    Raises:
        InvalidObject: naming the field, e.g. ``endpoints[2].addresses[0]``.
    """
    ref = object_ref(obj, "EndpointSlice")
    r = FieldReader(ref)
    meta, labels = sections.metadata(r, obj, "EndpointSlice")
    address_type = r.choice(obj.get("addressType"), "addressType", sections.ADDRESS_TYPES, "")
    if not address_type:
        r.fail("addressType", "missing")
    service_name = labels.get(SERVICE_NAME_LABEL, "")
    if address_type == "FQDN" or not service_name or not_ours(labels, proxy_name):
        return None
    family = IPFamily(address_type)
    annotations = r.string_map(meta.get("annotations"), "metadata.annotations")
    es = EndpointSlice(
        namespace=ref.namespace,
        name=ref.name,
        service=ServiceKey(namespace=ref.namespace, name=service_name),
        family=family,
        ports=_slice_ports(r, obj.get("ports")),
        endpoints=tuple(
            _endpoint(r, raw, i, family)
            for i, raw in enumerate(r.items(obj.get("endpoints"), "endpoints"))
        ),
        last_change_trigger_time=sections.trigger_time(annotations.get(TRIGGER_TIME_ANNOTATION)),
    )
    r.string(meta.get("resourceVersion"), "metadata.resourceVersion")  # checked, not kept
    return es


def _slice_ports(r: FieldReader, value: object) -> tuple[EndpointPort, ...]:
    """Usable slice ports; an entry whose ``port`` is null is dropped, as kube-proxy does."""
    ports: list[EndpointPort] = []
    names: dict[str, str] = {}
    for i, raw in enumerate(r.items(value, "ports")):
        f = f"ports[{i}]"
        entry = r.mapping(raw, f)
        name, protocol = _port_name(r, entry, f, names)
        port = r.port(entry.get("port"), f"{f}.port")
        if port is not None:
            ports.append(EndpointPort(name=name, port=port, protocol=protocol))
    return tuple(ports)


def _endpoint(r: FieldReader, raw: object, i: int, family: IPFamily) -> Endpoint:
    """One slice endpoint. Every address is checked, but only the first is proxied: the API
    calls them fungible and kube-proxy uses ``addresses[0]``."""
    quick = _quick_endpoint(raw) if family is IPFamily.IPV4 else None
    if quick is not None:
        return quick
    f = f"endpoints[{i}]"
    entry = r.mapping(raw, f)
    addresses = r.items(entry.get("addresses"), f"{f}.addresses")
    if not addresses:
        r.fail(f"{f}.addresses", "missing (an endpoint needs at least one address)")
    ips = [r.ip(v, f"{f}.addresses[{i}]") for i, v in enumerate(addresses)]
    for i, ip in enumerate(ips):
        if family_of(ip) is not family:
            r.fail(f"{f}.addresses[{i}]", f"{ip} is not an {family.value} address (addressType)")
    cond = r.mapping(entry.get("conditions"), f"{f}.conditions")
    ready = r.boolean(cond.get("ready"), f"{f}.conditions.ready")
    serving = r.boolean(cond.get("serving"), f"{f}.conditions.serving")
    terminating = r.boolean(cond.get("terminating"), f"{f}.conditions.terminating")
    hints = r.mapping(entry.get("hints"), f"{f}.hints")
    return Endpoint(
        ip=ips[0],
        ready=ready is not False,
        serving=serving is not False,
        terminating=terminating is True,
        node_name=shared(r.string(entry.get("nodeName"), f"{f}.nodeName")),
        zone=shared(r.string(entry.get("zone"), f"{f}.zone")),
        hints_zones=_hint_names(r, hints.get("forZones"), f"{f}.hints.forZones"),
        hints_nodes=_hint_names(r, hints.get("forNodes"), f"{f}.hints.forNodes"),
    )


_CONDITIONS = frozenset({"ready", "serving", "terminating"})


def _quick_endpoint(raw: object) -> Endpoint | None:
    """``_endpoint`` of an IPv4 slice for the common case (plain IPv4 addresses, boolean or
    unset conditions, no hints), without building field paths; None when anything is unusual,
    and ``_endpoint`` then reads it field by field (and names what is wrong)."""
    if type(raw) is not dict or raw.get("hints") is not None:
        return None
    addresses = raw.get("addresses")
    if type(addresses) is not list or not addresses:
        return None
    ips = [quick_ipv4(text) if type(text) is str else None for text in addresses]
    first = ips[0]
    if first is None or any(ip is None for ip in ips):
        return None
    cond = raw.get("conditions")
    cond = {} if cond is None else cond
    if type(cond) is not dict or not all(
        type(cond.get(k)) is bool or cond.get(k) is None for k in _CONDITIONS
    ):
        return None
    node, zone = raw.get("nodeName"), raw.get("zone")
    if not (node is None or type(node) is str) or not (zone is None or type(zone) is str):
        return None
    return Endpoint(
        ip=first,
        ready=cond.get("ready") is not False,
        serving=cond.get("serving") is not False,
        terminating=cond.get("terminating") is True,
        node_name=shared(node),
        zone=shared(zone),
    )


def _hint_names(r: FieldReader, value: object, field: str) -> frozenset[str] | None:
    names = [
        r.string(r.mapping(v, f"{field}[{i}]").get("name"), f"{field}[{i}].name") or ""
        for i, v in enumerate(r.items(value, field))
    ]
    return frozenset(names) if names else None


READ_FIELDS: Mapping[str, Mapping[str, list[str]]] = {
    "Node": {
        "metadata": ["name", "namespace", "labels", "deletionTimestamp"],
        "spec": ["podCIDR", "podCIDRs", "taints"],
        "status": ["addresses"],
    },
    "ServiceCIDR": {"metadata": ["name", "namespace", "labels"], "spec": ["cidrs"]},
}
"""The sections and fields ``parse_node`` and ``parse_service_cidr`` (and ``object_ref``) read:
the API's Nodes and ServiceCIDRs are decoded into these alone (``structs.REDUCED``), so a field
either reads must be listed here."""


def parse_node(obj: Mapping[str, Any]) -> Node:
    """A v1 Node: name, labels and zone, addresses (InternalIPs, then ExternalIPs, each in the
    order listed, without repeats) and pod CIDRs (``spec.podCIDRs``, else ``spec.podCIDR``)."""
    r = FieldReader(object_ref(obj, "Node"))
    meta, labels = sections.metadata(r, obj, "Node")
    status = r.mapping(obj.get("status"), "status")
    by_type: dict[str, list[IPAddress]] = {"InternalIP": [], "ExternalIP": []}
    for i, raw in enumerate(r.items(status.get("addresses"), "status.addresses")):
        entry = r.mapping(raw, f"status.addresses[{i}]")
        kind = r.string(entry.get("type"), f"status.addresses[{i}].type") or ""
        if kind in by_type:
            by_type[kind].append(r.ip(entry.get("address"), f"status.addresses[{i}].address"))
    spec = r.mapping(obj.get("spec"), "spec")
    cidrs = r.strings(spec.get("podCIDRs"), "spec.podCIDRs")
    fields = [f"spec.podCIDRs[{i}]" for i in range(len(cidrs))]
    if not cidrs and (single := r.string(spec.get("podCIDR"), "spec.podCIDR")):
        cidrs, fields = [single], ["spec.podCIDR"]
    taints = [
        r.string(r.mapping(t, f"spec.taints[{i}]").get("key"), f"spec.taints[{i}].key") or ""
        for i, t in enumerate(r.items(spec.get("taints"), "spec.taints"))
    ]
    return Node(
        name=meta["name"],
        zone=labels.get(ZONE_LABEL) or None,
        addresses=tuple(dict.fromkeys(by_type["InternalIP"] + by_type["ExternalIP"])),
        pod_cidrs=tuple(r.cidr(c, f, strict=True) for c, f in zip(cidrs, fields, strict=True)),
        labels=tuple(sorted(labels.items())),
        deleting=bool(meta.get("deletionTimestamp")),
        taint_keys=tuple(t for t in taints if t),
    )


def parse_service_cidr(obj: Mapping[str, Any]) -> ServiceCIDR:
    """A networking.k8s.io/v1 ServiceCIDR: ``spec.cidrs``, at most one per family."""
    r = FieldReader(object_ref(obj, "ServiceCIDR"))
    meta, _labels = sections.metadata(r, obj, "ServiceCIDR")
    spec = r.mapping(obj.get("spec"), "spec")
    raw = r.strings(spec.get("cidrs"), "spec.cidrs")
    if not raw:
        r.fail("spec.cidrs", "missing")
    if len(raw) > 2:
        r.fail("spec.cidrs", f"{len(raw)} ranges; at most two, one per family")
    cidrs = tuple(r.cidr(c, f"spec.cidrs[{i}]", strict=True) for i, c in enumerate(raw))
    if len(cidrs) == 2 and cidrs[0].version == cidrs[1].version:
        r.fail("spec.cidrs[1]", f"{cidrs[1]} is the same family as {cidrs[0]}")
    return ServiceCIDR(name=meta["name"], cidrs=cidrs)


_PARSERS: Mapping[str, Callable[[Mapping[str, Any]], ClusterObject | None]] = {
    "Service": parse_service,
    "EndpointSlice": parse_endpoint_slice,
    "Node": parse_node,
    "ServiceCIDR": parse_service_cidr,
}
KINDS = tuple(_PARSERS)


def to_change(
    obj: Mapping[str, Any], kind: str | None = None, proxy_name: str | None = None
) -> Upsert | Skip | Invalid:
    """The change event for one raw object (added or modified); never raises for bad content.

    Args:
        obj: the raw object.
        kind: its kind, when the object itself does not say (API list items).
        proxy_name: this proxy's ``service-proxy-name`` (None: the default proxy's objects).

    Returns:
        ``Upsert`` with the parsed object, ``Skip`` for one that is deliberately not proxied,
        ``Invalid`` with the error message for one that fails validation or is of another kind.
    """
    ref = object_ref(obj, kind)
    parser = _PARSERS.get(ref.kind)
    if parser is None:
        error = InvalidObject(str(ref), f"not one of {', '.join(KINDS)}", field="kind")
        return Invalid(ref=ref, error=str(error))
    try:
        if ref.kind == "Service":
            parsed: ClusterObject | None = parse_service(obj, proxy_name)
        elif ref.kind == "EndpointSlice":
            parsed = parse_endpoint_slice(obj, proxy_name)
        else:
            parsed = parser(obj)
    except InvalidObject as exc:
        return Invalid(ref=ref, error=str(exc))
    if parsed is None:
        return Skip(ref=ref)
    return Upsert(ref=ref, obj=parsed)
