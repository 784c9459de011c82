"""``nlproxy run``: keep the kernel's rules equal to what the cluster wants.

Sources: ``--manifests DIR`` or the Kubernetes API (``--kubeconfig``, or in-cluster). Settings
come from defaults, then ``--config`` (kube-proxy's KubeProxyConfiguration), then flags.

``--init-only`` sets the conntrack sysctls and exits 0 (one it may not set is a warning).
``--once`` reconciles once from a manifests directory and exits: 0 applied; 3 applied but some
objects were invalid and left out (each named on stderr); 2 usage or configuration error; 1
runtime failure with nothing half-applied. Without ``--once`` it runs the daemon.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from nlproxy import log
from nlproxy.cluster import in_cluster
from nlproxy.cluster.kubeconfig import checked, opened
from nlproxy.commands import _fastexit
from nlproxy.config import DaemonConfig, Flags, Settings, build_settings
from nlproxy.config.api_source import api_source
from nlproxy.config.flags import (
    KUBE_PROXY_FLAGS,
    LOGGING_FORMATS,
    KubeProxyFlag,
    duration,
    go_bool,
)
from nlproxy.config.watch import ConfigWatcher
from nlproxy.errors import ConfigError

ONCE_MMAP_THRESHOLD = 1 << 20
"""``run --once``'s malloc mmap and trim threshold (see ``daemon/memory.py``)."""

NAME = "run"
HELP = "program the rules for the cluster's Services (--once: reconcile once and exit)"


