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


def test_a_put_that_fails_part_way_leaves_the_buffer_as_before() -> None:
    """A message of elements refused half way (an element past the message's bound) is taken
    back whole: the buffer's length as before, and every byte past it zero again (the next put
    relies on bytes past the length being zero)."""
    from nlproxy._nftshim import ffi, lib

    buf = ffi.gc(lib.nls_buf_new(1 << 16), lib.nls_buf_free)
    assert lib.nls_put_batch_begin(buf, 1) == 0
    before = buf.len
    e = ffi.new("struct nls_elems *")
    table, name = ffi.new("char[]", b"t"), ffi.new("char[]", b"s")
    keys = ffi.new("uint8_t[]", bytes(range(1, 9)) * 2)
    comments = ffi.new("char *[]", [ffi.NULL, ffi.new("char[]", b"x" * 200)])
    e.msg, e.family, e.table, e.set = 12, 2, table, name  # NFT_MSG_NEWSETELEM, inet
    e.count, e.keys, e.key_len, e.comments, e.max_bytes = 2, keys, 8, comments, 100
    assert lib.nls_put_elems(buf, 2, e) < 0  # the first fits, the second cannot
    assert buf.len == before
    assert bytes(ffi.buffer(buf.data + before, 4096)) == bytes(4096)
