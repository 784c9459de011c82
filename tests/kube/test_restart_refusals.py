"""An API server restart: for about a second after it starts, its authorizer answers 403 to every
identity without cluster-admin rights. Kinds read a moment ago, with the rules programmed, are
no reason to fail ``/healthz`` (every node would at once, and a load balancer probing it would
drop them all together); a refusal that outlasts the grace period still is.

Against the in-repo API server answering 403 after each start as kube-apiserver does, through
the real ``kubernetes`` client, with the daemon's wiring of ``on_unavailable`` to the health.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from nlproxy.cluster.kube import Unavailable
from nlproxy.serve.health import HealthState, healthz
from tests.kube.apiserver import ApiServer
from tests.kube.conftest import eventually, is_upsert_of, populate, start_source
from tests.objects import service


class Wired:
    """``on_unavailable`` as the daemon wires it: required kinds block ``/healthz``."""

    def __init__(self) -> None:
        self.health = HealthState(grace_seconds=60)

    def __call__(self, kinds: Mapping[str, Unavailable]) -> None:
        self.health.block("; ".join(str(u) for u in kinds.values() if u.required))

    def code(self) -> int:
        return healthz(self.health, trio.current_time())[0]


async def restart(apiserver: ApiServer, *, forbidden_for: float) -> None:
    """Stop, and start again refusing everything for ``forbidden_for`` seconds."""
    await eventually(lambda: apiserver.active_watches == 4)
    apiserver.stop()
    await trio.sleep(0.5)
    apiserver.forbidden_for = forbidden_for
    apiserver.start()


async def test_refusals_right_after_a_restart_keep_healthz_ready(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    wired = Wired()
    # Production retry settings and grace.
    feed, source = await start_source(
        nursery, api_client, on_unavailable=wired, backoff_initial=0.5, backoff_max=30.0
    )
    wired.health.synced(trio.current_time())  # rules programmed, nothing pending
    await restart(apiserver, forbidden_for=1.5)
    codes: list[int] = []
    with trio.move_on_after(4.0):
        while True:
            codes.append(wired.code())
            await trio.sleep(0.02)
    assert apiserver.refused >= 3  # every kind was refused at least once
    assert set(codes) == {200}, f"{codes.count(503)} of {len(codes)} polls were 503"
    assert source.unavailable == {}
    await eventually(lambda: apiserver.active_watches == 4)  # and it follows changes again
    apiserver.store.put("services", service("after", cluster_ip="10.96.1.1"))
    await feed.until(is_upsert_of("after"))


async def test_a_refusal_that_outlasts_the_grace_fails_healthz(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    wired = Wired()
    _, source = await start_source(
        nursery, api_client, on_unavailable=wired, backoff_initial=0.5, backoff_max=30.0,
        refusal_grace=2.0,
    )  # fmt: skip
    wired.health.synced(trio.current_time())
    # The role was taken away while the server was down: refused for good after the start.
    await eventually(lambda: apiserver.active_watches == 4)
    apiserver.forbid("services")
    await restart(apiserver, forbidden_for=0.0)
    restarted = trio.current_time()
    await eventually(lambda: wired.code() == 503, within=15)
    failed_after = trio.current_time() - restarted
    assert failed_after >= 2.0  # not before the grace ...
    assert failed_after <= 2.0 + 5  # ... and soon after it, not at the backoff's pace
    assert "Service: " in wired.health.body(0.0)["reason"]  # type: ignore[operator]
    assert source.unavailable["Service"].required
    apiserver.allow("services")
    await eventually(lambda: wired.code() == 200, within=40)