def _go_bool(text: str) -> bool:
    try:
        return go_bool(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _mark_bit(text: str) -> int:
    """Checked here, so the error names the spelling given (``--iptables-masquerade-bit``)."""
    try:
        bit = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= bit <= 31:
        raise argparse.ArgumentTypeError(f"{bit} is not in 0..31")
    return bit


def _period(text: str) -> str:
    """A duration, checked here (so the error names the spelling given) and kept as text."""
    try:
        duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


_SWITCH: dict[str, Any] = {"nargs": "?", "const": True, "type": _go_bool, "metavar": "true|false"}
"""A kube-proxy boolean flag: alone it means true, and ``--flag=false`` is taken too."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _source_arguments(parser)
    _node_arguments(parser)
    _nlproxy_arguments(parser)
    _balancing_arguments(parser)
    _conntrack_arguments(parser)
    _kube_proxy_arguments(parser)
    parser.add_argument("--once", action="store_true", help="reconcile once and exit")
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --once: program the namespace even while another nlproxy does (it will "
        "undo what this run changes unless the manifests agree)",
    )


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the objects and the settings come from, and which node this is."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--manifests", type=Path, metavar="DIR", help="read objects from DIR")
    src.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster)")
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="KubeProxyConfiguration YAML. The daemon looks at it when the kernel tells of a "
        "change in its directory or its target's (inotify: a ConfigMap changes by symlink "
        "swap; every 2 s where inotify is not to be had): an invalid new file is one error "
        "line and the current settings stay; each changed setting is logged (old and new "
        "value) and applied by the running daemon, only the differences in one atomic batch; "
        "a change to a setting that cannot change in place (a bind address, the API client, "
        "the node's name) ends the daemon with status 1, rules in place, for the kubelet or "
        "systemd to start it again with the new settings, as kube-proxy does",
    )
    parser.add_argument(
        "--master",
        "--api-server",
        dest="master",
        metavar="URL",
        help="the API server's own address (https://HOST:PORT), overriding the kubeconfig's or "
        "the in-cluster one; credentials stay theirs (default: $NLPROXY_API_SERVER). A node "
        "without proxy rules can only reach it this way or through a kubeconfig naming it "
        "(docs/api-server.md)",
    )
    parser.add_argument(
        "--node-name",
        "--hostname-override",
        dest="node_name",
        help="this node's name (default: $NLPROXY_NODE_NAME, else the hostname); "
        "--hostname-override is kube-proxy's spelling",
    )


def _node_arguments(parser: argparse.ArgumentParser) -> None:
    """kube-proxy's flags for the node's addresses, the sync periods and the HTTP ports."""
    parser.add_argument(
        "--bind-address",
        metavar="IP",
        help="kube-proxy's spelling: a single address is taken as this node's IP (0.0.0.0 or :: "
        "mean all)",
    )
    parser.add_argument(
        "--proxy-mode",
        metavar="MODE",
        help="kube-proxy's flag: only 'nftables' (or empty) is accepted",
    )
    parser.add_argument(
        "--cleanup",
        default=False,
        **_SWITCH,
        help="kube-proxy's spelling of `nlproxy cleanup`: remove nlproxy's tables and exit",
    )
    parser.add_argument("--node-ip", default="", help="this node's IPs (default: from the Node)")
    parser.add_argument("--cluster-cidr", help="pod CIDRs, comma-separated")
    parser.add_argument("--service-cidr", default="", help="service CIDRs, comma-separated")
    parser.add_argument(
        "--nodeport-addresses", help="'primary' (the default) or CIDRs, comma-separated"
    )
    parser.add_argument(
        "--masquerade-bit",
        "--iptables-masquerade-bit",
        dest="masquerade_bit",
        type=_mark_bit,
        help="packet mark bit (default 14)",
    )
    parser.add_argument(
        "--min-sync-period",
        "--iptables-min-sync-period",
        dest="min_sync_period",
        type=_period,
        help="least time between syncs (default 100ms)",
    )
    parser.add_argument(
        "--sync-period",
        "--iptables-sync-period",
        dest="sync_period",
        type=_period,
        help="full verify interval (default 60s)",
    )
    parser.add_argument(
        "--healthz-bind-address",
        help="host:port, or a host alone (port 10256), or '' to turn it off (default "
        "0.0.0.0:10256)",
    )
    parser.add_argument(
        "--metrics-bind-address",
        help="host:port, or a host alone (port 10249), or '' to turn it off (default "
        "127.0.0.1:10249)",
    )


def _nlproxy_arguments(parser: argparse.ArgumentParser) -> None:
    """nlproxy's own choices, beyond kube-proxy's flags: what it removes, refuses and serves."""
    parser.add_argument(
        "--conntrack-flush-tcp",
        action="store_true",
        help="also delete TCP flows of removed endpoints (UDP/SCTP always are)",
    )
    parser.add_argument(
        "--owned-table",
        action="store_true",
        help="create the tables owned and persistent (Linux >= 6.9), so `nft flush ruleset` "
        "cannot remove them",
    )
    parser.add_argument(
        "--external-ip-cidrs",
        metavar="CIDR,...",
        help="the only ranges spec.externalIPs may take; others are refused and named (default: "
        "any, as kube-proxy; loopback, link-local, multicast and unspecified always are)",
    )
    parser.add_argument(
        "--service-node-port-range",
        metavar="LOW-HIGH",
        help="the API server's --service-node-port-range: a healthCheckNodePort outside it is "
        "refused and named, never listened on (default: 30000-32767, the API server's)",
    )
    parser.add_argument(
        "--replace-kube-proxy",
        action="store_true",
        help="after the first sync, remove kube-proxy's rules (as `nlproxy cleanup "
        "--kube-proxy`) whenever they are found; stop kube-proxy on the node first",
    )
    parser.add_argument(
        "--service-proxy-name",
        metavar="NAME",
        help="serve only the Services labelled service.kubernetes.io/service-proxy-name=NAME "
        "(which kube-proxy skips), beside kube-proxy serving the rest: a canary "
        "(docs/migrating.md); default: the Services without that label, as kube-proxy",
    )


def _balancing_arguments(parser: argparse.ArgumentParser) -> None:
    """nlproxy's own choices of how endpoints are picked and what is counted."""
    parser.add_argument(
        "--exclude-unreachable-endpoints",
        action="store_true",
        help="leave endpoints this node cannot route to out of load balancing until they recover "
        "(never a service's last ones)",
    )
    parser.add_argument(
        "--service-counters",
        action="store_true",
        help="count packets and bytes per service port (nlproxy_service_packets_total, "
        "nlproxy_service_bytes_total): two counter sets and three chains per family, one "
        "element per frontend, a set lookup per packet of DNAT'd connections",
    )
    parser.add_argument(
        "--load-balancing",
        choices=["random", "round-robin", "consistent-hash"],
        help="endpoint choice of Services without the nlproxy.io/load-balancing annotation "
        "(default random, or from the config file's ipvs.scheduler: rr, sh, mh)",
    )
    parser.add_argument(
        "--programming-latency-services",
        type=int,
        default=0,
        metavar="N",
        help="export nlproxy_service_programming_latency_seconds for the N Services whose last "
        "change took longest to program (0..1000; default 0: not exported)",
    )
    parser.add_argument(
        "--consistent-hash-seed",
        type=int,
        metavar="N",
        help="jhash seed (0..4294967295) of consistent-hash Services; the same on every node "
        "(default: derived from each Service's UID)",
    )


def _conntrack_arguments(parser: argparse.ArgumentParser) -> None:
    """The conntrack sysctls, and the two ways to set up and exit (--init-only,
    --write-config-to)."""
    ct = parser.add_argument_group(
        "conntrack (kube-proxy's flags; set by the daemon at start-up, 0 leaves a value alone)"
    )
    ct.add_argument("--conntrack-max-per-core", type=int, metavar="N", help="default 32768")
    ct.add_argument("--conntrack-min", type=int, metavar="N", help="default 131072")
    ct.add_argument("--conntrack-tcp-timeout-established", metavar="DURATION", help="default 24h")
    ct.add_argument("--conntrack-tcp-timeout-close-wait", metavar="DURATION", help="default 1h")
    ct.add_argument("--conntrack-tcp-be-liberal", **_SWITCH)
    ct.add_argument("--conntrack-udp-timeout", metavar="DURATION")
    ct.add_argument("--conntrack-udp-timeout-stream", metavar="DURATION")
    parser.add_argument(
        "--init-only",
        default=False,
        **_SWITCH,
        help="set the conntrack sysctls (the table size only ever raised) and exit, as "
        "kube-proxy's --init-only: the step that needs a writable /proc/sys, for a privileged "
        "init container or systemd's ExecStartPre=+; the daemon then runs with two capabilities",
    )
    parser.add_argument(
        "--write-config-to",
        type=Path,
        metavar="FILE",
        help="write the settings this command line and --config make, as a "
        "KubeProxyConfiguration, to FILE and exit",
    )


class _Unused(argparse.Action):
    """A kube-proxy flag nlproxy has no use for: its value is read (and refused as kube-proxy
    would), and the flag is kept in ``ignored`` to be named once in a warning."""

    def __init__(self, *args: object, why: str, **kwargs: object) -> None:
        self.why = why
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        seen = dict(getattr(namespace, "ignored", ()))
        seen[self.option_strings[0]] = self.why
        namespace.ignored = tuple(seen.items())


def _reader(flag: KubeProxyFlag) -> object:
    def read(text: str) -> object:
        try:
            return flag.read(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = flag.name  # argparse names the type in some of its messages
    return read


def _logging_format(text: str) -> str:
    if text not in LOGGING_FORMATS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOGGING_FORMATS)}")
    return LOGGING_FORMATS[text]


