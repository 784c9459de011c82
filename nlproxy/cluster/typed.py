"""Typed decoding: Services and EndpointSlices straight from bytes into the model, at C speed.

The fast twin of ``cluster/parse.py`` (which stays the only code that names what is wrong). A
compiled decoder (msgspec) reads each object into small structs holding only the fields the
model needs (declared in ``structs.py``), skipping everything else (``managedFields``,
``last-applied-configuration``) without building it; the common shapes then become model values
with few Python calls, and the rarer sections are read by the readers the parser calls too
(``sections.py``). Whatever is not plainly valid here — a wrong type, an odd value, a field
this module does not handle, and, for hand-written manifests, an unknown field — is handed back
(``None``), and the caller runs the field-by-field parser, which gives the same model for a
valid object and names the field of an invalid one. So this module never makes an
``Invalid``: it only skips work for good objects.

Nodes and ServiceCIDRs (one, and a handful, per cluster) are read by the parser, but from the
API their JSON is first decoded into structs of only the fields the parser reads (a Node's
``status.images`` and ``managedFields`` are skipped in C, never built), which are handed to the
parser as a small dict: the same model, and the same message for an invalid one. Anything the
structs do not fit is parsed whole, as before. Manifests' Nodes and ServiceCIDRs are already
documents and go to the parser as they are. Pure: no I/O, logging or state.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from nlproxy.cluster import parse, sections
from nlproxy.cluster.fields import FieldReader
from nlproxy.cluster.model import (
    Endpoint,
    EndpointPort,
    EndpointSlice,
    Invalid,
    IPAddress,
    IPFamily,
    IPNetwork,
    ObjectRef,
    Protocol,
    Service,
    ServiceKey,
    ServicePort,
    ServicePortRef,
    ServiceType,
    Skip,
    Upsert,
)
from nlproxy.cluster.sections import (
    ADDRESS_TYPES,
    HASH_KEY_ANNOTATION,
    LOAD_BALANCING_ANNOTATION,
    POLICIES,
    SERVICE_NAME_LABEL,
    SOURCE_RANGES_ANNOTATION,
    TRIGGER_TIME_ANNOTATION,
    created_text,
)
from nlproxy.cluster.structs import LENIENT, REDUCED, STRICT
from nlproxy.errors import InvalidObject

FAST_KINDS = frozenset({"Service", "EndpointSlice"})


def change(
    raw: bytes | memoryview, kind: str, proxy_name: str | None = None
) -> Upsert | Skip | Invalid:
    """The change for one object's JSON (an API list item or watch object): typed when it is
    plainly valid, else the parser's (which names what is wrong). ``proxy_name``: this proxy's
    ``service-proxy-name`` (``sections.not_ours``)."""
    fast = from_json(raw, kind, proxy_name) if kind in FAST_KINDS else None
    if fast is not None:
        return fast
    reduced = REDUCED.get(kind)
    if reduced is not None:
        try:
            small = msgspec.to_builtins(reduced.decode(raw))
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass  # not the shape the parser reads: parsed whole, which names what is wrong
        else:
            return parse.to_change(small, kind, proxy_name)
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        doc = exc
    if not isinstance(doc, dict):
        ref = ObjectRef(kind=kind, namespace="", name=sections.UNNAMED)
        return Invalid(ref=ref, error=str(InvalidObject(str(ref), "not a JSON object")))
    return parse.to_change(doc, kind, proxy_name)


def from_json(
    raw: bytes | memoryview, kind: str, proxy_name: str | None = None
) -> Upsert | Skip | None:
    """The change for one object's JSON (an API list item or watch object), or None when the
    parser must read it: the struct does not fit, or the object is not plainly valid."""
    try:
        obj = LENIENT.json[kind].decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, KeyError):
        return None
    return _change(obj, kind, proxy_name)


def from_document(
    doc: Mapping[str, Any], kind: str, proxy_name: str | None = None
) -> Upsert | Skip | None:
    """The change for one manifest object (a decoded document), or None when the parser must
    read it: as ``from_json``, and also when the object has a field the kind does not know
    (the parser's path names it, as ``kubectl --validate=strict`` would)."""
    try:
        obj = msgspec.convert(doc, STRICT.types[kind])
    except (msgspec.ValidationError, KeyError):
        return None
    return _change(obj, kind, proxy_name)


def from_manifest_json(
    raw: bytes | memoryview | msgspec.Raw, kind: str, proxy_name: str | None = None
) -> Upsert | Skip | None:
    """The change for one manifest object's JSON, straight from its bytes (no document is
    built), or None when the parser must read it: as ``from_document`` of its document."""
    try:
        obj = STRICT.json[kind].decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, KeyError):
        return None
    return _change(obj, kind, proxy_name)


