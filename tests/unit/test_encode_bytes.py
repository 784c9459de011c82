"""The encoder's batch is a function of its operations alone: every byte, padding included.

Attribute padding the netlink helpers skip must not carry whatever the buffer's memory held
before (another batch's bytes): a batch encoded again, after other batches used and freed
their buffers, is byte for byte the first one.
"""

from __future__ import annotations

from nlproxy.nft.encode import Batch
from nlproxy.nft.ir import Family, Ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.proxy.planner import plan
from tests.world import config, world


def _bytes(rs: Ruleset) -> bytes:
    batch = Batch(rs.table, {}, 1)
    batch.add(diff(rs, None))
    return bytes(batch.finish())


def test_a_batch_is_the_same_bytes_after_other_batches() -> None:
    plain = plan(world(), config()).rulesets
    counted = plan(world(), config(service_counters=True)).rulesets
    first = {f: _bytes(plain[f]) for f in (Family.IP, Family.IP6)}
    for _ in range(3):
        for f in (Family.IP, Family.IP6):
            _bytes(counted[f])  # another batch's bytes in memory the next buffer may reuse
            assert _bytes(plain[f]) == first[f]