def _kube_proxy_arguments(parser: argparse.ArgumentParser) -> None:
    """kube-proxy's flags beyond nlproxy's own options (``config/flags.py``)."""
    group = parser.add_argument_group(
        "kube-proxy's flags (a kube-proxy command line runs unchanged; those nlproxy has no use "
        "for are read and named in a warning)"
    )
    for flag in KUBE_PROXY_FLAGS:
        kwargs: dict[str, object] = {"type": _reader(flag)}
        if flag.switch:
            kwargs.update(nargs="?", const=True, metavar="true|false")
        else:
            kwargs["metavar"] = flag.metavar or "VALUE"
        if flag.dest is not None:
            group.add_argument(flag.name, dest=flag.dest, help=flag.help, **kwargs)  # type: ignore[arg-type]
        else:
            group.add_argument(
                flag.name,
                action=_Unused,
                why=flag.why,
                dest="ignored",
                default=argparse.SUPPRESS,
                help=f"not used: {flag.why}",
                **kwargs,  # type: ignore[arg-type]
            )
    group.add_argument(
        "--logging-format",
        dest="log_format",
        type=_logging_format,
        default=argparse.SUPPRESS,
        metavar="text|json",
        help="kube-proxy's spelling of --log-format (text: console)",
    )
    parser.set_defaults(ignored=())


def flags(args: argparse.Namespace) -> Flags:
    """The parsed command line as :class:`Flags`."""
    names = {f.name for f in fields(Flags)}
    return Flags(**{k: v for k, v in vars(args).items() if k in names})


def settings(args: argparse.Namespace) -> Settings:
    """The parsed command line as :class:`Flags`, merged over the file and the defaults."""
    return build_settings(flags(args))


def run(args: argparse.Namespace) -> int:
    if args.cleanup:
        from nlproxy.commands import cleanup

        return cleanup.run(args)
    given = flags(args)
    s = build_settings(given)
    # Following the file from the settings it gave (before check_start fills in what the
    # command line left to be found): a change is told against what the same flags made.
    watcher = ConfigWatcher(given, s) if given.config is not None and not s.once else None
    for warning in s.daemon.warnings:
        log.warn("config.warning", warning)
    if args.write_config_to is not None:
        from nlproxy.config.export import write_kube_proxy_config

        write_kube_proxy_config(s, args.write_config_to)
        return 0
    if args.init_only:
        _set_conntrack(s.daemon, s.netns)
        return 0
    if s.once and s.manifests is None:
        raise ConfigError("run --once", "needs --manifests DIR")
    s = check_start(s)
    from nlproxy.daemon.nslock import NamespaceLock

    lock = None if s.once and s.force else NamespaceLock(s.netns)
    try:
        if not s.once:
            from nlproxy.daemon.run import run_daemon

            if s.daemon.oom_score_adj is not None:
                _set_oom_score_adj(s.daemon.oom_score_adj)
            # A changed --config file is applied in place; a change that cannot be ends the
            # daemon (status 1) for its supervisor to start it again (daemon/run.py). No end
            # in-process: the stop deadline there must not end the process that called it.
            return run_daemon(
                s,
                prepare=lambda: _set_conntrack(s.daemon, s.netns),
                watcher=watcher,
                end=_fastexit.end if _fastexit.allowed() else None,
            )
        from nlproxy.daemon.memory import AllocatorSettings, tune_allocator
        from nlproxy.operate.run import run_once

        # Blocks of 1 MiB and more (the files read whole, the loader's and the planner's big
        # tables, the encoded batch) mapped on their own go back to the system when freed,
        # instead of glibc raising its threshold and leaving them as holes in the heap. At
        # 10k x 10 JSON the peak RSS is 5.5 MiB lower (4 MiB as the daemon's threshold: 4.3),
        # no slower.
        tune_allocator(AllocatorSettings(threshold=ONCE_MMAP_THRESHOLD))
        return run_once(s, end=_fastexit.end)
    finally:
        if lock is not None:
            lock.release()


