"""The conntrack table's size and timeouts, as kube-proxy sets them (its ``conntrack`` section).

A node switched from kube-proxy keeps what kube-proxy set only until the next reboot unless the
proxy sets it again, so nlproxy does, with kube-proxy's defaults and meaning: an unset field
takes the default, 0 leaves the kernel's value alone. Written to ``/proc/sys`` in the node's
network namespace (no exec). Where the process may not (a systemd user with two capabilities,
a read-only ``/proc/sys``), one warning says exactly what to set; ``run --init-only`` sets them
with the privileges the daemon does not keep (the DaemonSet's privileged init container, the
systemd unit's ``ExecStartPre=+``). ``deploy/sysctl/``'s ``sysctl.d`` file holds the timeouts
only: a fixed table size there would lower a larger one at every boot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nlproxy.netlink import netns

PROC = Path("/proc/sys/net/netfilter")
HASHSIZE = Path("/sys/module/nf_conntrack/parameters/hashsize")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConntrackConfig:
    """kube-proxy's ``conntrack`` section; None or 0 leaves that value alone.

    Attributes:
        max_per_core, min: ``nf_conntrack_max`` is ``max(max_per_core * CPUs, min)``, raised
            only (a larger value already set stays).
        tcp_established_timeout, tcp_close_wait_timeout, udp_timeout, udp_stream_timeout:
            seconds.
        tcp_be_liberal: set ``nf_conntrack_tcp_be_liberal`` to 1 (out-of-window packets are
            not INVALID).
    """

    max_per_core: int | None = 32768
    min: int | None = 131072
    tcp_established_timeout: int | None = 86400
    tcp_close_wait_timeout: int | None = 3600
    tcp_be_liberal: bool = False
    udp_timeout: int | None = None
    udp_stream_timeout: int | None = None

    def wanted(self, cpus: int) -> dict[str, int]:
        """The sysctls (names under net.netfilter) and values to set."""
        out: dict[str, int] = {}
        if self.max_per_core:
            out["nf_conntrack_max"] = max(self.max_per_core * cpus, self.min or 0)
        timeouts = {
            "nf_conntrack_tcp_timeout_established": self.tcp_established_timeout,
            "nf_conntrack_tcp_timeout_close_wait": self.tcp_close_wait_timeout,
            "nf_conntrack_udp_timeout": self.udp_timeout,
            "nf_conntrack_udp_timeout_stream": self.udp_stream_timeout,
        }
        out.update({name: value for name, value in timeouts.items() if value})
        if self.tcp_be_liberal:
            out["nf_conntrack_tcp_be_liberal"] = 1
        return out


@dataclass(frozen=True, slots=True)
class Outcome:
    """What applying did: sysctls set, left (already as wanted, or larger), and refused."""

    set: dict[str, int]
    kept: dict[str, int]
    refused: dict[str, tuple[int, str]]

    def advice(self) -> str:
        """The one line telling an operator what to set where the process could not."""
        lines = [f"net.netfilter.{name}={value}" for name, (value, _) in self.refused.items()]
        return (
            "set these sysctls (`nlproxy run --init-only` as root does, once per boot; the "
            "DaemonSet's init container and the systemd unit run it): " + ", ".join(lines)
        )


def apply(config: ConntrackConfig, netns_name: str | None) -> Outcome:
    """Set the wanted values in ``netns_name`` (None: this namespace). Never raises for a
    value it may not set: it is reported in the outcome."""
    cpus = os.cpu_count() or 1
    done: dict[str, int] = {}
    kept: dict[str, int] = {}
    refused: dict[str, tuple[int, str]] = {}
    for name, value in config.wanted(cpus).items():
        try:
            with netns.entered(netns_name):
                current = int((PROC / name).read_text())
                if current == value or (name == "nf_conntrack_max" and current > value):
                    kept[name] = current
                    continue
                (PROC / name).write_text(str(value))
            done[name] = value
        except (OSError, ValueError) as exc:
            refused[name] = (value, getattr(exc, "strerror", None) or str(exc))
            continue
        if name == "nf_conntrack_max":
            _raise_hashsize(value // 4)
    return Outcome(done, kept, refused)


def apply_logged(config: ConntrackConfig, netns_name: str | None) -> Outcome:
    """:func:`apply`, with what was set logged (info) and what was not (one warning, with the
    advice): at daemon start, with ``--init-only``, and when a changed ``--config`` asks."""
    from nlproxy.log import get_logger

    outcome = apply(config, netns_name)
    log = get_logger("conntrack")
    if outcome.set:
        log.info("conntrack.sysctls_set", sysctls=outcome.set)
    if outcome.refused:
        reasons = {name: why for name, (_, why) in outcome.refused.items()}
        log.warning("conntrack.sysctls_refused", error=outcome.advice(), reasons=reasons)
    return outcome


def _raise_hashsize(buckets: int) -> None:
    """kube-proxy raises the hash table with the table size (a module parameter: the whole
    node's, root only); failing here costs lookups, not correctness."""
    try:
        if int(HASHSIZE.read_text()) < buckets:
            HASHSIZE.write_text(str(buckets))
    except (OSError, ValueError):
        pass
