"""Objects as a real kube-apiserver sends them, for scale tests and benchmarks.

The builders in ``objects.py`` (and ``bench/gen.py``) give the fields nlproxy reads; a real
server sends much more, and the extra bytes are what a list of 10k Services and 10k
EndpointSlices costs to read and decode. ``dress_service`` and ``dress_slice`` add what a
cluster's objects carry, modelled on kube-apiserver 1.3x JSON: a Service applied by Helm with
``kubectl.kubernetes.io/last-applied-configuration``, ``app.kubernetes.io/*`` labels and its
``managedFields`` (FieldsV1); an EndpointSlice written by the EndpointSlice controller, with the
Service's labels copied, ``endpoints.kubernetes.io/last-change-trigger-time``, an owner
reference, a ``targetRef`` and zone per endpoint, and the controller's ``managedFields``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]

CREATED = "2026-09-14T08:21:37Z"
TRIGGERED = "2026-09-14T08:21:52Z"


def uid_of(*parts: str) -> str:
    """A stable UUID for an object (the same name gives the same uid in every run)."""
    return str(uuid.UUID(bytes=hashlib.sha256("/".join(parts).encode()).digest()[:16], version=4))


def _app_labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": f"{name}-prod",
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/part-of": "storefront",
        "app.kubernetes.io/managed-by": "Helm",
        "helm.sh/chart": "storefront-4.12.3",
    }


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _fields(keys: Mapping[str, Any]) -> dict[str, Any]:
    """FieldsV1 for a map: ``{".": {}, "f:key": {}, ...}``."""
    return {".": {}, **{f"f:{k}": {} for k in keys}}


def dress_service(obj: Mapping[str, Any]) -> Obj:
    """A copy of a Service with the metadata, defaults and status a real server returns."""
    svc = copy.deepcopy(dict(obj))
    meta = svc.setdefault("metadata", {})
    name, ns = meta["name"], meta.get("namespace", "default")
    spec = svc.setdefault("spec", {})
    selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": f"{name}-prod"}
    spec.setdefault("selector", selector)
    labels = {**_app_labels(name), **meta.get("labels", {})}
    applied = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "annotations": {"meta.helm.sh/release-name": f"{name}-prod"},
            "labels": labels,
            "name": name,
            "namespace": ns,
        },
        "spec": {"ports": spec.get("ports", []), "selector": spec["selector"], "type": "ClusterIP"},
    }
    meta.update(
        uid=meta.get("uid") or uid_of("Service", ns, name),
        creationTimestamp=CREATED,
        labels=labels,
        annotations={
            "meta.helm.sh/release-name": f"{name}-prod",
            "meta.helm.sh/release-namespace": ns,
            "kubectl.kubernetes.io/last-applied-configuration": json.dumps(applied) + "\n",
            **meta.get("annotations", {}),
        },
    )
    port_keys = {
        "k:" + _compact({"port": p["port"], "protocol": p.get("protocol", "TCP")}): {
            ".": {},
            "f:name": {},
            "f:port": {},
            "f:protocol": {},
            "f:targetPort": {},
        }
        for p in spec.get("ports", [])
    }
    meta["managedFields"] = [
        {
            "manager": "helm",
            "operation": "Update",
            "apiVersion": "v1",
            "time": CREATED,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {
                    "f:annotations": _fields(meta["annotations"]),
                    "f:labels": _fields(labels),
                },
                "f:spec": {
                    "f:internalTrafficPolicy": {},
                    "f:ports": {".": {}, **port_keys},
                    "f:selector": {},
                    "f:sessionAffinity": {},
                    "f:type": {},
                },
            },
        }
    ]
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    svc.setdefault("status", {"loadBalancer": {}})
    return svc


def dress_slice(obj: Mapping[str, Any], *, zone: str = "zone-a") -> Obj:
    """A copy of an EndpointSlice as the EndpointSlice controller writes it."""
    eps = copy.deepcopy(dict(obj))
    meta = eps.setdefault("metadata", {})
    name, ns = meta["name"], meta.get("namespace", "default")
    service = meta.get("labels", {}).get("kubernetes.io/service-name", name)
    labels = {
        **_app_labels(service),
        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
        **meta.get("labels", {}),
    }
    svc_uid = uid_of("Service", ns, service)
    annotations = {
        "endpoints.kubernetes.io/last-change-trigger-time": TRIGGERED,
        **meta.get("annotations", {}),
    }
    meta.update(
        uid=meta.get("uid") or uid_of("EndpointSlice", ns, name),
        generateName=f"{service}-",
        generation=1,
        creationTimestamp=CREATED,
        labels=labels,
        annotations=annotations,
        ownerReferences=[
            {
                "apiVersion": "v1",
                "kind": "Service",
                "name": service,
                "uid": svc_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        managedFields=[
            {
                "manager": "kube-controller-manager",
                "operation": "Update",
                "apiVersion": "discovery.k8s.io/v1",
                "time": TRIGGERED,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:addressType": {},
                    "f:endpoints": {},
                    "f:metadata": {
                        "f:annotations": _fields(annotations),
                        "f:generateName": {},
                        "f:labels": _fields(labels),
                        "f:ownerReferences": {".": {}, "k:" + _compact({"uid": svc_uid}): {}},
                    },
                    "f:ports": {},
                },
            }
        ],
    )
    for i, ep in enumerate(eps.get("endpoints", [])):
        conditions = ep.setdefault("conditions", {})
        ready = conditions.setdefault("ready", True)
        conditions.setdefault("serving", ready)
        conditions.setdefault("terminating", False)
        pod = f"{service}-7c9f8d6b5-{hashlib.sha256(f'{name}/{i}'.encode()).hexdigest()[:5]}"
        ref = {"kind": "Pod", "namespace": ns, "name": pod, "uid": uid_of("Pod", ns, pod)}
        ep.setdefault("targetRef", ref)
        ep.setdefault("zone", zone)
    return eps
