#!/usr/bin/env bash
# Starts libvirt for the VM tests if it is not running, and stops again only what it started.
#   libvirt.sh start|stop
# With systemd as init, start uses systemctl (and stop leaves the system's daemons alone). In a
# container without systemd it runs virtlogd and libvirtd directly and remembers their pids in
# vm-tests/.libvirt-pids, which `stop` uses to end exactly those processes.
set -euo pipefail
pids=$(cd "$(dirname "$0")/.." && pwd)/.libvirt-pids

running() { virsh -c qemu:///system version >/dev/null 2>&1; }

case ${1:-} in
start)
  running && exit 0
  if [ -d /run/systemd/system ]; then
    systemctl start virtlogd.socket libvirtd.socket libvirtd.service
  else
    : >"$pids"
    for d in virtlogd libvirtd; do
      pgrep -x "$d" >/dev/null && continue
      "$d" -d
      sleep 0.5
      pgrep -nx "$d" >>"$pids"
    done
  fi
  for _ in $(seq 30); do running && exit 0; sleep 1; done
  echo "libvirt.sh: libvirtd does not answer on qemu:///system" >&2
  exit 1
  ;;
stop)
  [ -f "$pids" ] || exit 0
  # libvirtd first: it keeps virtlogd busy while it runs.
  tac "$pids" | while read -r pid; do
    kill "$pid" 2>/dev/null || true
    # Wait for it to be gone: a start right after (the next run) would otherwise find the
    # exiting daemon, skip starting one, and then find none answering.
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  rm -f "$pids"
  ;;
*)
  echo "usage: libvirt.sh start|stop" >&2
  exit 2
  ;;
esac