def _manifest_service(obj: Any, proxy_name: str | None = None) -> Upsert | Skip | None:
    try:
        return _service_or_raise(obj, proxy_name)
    except (_NotPlain, InvalidObject):
        return None


def _manifest_slice(obj: Any, proxy_name: str | None = None) -> Upsert | Skip | None:
    try:
        return _slice_or_raise(obj, proxy_name)
    except (_NotPlain, InvalidObject):
        return None


MANIFEST_ITEM = STRICT.either
"""Decodes a manifest object's JSON in one call when it is a Service or an EndpointSlice that
says so (``kind``) and has only fields its kind knows, into a struct that ``MANIFEST_READERS``
reads; anything else (another kind, no kind, an unknown field, a wrong type) raises
``msgspec.ValidationError``, and the caller reads it the general way."""
MANIFEST_READERS: dict[
    type[Any], tuple[str, str, Callable[[Any, str | None], Upsert | Skip | None]]
] = {
    t: (kind, group, _manifest_service if kind == "Service" else _manifest_slice)
    for t, kind in STRICT.kind_of.items()
    for group in ["" if kind == "Service" else "discovery.k8s.io"]
}
"""A ``MANIFEST_ITEM`` struct's type to its kind, the API group the kind must come from, and
its reader (of the struct and the proxy's name): the change, or None when the parser must
read the object (it is not plainly valid)."""


def from_struct(obj: Any, kind: str, proxy_name: str | None = None) -> Upsert | Skip | None:
    """The change for one object already decoded into its kind's lenient struct (a list
    page's item, ``kube_http.page_changes``), or None when the parser must read it: what
    ``from_json`` gives for the object's JSON."""
    return _change(obj, kind, proxy_name)


def _change(obj: Any, kind: str, proxy_name: str | None) -> Upsert | Skip | None:
    try:
        if kind == "Service":
            return _service(obj, proxy_name)
        return _slice(obj, proxy_name)
    except InvalidObject:
        return None


class _NotPlain(Exception):
    """Not plainly valid: the parser reads the object."""


MEMO_LIMIT = 4096
"""The most distinct strings each memo below holds (cleared when full): namespaces, port
names and target port names repeat across objects, so each is checked and interned once."""
_NAMESPACES: dict[str | None, str] = {}
_PORT_NAMES: dict[str | None, str] = {}
_TARGET_NAMES: set[str] = set()


def _memo_reset() -> None:
    _NAMESPACES.clear()
    _NAMESPACES.update({None: "default", "": "default"})
    _PORT_NAMES.clear()
    _PORT_NAMES.update({None: "", "": ""})
    _TARGET_NAMES.clear()


_memo_reset()


def memo_sizes() -> tuple[int, int, int]:
    """How many strings the memos hold now (namespaces, port names, target port names): each
    at most ``MEMO_LIMIT``."""
    return len(_NAMESPACES), len(_PORT_NAMES), len(_TARGET_NAMES)


def _label(memo: dict[str | None, str], value: str | None) -> str:
    """``value`` as the one shared copy in ``memo`` (its default when unset) once checked to be
    a DNS label; ``_NotPlain`` if it is not one (the parser names what is wrong)."""
    shared = memo.get(value)
    if shared is not None:
        return shared
    if type(value) is not str or not sections.DNS_LABEL.fullmatch(value):
        raise _NotPlain
    if len(memo) >= MEMO_LIMIT:
        _memo_reset()
    shared = memo[value] = sys.intern(value)
    return shared


def _namespace(namespace: str | None) -> str:
    """A valid namespace, shared ("default" when unset); ``_NotPlain`` if it is not one."""
    return _label(_NAMESPACES, namespace)


