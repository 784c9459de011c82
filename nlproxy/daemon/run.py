"""The daemon: wires source → sync loop → kernel, the drift watch and the HTTP servers into
one trio nursery. Holds no logic of its own.

Start order: source (initial list) → sync loop (first successful sync) → HTTP → READY=1 to
systemd. SIGTERM/SIGINT cancel everything and leave the rules in place, so traffic keeps flowing
while the service restarts; ``nlproxy cleanup`` removes them.

Stopping is bounded: a stop (a signal or a changed ``--config``) arms a deadline
(``stop.py``); a worker thread still busy in a sync, a read-back or a blocking call when it
passes is left behind, and the process ends with its logs flushed (``end``, given by the command
line). The rules are left as they are at any instant: a batch is atomic in the kernel, and the
next start reads the kernel back and sends only the differences.

A changed ``--config`` file (a ConfigMap's symlink swap; ``config/watch.py``) is looked at when the
kernel tells of a change in its directories (``config/notify.py``; every
:data:`~nlproxy.config.notify.POLL_SECONDS` where it cannot): an invalid new file is one error
line naming the file and why, and the daemon runs on with the settings it has. A valid file logs
each changed setting (old and new value). What can change in place is applied in place, the process
running on: the planner's settings go to the sync loop, whose next sync plans afresh and sends only
what differs, one atomic batch per family; the sync periods reschedule the loop; changed conntrack
settings are written to the sysctls; ``/configz`` shows the new settings. A change to a setting that
cannot (``watch.RESTART_FIELDS``: bind addresses, the API client, the node's name...) exits with
status :data:`EXIT_CONFIG_CHANGED` (1, as kube-proxy exits on a config change), nothing of the file
applied and the rules in place, so that the kubelet or systemd starts it again with the new
settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import resource
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry

from nlproxy import __version__
from nlproxy.cluster.model import Change, ClusterSnapshot, IPAddress, ServiceKey, ServicePortRef
from nlproxy.cluster.source import Source
from nlproxy.cluster.state import ClusterState
from nlproxy.config import Settings, external_networks
from nlproxy.config.configz import configz
from nlproxy.config.notify import POLL_SECONDS, Changes
from nlproxy.config.watch import ConfigWatcher, Reload
from nlproxy.conntrack.sysctl import apply_logged
from nlproxy.daemon import census, systemd
from nlproxy.daemon.foreign import ForeignWatch
from nlproxy.daemon.memory import release, tune_allocator
from nlproxy.daemon.stop import StopDeadline
from nlproxy.daemon.supervise import Supervisor, at_once, ending
from nlproxy.errors import NlproxyError
from nlproxy.inspect.foreign_check import ForeignCheck
from nlproxy.inspect.reachability import ReachabilityMonitor, left_out, without_unreachable
from nlproxy.inspect.rtnl import RtnlNode
from nlproxy.inspect.watch import ADDRESS_GROUPS, RouteWatcher
from nlproxy.log import get_logger
from nlproxy.nft.monitor import Drift, GenerationWatch
from nlproxy.proxy.budget import SYNC_QUOTA
from nlproxy.proxy.planner import PortPlan
from nlproxy.serve.budget import DescriptorBudget
from nlproxy.serve.health import HealthState, healthz
from nlproxy.serve.healthcheck import HealthCheckServers, health_checks
from nlproxy.serve.http import Response, serve
from nlproxy.serve.metrics import Metrics, ServiceCounters
from nlproxy.sync.kernel import real as real_kernel
from nlproxy.sync.loop import SyncLoop
from nlproxy.sync.syncer import Syncer, SyncResult

if TYPE_CHECKING:  # the kube source (and the kubernetes package) is imported only when used
    from nlproxy.cluster.kube_link import Unavailable


def run_daemon(
    settings: Settings,
    prepare: Callable[[], None] | None = None,
    *,
    watcher: ConfigWatcher | None = None,
    end: Callable[[int], object] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (status 0) or a ``--config`` file changing a setting that
    cannot change in place (status :data:`EXIT_CONFIG_CHANGED`); returns the exit status.

    ``prepare`` runs after the start-up line (node set-up such as kube-proxy's conntrack
    sysctls), so that line is always the first a platform team reads. ``watcher`` follows the
    ``--config`` file (None: there is none). ``end`` ends the process with a status, its output
    flushed, without waiting for anything (``commands/_fastexit.end``); when given, a stop that
    has not ended ``stop.STOP_DEADLINE_SECONDS`` after it was asked for is ended by it, and so
    is the process once the daemon has stopped (no interpreter teardown of a large heap, no
    wait for a worker thread left in a blocking call).
    """
    # malloc suited to a long-lived process whose plan is large (memory.py); before any thread
    # exists, since a thread that already has an arena keeps it.
    tune_allocator()
    census.start()  # off unless NLPROXY_CENSUS is set (a heap census for the benchmarks)
    _raise_descriptor_limit()
    daemon = Daemon(settings, watcher=watcher, end=end)
    daemon.log_start()
    if prepare is not None:
        prepare()
    trio.run(daemon.run)
    status = daemon.exit_status
    if end is not None:
        end(status)  # returns where ending the process is not allowed (in-process callers)
    return status


