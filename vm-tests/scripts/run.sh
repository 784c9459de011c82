#!/usr/bin/env bash
# Brings the test VMs up, runs vm-tests/ with the host's .venv python, and destroys the VMs
# whatever happened (also on failure or Ctrl-C). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
export VAGRANT_DEFAULT_PROVIDER=${VAGRANT_DEFAULT_PROVIDER:-libvirt}
log=vm-tests/.last-run
mkdir -p "$log"

teardown() {
  rc=$?
  trap - EXIT INT TERM
  echo "vm-tests: saving the nodes' journals in $log, then destroying the VMs"
  for vm in node1 node2; do
    timeout 60 vagrant ssh "$vm" -c "sudo journalctl -b --no-pager -o short-iso" \
      >"$log/$vm.journal" 2>/dev/null || true
  done
  vagrant destroy -f || rc=1
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

vagrant up
# A host whose kernel hands bridged frames to its own netfilter (bridge-nf-call-iptables=1, as on
# any host running a kubelet) would send the VMs' traffic between each other through the host's
# rules too, and a service proxy on the host would rewrite it: the VM networks' bridges opt out,
# each for itself, leaving the host's setting alone.
for net in nlproxy-vm-net nlproxy-vm-mgmt; do
  br=$(virsh -c qemu:///system net-info "$net" 2>/dev/null | awk '/^Bridge:/ {print $2}')
  if [ -n "$br" ]; then
    ip link set dev "$br" type bridge nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0
  fi
done
.venv/bin/python -m pytest -q -p no:cacheprovider vm-tests "$@"