def _port_name_of(name: str | None) -> str:
    """A valid port name (a DNS label, or empty), shared; ``_NotPlain`` if it is not one."""
    return _label(_PORT_NAMES, name)


_SERVICE_NAME = sections.NAMES["Service"]
_SLICE_NAME = sections.NAMES["EndpointSlice"]


def _names(obj: Any, kind: str) -> tuple[ObjectRef, Any]:
    """``(ref, metadata)`` when the name and namespace are valid (else ``_NotPlain``)."""
    meta = obj.metadata
    if meta is None:
        raise _NotPlain
    name = meta.name
    pattern, longest, _what = _SERVICE_NAME if kind == "Service" else _SLICE_NAME
    if not name or len(name) > longest or not pattern.fullmatch(name):
        raise _NotPlain
    namespace = _NAMESPACES.get(meta.namespace) or _namespace(meta.namespace)
    return ObjectRef(kind=kind, namespace=namespace, name=name), meta


def _service(obj: Any, proxy_name: str | None) -> Upsert | Skip | None:
    try:
        return _service_or_raise(obj, proxy_name)
    except _NotPlain:
        return None


def _service_or_raise(obj: Any, proxy_name: str | None) -> Upsert | Skip:
    ref, meta = _names(obj, "Service")
    if _not_ours(meta.labels, proxy_name):
        return Skip(ref=ref)
    spec = obj.spec
    if spec is None:
        raise _NotPlain
    kind = spec.type or "ClusterIP"
    if kind == "ExternalName":
        return Skip(ref=ref)
    svc_type = _SERVICE_TYPE.get(kind)
    if svc_type is None:
        raise _NotPlain
    cluster_ips = _cluster_ips(spec) or sections.cluster_ips(
        FieldReader(ref),
        {"clusterIP": spec.clusterIP, "clusterIPs": spec.clusterIPs, "ipFamilies": spec.ipFamilies},
    )
    if cluster_ips is None:
        return Skip(ref=ref)
    external_ips = tuple([_ip(v) for v in spec.externalIPs]) if spec.externalIPs else ()
    etp, itp = spec.externalTrafficPolicy, spec.internalTrafficPolicy
    if (etp and etp not in POLICIES) or (itp and itp not in POLICIES):
        raise _NotPlain
    ext_local = etp == "Local" and (svc_type is not ServiceType.CLUSTER_IP or bool(external_ips))
    health = spec.healthCheckNodePort
    if health is not None and health != 0 and not 1 <= health <= 65535:
        raise _NotPlain
    annotations = meta.annotations
    status = obj.status
    if (
        external_ips
        or ext_local
        or itp == "Local"
        or spec.trafficDistribution
        or spec.loadBalancerSourceRanges
        or spec.sessionAffinity not in _NO_AFFINITY
        or (status is not None and not _empty_status(status))
        or (
            annotations
            and (
                SOURCE_RANGES_ANNOTATION in annotations
                or LOAD_BALANCING_ANNOTATION in annotations
                or HASH_KEY_ANNOTATION in annotations
            )
        )
    ):
        svc = _uncommon_service(ref, meta, spec, status, svc_type, cluster_ips, external_ips)
    else:  # the common case: the other fields keep their defaults (each keyword costs)
        svc = Service(
            key=ServiceKey(namespace=ref.namespace, name=ref.name),
            type=svc_type,
            cluster_ips=cluster_ips,
            ports=_service_ports(ref.namespace, ref.name, spec.ports),
            created=created_text(meta.creationTimestamp),
            uid=meta.uid or "",
        )
    return Upsert(ref=ref, obj=svc)


