#!/usr/bin/env bash
# Provisions a node VM: Debian packages, nlproxy from its Debian package (the host builds it into
# /vagrant/vm-tests/.deb with `make deb`: /opt/nlproxy, the systemd unit, the nlproxy user, so the
# VM needs neither PyPI nor a compiler), pods with echo servers, manifests.
#   node.sh NODE-NAME
set -euo pipefail
node=$1
src=/vagrant
vmt=$src/vm-tests
lib=/usr/local/lib/nlproxy-vm

bash "$vmt/provision/packages.sh"
install -d "$lib" /etc/nlproxy-vm
install -m 0644 "$vmt/provision/echo.py" "$vmt/provision/probe.py" "$lib/"
install -m 0755 "$vmt/provision/pods.sh" /usr/local/sbin/nlproxy-vm-pods

# Pods: one namespace and echo server each, re-created at every boot.
python3 "$vmt/cluster.py" pods "$node" >/etc/nlproxy-vm/pods
python3 "$vmt/cluster.py" routes "$node" >/etc/nlproxy-vm/routes
python3 - "$vmt/cluster.py" "$node" >/etc/nlproxy-vm/gateway <<'PY'
import ipaddress, runpy, sys
cluster = runpy.run_path(sys.argv[1])
print(ipaddress.ip_network(cluster["node"](sys.argv[2]).pod_cidr)[1])
PY
ip=$(command -v ip)
cat >/etc/systemd/system/nlproxy-vm-pods.service <<UNIT
[Unit]
Description=nlproxy VM tests: pod namespaces, veths and routes
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/nlproxy-vm-pods

[Install]
WantedBy=multi-user.target
UNIT
cat >/etc/systemd/system/nlproxy-vm-echo@.service <<UNIT
[Unit]
Description=nlproxy VM tests: echo server in pod %i
After=nlproxy-vm-pods.service
Requires=nlproxy-vm-pods.service

[Service]
ExecStart=$ip netns exec %i /usr/bin/python3 $lib/echo.py %i 8080
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now nlproxy-vm-pods.service
while read -r pod _; do
  systemctl enable --now "nlproxy-vm-echo@$pod.service"
done </etc/nlproxy-vm/pods

# nlproxy itself, as a node operator installs it. Reinstalled on every provisioning run: the
# tree may have changed with the version unchanged. --force-confold keeps /etc/default/nlproxy as
# written below on a re-run.
debs=("$vmt"/.deb/nlproxy_*.deb)
if [ ! -f "${debs[0]}" ]; then
  echo "node.sh: no package in $vmt/.deb (make -C vm-tests deb)" >&2
  exit 1
fi
DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold "${debs[0]}"
/opt/nlproxy/bin/nlproxy version

install -d -m 0755 /etc/nlproxy /etc/nlproxy/manifests
python3 "$vmt/cluster.py" manifests /etc/nlproxy/manifests
cat >/etc/default/nlproxy <<EOF2
NLPROXY_ARGS="--manifests /etc/nlproxy/manifests --node-name $node --cluster-cidr $(python3 "$vmt/cluster.py" get cluster_cidr) --service-cidr $(python3 "$vmt/cluster.py" get service_cidr)"
EOF2
systemctl enable nlproxy.service
systemctl restart nlproxy.service
systemctl is-active nlproxy.service