def _raise_descriptor_limit() -> None:
    """Lift the soft descriptor limit to the hard one (often 1024 → far more): the HTTP
    servers bound their connections, and the netlink sockets must never meet EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


SUPERVISED = ("inspector", "foreign-check")
"""The tasks restarted when they fail (they only report); any other ends the daemon
(``supervise.py``)."""

EXIT_CONFIG_CHANGED = 1
"""The status the daemon exits with when its ``--config`` file changed a setting it cannot apply
in place: as kube-proxy,
non-zero, so that a supervisor restarting only failures (systemd ``Restart=on-failure``) starts
it again too."""


def _shown(value: object) -> object:
    """A setting's value as a log line shows it: collections as lists, addresses as text."""
    if isinstance(value, (tuple, list, frozenset, set)):
        items = [_shown(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (frozenset, set)) else items
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # addresses, networks, paths


class Daemon:
    def __init__(
        self,
        settings: Settings,
        *,
        watcher: ConfigWatcher | None = None,
        end: Callable[[int], object] | None = None,
    ) -> None:
        self.settings = settings
        self.watcher = watcher
        self.exit_status = 0
        self.netns = settings.netns
        self.cfg = cfg = settings.daemon
        self._configz = configz(settings)
        pcfg = settings.proxy
        self.registry = CollectorRegistry()
        self.metrics = Metrics(
            self.registry, slowest_services=settings.programming_latency_services
        )
        self.counters = (
            ServiceCounters(self.registry, netns=self.netns) if pcfg.service_counters else None
        )
        self._ports: Mapping[ServicePortRef, PortPlan] = {}
        self._left_out: frozenset[IPAddress] | None = None  # see _filter
        self.health = HealthState(grace_seconds=2 * cfg.sync_period, node_name=cfg.node_name)
        # The report-only tasks, restarted when they fail; the others end the daemon
        # (supervise.py). Both series exist at 0 from the start.
        self.supervisor = Supervisor(self.metrics.task_restarts)
        for task in SUPERVISED:
            self.metrics.task_restarts.labels(task=task)
        self.syncer = Syncer(
            pcfg,
            real_kernel(self.netns),
            owner=settings.owned_table,
            flush_tcp=settings.conntrack_flush_tcp,
            plan_after_restart=True,  # healthy once the records vouch for the tables
            # Big round-robin/consistent-hash tables are built a Service's budget per sync, so
            # no other change waits behind a burst of them (``sync/balancing.py``).
            quota=SYNC_QUOTA,
        )
        self.node = RtnlNode(self.netns)
        self.reachability = ReachabilityMonitor(
            self.registry, netns=self.netns, node=self.node, on_change=self._unreachable_changed
        )
        self.watch: GenerationWatch | None = None
        # The nftables part only when the generation moved (``inspect/foreign_check.py``).
        self.foreign = ForeignWatch(
            ForeignCheck(self.netns, self._generation), self.metrics, lambda: self.settings
        )
        self.loop = self._sync_loop(settings)
        self.healthchecks: HealthCheckServers | None = None
        self.connections = DescriptorBudget()  # one for every HTTP server
        self._service_cidrs = pcfg.service_cidrs
        self._nursery: trio.Nursery | None = None
        self._addresses_watched = False
        self.log = get_logger("daemon")
        self.deadline = StopDeadline(end, self.log)

    def _sync_loop(self, settings: Settings) -> SyncLoop:
        """The sync loop over a fresh cluster state, reporting to this daemon."""
        cfg, pcfg = settings.daemon, settings.proxy
        return SyncLoop(
            ClusterState(
                cfg.node_name,
                external_ip_cidrs=external_networks(cfg),
                service_cidrs=pcfg.service_cidrs,
                cluster_cidrs=pcfg.cluster_cidrs,
                node_port_range=cfg.node_port_range,
            ),
            self.syncer,
            health=self.health,
            metrics=self.metrics,
            min_interval=cfg.min_sync_period,
            sync_period=cfg.sync_period,
            on_synced=self._synced,
            snapshot_filter=self._filter if settings.exclude_unreachable_endpoints else None,
            release_memory=release,
            quiet=self._quiet,
        )

    def _quiet(self) -> bool:
        """Whether every transaction since the watch's last look is this process's own (see
        ``SyncLoop``; called on the loop between syncs, so the own generations hold still).

        It looks itself: a move it finds is taken from the watch (which would report it
        again), and when another process made it the verify that asked reads back, once."""
        watch = self.watch
        if watch is None:
            return False
        try:
            span = watch.look()
        except (NlproxyError, OSError):  # the watch's answer unreadable, its socket gone
            return False  # not known to be quiet: the verify syncs and reads back
        if span is None or self.syncer.own_commits(*span):
            return True
        self.foreign.ask()
        return False

    def _generation_moved(self, after: int, upto: int) -> None:
        """The generation watch's report: transactions ``(after, upto]`` were committed.

        This process's own commits are nothing to look at. Any other may have changed the
        tables; the kernel names its writer only to members of NFNLGRP_NFTABLES, which the
        daemon is not (``nft/monitor.py``), so the span goes to the loop as generations of
        unknown writers: it checks them against its own commits once no sync is in progress
        (one may have committed and not yet noted its generation) and reads back if any is
        another's. The foreign-proxy check looks again too.
        """
        try:
            own = self.syncer.own_commits(after, upto)
        except RuntimeError:  # a sync's thread noted a generation meanwhile: the loop decides
            own = False
        if own:
            return
        self.foreign.ask()
        self.loop.request_verify(Drift(0, "(generation moved)", 0, lost=(after, upto)))

    def _filter(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """``snapshot`` without the unreachable endpoints; the inspector keeps classifying
        those it takes out (so they come back once reachable, not at the next sync), told
        with the plan made without them (``_synced``): a pass between the two would drop what
        the plan it has still leaves out."""
        bad = self.reachability.unreachable
        filtered = without_unreachable(snapshot, bad)
        self._left_out = left_out(snapshot, filtered, bad)
        return filtered

    def _unreachable_changed(self, bad: frozenset[IPAddress]) -> None:
        if self.settings.exclude_unreachable_endpoints:
            self.log.info("endpoints.excluded", unreachable=sorted(map(str, bad)))
            self.loop.request_sync()

    def _synced(self, result: SyncResult, changed: set[ServiceKey] | None) -> None:
        """After each successful sync: object counts, health checks, reachability."""
        self.metrics.rejected_services.set(len(result.excluded))
        for reason, count in self.syncer.balancing.counts.items():
            self.metrics.lb_defaulted.labels(reason=reason).set(count)
        if result.plan is None:
            return
        self._ports = result.plan.ports  # updated in place by later syncs: copied at a scrape
        for family, rs in result.plan.rulesets.items():
            counts = {
                "chain": len(rs.chains),
                "rule": sum(len(r) for r in rs.rules.values()),
                "set": len(rs.sets),
                "element": sum(len(e) for e in rs.elements.values()),
            }
            for kind, n in counts.items():
                self.metrics.objects.labels(family=family.value, kind=kind).set(n)
        if self.healthchecks is not None:
            # The Syncer's: with those of Services kept while their file does not parse.
            checks = result.health_checks
            self.healthchecks.update(health_checks(result.plan.ports) if checks is None else checks)
        if self._left_out is not None:
            self.reachability.hold(self._left_out)
        self.reachability.plan_changed(result.plan.ports, changed)

    def _source(self) -> Source:
        if self.settings.manifests is not None:
            from nlproxy.cluster.watchdir import ManifestSource

            source = ManifestSource(
                self.settings.manifests, proxy_name=self.settings.service_proxy_name
            )
            self.loop.set_source_errors(lambda: source.errors)
            return source
        from nlproxy.cluster import in_cluster
        from nlproxy.cluster.kube import KubeSource, api_client_from_config
        from nlproxy.cluster.ratelimit import TokenBucket
        from nlproxy.config.api_source import api_source
        from nlproxy.sync.preload import Preload

        at = api_source(self.cfg)
        client = api_client_from_config(at.kubeconfig, server=at.api_server)
        fallback = at.fallback
        # The initial lists' pages go into the state as they land, and the state is planned
        # ahead once the Services are listed (a cold start only): the first sync is its commit.
        preload = Preload(self.loop.state, self.syncer)
        return KubeSource(
            client,
            node_name=self.cfg.node_name,
            service_cidrs=self._service_cidrs,
            on_unavailable=self._unavailable,
            on_request=self.metrics.kube_request,
            on_down=self._api_down,
            unreachable=in_cluster.unreachable(in_cluster.server()) if fallback else "",
            proxy_name=self.settings.service_proxy_name,
            limit=TokenBucket(self.cfg.kube_api_qps, self.cfg.kube_api_burst),
            on_page=preload.page,
            on_listed=preload.listed,
        )

    def _api_down(self, reason: str | None) -> None:
        """Why the API server does not answer (None: it answers again), for ``/healthz``."""
        self.health.api_unreachable(reason)

    def _unavailable(self, kinds: Mapping[str, Unavailable]) -> None:
        """The source's unreadable kinds: a metric each; required ones block /healthz."""
        self.metrics.source_unavailable.clear()
        for u in kinds.values():
            self.metrics.source_unavailable.labels(kind=u.kind, verb=u.verb, reason=u.reason).set(1)
        self.health.block("; ".join(str(u) for u in kinds.values() if u.required))

    async def _healthz(self, path: str) -> Response:
        if path in ("/healthz", "/livez"):
            live = path == "/livez"
            self.loop.vouch()  # a resting loop's last update is now (SyncLoop.vouch)
            code, body = healthz(self.health, trio.current_time(), live=live)
            counter = self.metrics.livez_total if live else self.metrics.healthz_total
            counter.labels(code=str(code)).inc()
            return Response(code, body)
        return Response(404, b"not found\n", content_type="text/plain")

    async def _metrics(self, path: str) -> Response:
        if path == "/proxyMode":  # as kube-proxy answers it; tools and e2e tests ask
            return Response(200, b"nftables", content_type="text/plain")
        if path == "/configz":  # the effective configuration, shaped as kube-proxy's
            return Response(200, self._configz)
        if path == "/programming" or path.startswith("/programming/"):  # status, explain
            return self._programming(path.removeprefix("/programming").removeprefix("/"))
        if path == "/metrics":
            self.loop.vouch()  # the last-sync metric, as /healthz's last update
            body = await self._exposition()
            return Response(200, body, content_type="text/plain; version=0.0.4")
        return await self._healthz(path)

    def _programming(self, service: str) -> Response:
        """The slowest Services' last programming latency; with ``namespace/name``, that one's."""
        latency = self.loop.report.latency
        if not service:
            return Response(200, json.dumps(latency.to_json()).encode())
        namespace, _, name = service.partition("/")
        if not namespace or not name or "/" in name:
            return Response(404, b"not found\n", content_type="text/plain")
        key = ServiceKey(namespace=namespace, name=name)
        return Response(200, json.dumps(latency.to_json(key)).encode())

    async def _exposition(self) -> bytes:
        """The metrics; with service counters, read from the kernel in a worker thread.

        Cancellation: the thread's reading is abandoned (it only reads).
        """
        counters = self.counters
        if counters is None:
            return self.metrics.exposition()
        ports = list(self._ports.values())  # a sync in its thread may change the plan meanwhile

        def work() -> bytes:
            try:
                counters.refresh(ports)
            except (NlproxyError, OSError) as exc:  # the other metrics are still served
                self.log.warning("metrics.counters_failed", error=str(exc))
            return self.metrics.exposition()

        return await trio.to_thread.run_sync(work, abandon_on_cancel=True)

    def _generation(self) -> int | None:
        """The kernel's nftables generation now, from the watch's socket (None: no watch)."""
        watch = self.watch
        return None if watch is None or not watch.running else watch.current()

    async def _watch_addresses(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the state's interface addresses current (``nodePortAddresses`` CIDRs select
        them): one dump now, and again after every address notification.

        Cancellation: safe at any point (the dump's thread is abandoned: it only reads).
        """
        with RouteWatcher(self.netns, groups=ADDRESS_GROUPS) as watch:
            started = False
            while True:
                try:
                    addrs = await trio.to_thread.run_sync(
                        self.node.addresses, abandon_on_cancel=True
                    )
                except (NlproxyError, OSError) as exc:  # kept as they were; tried at the next event
                    self.log.warning("addresses.failed", error=str(exc))
                else:
                    self.loop.set_local_addresses(addrs)
                if not started:
                    started = True
                    task_status.started()
                await watch.changed()

    async def _start_address_watch(self) -> None:
        """Start :meth:`_watch_addresses` when ``nodePortAddresses`` has CIDRs and it does not
        run yet (at start, and when a ``--config`` change adds them)."""
        pcfg = self.settings.proxy
        if self._addresses_watched or not (pcfg.nodeport_cidrs(4) or pcfg.nodeport_cidrs(6)):
            return
        assert self._nursery is not None, "started from run()"
        self._addresses_watched = True
        await self._nursery.start(ending("addresses", self._watch_addresses))

    def _stop(self, cancel: trio.CancelScope, status: int) -> None:
        """Cancel every task (on the trio thread) and arm the stop deadline."""
        if not cancel.cancel_called:
            self.exit_status = status
        systemd.notify("STOPPING=1")
        cancel.cancel()
        self.deadline.arm(status)

    @contextlib.contextmanager
    def _stop_signals(self, cancel: trio.CancelScope) -> Iterator[None]:
        """SIGTERM and SIGINT stop the daemon (status 0): see ``StopDeadline.signals``."""

        def stopping(signum: int) -> None:
            if not cancel.cancel_called:
                self.log.info("daemon.stopping", signal=signal.Signals(signum).name)
            self._stop(cancel, 0)

        with self.deadline.signals(stopping):
            yield

    async def _watch_config(self, watcher: ConfigWatcher, cancel: trio.CancelScope) -> None:
        """Look at the ``--config`` file at once (it may have changed since the start) and then
        whenever it may have changed (``config/notify.py``); see the module docstring for what
        a change does.

        Cancellation: safe at any point (the thread only stats and reads the file, and looks
        up its directories; abandoned, so a file that blocks a read, such as a FIFO, or a hung
        mount cannot hold a stop).
        """
        changes = Changes()

        def look() -> tuple[Reload | None, list[Path]]:
            return watcher.check(), watcher.directories()

        try:
            while True:
                reload, directories = await trio.to_thread.run_sync(look, abandon_on_cancel=True)
                if changes.follow(directories):
                    self.log.info(
                        "config.polled",
                        file=str(watcher.path),
                        every_s=POLL_SECONDS,
                        reason=str(changes.polling),
                    )
                if reload is not None and not await self._reload(reload, str(watcher.path), cancel):
                    return
                await changes.wait()
        finally:
            changes.close()

    async def _reload(self, reload: Reload, where: str, cancel: trio.CancelScope) -> bool:
        """Say what the changed ``--config`` file ``where`` changes and apply it; False: the
        daemon stops for it (a setting that cannot change in place)."""
        if reload.error is not None:
            self.log.error(
                "config.invalid",
                file=where,
                error=f"{reload.error}; the current settings are kept",
            )
            return True
        for warning in reload.warnings:
            self.log.warning("config.warning", file=where, warning=warning)
        if not reload.changes:
            self.log.info("config.unchanged", file=where)
            return True
        for change in reload.changes:
            self.log.info(
                "config.changed",
                file=where,
                setting=change.name,
                old=_shown(change.old),
                new=_shown(change.new),
            )
        if reload.restart:
            self.log.warning(
                "daemon.restarting",
                file=where,
                exit_status=EXIT_CONFIG_CHANGED,
                settings=[c.name for c in reload.restart],
                reason="the --config file changed settings that cannot change in place; "
                "exiting, rules in place, to be started again with the new settings",
            )
            self._stop(cancel, EXIT_CONFIG_CHANGED)
            return False
        await self._apply_settings(reload.settings)
        self.log.info("config.applied", file=where, settings=[c.name for c in reload.changes])
        return True

    async def _apply_settings(self, new: Settings) -> None:
        """Apply ``new`` settings in place (none of ``watch.RESTART_FIELDS`` differs): the
        planner's go to the sync loop (its next sync, at once, sends what differs), the periods
        reschedule it, conntrack sysctls are written, ``/configz`` shows them.

        Cancellation: safe at any point (the sysctls' thread is abandoned: each write stands
        alone, and the next start writes them all).
        """
        old, self.settings = self.settings, new
        self.cfg = cfg = new.daemon
        self._configz = configz(new)
        self.health.set_grace(2 * cfg.sync_period)
        self.loop.set_periods(min_interval=cfg.min_sync_period, sync_period=cfg.sync_period)
        if new.proxy != old.proxy:
            self.loop.reconfigure(new.proxy)
            await self._start_address_watch()
        if cfg.conntrack != old.daemon.conntrack:
            await trio.to_thread.run_sync(
                apply_logged, cfg.conntrack, self.netns, abandon_on_cancel=True
            )

    async def _watchdog(self, interval: float) -> None:
        while True:
            systemd.notify("WATCHDOG=1")
            await trio.sleep(interval)

    async def _censuses(self) -> None:
        """SIGUSR1 writes a heap census when censuses are on (census.py); it is not listened
        for otherwise, so it keeps its default action then."""
        taken = 0
        with trio.open_signal_receiver(signal.SIGUSR1) as signals:
            async for _ in signals:
                taken += 1
                await self._census(str(taken))

    async def _census(self, name: str) -> None:
        """Write a heap census (``census.py``) in a worker thread, when censuses are on."""
        if census.prefix() is not None:
            try:
                path = await trio.to_thread.run_sync(census.write, name, abandon_on_cancel=True)
            except OSError as exc:  # a diagnostic must never stop the proxy
                self.log.warning("daemon.census_failed", name=name, error=str(exc))
                return
            self.log.info("daemon.census", path=str(path))

    def log_start(self) -> None:
        """One line a platform team can read the node's set-up from."""
        pcfg = self.syncer.config
        cfg = dataclasses.asdict(self.cfg)
        cfg.pop("warnings", None)
        if self.settings.manifests is not None:
            source = f"manifests {self.settings.manifests}"
        else:
            source = f"kubeconfig {self.cfg.kubeconfig}" if self.cfg.kubeconfig else "in-cluster"
            if self.cfg.api_server:
                source += f", API server {self.cfg.api_server}"
        self.log.info(
            "daemon.starting",
            version=__version__,
            node=self.cfg.node_name,
            node_ips=[str(ip) for ip in pcfg.node_ips] or "from the Node object",
            cluster_cidrs=[str(c) for c in pcfg.cluster_cidrs],
            service_cidrs=[str(c) for c in pcfg.service_cidrs],
            nodeport_addresses=list(pcfg.nodeport_addresses),
            source=source,
            netns=self.netns,
            config=cfg,
        )

    async def _serve_http(self, nursery: trio.Nursery) -> None:
        """Start ``/healthz`` and ``/metrics``. Listening from the start: a slow first list is
        "not ready" on /healthz (503) while /livez says the process is alive, and /metrics
        shows the progress."""
        for addr, handler in (
            (self.cfg.healthz_bind_address, self._healthz),
            (self.cfg.metrics_bind_address, self._metrics),
        ):
            if addr is not None:  # None: turned off (an empty address)
                serving = functools.partial(serve, netns_name=self.netns, budget=self.connections)
                await nursery.start(serving, addr, handler)

    async def run(self) -> None:
        self.deadline.start()
        send, recv = trio.open_memory_channel[Sequence[Change]](64)
        try:
            stop = trio.CancelScope()
            with stop, self._stop_signals(stop):
                async with trio.open_nursery() as nursery:
                    if census.prefix() is not None:
                        nursery.start_soon(self._censuses)
                    await self._serve_http(nursery)
                    # Watching before the first read-back and commit: a change another process
                    # makes to the tables at any time after start-up is seen (the quiet verify
                    # trusts that nothing unseen happened since the watch's first generation). A
                    # watch by generation, not a member of NFNLGRP_NFTABLES: a member makes the
                    # kernel build a message per element of every commit on the host, the daemon's
                    # own 10k x 10 sync's and any other writer's (docs/ruleset.md).
                    self.watch = GenerationWatch(netns_name=self.netns)
                    watch = functools.partial(self.watch.run, self._generation_moved)
                    await nursery.start(ending("generation-watch", watch))
                    # The initial lists, the state and the first plan build the objects the daemon
                    # keeps for good; the cyclic GC would walk them over and over while they grow
                    # (runtime/hotpath.py). Paused until the first sync has frozen them.
                    self.loop.hold_collection()
                    self._nursery = nursery
                    # The node's addresses before the lists: a plan made ahead of the first sync
                    # (a cold start) plans the node ports for them, as that sync will.
                    await self._start_address_watch()
                    source = self._source()
                    await nursery.start(ending("source", functools.partial(source.run, send)))
                    self.healthchecks = HealthCheckServers(
                        nursery,
                        netns_name=self.netns,
                        budget=self.connections,
                        metrics=self.metrics,
                    )
                    keep = self.supervisor.keep
                    await nursery.start(keep, "inspector", self.reachability.run)
                    await nursery.start(self.loop.run, recv)
                    await self._census("first_sync")
                    nursery.start_soon(keep, "foreign-check", at_once(self.foreign.run))
                    systemd.notify("READY=1")
                    self.log.info("daemon.ready", node=self.cfg.node_name)
                    interval = systemd.watchdog_interval()
                    if interval:
                        nursery.start_soon(self._watchdog, interval)
                    if self.watcher is not None:
                        config = functools.partial(self._watch_config, self.watcher, stop)
                        nursery.start_soon(ending("config-watch", at_once(config)))
        finally:
            self.syncer.close()
