"""The sections of a raw Kubernetes object that both readers of ``cluster/`` read.

The field parser (``parse.py``) and the fast decoder (``typed.py``) read an object's metadata
and a Service's rarer sections (cluster IPs, load-balancer ingress, source ranges, affinity,
nlproxy's annotations) and an EndpointSlice's trigger time through these readers, so that both
give the same model and the same message. Each reader takes a ``FieldReader`` naming the object
and returns model values or raises ``InvalidObject`` naming the field. Pure: no I/O, logging or
state.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from nlproxy.cluster.fields import FieldReader, describe
from nlproxy.cluster.model import (
    IPAddress,
    IPFamily,
    IPNetwork,
    LoadBalancing,
    ObjectRef,
    Protocol,
    ServiceType,
)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
HEADLESS_LABEL = "service.kubernetes.io/headless"
ZONE_LABEL = "topology.kubernetes.io/zone"
SOURCE_RANGES_ANNOTATION = "service.beta.kubernetes.io/load-balancer-source-ranges"
TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
LOAD_BALANCING_ANNOTATION = "nlproxy.io/load-balancing"
HASH_KEY_ANNOTATION = "nlproxy.io/consistent-hash-key"
_HASH_KEYS = ("client-ip", "client-ip-port")
DEFAULT_AFFINITY_TIMEOUT = 10800
MAX_AFFINITY_TIMEOUT = 86400
NAMESPACED_KINDS = frozenset({"Service", "EndpointSlice"})
UNNAMED = "(unnamed)"

# kube-proxy's informers select objects without these labels; the EndpointSlice controller copies
# a Service's labels to its slices, so both kinds are filtered the same way.
_SKIP_LABELS = frozenset({SERVICE_PROXY_NAME_LABEL, HEADLESS_LABEL})


def not_ours(labels: Mapping[str, str] | None, proxy_name: str | None) -> bool:
    """Whether an object with ``labels`` is left to another proxy, or is a headless Service's.

    kube-proxy's convention: a proxy started with a name serves exactly the objects whose
    ``service.kubernetes.io/service-proxy-name`` label is that name, and the unnamed default
    (``proxy_name`` None) serves those without the label. Headless objects are nobody's.
    """
    if proxy_name is None:
        return labels is not None and not _SKIP_LABELS.isdisjoint(labels)
    return (
        not labels or labels.get(SERVICE_PROXY_NAME_LABEL) != proxy_name or HEADLESS_LABEL in labels
    )


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# What the API server accepts as each kind's name (apimachinery's validation), so a manifest
# it would refuse is named here instead of failing the kernel's batch for every Service.
NAMES: dict[str, tuple[re.Pattern[str], int, str]] = {
    "Service": (_DNS_1035_LABEL, 63, "a DNS-1035 label: a-z, 0-9 and '-', starting with a letter"),
    "EndpointSlice": (_DNS_SUBDOMAIN, 253, "a DNS-1123 subdomain: a-z, 0-9, '-' and '.'"),
    "Node": (_DNS_SUBDOMAIN, 253, "a DNS-1123 subdomain: a-z, 0-9, '-' and '.'"),
    "ServiceCIDR": (_DNS_SUBDOMAIN, 253, "a DNS-1123 subdomain: a-z, 0-9, '-' and '.'"),
}
IANA_SVC_NAME = re.compile(r"(?=.*[a-z])(?!.*--)[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?")
PROTOCOLS = tuple(p.value for p in Protocol)
SERVICE_TYPES = (*(t.value for t in ServiceType), "ExternalName")
_FAMILIES = tuple(f.value for f in IPFamily)
POLICIES = ("Cluster", "Local")
_AFFINITIES = ("None", "ClientIP")
ADDRESS_TYPES = ("IPv4", "IPv6", "FQDN")


def shared(name: str | None) -> str | None:
    """A name that many objects repeat (node, zone, namespace, port name), as one shared string
    rather than a copy per object (100k endpoints name a handful of nodes); None when empty."""
    return sys.intern(name) if name else None


def family_of(ip: IPAddress | IPNetwork) -> IPFamily:
    """The family of an address or a network."""
    return IPFamily.IPV4 if ip.version == 4 else IPFamily.IPV6


def object_ref(obj: Mapping[str, Any], kind: str | None = None) -> ObjectRef:
    """The identity of a raw object, read leniently so even a malformed object can be named.

    Args:
        obj: the raw object.
        kind: its kind when the object does not say (list items from the API omit ``kind``).

    Returns:
        The ref; a namespaced kind without ``metadata.namespace`` is in ``default`` (as
        ``kubectl apply`` does), a missing name reads ``(unnamed)``.
    """
    if kind is None:
        raw_kind = obj.get("kind")
        kind = raw_kind if isinstance(raw_kind, str) else ""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name")
    namespace = meta.get("namespace")
    if kind in NAMESPACED_KINDS:
        namespace = shared(namespace if isinstance(namespace, str) else None) or "default"
    else:
        namespace = ""
    return ObjectRef(
        kind=kind, namespace=namespace, name=name if isinstance(name, str) and name else UNNAMED
    )


def metadata(
    r: FieldReader, obj: Mapping[str, Any], kind: str
) -> tuple[Mapping[str, Any], dict[str, str]]:
    """``(metadata, labels)``, checking the name and namespace as the API server does."""
    meta = r.mapping(obj.get("metadata"), "metadata")
    name = r.string(meta.get("name"), "metadata.name")
    if not name:
        r.fail("metadata.name", "missing")
    pattern, longest, what = NAMES[kind]
    if len(name) > longest or not pattern.fullmatch(name):
        r.fail("metadata.name", f"{describe(name)} is not a valid {kind} name ({what}, "
               f"at most {longest} characters)")  # fmt: skip
    namespace = r.string(meta.get("namespace"), "metadata.namespace")
    if namespace and not DNS_LABEL.fullmatch(namespace):
        r.fail(
            "metadata.namespace",
            f"{describe(namespace)} is not a valid namespace (a DNS-1123 label: a-z, 0-9 and "
            "'-', at most 63 characters)",
        )
    return meta, r.string_map(meta.get("labels"), "metadata.labels")


def created(r: FieldReader, meta: Mapping[str, Any]) -> str:
    """``metadata.creationTimestamp``, once ``metadata.resourceVersion`` is checked (a string,
    which the model does not keep: a new one alone changes nothing proxied)."""
    r.string(meta.get("resourceVersion"), "metadata.resourceVersion")
    return created_text(meta.get("creationTimestamp"))


def created_text(value: object) -> str:
    """A creation timestamp as the model keeps it: RFC 3339 in UTC to the second
    (``YYYY-MM-DDTHH:MM:SSZ``, as the API server writes it), so that its text sorts as its
    instant; ``""`` when it is missing or not a timestamp (``"0"``), which sorts after the
    others. (YAML may have read it as a datetime.) Only ordered, never refused."""
    if type(value) is str and len(value) == 20 and value[19] == "Z" and value[10] == "T":
        return value  # the API's own form: the common case, as it is
    if isinstance(value, str):
        value = value.upper()  # RFC 3339 allows "t" and "z"; fromisoformat does not
        if "T" not in value:
            return ""
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return ""
    if not isinstance(value, datetime):
        return ""
    when = value.astimezone(UTC) if value.tzinfo else value
    return (
        f"{when.year:04}-{when.month:02}-{when.day:02}T"
        f"{when.hour:02}:{when.minute:02}:{when.second:02}Z"
    )


def load_balancing(r: FieldReader, annotations: Mapping[str, str]) -> dict[str, Any]:
    """nlproxy's own annotations: the endpoint choice and, for consistent hashing, its key. The
    API server never validates annotations, so a value nlproxy does not know (a typo such as
    ``roundrobin``) keeps the default and is noted in ``annotation_warnings``, as kube-proxy
    treats an unknown ``ipvs.scheduler``: the Service stays up."""
    warnings: list[str] = []
    lb = _annotation(r, annotations, LOAD_BALANCING_ANNOTATION, tuple(LoadBalancing), warnings)
    key = _annotation(r, annotations, HASH_KEY_ANNOTATION, _HASH_KEYS, warnings)
    return {
        "load_balancing": LoadBalancing(lb) if lb else None,
        "hash_source_port": key == "client-ip-port",
        "annotation_warnings": tuple(warnings),
    }


def _annotation(
    r: FieldReader, annotations: Mapping[str, str], name: str, choices: tuple[str, ...],
    warnings: list[str],
) -> str:  # fmt: skip
    field = f"metadata.annotations[{name}]"
    text = r.string(annotations.get(name), field) or ""
    if text and text not in choices:
        warnings.append(
            f"{field}: {describe(text)} is not one of {', '.join(choices)}; the default is kept"
        )
        return ""
    return text


def policy_local(r: FieldReader, spec: Mapping[str, Any], policy: str) -> bool:
    """Whether ``spec.<policy>`` (a traffic policy) is ``Local``; unset means ``Cluster``."""
    return r.choice(spec.get(policy), f"spec.{policy}", POLICIES, "Cluster") == "Local"


def cluster_ips(r: FieldReader, spec: Mapping[str, Any]) -> tuple[IPAddress, ...] | None:
    """``spec.clusterIPs`` (or ``spec.clusterIP``) checked against ``spec.ipFamilies``; ``None``
    for a headless Service."""
    single = r.string(spec.get("clusterIP"), "spec.clusterIP") or ""
    raw = r.strings(spec.get("clusterIPs"), "spec.clusterIPs")
    if "None" in (single, *raw[:1]):
        return None
    field = "spec.clusterIPs"
    if not raw:
        if not single:
            r.fail("spec.clusterIP", "missing (only a headless Service, clusterIP None, has none)")
        raw, field = [single], "spec.clusterIP"
    elif single and single != raw[0]:
        r.fail(
            "spec.clusterIPs[0]",
            f"{describe(raw[0])} differs from spec.clusterIP {describe(single)}",
        )
    if len(raw) > 2:
        r.fail("spec.clusterIPs", f"{len(raw)} addresses; at most two, one per family")
    fields = [field] if field == "spec.clusterIP" else [f"{field}[{i}]" for i in range(len(raw))]
    ips = tuple(r.ip(v, f) for v, f in zip(raw, fields, strict=True))
    if len(ips) == 2 and ips[0].version == ips[1].version:
        r.fail(fields[1], f"{ips[1]} is the same family as {ips[0]}; dual-stack needs one of each")
    families: list[IPFamily] = []
    for i, v in enumerate(r.strings(spec.get("ipFamilies"), "spec.ipFamilies")):
        family = r.choice(v, f"spec.ipFamilies[{i}]", _FAMILIES, "")
        if not family:
            r.fail(f"spec.ipFamilies[{i}]", "empty")
        families.append(IPFamily(family))
    if len(set(families)) != len(families):
        r.fail("spec.ipFamilies", "lists a family twice")
    if families and len(families) < len(ips):
        r.fail("spec.ipFamilies", f"lists {len(families)} families for {len(ips)} cluster IPs")
    for i, (ip, family) in enumerate(zip(ips, families, strict=False)):
        if family_of(ip) is not family:
            r.fail(fields[i], f"{ip} is not {family.value} (spec.ipFamilies[{i}])")
    return ips


def load_balancer_ips(r: FieldReader, obj: Mapping[str, Any]) -> tuple[IPAddress, ...]:
    """Ingress IPs of VIP-mode load balancers; ``ipMode: Proxy`` ones deliver traffic to the
    node themselves, so kube-proxy ignores them (as it does hostname-only entries)."""
    status = r.mapping(
        r.mapping(obj.get("status"), "status").get("loadBalancer"), "status.loadBalancer"
    )
    ips: list[IPAddress] = []
    field = "status.loadBalancer.ingress"
    for i, raw in enumerate(r.items(status.get("ingress"), field)):
        entry = r.mapping(raw, f"{field}[{i}]")
        mode = r.choice(entry.get("ipMode"), f"{field}[{i}].ipMode", ("VIP", "Proxy"), "VIP")
        if entry.get("ip") not in (None, "") and mode == "VIP":
            ips.append(r.ip(entry.get("ip"), f"{field}[{i}].ip"))
    return tuple(ips)


def source_ranges(
    r: FieldReader, spec: Mapping[str, Any], annotations: Mapping[str, str]
) -> tuple[IPNetwork, ...]:
    """``spec.loadBalancerSourceRanges``, else the older comma-separated annotation. Surrounding
    whitespace is tolerated and host bits are ignored, as the API server lets both through."""
    field = "spec.loadBalancerSourceRanges"
    values = r.strings(spec.get("loadBalancerSourceRanges"), field)
    fields = [f"{field}[{i}]" for i in range(len(values))]
    if not values and annotations.get(SOURCE_RANGES_ANNOTATION, "").strip():
        values = annotations[SOURCE_RANGES_ANNOTATION].split(",")
        fields = [f"metadata.annotations[{SOURCE_RANGES_ANNOTATION}]"] * len(values)
    return tuple(r.cidr(v, f, strict=False) for v, f in zip(values, fields, strict=True))


def affinity_timeout(r: FieldReader, spec: Mapping[str, Any]) -> int | None:
    """The ``ClientIP`` session affinity's timeout (its default when unset), or None without
    affinity."""
    affinity = r.choice(spec.get("sessionAffinity"), "spec.sessionAffinity", _AFFINITIES, "None")
    if affinity != "ClientIP":
        return None
    field = "spec.sessionAffinityConfig.clientIP.timeoutSeconds"
    config = r.mapping(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig")
    client = r.mapping(config.get("clientIP"), "spec.sessionAffinityConfig.clientIP")
    timeout = r.integer(client.get("timeoutSeconds"), field, 1, MAX_AFFINITY_TIMEOUT)
    return DEFAULT_AFFINITY_TIMEOUT if timeout is None else timeout


def trigger_time(value: str | None) -> datetime | None:
    """The RFC 3339 trigger time; kube-proxy ignores a value it cannot parse, and so do we
    (the annotation only feeds a latency metric)."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
