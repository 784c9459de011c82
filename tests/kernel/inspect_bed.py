"""Pods on a node in namespaces, wired as a CNI wires them, for the endpoint inspector's tests."""

from __future__ import annotations

from collections.abc import Callable

from tests.netns import sh

MakeNetns = Callable[[str], str]


def ip(ns: str, *args: str) -> str:
    return sh("ip", "-n", ns, *args)


def add_pod(node: str, pod: str, host_if: str, addr: str) -> None:
    """A ptp pod (the ptp plugin, kindnet): veth pair, /32 in the pod, host route on the node.

    As the ptp plugin does, the host end carries the pod's gateway address: without an address
    on the device, the kernel finds no source for a ``scope host`` route (EINVAL).
    """
    ip(node, "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", pod)
    ip(node, "link", "set", host_if, "up")
    ip(pod, "link", "set", "eth0", "up")
    if ":" in addr:
        ip(pod, "addr", "add", f"{addr}/128", "dev", "eth0", "nodad")
    else:
        gateway = addr.rsplit(".", 1)[0] + ".1"
        ip(node, "addr", "add", f"{gateway}/32", "dev", host_if)
        ip(pod, "addr", "add", f"{addr}/32", "dev", "eth0")
        ip(pod, "route", "add", gateway, "dev", "eth0", "scope", "link")
        ip(pod, "route", "add", "default", "via", gateway)
    ip(node, "route", "add", addr, "dev", host_if, "scope", "host")


def node_ns(make_netns: MakeNetns, prefix: str = "node") -> str:
    node = make_netns(prefix)
    ip(node, "addr", "add", "192.168.77.1/32", "dev", "lo")
    return node
