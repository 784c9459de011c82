#!/usr/bin/env bash
# Provisions the outside client: the probe tool, and a route to the service CIDR through a node
# (the way an upstream router would send ClusterIP traffic into the cluster).
#   client.sh SERVICE-CIDR GATEWAY
set -euo pipefail
cidr=$1 via=$2
bash /vagrant/vm-tests/provision/packages.sh
install -d /usr/local/lib/nlproxy-vm
install -m 0644 /vagrant/vm-tests/provision/probe.py /usr/local/lib/nlproxy-vm/
ip=$(command -v ip)
cat >/etc/systemd/system/nlproxy-vm-route.service <<UNIT
[Unit]
Description=nlproxy VM tests: route $cidr via $via
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for i in \$(seq 60); do $ip route replace $cidr via $via && exit 0; sleep 1; done; exit 1'

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable nlproxy-vm-route.service
systemctl restart nlproxy-vm-route.service