def _uncommon_service(
    ref: ObjectRef,
    meta: Any,
    spec: Any,
    status: Any,
    svc_type: ServiceType,
    cluster_ips: tuple[IPAddress, ...],
    external_ips: tuple[IPAddress, ...],
) -> Service:
    """A Service with one of the rarer sections (external IPs, a Local policy, load-balancer
    ingress or source ranges, affinity, traffic distribution, nlproxy's annotations), those
    read through the parser's own readers (``sections``); ``_NotPlain`` or ``InvalidObject``
    when it is not plainly valid."""
    r = FieldReader(ref)
    annotations = meta.annotations
    lb_ips: tuple[IPAddress, ...] = ()
    if status is not None and not _empty_status(status):
        lb_ips = sections.load_balancer_ips(r, {"status": status})
    ranges: tuple[IPNetwork, ...] = ()
    if spec.loadBalancerSourceRanges or (annotations and SOURCE_RANGES_ANNOTATION in annotations):
        source = {"loadBalancerSourceRanges": spec.loadBalancerSourceRanges}
        ranges = sections.source_ranges(r, source, annotations or {})
    affinity = None
    if spec.sessionAffinity not in _NO_AFFINITY:
        config = {
            "sessionAffinity": spec.sessionAffinity,
            "sessionAffinityConfig": spec.sessionAffinityConfig,
        }
        affinity = sections.affinity_timeout(r, config)
    balancing: dict[str, Any] = _DEFAULT_BALANCING
    if annotations and (
        LOAD_BALANCING_ANNOTATION in annotations or HASH_KEY_ANNOTATION in annotations
    ):
        balancing = sections.load_balancing(r, annotations)
    etp, itp = spec.externalTrafficPolicy, spec.internalTrafficPolicy
    ext_local = etp == "Local" and (svc_type is not ServiceType.CLUSTER_IP or bool(external_ips))
    health = spec.healthCheckNodePort
    return Service(
        key=ServiceKey(namespace=ref.namespace, name=ref.name),
        type=svc_type,
        cluster_ips=cluster_ips,
        ports=_service_ports(ref.namespace, ref.name, spec.ports),
        external_ips=external_ips,
        load_balancer_ips=lb_ips,
        load_balancer_source_ranges=ranges,
        external_policy_local=ext_local,
        internal_policy_local=itp == "Local",
        affinity_timeout=affinity,
        health_check_node_port=health
        if ext_local and health and svc_type is ServiceType.LOAD_BALANCER
        else None,
        traffic_distribution=spec.trafficDistribution or None,
        created=created_text(meta.creationTimestamp),
        **balancing,
        uid=meta.uid or "",
    )


_not_ours = sections.not_ours
_NO_AFFINITY = (None, "", "None")
# Enum members by value: a lookup, not the enum's Python-level __call__.
_SERVICE_TYPE = {t.value: t for t in ServiceType}
_PROTOCOL_OR_TCP: dict[str | None, Protocol] = {
    None: Protocol.TCP,
    "": Protocol.TCP,
    **{p.value: p for p in Protocol},
}
_DEFAULT_BALANCING: dict[str, Any] = {"load_balancing": None, "hash_source_port": False}


def _cluster_ips(spec: Any) -> tuple[IPAddress, ...] | None:
    """The common case of ``sections.cluster_ips``: one IPv4 ClusterIP, given alike in both
    fields (or only in one), family unset or IPv4; None for anything else."""
    many, single, families = spec.clusterIPs, spec.clusterIP, spec.ipFamilies
    text = many[0] if many is not None and len(many) == 1 else None if many else single
    if text is None or (single and single != text) or families not in (None, [], ["IPv4"]):
        return None
    ip = _v4(text)
    return None if ip is None else (ip,)


def _empty_status(status: object) -> bool:
    if status is None:
        return True
    if type(status) is not dict:
        return False
    lb = status.get("loadBalancer")
    return lb is None or (type(lb) is dict and lb.get("ingress") in (None, []))


def _service_ports(
    namespace: str, service: str, raw_ports: list[Any] | None
) -> tuple[ServicePort, ...]:
    if not raw_ports:
        raise _NotPlain
    several = len(raw_ports) > 1
    names: set[str] = set()
    numbers: set[tuple[int, Protocol]] = set()
    ports: list[ServicePort] = []
    for entry in raw_ports:
        name = _PORT_NAMES.get(entry.name)
        if name is None:
            name = _port_name_of(entry.name)
        protocol = _PROTOCOL_OR_TCP.get(entry.protocol)
        port = entry.port
        if (
            (several and (not name or name in names))
            or protocol is None
            or port is None
            or not 1 <= port <= 65535
            or (port, protocol) in numbers
        ):
            raise _NotPlain
        if several:
            names.add(name)
            numbers.add((port, protocol))
        target = entry.targetPort
        if type(target) is int and 1 <= target <= 65535:
            pass
        elif not target:  # unset, 0 or "": the port
            target = port
        else:
            target = _target_port(target, port)
        node_port = entry.nodePort
        if node_port is not None and (node_port == 0 or not 1 <= node_port <= 65535):
            node_port = _port(node_port, zero_ok=True)
        ports.append(
            ServicePort(
                ref=ServicePortRef(
                    namespace=namespace, name=service, port_name=name, protocol=protocol
                ),
                port=port,
                target_port=target,
                node_port=node_port,
            )
        )
    return tuple(ports)


