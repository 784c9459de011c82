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
.venv/bin/python -m pytest -q -p no:cacheprovider vm-tests "$@"
