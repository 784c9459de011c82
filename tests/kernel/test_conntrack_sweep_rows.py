"""The sweep's light reading on the kernel's own dump messages, and its exact deletion.

Flows of IPv4 and IPv6, TCP, UDP and SCTP, translated or not, are created in a fresh
namespace; every message the kernel dumps for them is read by one ``SweepReader`` (learning
their layouts) exactly as the full decoder reads it (the fast reading is taken for all of
them), and ``Conntrack.delete_rows`` deletes exactly the rows it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from nlproxy.conntrack.kernel import Conntrack, Flow, FlowFilter
from nlproxy.conntrack.messages import (
    CT_MESSAGE,
    FlowTuple,
    decode_flow,
    read_attrs,
)
from nlproxy.conntrack.plan import Pass
from nlproxy.conntrack.rows import SweepReader, flow_row
from tests.kernel.test_conntrack_cli import fill, grid


def flows() -> list[Flow]:
    """The grid's translated flows (the reply from a backend) and untranslated ones."""
    plain = [
        replace(
            f,
            orig=replace(f.orig, sport=1 + i),
            reply=FlowTuple(f.orig.dst, f.orig.src, f.orig.proto, f.orig.dport, 1 + i),
        )
        for i, f in enumerate(f for f in grid() if f.orig.dport == 53)
    ]
    return grid() + plain


def test_kernel_messages_read_as_the_decoder_reads_them(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("ctrow")
    made = flows()
    fill(ns, made)
    ct = Conntrack(ns)
    everything = FlowFilter()
    payloads = list(ct._payloads(Pass(everything, (everything,))))
    assert len(payloads) == len(made)
    reader = SweepReader()
    for payload in payloads:
        fast = reader.row(payload)
        assert fast is not None
        slow = flow_row(decode_flow(payload))
        assert fast[:6] == slow[:6]
        got: dict[str, object] = {}
        want: dict[str, object] = {}
        read_attrs(fast[6], 0, len(fast[6]), CT_MESSAGE, got)
        read_attrs(slow[6], 0, len(slow[6]), CT_MESSAGE, want)
        assert got == want
    rows = [flow_row(decode_flow(p)) for p in payloads]
    assert {(r[1], r[2]) == (r[3], r[4]) for r in rows} == {True, False}


def test_delete_rows_deletes_exactly_those_flows(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("ctrowdel")
    made = flows()
    fill(ns, made)
    ct = Conntrack(ns)
    udp = list(ct.sweep_rows(FlowFilter(proto="udp")))
    sctp = list(ct.sweep_rows(FlowFilter(proto="sctp")))
    assert udp
    assert sctp
    assert {r[0] for r in udp} == {17}
    gone = [r for r in udp + sctp if r[2] == 53]
    assert ct.delete_rows(gone) == len(gone)
    assert ct.delete_rows(gone) == 0  # already gone: not counted
    left = {(f.orig, f.reply) for f in ct.list()}
    want = {(f.orig, f.reply) for f in made if f.orig.proto == 6 or f.orig.dport != 53}
    assert left == want