def _port_name(entry: Any, seen: set[str]) -> tuple[str, Protocol]:
    name = _PORT_NAMES.get(entry.name)
    if name is None:
        name = _port_name_of(entry.name)
    if name in seen:
        raise _NotPlain
    seen.add(name)
    protocol = _PROTOCOL_OR_TCP.get(entry.protocol)
    if protocol is None:
        raise _NotPlain
    return name, protocol


def _target_port(value: int | str | None, port: int) -> int | str:
    if isinstance(value, str):
        if not value:
            return port
        if value not in _TARGET_NAMES:
            if not sections.IANA_SVC_NAME.fullmatch(value):
                raise _NotPlain
            if len(_TARGET_NAMES) >= MEMO_LIMIT:
                _memo_reset()
            _TARGET_NAMES.add(value)
        return value
    number = _port(value, zero_ok=True)
    return port if number is None else number


def _port(value: int | None, *, zero_ok: bool = False) -> int | None:
    if value is None or (zero_ok and value == 0):
        return None
    if not 1 <= value <= 65535:
        raise _NotPlain
    return value


def _ip(text: str) -> IPAddress:
    """``FieldReader.ip`` without the message: the address, or ``_NotPlain``."""
    quick = _v4(text)
    if quick is not None:
        return quick
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise _NotPlain from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        raise _NotPlain
    return ip


def _slice(obj: Any, proxy_name: str | None) -> Upsert | Skip | None:
    try:
        return _slice_or_raise(obj, proxy_name)
    except _NotPlain:
        return None


def _slice_or_raise(obj: Any, proxy_name: str | None) -> Upsert | Skip:
    ref, meta = _names(obj, "EndpointSlice")
    address_type = obj.addressType
    if address_type not in ADDRESS_TYPES:
        raise _NotPlain
    labels = meta.labels
    service_name = labels.get(SERVICE_NAME_LABEL) if labels else None
    if address_type == "FQDN" or not service_name or _not_ours(labels, proxy_name):
        return Skip(ref=ref)
    family = IPFamily.IPV4 if address_type == "IPv4" else IPFamily.IPV6
    annotations = meta.annotations
    trigger = annotations.get(TRIGGER_TIME_ANNOTATION) if annotations else None
    namespace = ref.namespace
    ports = _slice_ports(obj.ports)
    endpoints = _endpoints(obj.endpoints, family)
    service = ServiceKey(namespace=namespace, name=service_name)
    eps = EndpointSlice(
        namespace=namespace,
        name=ref.name,
        service=service,
        family=family,
        ports=ports,
        endpoints=endpoints,
        last_change_trigger_time=sections.trigger_time(trigger) if trigger else None,
    )
    return Upsert(ref=ref, obj=eps)


def _slice_ports(raw: list[Any] | None) -> tuple[EndpointPort, ...]:
    ports: list[EndpointPort] = []
    names: set[str] = set()
    for entry in raw or ():
        name, protocol = _port_name(entry, names)
        port = _port(entry.port)
        if port is not None:
            ports.append(EndpointPort(name=name, port=port, protocol=protocol))
    return tuple(ports)