OOM_SCORE_ADJ = Path("/proc/self/oom_score_adj")


def _set_oom_score_adj(value: int, path: Path = OOM_SCORE_ADJ) -> None:
    """Write the process's ``oom_score_adj``, as kube-proxy does at start; one it may not write
    (lowering it needs CAP_SYS_RESOURCE) is a warning, as kube-proxy logs it and goes on."""
    try:
        path.write_text(f"{value}\n")
    except OSError as exc:
        print(
            f"nlproxy: warning: --oom-score-adj: cannot set {path} to {value}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )


def _set_conntrack(cfg: DaemonConfig, netns_name: str | None) -> None:
    """kube-proxy's conntrack sysctls, at daemon start as kube-proxy does, and with
    ``--init-only``. One not set is a warning, not a failure: an init container that failed
    would keep the node without a proxy, which costs more than a default table size."""
    from nlproxy.conntrack.sysctl import apply_logged

    apply_logged(cfg.conntrack, netns_name)


def check_start(s: Settings) -> Settings:
    """What can be checked before the first sync, so a mistake is one line and exit 2, not a
    crash inside the daemon: the source, and (for the daemon) the ports it will serve on.

    Returns:
        ``s``, with a kubeconfig path from the KubeProxyConfiguration dropped when the file is
        absent (kubeadm's ConfigMap names a path the DaemonSet may not mount): the in-cluster
        configuration is used then, with a warning.

    Raises:
        ConfigError: names the flag or field.
    """
    cfg = s.daemon
    if s.manifests is not None:
        if not s.manifests.is_dir():
            raise ConfigError("--manifests", f"{s.manifests} is not a directory")
    else:
        cfg = _api_source_checked(cfg)
    if not s.once:
        for flag, addr in (
            ("--healthz-bind-address", cfg.healthz_bind_address),
            ("--metrics-bind-address", cfg.metrics_bind_address),
        ):
            if addr is not None:
                _check_bindable(flag, addr, s.netns)
    return replace(s, daemon=cfg)


def _api_source_checked(cfg: DaemonConfig) -> DaemonConfig:
    """``cfg`` with the kubeconfig ``run`` uses (``config.api_source``'s rule: None for the
    in-cluster configuration), once it can be opened; the in-cluster fallback is warned of.

    Raises:
        ConfigError: no credentials, or a kubeconfig given that cannot be opened.
    """
    at = api_source(cfg)
    missing = f"{at.skipped}: using the in-cluster configuration" if at.skipped else ""
    if missing and not at.fallback:  # else said by the one line on the fallback below
        log.warn("config.kubeconfig_missing", missing)
    if at.kubeconfig is not None:
        where = "clientConnection.kubeconfig" if cfg.kubeconfig_from_file else "--kubeconfig"
        # kube-proxy's kubeconfig is one file (client-go's explicit path, no KUBECONFIG list,
        # no '~'): a list is refused as a file that does not exist, saying so.
        opened(at.kubeconfig, where)
        # what the client's loader cannot use is refused now, before anything on the node is
        # changed (the daemon writes the conntrack sysctls before it loads the client)
        checked(at.kubeconfig, server=at.api_server is None)
    if at.no_credentials:
        raise ConfigError("--kubeconfig", at.no_credentials)
    if at.fallback:
        address = in_cluster.server()
        why = f"{missing}; " if missing else ""
        log.warn(
            "config.api_server_in_cluster", why + in_cluster.warning(address), api_server=address
        )
    return replace(cfg, kubeconfig=at.kubeconfig)


def _check_bindable(flag: str, addr: str, netns_name: str | None) -> None:
    """Bind ``addr`` for a moment, where the daemon will (``--netns``): a port in use is named
    now, not as a crash later."""
    from nlproxy.serve.http import listening_socket

    try:
        listening_socket(addr, netns_name).close()
    except OSError as exc:
        raise ConfigError(flag, f"{addr}: {exc.strerror}") from exc
