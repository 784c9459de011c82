"""Disruptions, last because they are: another process flushing the whole ruleset (nlproxy
repairs its table at once) and a node reboot (pods, nlproxy and its rules come back)."""

from __future__ import annotations

import cluster
from conftest import Vms, pods_answering, wait_for

NODE1, NODE2 = cluster.nodes()
WEB_PODS = {p for p, _, _ in cluster.endpoints(cluster.WEB)}


def table_exists(vms: Vms, node: str) -> bool:
    return vms.run(node, "sudo nft list table ip nlproxy >/dev/null", check=False).returncode == 0


def test_flush_ruleset_is_repaired(vms: Vms) -> None:
    start = vms.clock(NODE1.name)
    vms.run(NODE1.name, "sudo nft flush ruleset")
    wait_for(
        "nlproxy's table back on node1 after `nft flush ruleset`",
        lambda: table_exists(vms, NODE1.name),
    )
    events = [line["event"] for line in vms.journal(NODE1.name, since=start)]
    assert "drift.detected" in events, events
    assert vms.main_pid(NODE1.name) != 0
    assert pods_answering(vms, "client", "tcp", NODE1.ip, 30080, 40) == WEB_PODS


def test_node_reboot_brings_back_rules_and_service(vms: Vms) -> None:
    boot_id = vms.out(NODE2.name, "cat /proc/sys/kernel/random/boot_id")
    # The SSH session may die with the node; whether it returns is not the point.
    vms.run(NODE2.name, "sudo systemctl reboot", check=False, timeout=60)
    wait_for(
        "node2 back from its reboot",
        lambda: vms.out(NODE2.name, "cat /proc/sys/kernel/random/boot_id") != boot_id,
        deadline=600,
    )
    wait_for(
        "nlproxy active on node2 after the reboot",
        lambda: vms.out(NODE2.name, "systemctl is-active nlproxy") == "active",
        300,
    )
    assert table_exists(vms, NODE2.name)
    wait_for(
        "every web pod answering through node2's node port after the reboot",
        lambda: pods_answering(vms, "client", "tcp", NODE2.ip, 30080, 40) == WEB_PODS,
        deadline=120,
    )
    from_pod = pods_answering(vms, NODE2.name, "udp", cluster.WEB.cluster_ip, 53, 40, pod="web-2b")
    assert from_pod == WEB_PODS
