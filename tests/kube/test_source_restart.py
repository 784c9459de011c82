"""A source that fails unexpectedly is restarted by the daemon's supervisor
(``daemon/supervise.py``), against the in-repo API server and the real client.

The failure comes from inside a watch's worker thread: the ``on_request`` hook the daemon hands
the source (its ``rest_client_*`` metrics) raises at the first request after the watches are
dropped, as any fault of nlproxy's own in the stream's thread would. Without a supervisor that
ends the source task, and the daemon with it. Restarted, the source lists every kind again
(a ``Replace`` each: what changed while it was down is not lost) and follows the cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import partial

import structlog
import trio
from prometheus_client import CollectorRegistry

from nlproxy.cluster.kube import KubeSource
from nlproxy.cluster.model import Change, Replace
from nlproxy.daemon.supervise import Supervisor
from nlproxy.serve.health import HealthState
from nlproxy.serve.metrics import Metrics
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import NODE, Feed, is_upsert_of, populate
from tests.objects import service


class FailOnce:
    """An ``on_request`` hook that raises once, at the first request after ``arm()``."""

    def __init__(self) -> None:
        self._armed = threading.Event()
        self._lock = threading.Lock()
        self.raised = 0

    def arm(self) -> None:
        self._armed.set()

    def __call__(self, method: str, host: str, status: int | None, seconds: float) -> None:
        with self._lock:
            if not self._armed.is_set() or self.raised:
                return
            self.raised += 1
        raise RuntimeError("fault in the watch thread")


async def test_a_source_that_fails_unexpectedly_is_restarted_and_follows_the_cluster(
    apiserver: ApiServer, api_client: object, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    registry = CollectorRegistry()
    health = HealthState(grace_seconds=60)
    supervisor = Supervisor(Metrics(registry).task_restarts, health, initial=0.05)
    hook = FailOnce()
    source = KubeSource(
        api_client,  # type: ignore[arg-type]
        node_name=NODE,
        backoff_initial=0.05,
        backoff_max=0.3,
        on_request=hook,
    )
    send, receive = trio.open_memory_channel[Sequence[Change]](1000)
    feed = Feed(receive)
    with structlog.testing.capture_logs() as logs:
        with trio.fail_after(60):
            await nursery.start(supervisor.keep, "source", partial(source.run, send))
        first = await feed.batch()
        assert {c.kind for c in first if isinstance(c, Replace)} == {
            "Service",
            "EndpointSlice",
            "Node",
            "ServiceCIDR",
        }
        hook.arm()
        apiserver.drop_connections()  # the watches ask again: the first request fails
        apiserver.store.put("services", service("meanwhile", cluster_ip="10.96.1.8"))
        seen = await feed.until(lambda c: isinstance(c, Replace) and c.kind == "Service")
        replace = [c for c in seen if isinstance(c, Replace)][-1]
        assert "meanwhile" in {c.ref.name for c in replace.changes}  # relisted, not lost
        apiserver.store.put("services", service("after", cluster_ip="10.96.1.9"))
        await feed.until(is_upsert_of("after"), within=30)
    assert hook.raised == 1
    failed = [e for e in logs if e["event"] == "task.failed"]
    assert [(e["task"], e["error"], e["log_level"]) for e in failed] == [
        ("source", "RuntimeError: fault in the watch thread", "error")
    ]
    restarts = {"task": "source"}
    assert registry.get_sample_value("nlproxy_task_restarts_total", restarts) == 1.0
    assert not health.failing  # once is not "keeps failing"
