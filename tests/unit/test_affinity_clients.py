"""Which of a dynamic map's clients are stale, and the batch that forgets them
(``nft/dynmap.py``; the kernel side is tests/kernel/test_nft_affinity_clients.py)."""

from __future__ import annotations

from ipaddress import IPv4Address as A

from nlproxy.nft.dynmap import forget_ops, stale
from nlproxy.nft.ir import Element, Operation, Verb

GONE, KEPT = (A("10.1.0.1"), 80), (A("10.1.0.2"), 80)
CLIENTS = [
    Element(set="aff", key=(A("10.0.0.1"),), value=GONE, timeout=600),
    Element(set="aff", key=(A("10.0.0.2"),), value=KEPT, timeout=600),
    Element(set="aff", key=(A("10.0.0.3"),), value=(A("10.1.0.2"), 81), timeout=600),
]


def test_a_client_is_stale_when_its_endpoint_is_not_kept() -> None:
    assert [el.key for el in stale(CLIENTS, {KEPT})] == [(A("10.0.0.1"),), (A("10.0.0.3"),)]
    assert stale(CLIENTS, {GONE, KEPT, (A("10.1.0.2"), 81)}) == []


def test_forgetting_sends_keys_only() -> None:
    gone = stale(CLIENTS, {KEPT})
    for destroy, verb in ((True, Verb.DESTROY), (False, Verb.DELETE)):
        assert forget_ops(gone, destroy=destroy) == [
            Operation(verb, Element(set="aff", key=(A("10.0.0.1"),))),
            Operation(verb, Element(set="aff", key=(A("10.0.0.3"),))),
        ]
