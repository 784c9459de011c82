"""Which of a dynamic map's clients are stale, and the batch that forgets them
(``nft/dynmap.py``; the kernel side is tests/kernel/test_nft_affinity_clients.py)."""

from __future__ import annotations

from ipaddress import IPv4Address as A

from nlproxy.nft.dynmap import forget_ops, pack_endpoints, stale
from nlproxy.nft.ir import DataType, Element, Map, Operation, SetFlag, Verb

AFF = Map(
    name="aff",
    key=(DataType.IPV4_ADDR,),
    data=(DataType.IPV4_ADDR, DataType.INET_SERVICE),
    flags=SetFlag.TIMEOUT | SetFlag.EVAL,
    timeout=600,
)
GONE, KEPT, OTHER_PORT = (A("10.1.0.1"), 80), (A("10.1.0.2"), 80), (A("10.1.0.2"), 81)
# As the kernel sends them: the address, then the port padded to 4 bytes.
CLIENTS = {
    A("10.0.0.1").packed: bytes([10, 1, 0, 1, 0, 80, 0, 0]),
    A("10.0.0.2").packed: bytes([10, 1, 0, 2, 0, 80, 0, 0]),
    A("10.0.0.3").packed: bytes([10, 1, 0, 2, 0, 81, 0, 0]),
}


def test_a_client_is_stale_when_its_endpoint_is_not_kept() -> None:
    assert stale(CLIENTS, pack_endpoints(AFF, [KEPT])) == [
        A("10.0.0.1").packed,
        A("10.0.0.3").packed,
    ]
    assert stale(CLIENTS, pack_endpoints(AFF, [GONE, KEPT, OTHER_PORT])) == []


def test_forgetting_sends_keys_only() -> None:
    gone = stale(CLIENTS, pack_endpoints(AFF, [KEPT]))
    for destroy, verb in ((True, Verb.DESTROY), (False, Verb.DELETE)):
        assert forget_ops(AFF, gone, destroy=destroy) == [
            Operation(verb, Element(set="aff", key=(A("10.0.0.1"),))),
            Operation(verb, Element(set="aff", key=(A("10.0.0.3"),))),
        ]
