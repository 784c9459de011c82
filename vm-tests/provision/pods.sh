#!/usr/bin/env bash
# Creates this node's pods the way a ptp CNI plugin does, idempotently (run at every boot by
# nlproxy-vm-pods.service): one network namespace per pod on a veth, the pod's /32 on its eth0
# with a default route via the node-side gateway (the pod CIDR's .1, held by every node-side
# veth), and a `scope host` route to the pod on the node. Also routes the other nodes' pod CIDRs
# via those nodes.  Reads /etc/nlproxy-vm/pods ("name ip") and /etc/nlproxy-vm/routes ("cidr via").
set -euo pipefail
conf=/etc/nlproxy-vm
gateway=$(cat "$conf/gateway")

sysctl -q -w net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.default.rp_filter=2

while read -r pod ip; do
  [ -n "$pod" ] || continue
  veth=veth-$pod
  [ -e "/run/netns/$pod" ] || ip netns add "$pod"
  ip -n "$pod" link set lo up
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip link add "$veth" type veth peer name eth0 netns "$pod"
  fi
  ip addr replace "$gateway/32" dev "$veth"
  ip link set "$veth" up
  ip -n "$pod" addr replace "$ip/32" dev eth0
  ip -n "$pod" link set eth0 up
  ip -n "$pod" route replace "$gateway" dev eth0 scope link
  ip -n "$pod" route replace default via "$gateway" dev eth0
  ip route replace "$ip" dev "$veth" scope host
done <"$conf/pods"

# The node network may still be coming up at boot: wait for the next hops to be reachable.
while read -r cidr via; do
  [ -n "$cidr" ] || continue
  for _ in $(seq 60); do
    ip route replace "$cidr" via "$via" 2>/dev/null && break
    sleep 1
  done
  ip route show "$cidr" | grep -q "via $via" || { echo "pods.sh: no route to $cidr via $via" >&2; exit 1; }
done <"$conf/routes"