def _endpoints(raw: list[Any] | None, family: IPFamily) -> tuple[Endpoint, ...]:
    """The endpoints of a slice: the loop that 100k endpoints go through, kept flat."""
    if family is not IPFamily.IPV4 or not _FAST_V4:
        return _endpoints_any(raw, _ipv4 if family is IPFamily.IPV4 else _ipv6)
    if not raw:
        return ()
    out: list[Endpoint] = []
    append = out.append
    names: dict[str | None, str | None] = {None: None}  # sections.shared, once per name
    get = names.get
    new, pton, from_bytes, af_inet, v4 = _new, _pton, int.from_bytes, _AF_INET, _V4
    make = Endpoint
    try:
        for entry in raw:
            if entry.hints is not None:
                raise _NotPlain  # hints: the parser's
            addresses = entry.addresses
            # IPv4Address(number) without its Python-level checks: a third of the cost. The
            # slot is stored as an attribute (the interpreter's own slot store), not through
            # the descriptor's ``__set__``.
            ip = new(v4)
            ip._ip = from_bytes(pton(af_inet, addresses[0]))  # IndexError: none
            if len(addresses) > 1:
                for other in addresses[1:]:
                    pton(af_inet, other)
            node = get(entry.nodeName, _MISSING)
            if node is _MISSING:
                node = names[entry.nodeName] = sys.intern(entry.nodeName) or None
            zone = get(entry.zone, _MISSING)
            if zone is _MISSING:
                zone = names[entry.zone] = sys.intern(entry.zone) or None
            cond = entry.conditions
            if cond is None:  # _PLAIN
                ready = serving = True
                terminating = False
            else:  # _conditions, inline: the one call per endpoint left
                ready = cond.ready is not False
                serving = cond.serving is not False
                terminating = cond.terminating is True
            append(
                make(
                    ip=ip,
                    ready=ready,
                    serving=serving,
                    terminating=terminating,
                    node_name=node,
                    zone=zone,
                )
            )
    except (OSError, ValueError, IndexError):  # inet_pton's, or no address
        raise _NotPlain from None
    return tuple(out)


_MISSING: Any = object()
_PLAIN = (True, True, False)
"""(ready, serving, terminating) of an endpoint without conditions, as kube-proxy reads it."""


def _conditions(cond: Any) -> tuple[bool, bool, bool]:
    """(ready, serving, terminating) of an endpoint's conditions: unset ready or serving
    counts as true, unset terminating as false."""
    return cond.ready is not False, cond.serving is not False, cond.terminating is True


def _endpoints_any(raw: list[Any] | None, address: Any) -> tuple[Endpoint, ...]:
    out: list[Endpoint] = []
    names: dict[str | None, str | None] = {None: None}
    for entry in raw or ():
        addresses = entry.addresses
        if not addresses or entry.hints is not None:
            raise _NotPlain  # hints: the parser's
        first = address(addresses[0])
        for other in addresses[1:]:
            address(other)
        cond = entry.conditions
        ready, serving, terminating = _PLAIN if cond is None else _conditions(cond)
        node, zone = entry.nodeName, entry.zone
        if node not in names:
            names[node] = sections.shared(node)
        if zone not in names:
            names[zone] = sections.shared(zone)
        out.append(
            Endpoint(
                ip=first,
                ready=ready,
                serving=serving,
                terminating=terminating,
                node_name=names[node],
                zone=names[zone],
            )
        )
    return tuple(out)


_pton = socket.inet_pton
_AF_INET = socket.AF_INET
_V4 = ipaddress.IPv4Address
_new: Any = object.__new__


def _fast_v4_works() -> bool:
    """Whether an address built from its number by setting ``_ip`` is the constructor's (the
    layout of CPython's ``ipaddress``); if not, the endpoint loop takes the constructor."""
    try:
        ip = _new(_V4)
        ip._ip = 0x0A000001
    except (TypeError, AttributeError):
        return False
    real = _V4("10.0.0.1")
    return (
        ip == real and hash(ip) == hash(real) and str(ip) == str(real) and ip.packed == real.packed
    )


_FAST_V4 = _fast_v4_works()


def _v4(text: str) -> ipaddress.IPv4Address | None:
    """``quick_ipv4``, building the address from its number as the endpoint loop does."""
    try:
        number = int.from_bytes(_pton(_AF_INET, text))
    except (OSError, ValueError):
        return None
    if not _FAST_V4:
        return _V4(number)
    ip = _new(_V4)
    ip._ip = number
    return ip  # type: ignore[no-any-return]


def _ipv4(text: str) -> ipaddress.IPv4Address:
    """``quick_ipv4``, or ``_NotPlain``."""
    ip = _v4(text)
    if ip is None:
        raise _NotPlain
    return ip


def _ipv6(text: str) -> ipaddress.IPv6Address:
    ip = _ip(text)
    if not isinstance(ip, ipaddress.IPv6Address):
        raise _NotPlain
    return ip
