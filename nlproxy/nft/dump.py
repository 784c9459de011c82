"""nftables dump requests and replies over netlink, through libnftnl: the read-back's plumbing.

Sits under the read-back (``readback.py`` and ``readsets.py``): it builds GET requests with
libnftnl (the ``_nftshim`` cffi module, imported on first use), runs them on a
:class:`~nlproxy.netlink.nlsock.NetfilterSocket`, flags interrupted dumps (the element dumps of
``readsets.py`` flag the walks the kernel does not: :func:`~nlproxy.nft.readsets.walked`), and
hands back parsed libnftnl objects and their attributes as Python values. It only reads: it
never sends anything that changes the kernel, and it knows nothing of the IR.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nlproxy.errors import NlproxyError
from nlproxy.netlink.codec import NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, Message, nlmsghdr
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.ir import Family
from nlproxy.nft.uapi import (
    NFT_MSG_GETCHAIN,
    NFT_MSG_GETGEN,
    NFT_MSG_GETRULE,
    NFT_MSG_GETSET,
)

_DUMP_KINDS = {NFT_MSG_GETCHAIN: "chain", NFT_MSG_GETSET: "set", NFT_MSG_GETRULE: "rule"}


class ReadbackError(NlproxyError):
    """The kernel's answer to a dump could not be read."""


class Interrupted(Exception):
    """A dump to start again: a reply carried NLM_F_DUMP_INTR (the ruleset changed during it),
    or a set's elements came back from a walk the kernel disturbed without saying so (a key
    listed twice: ``readsets.walked``).

    Args:
        why: what was seen, for the error that names the object once the retries are spent.
    """

    def __init__(self, why: str = "the ruleset changed during the dump") -> None:
        super().__init__(why)
        self.why = why


class Disturbed(Interrupted):
    """A set's elements came back from a walk the kernel disturbed without flagging the dump
    (``readsets.walked``): read them again, once the kernel's own work on the set is over
    (:func:`settle`).

    ``seen`` is what the walk listed, where the reader keeps it (``readsets.read_pairs``): each
    of those was in the set, only others are missing."""

    seen: dict[bytes, bytes] | None = None


SETTLE_S = 0.05
"""The pause before the n-th read again of a disturbed set is n times this (0.5 s in all over
the retries). The kernel's deferred resize of a hash map that a commit grew to 100k elements
was over by the next read, 0.25 s after the commit, in every case measured: one read of a large
table outlasts it, but reads of a small table in a row could all meet it."""


def settle(attempt: int) -> None:
    """Wait before read ``attempt + 1`` of a set whose walk was disturbed (:data:`SETTLE_S`)."""
    time.sleep(SETTLE_S * (attempt + 1))


@functools.cache
def nftnl() -> tuple[Any, Any]:
    """The cffi module's ``(ffi, lib)``, imported on first use (importing nlproxy.nft must not
    need it)."""
    from nlproxy._nftshim import ffi, lib

    return ffi, lib


def request(msg: int, family: Family, flags: int, seq: int, build: Callable[[Any], None]) -> bytes:
    """A request message ``msg`` whose payload ``build(nlh)`` writes with libnftnl."""
    ffi, lib = nftnl()
    buf = ffi.new("char[]", 4096)
    nlh = lib.nftnl_nlmsg_build_hdr(buf, msg, family.nfproto, flags, seq)
    build(nlh)
    return bytes(ffi.buffer(buf, nlh.nlmsg_len))


def nlh_of(msg: Message) -> Any:
    """A parseable ``struct nlmsghdr *`` for a received message (nlsock strips the header)."""
    ffi, _ = nftnl()
    data = nlmsghdr(16 + len(msg.payload), msg.type, msg.flags, msg.seq) + msg.payload
    return ffi.from_buffer("struct nlmsghdr *", data)


