"""kube-proxy's IPVS mode as it leaves a node, made by the real tools in a VM whose kernel has
IPVS and dummy devices (the host's test kernel has neither): `ipvsadm` virtual servers, `ipset`
sets referenced from iptables-nft rules, the `kube-ipvs0` dummy with its addresses. `nlproxy
cleanup --kube-proxy` removes exactly kube-proxy's part, once, and nlproxy's Services answer
throughout; a virtual server and an ipset of the node's own stay."""

from __future__ import annotations

import shlex

import cluster
from conftest import Vms, pods_answering, wait_for

NODE1 = cluster.nodes()[0]
WEB_PODS = {p for p, _, _ in cluster.endpoints(cluster.WEB)}
CLUSTER_IP = "10.96.77.1"  # on kube-ipvs0, as kube-proxy binds ClusterIPs
USER_VS = f"{NODE1.ip}:8089"  # not kube-proxy's: the node's address, outside the NodePort range

SETUP = f"""
set -e
modprobe ip_vs
ip link add kube-ipvs0 type dummy
ip addr add {CLUSTER_IP}/32 dev kube-ipvs0
ipset create KUBE-CLUSTER-IP hash:ip,port
ipset add KUBE-CLUSTER-IP {CLUSTER_IP},tcp:80
ipset create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
ipset create KUBE-IPVS-IPS hash:ip
ipset add KUBE-IPVS-IPS {CLUSTER_IP}
ipset create user-allow hash:ip
ipvsadm -A -t {CLUSTER_IP}:80 -s rr
ipvsadm -a -t {CLUSTER_IP}:80 -r 10.244.9.9:8080 -m
ipvsadm -A -t {NODE1.ip}:31777 -s rr
ipvsadm -A -u {CLUSTER_IP}:53 -s rr
ipvsadm -A -t {USER_VS} -s rr
iptables-nft -t nat -N KUBE-SERVICES
iptables-nft -t nat -N KUBE-NODE-PORT
iptables-nft -t nat -A PREROUTING -j KUBE-SERVICES
iptables-nft -t nat -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
iptables-nft -t nat -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
iptables-nft -t nat -A KUBE-NODE-PORT -p tcp -m set --match-set KUBE-NODE-PORT-TCP dst -j ACCEPT
iptables-nft -t filter -N KUBE-IPVS-FILTER
iptables-nft -t filter -A INPUT -j KUBE-IPVS-FILTER
iptables-nft -t filter -A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
iptables-nft -t filter -A KUBE-IPVS-FILTER -m conntrack --ctstate NEW \
  -m set --match-set KUBE-IPVS-IPS dst -j REJECT
"""

TEARDOWN = f"ipvsadm -D -t {USER_VS}; ipset destroy user-allow"


def test_ipvs_leftovers_removed_exactly_once(vms: Vms) -> None:
    node = NODE1.name
    vms.run(node, f"sudo bash -c {shlex.quote(SETUP)}")
    try:
        out = vms.out(node, "sudo nlproxy preflight --api-server https://127.0.0.1:6443 --json")
        assert "3 IPVS virtual servers (kube-proxy, IPVS)" in out
        cleaned = vms.run(node, "sudo nlproxy cleanup --kube-proxy").stdout
        assert "removed: 3 IPVS virtual servers (kube-proxy, IPVS)" in cleaned
        assert "removed: 3 KUBE-* ipsets (kube-proxy, IPVS)" in cleaned
        assert "removed: device kube-ipvs0 with 1 addresses (kube-proxy, IPVS)" in cleaned
        assert "removed: 2 KUBE-* chains in table ip nat (kube-proxy, iptables-nft)" in cleaned
        assert "removed: 1 KUBE-* chains in table ip filter (kube-proxy, iptables-nft)" in cleaned

        services = vms.out(node, "sudo ipvsadm -Ln")
        assert USER_VS in services
        assert CLUSTER_IP not in services
        assert ":31777" not in services
        assert vms.out(node, "sudo ipset list -n").split() == ["user-allow"]
        assert vms.run(node, "ip link show kube-ipvs0", check=False).returncode != 0
        saved = vms.out(node, "sudo iptables-nft-save")
        assert "KUBE-" not in saved
        assert "REJECT" not in saved

        again = vms.out(node, "sudo nlproxy cleanup --kube-proxy")
        assert again == "no kube-proxy rules found"
        wait_for(
            "every web pod answering through node1's node port after the cleanup",
            lambda: pods_answering(vms, "client", "tcp", NODE1.ip, 30080, 40) == WEB_PODS,
        )
    finally:
        vms.run(node, f"sudo bash -c {shlex.quote(TEARDOWN)}", check=False)
