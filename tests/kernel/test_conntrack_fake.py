"""``conntrack/fake.py`` against the kernel: the same flows, the same filters, the same answer.

The kernel's table is filled with ctnetlink NEW messages, the fake with the same flows; each
case lists and deletes by the same filters on both sides (the sync's stale-flow filters among
them) and compares which flows each selected and which remain.
"""

from __future__ import annotations

from collections.abc import Callable
from ipaddress import ip_address

import pytest

from nlproxy.conntrack.fake import FakeConntrack
from nlproxy.conntrack.kernel import Conntrack, Flow, FlowFilter
from nlproxy.conntrack.plan import stale_flow_filters
from nlproxy.proxy.layout import Backend, Frontend
from tests.kernel.test_conntrack_cli import fill, grid


def seen(flows: object) -> set[tuple[str, str, str]]:
    return {(f.proto, str(f.orig), str(f.reply)) for f in flows}  # type: ignore[attr-defined]


def _stale() -> list[FlowFilter]:
    """What the sync deletes when 10.244.0.1 and fd00:244::2 leave their UDP services."""
    vip4, vip6 = ip_address("10.96.0.10"), ip_address("fd00:96::11")
    old = {
        Frontend("udp", vip4, 53): frozenset({Backend(ip_address("10.244.0.1"), 8057)}),
        Frontend("udp", vip6, 53): frozenset({Backend(ip_address("fd00:244::2"), 8059)}),
    }
    new = {Frontend("udp", vip4, 53): frozenset(), Frontend("udp", vip6, 53): frozenset()}
    return stale_flow_filters(old, new, node_addrs=())


CASES: dict[str, Callable[[], list[FlowFilter]]] = {
    "one frontend": lambda: [FlowFilter(orig_dst=ip_address("10.96.0.11"), orig_dport=80)],
    "a protocol and a backend": lambda: [
        FlowFilter(proto="udp", reply_src=ip_address("10.244.0.2"))
    ],
    "IPv6, checked here": lambda: [
        FlowFilter(proto="sctp", orig_dport=53, reply_src=ip_address("fd00:244::1"))
    ],
    "both families at once": lambda: [
        FlowFilter(orig_dst=ip_address("10.96.0.10"), orig_dport=53, proto="tcp"),
        FlowFilter(orig_dst=ip_address("fd00:96::10"), orig_dport=80, proto="udp"),
    ],
    "the sync's stale flows": _stale,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fake_selects_and_deletes_as_the_kernel(
    make_netns: Callable[[str], str], case: str
) -> None:
    filters = CASES[case]()
    assert filters
    ns = make_netns("ctfake")
    flows: list[Flow] = grid()
    fill(ns, flows)
    kernel, fake = Conntrack(ns), FakeConntrack(flows)
    assert seen(kernel.list()) == seen(fake.list()) == seen(flows)
    for flt in filters:
        assert seen(kernel.list(flt)) == seen(fake.list(flt))

    deleted = kernel.delete(filters)
    assert fake.delete(filters) == deleted
    assert deleted
    assert seen(kernel.list()) == seen(fake.list())
    assert seen(fake.deleted) == seen(flows) - seen(fake.flows)
