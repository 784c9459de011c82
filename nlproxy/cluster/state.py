"""Cluster state: the current valid objects, and which services changed.

Sits between the sources (which send ``Change`` events of already parsed objects) and the
planner (which reads a ``ClusterSnapshot``). Like kube-proxy's change trackers it reports the
services whose proxying inputs changed, so unchanged services' plan fragments can be reused.
Nothing here knows nftables; it does no I/O and no logging.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from nlproxy.cluster.claims import NODE_PORT_RANGE, Claims
from nlproxy.cluster.model import (
    Change,
    ClusterObject,
    ClusterSnapshot,
    Delete,
    EndpointSlice,
    Invalid,
    IPAddress,
    IPNetwork,
    Node,
    ObjectRef,
    Replace,
    Service,
    ServiceCIDR,
    ServiceKey,
    Skip,
    Upsert,
)

_SliceId = tuple[str, str]  # (namespace, name) of an EndpointSlice
_SliceIds = _SliceId | tuple[_SliceId, ...]
"""A Service's slices as ``ClusterState`` keeps them: its one slice's id itself (nearly every
Service), or a sorted tuple of two or more (``_ids``)."""
_OBJ = operator.attrgetter("obj")


def _ids(held: _SliceIds) -> tuple[_SliceId, ...]:
    """The slice ids of ``held`` (``_SliceIds``) as a tuple."""
    return (held,) if type(held[0]) is str else held  # type: ignore[return-value]


class ClusterState:
    """The current objects of one node's view of the cluster.

    Rules: an ``Invalid`` change keeps the object's last good version (what is programmed for
    it stays) and records the error; ``Skip`` and ``Delete`` remove the object; ``Replace``
    removes every object of its kind it does not list. Only the Node named ``node_name`` is
    kept; other Nodes are ignored.

    Services claiming one frontend, and external addresses no Service may take, are settled by
    ``claims.py``: the snapshot holds each Service as the planner should see it (left out, or
    without the refused addresses), and :attr:`refused` names what was refused.

    Args:
        node_name: the name of the Node nlproxy runs on.
        external_ip_cidrs: the ranges ``spec.externalIPs`` may take (empty: any).
        service_cidrs: ``--service-cidr``: ranges ClusterIPs may take, besides those of the
            ServiceCIDR objects (none of a family known: any but the refused below).
        cluster_cidrs: ``--cluster-cidr``: the pods' ranges, which no ClusterIP may be in
            (nor in this Node's ``podCIDRs``, nor be one of this node's own addresses).
        node_port_range: the API server's NodePort range; a ``healthCheckNodePort`` outside
            it is refused.
    """

    def __init__(
        self,
        node_name: str,
        *,
        external_ip_cidrs: Iterable[IPNetwork] = (),
        service_cidrs: Iterable[IPNetwork] = (),
        cluster_cidrs: Iterable[IPNetwork] = (),
        node_port_range: tuple[int, int] = NODE_PORT_RANGE,
    ) -> None:
        self._node_name = node_name
        self._services: dict[ServiceKey, Service] = {}
        # What the planner sees: the Services as settled by the claims.
        self._view: dict[ServiceKey, Service] = {}
        self._claims = Claims(
            external_ip_cidrs,
            service_cidrs,
            cluster_cidrs=cluster_cidrs,
            node_port_range=node_port_range,
        )
        self._services_touched: set[ServiceKey] = set()
        self._slices: dict[_SliceId, EndpointSlice] = {}
        # Sorted tuples, not sets: almost every service has one or two slices, and a set costs
        # four times a small tuple (10k services: 2 MB); one slice's id is kept as itself.
        self._slice_ids: dict[ServiceKey, _SliceIds] = {}
        self._node: Node | None = None
        self._cidrs: dict[str, ServiceCIDR] = {}
        self._local_addresses: tuple[IPAddress, ...] = ()
        self._invalid: dict[ObjectRef, str] = {}
        self._unread: dict[str, tuple[str, ...]] = {}  # by kind, as the last Replace said
        # Services deliberately not proxied (headless, ExternalName, another proxy's): their
        # slices are not orphans.
        self._skipped: set[ServiceKey] = set()
        # Snapshot cache: the groups of slices per service are rebuilt only for dirty services,
        # and the mappings are copied only when something in them changed.
        self._groups: dict[ServiceKey, tuple[EndpointSlice, ...]] = {}
        self._dirty_groups: set[ServiceKey] = set()
        self._snapshot: ClusterSnapshot | None = None
        self._services_view: Mapping[ServiceKey, Service] = MappingProxyType({})
        self._services_dirty = False
        self._preloaded: set[ServiceKey] = set()  # taken by preload(), reported by apply()

    @property
    def node_name(self) -> str:
        return self._node_name

    @property
    def invalid(self) -> Mapping[ObjectRef, str]:
        """Current validation errors by object (exit status 3, status reporting)."""
        return MappingProxyType(dict(self._invalid))

    @property
    def unread(self) -> tuple[str, ...]:
        """Where the sources could not read objects they never read before
        (``Replace.unread``), sorted: what is programmed and absent may be theirs."""
        return tuple(sorted({place for places in self._unread.values() for place in places}))

    @property
    def refused(self) -> list[str]:
        """What was refused, one message per Service left out or address refused."""
        return [
            message
            for key in sorted(self._claims.refused)
            for message in self._claims.refused[key].messages(key)
        ]

    def orphans(self, among: Iterable[ObjectRef] | None = None) -> dict[ObjectRef, str]:
        """EndpointSlices whose Service is unknown, with the error naming both.

        Such a slice is almost always a typo in its ``kubernetes.io/service-name`` label; from
        the API it may also have arrived just before its Service, so callers decide when an
        orphan is worth reporting. A Service that is skipped (headless, another proxy's) or
        invalid is known: its slices are not orphans.

        Args:
            among: check only these slices (default: every slice).
        """
        ids = (
            self._slices
            if among is None
            else [(r.namespace, r.name) for r in among if r.kind == "EndpointSlice"]
        )
        out: dict[ObjectRef, str] = {}
        for slice_id in ids:
            eps = self._slices.get(slice_id)
            if eps is None or self._known(eps.service):
                continue
            ref = ObjectRef(kind="EndpointSlice", namespace=slice_id[0], name=slice_id[1])
            out[ref] = f"EndpointSlice {slice_id[0]}/{slice_id[1]}: Service {eps.service} not found"
        return out

    def _known(self, key: ServiceKey) -> bool:
        if key in self._services or key in self._skipped:
            return True
        return ObjectRef(kind="Service", namespace=key.namespace, name=key.name) in self._invalid

    def preload(self, changes: Iterable[Upsert | Skip | Invalid]) -> set[ServiceKey]:
        """Take a page of an initial list as it arrives, before the list is complete: the
        objects are stored (claims settled, as :meth:`apply` does) so that the work is done
        while the API server prepares the next page, not all at once after the last.

        The list itself still comes as a ``Replace`` of every object it holds; applying it then
        finds these objects stored (the same ones: compared by identity first) and only removes
        what it does not list. The services preloaded are reported by that next
        :meth:`apply`, as if it had changed them, so a sync and its accounting (pending
        changes, programming latency) see them then, not before.

        Returns:
            The services whose inputs this page changed (for a caller that prepares work per
            service, such as the restart digest).
        """
        earlier, self._preloaded = self._preloaded, set()
        changed = self.apply(changes)
        earlier |= changed
        self._preloaded = earlier
        return changed

    def apply(self, changes: Iterable[Change]) -> set[ServiceKey]:
        """Apply change events in order.

        Returns:
            The services whose proxying inputs changed: the Service itself or any of its
            EndpointSlices. A change to what planning reads of this Node (``_planned``) or
            to any ServiceCIDR marks every service; one to its labels, taints or deletion
            alone marks none (they decide only ``/healthz``'s ``nodeEligible``).
            A change of ``resourceVersion`` alone is not a change (the model does not hold
            it: the new object equals the old one, which stays). Services :meth:`preload`
            took since the last call are reported too.
        """
        changed: set[ServiceKey] = set()
        if self._preloaded:
            changed, self._preloaded = self._preloaded, set()
        everything = False
        for change in changes:
            if isinstance(change, Replace):
                everything |= self._replace(change, changed)
            else:
                everything |= self._apply_one(change, changed)
        if everything:
            changed.update(self._services, self._slice_ids)
            self._snapshot = None
        # Only Services whose object came or went can change a claim (a slice cannot), unless
        # the service ranges changed: then every ClusterIP is checked against them anew.
        touched = changed & self._services_touched
        self._services_touched = set()
        if everything and (
            self._claims.set_service_ranges(
                net for cidr in self._cidrs.values() for net in cidr.cidrs
            )
            | self._set_node_facts()
        ):
            touched |= self._services.keys()
        settled = self._claims.update(touched, self._services)
        changed |= settled
        self._settle_all(touched | settled)
        return changed

    def _settle_all(self, keys: set[ServiceKey]) -> None:
        """``_settle`` of each of ``keys``; the common case (nothing refused) inline."""
        if self._claims.refused:
            for key in keys:
                self._settle(key)
            return
        services, view = self._services, self._view
        dirty = False
        for key in keys:
            svc = services.get(key)
            if svc is None:
                dirty |= view.pop(key, None) is not None
            elif view.get(key) is not svc:
                view[key] = svc
                dirty = True
        if dirty:
            self._services_dirty = True
            self._snapshot = None

    def _settle(self, key: ServiceKey) -> None:
        """Put ``key``'s Service into the planner's view as the claims have it."""
        svc = self._services.get(key)
        effective = self._claims.effective(svc) if svc is not None else None
        if effective is None:
            if self._view.pop(key, None) is not None:
                self._services_dirty = True
                self._snapshot = None
        elif self._view.get(key) is not effective:
            self._view[key] = effective
            self._services_dirty = True
            self._snapshot = None

    def set_local_addresses(self, addresses: Iterable[IPAddress]) -> set[ServiceKey]:
        """Record this node's interface addresses (sorted, without duplicates): no ClusterIP
        may be one of them.

        Returns:
            Every service when they changed (NodePort addresses may move), else nothing.
        """
        new = tuple(sorted(set(addresses), key=lambda a: (a.version, int(a))))
        if new == self._local_addresses:
            return set()
        self._local_addresses = new
        self._snapshot = None
        if self._set_node_facts():
            keys = set(self._services)
            self._settle_all(keys | self._claims.update(keys, self._services))
        return {*self._services, *self._slice_ids}

    def set_cluster_cidrs(self, cidrs: Iterable[IPNetwork]) -> set[ServiceKey]:
        """``--cluster-cidr`` changed (a ``--config`` file applied in place): no ClusterIP may
        be in the new ranges. Returns the services to plan again (all, when the ranges moved)."""
        self._claims.configured_pods = tuple(cidrs)
        if not self._set_node_facts():
            return set()
        keys = set(self._services)
        self._settle_all(keys | self._claims.update(keys, self._services))
        return keys

    def _set_node_facts(self) -> bool:
        """Hand the claims this node's own addresses and pod ranges; whether they changed."""
        node = self._node
        own = (*self._local_addresses, *(node.addresses if node is not None else ()))
        return self._claims.set_node(own, node.pod_cidrs if node is not None else ())

    def snapshot(self) -> ClusterSnapshot:
        """The valid objects now, for the planner; the same object until something changes."""
        if self._snapshot is not None:
            return self._snapshot
        slices, groups = self._slices, self._groups
        for key in self._dirty_groups:
            ids = self._slice_ids.get(key)
            if not ids:
                groups.pop(key, None)
            elif type(ids[0]) is str:  # one slice
                groups[key] = (slices[ids],)
            else:
                groups[key] = tuple([slices[i] for i in ids])  # type: ignore[index]
        self._dirty_groups.clear()
        if self._services_dirty:
            self._services_view = MappingProxyType(dict(self._view))
            self._services_dirty = False
        self._snapshot = ClusterSnapshot(
            services=self._services_view,
            slices=MappingProxyType(dict(self._groups)),
            node=self._node,
            service_cidrs=tuple(self._cidrs[name] for name in sorted(self._cidrs)),
            local_addresses=self._local_addresses,
            unread=self.unread,
        )
        return self._snapshot

    # Internals: each returns True when the change affects every service.

    def _apply_one(
        self, change: Upsert | Delete | Skip | Invalid, changed: set[ServiceKey]
    ) -> bool:
        # Dispatch on exact types, the common ones first: a cold list goes through here once
        # per object.
        if type(change) is Invalid:
            if change.ref.kind != "Node" or change.ref.name == self._node_name:
                self._invalid[change.ref] = change.error
            return False
        if self._invalid:
            self._invalid.pop(change.ref, None)
        if type(change) is Upsert:
            obj = change.obj
            if type(obj) is EndpointSlice:
                self._store_slice(obj, changed)
                return False
            if type(obj) is Service:
                if self._skipped:
                    self._skipped.discard(obj.key)
                self._store_service(obj, changed)
                return False
            return self._store(obj, changed)
        ref = change.ref
        if ref.kind == "Service":
            key = ServiceKey(namespace=ref.namespace, name=ref.name)
            if type(change) is Skip:
                self._skipped.add(key)
            else:
                self._skipped.discard(key)
        return self._remove(ref, changed)

    def _replace(self, replace: Replace, changed: set[ServiceKey]) -> bool:
        everything = False
        if self._unread.get(replace.kind, ()) != replace.unread:
            self._unread[replace.kind] = replace.unread
            self._snapshot = None
        if self._holds_just(replace):
            # A cold start's list over its preloaded pages: every object listed is the one
            # stored, and nothing else is, so nothing is removed, stored or reported.
            if replace.kind == "Service":
                self._skipped.clear()
            return False
        present = self._refs_of(replace.kind)
        if present or self._invalid:  # on a cold start, nothing to compare the list with
            listed = {change.ref for change in replace.changes}
            for ref in present - listed:
                everything |= self._remove(ref, changed)
            for ref in [r for r in self._invalid if r.kind == replace.kind and r not in listed]:
                del self._invalid[ref]
        if replace.kind == "Service":
            self._skipped.clear()  # the listed Skips add theirs back
        for change in replace.changes:
            everything |= self._apply_one(change, changed)
        return everything

    def _holds_just(self, replace: Replace) -> bool:
        """Whether the state holds exactly the Services (or slices) ``replace`` lists, each as
        the very object listed, in the order listed, and no invalid object: what the general
        path would then do changes nothing. Compared by identity at C speed, without the refs
        that path builds (a list whose pages were preloaded stores them in its order)."""
        kind, changes = replace.kind, replace.changes
        stored: Mapping[Any, object] | None = (
            self._services
            if kind == "Service"
            else self._slices
            if kind == "EndpointSlice"
            else None
        )
        if stored is None or self._invalid or len(changes) != len(stored):
            return False
        # The stored objects are distinct and each is stored under its own key: one listed
        # Upsert per position, of that very object, lists each of them once and nothing else.
        return set(map(type, changes)) <= {Upsert} and all(
            map(operator.is_, map(_OBJ, changes), stored.values())
        )

    def _refs_of(self, kind: str) -> set[ObjectRef]:
        if kind == "Service":
            return {
                ObjectRef(kind=kind, namespace=k.namespace, name=k.name) for k in self._services
            }
        if kind == "EndpointSlice":
            return {ObjectRef(kind=kind, namespace=ns, name=name) for ns, name in self._slices}
        if kind == "Node":
            node = self._node
            return set() if node is None else {ObjectRef(kind=kind, namespace="", name=node.name)}
        if kind == "ServiceCIDR":
            return {ObjectRef(kind=kind, namespace="", name=name) for name in self._cidrs}
        return set()

    def _store_service(self, obj: Service, changed: set[ServiceKey]) -> None:
        key = obj.key
        old = self._services.get(key)
        if old is not None and (old is obj or old == obj):
            # A relist's copy, or the preloaded object itself: the snapshot keeps the object it
            # has (caches go by identity).
            return
        self._services[key] = obj
        self._services_touched.add(key)
        self._services_dirty = True
        self._snapshot = None
        changed.add(key)  # apply() settles its claims and puts it in the view

    def _store(self, obj: ClusterObject, changed: set[ServiceKey]) -> bool:
        match obj:
            case Service():
                self._store_service(obj, changed)
                return False
            case EndpointSlice():
                self._store_slice(obj, changed)
                return False
            case Node():
                if obj.name != self._node_name or obj == self._node:
                    return False
                old, self._node = self._node, obj
                self._snapshot = None  # /healthz reads the Node's taints and deletion from it
                return old is None or _planned(old) != _planned(obj)
            case ServiceCIDR():
                old_cidr = self._cidrs.get(obj.name)
                self._cidrs[obj.name] = obj
                return old_cidr != obj

    def _store_slice(self, obj: EndpointSlice, changed: set[ServiceKey]) -> None:
        slice_id = (obj.namespace, obj.name)
        old = self._slices.get(slice_id)
        if old is not None and (old is obj or old == obj):
            return  # a relist's copy, or the preloaded object itself, as for Services
        self._slices[slice_id] = obj
        self._snapshot = None
        if old is not None and old.service != obj.service:
            self._unlink_slice(old, changed)
        held = self._slice_ids.get(obj.service)
        if held is None:
            self._slice_ids[obj.service] = slice_id
        else:
            ids = _ids(held)
            if slice_id not in ids:
                self._slice_ids[obj.service] = tuple(sorted((*ids, slice_id)))
        self._dirty_groups.add(obj.service)
        changed.add(obj.service)

    def _unlink_slice(self, old: EndpointSlice, changed: set[ServiceKey]) -> None:
        slice_id = (old.namespace, old.name)
        held = self._slice_ids.get(old.service)
        ids = tuple(i for i in _ids(held) if i != slice_id) if held is not None else ()
        if len(ids) > 1:
            self._slice_ids[old.service] = ids
        elif ids:
            self._slice_ids[old.service] = ids[0]
        else:
            self._slice_ids.pop(old.service, None)
        self._dirty_groups.add(old.service)
        changed.add(old.service)

    def _remove(self, ref: ObjectRef, changed: set[ServiceKey]) -> bool:
        if ref.kind == "Service":
            key = ServiceKey(namespace=ref.namespace, name=ref.name)
            if self._services.pop(key, None) is not None:
                self._services_touched.add(key)
                self._view.pop(key, None)
                self._services_dirty = True
                self._snapshot = None
                changed.add(key)
        elif ref.kind == "EndpointSlice":
            old = self._slices.pop((ref.namespace, ref.name), None)
            if old is not None:
                self._snapshot = None
                self._unlink_slice(old, changed)
        elif ref.kind == "Node":
            if self._node is not None and ref.name == self._node.name:
                self._node = None
                return True
        elif ref.kind == "ServiceCIDR":
            return self._cidrs.pop(ref.name, None) is not None
        return False


def _planned(node: Node) -> tuple[object, ...]:
    """What planning reads of this Node: its zone, addresses and pod CIDRs (the planner is
    given the Node without the rest: ``sync/relist.py``'s ``planning_node``)."""
    return (node.zone, node.addresses, node.pod_cidrs)