def messages(s: NetfilterSocket, req: bytes, seq: int) -> Iterator[Message]:
    """The replies to ``req``.

    Raises:
        Interrupted: the ruleset changed during the dump (NLM_F_DUMP_INTR).
    """
    for msg in s.dump(req, seq):
        if msg.flags & NLM_F_DUMP_INTR:
            # The rest of this dump carries its sequence number; the retry's dumps skip it.
            raise Interrupted
        yield msg


def generation(s: NetfilterSocket) -> int:
    """The ruleset's generation id (it moves with every commit)."""
    _, lib = nftnl()
    seq = s.next_seq()
    req = request(NFT_MSG_GETGEN, Family.INET, NLM_F_ACK, seq, lambda nlh: None)
    for msg in s.dump(req, seq):
        with parsed("gen", nlh_of(msg)) as gen:
            return int(lib.nftnl_gen_get_u32(gen, lib.NFTNL_GEN_ID))
    raise ReadbackError("generation", "the kernel sent no generation id")


def dump(
    s: NetfilterSocket,
    msg_type: int,
    family: Family,
    table: str,
    parse: Callable[[Any, Family], Any],
) -> Iterator[Any]:
    """Dump one kind of object of ``table``, yielding what ``parse(nlh, family)`` gives for each.

    ``parse`` returns (table name, object): the kernel ignores the table filter of chain dumps
    (nf_tables_dump_chains), so objects of other tables are dropped here.
    """
    _, lib = nftnl()
    seq = s.next_seq()
    kind = _DUMP_KINDS[msg_type]
    alloc, free = getattr(lib, f"nftnl_{kind}_alloc"), getattr(lib, f"nftnl_{kind}_free")
    set_str = getattr(lib, f"nftnl_{kind}_set_str")
    build = getattr(lib, f"nftnl_{kind}_nlmsg_build_payload")
    attr = getattr(lib, f"NFTNL_{kind.upper()}_TABLE")

    def payload(nlh: Any) -> None:
        obj = alloc()
        set_str(obj, attr, table.encode())
        build(nlh, obj)
        free(obj)

    req = request(msg_type, family, NLM_F_DUMP, seq, payload)
    for msg in messages(s, req, seq):
        owner, obj = parse(nlh_of(msg), family)
        if owner == table:
            yield obj


@contextmanager
def parsed(kind: str, nlh: Any, parse: str = "nlmsg_parse") -> Iterator[Any]:
    """A libnftnl ``kind`` object (table, chain, set, rule, gen) parsed from ``nlh``, freed when
    the block ends."""
    _, lib = nftnl()
    obj = getattr(lib, f"nftnl_{kind}_alloc")()
    try:
        if getattr(lib, f"nftnl_{kind}_{parse}")(nlh, obj) < 0:
            raise ReadbackError(kind, "cannot parse the kernel's answer")
        yield obj
    finally:
        getattr(lib, f"nftnl_{kind}_free")(obj)


def iterate(create: Any, next_: Any, destroy: Any, obj: Any) -> list[Any]:
    """All items of a libnftnl iterator (they live as long as ``obj``)."""
    ffi, _ = nftnl()
    it = create(obj)
    items = []
    try:
        item = next_(it)
        while item != ffi.NULL:
            items.append(item)
            item = next_(it)
    finally:
        destroy(it)
    return items


def get_bytes(getter: Any, obj: Any, attr: int) -> bytes:
    """A data attribute of a libnftnl object, b"" when absent."""
    ffi, _ = nftnl()
    n = ffi.new("uint32_t *")
    ptr = getter(obj, attr, n)
    if ptr == ffi.NULL:
        return b""
    return bytes(ffi.buffer(ptr, n[0]))


def get_str(getter: Any, obj: Any, attr: int) -> str:
    """A string attribute of a libnftnl object, "" when absent."""
    ffi, _ = nftnl()
    ptr = getter(obj, attr)
    return "" if ptr == ffi.NULL else str(ffi.string(ptr).decode())
