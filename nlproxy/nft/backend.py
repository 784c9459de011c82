"""The kernel backend: apply a transaction to one nftables table as one atomic batch.

Sits at the end of the write path: the reconciler hands :meth:`NftBackend.apply` a sequence of
:class:`~nlproxy.nft.ir.Operation`; it validates them (``validate.py``), encodes all of them into
one nfnetlink batch (``encode.py``), sends it on the backend's NETLINK_NETFILTER socket and reads
the kernel's answers. It decides nothing about what to program, and it never execs ``nft``.

Kernel batch semantics this relies on (nfnetlink, Linux 6.x):

* The kernel processes a batch synchronously inside ``sendmsg``: when the send returns, every
  answer is already queued on the socket, so the answers are drained without blocking.
* Each message that fails gets an NLMSG_ERROR; a message flagged NLM_F_ACK gets one even when it
  succeeds. The kernel keeps processing after a failure to report every error, then aborts the
  whole batch: all or nothing. Only the last message asks for an ACK, so a successful batch of
  100k messages produces one answer; a failed one produces an answer per failing message (plus
  the last). Should they overflow the 64 MiB receive buffer (ENOBUFS), the kernel drops the
  later ones: the first error, the one reported, is always read. Errors after the first are
  often its consequences. A batch without the final ACK and without errors is an error too.
* A batch without BATCH_END is processed and answered just the same, then aborted: nothing of
  it applies (nft's ``--check``). :meth:`NftBackend.check` asks the kernel that way whether it
  would take a batch.
* With NETLINK_EXT_ACK the kernel adds a message and the offset of the offending attribute; for
  an element message that offset points into one element, which names it exactly, and for a
  rule into one expression (``exprs[i]`` in the error).

Owned tables (NFT_TABLE_F_OWNER, Linux >= 5.12), as observed on Linux 6.18 by
``tests/kernel/test_nft_write_owner.py``:

* Only the socket that created the table may change or delete it: any other socket, including
  ``nft`` run by root, gets EPERM, so the backend keeps its socket open for its whole life.
* ``nft flush ruleset`` leaves an owned table alone (the kernel skips tables owned by others).
* When the owning socket closes (the process exits), the kernel deletes the table, unless it was
  created with NFT_TABLE_F_PERSIST (Linux >= 6.9): then it stays, orphaned, rules in force, and
  anyone may change it like an ordinary table (``nft add chain`` works again).
* A new process re-takes an orphaned persistent table by adding it again from its socket with
  exactly the same flags (owner + persist); from then on only that socket may change it. Adding
  it with other flags (e.g. owner alone, or none) fails with EOPNOTSUPP: persist cannot be
  dropped from an existing table. nft 1.0.6 lists such a table with an empty ``flags`` line.
"""

from __future__ import annotations

import errno as errno_mod
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nlproxy.errors import InvalidNftObject, KernelError
from nlproxy.netlink.codec import (
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    be32,
    be64,
    nfnl_attributes,
    nfnl_message,
    nfnl_type,
    str_attr,
    text,
)
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft import validate as validation
from nlproxy.nft.encode import Batch
from nlproxy.nft.ir import (
    Chain,
    DataType,
    Element,
    Family,
    Map,
    Operation,
    Ruleset,
    Set,
    SetFlag,
    SetLike,
    Table,
    Verb,
)
from nlproxy.nft.packed import PackedElements
from nlproxy.nft.tables import Tables
from nlproxy.nft.uapi import (
    NFNL_SUBSYS_NFTABLES,
    NFT_MSG_GETCHAIN,
    NFT_MSG_GETSET,
    NFT_MSG_GETTABLE,
    NFTA_CHAIN_NAME,
    NFTA_CHAIN_TABLE,
    NFTA_SET_DATA_LEN,
    NFTA_SET_DATA_TYPE,
    NFTA_SET_FLAGS,
    NFTA_SET_KEY_LEN,
    NFTA_SET_KEY_TYPE,
    NFTA_SET_NAME,
    NFTA_SET_TABLE,
    NFTA_SET_TIMEOUT,
    NFTA_TABLE_NAME,
)
from nlproxy.nft.values import NFT_DATA_VERDICT, concat_len, type_ids
from nlproxy.nft.view import steps

_TYPES = {dt.type_id: dt for dt in DataType}
_BATCH_END_LEN = 20  # nlmsghdr + nfgenmsg: BATCH_END, the last message of an encoded batch


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What one :meth:`NftBackend.apply` sent: messages in the batch and wall seconds, in all
    and for its three stages (validation, encoding, the kernel's commit)."""

    messages: int
    seconds: float
    validate_s: float = 0.0
    encode_s: float = 0.0
    commit_s: float = 0.0


def kernel_release() -> tuple[int, int]:
    """The running kernel's (major, minor) version."""
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def kernel_supports_persist() -> bool:
    """NFT_TABLE_F_PERSIST exists from Linux 6.9: without it an owned table dies with us."""
    return kernel_release() >= (6, 9)


def kernel_supports_destroy() -> bool:
    """NFT_MSG_DESTROY* (delete if present) exist from Linux 6.3."""
    return kernel_release() >= (6, 3)


class NftBackend:
    """Applies transactions to ``table`` in network namespace ``netns`` (None: the current one).

    The socket stays open for the backend's lifetime: an owned table can only be changed from the
    socket that created it, and closing that socket deletes the table unless it persists.

    Args:
        table: the table every operation is about.
        netns: a named network namespace (``/var/run/netns/NAME``) or a path.
        known: what the kernel already has in the table; when None, the backend reads the
            table's chain names and set declarations from the kernel on first use. Either way
            it keeps that view up to date with what it applies.
    """

    def __init__(self, table: Table, *, netns: str | None = None, known: Ruleset | None = None):
        self.table = table
        self.netns = netns
        self.sock = NetfilterSocket(netns)
        self._known = known

    # -- public -----------------------------------------------------------------------------

    def apply(self, ops: Sequence[Operation], known: Ruleset | None = None) -> ApplyResult:
        """Validate, encode and commit ``ops`` as one atomic batch.

        Args:
            ops: the transaction, in order.
            known: overrides the backend's view of what the table holds, for validation.

        Returns:
            the number of messages sent and the wall time of encode + commit.

        Raises:
            InvalidNftObject: an operation is invalid; nothing was sent.
            KernelError: the kernel rejected the batch; nothing of it was applied. ``ref`` names
                the object of the first failing operation, ``index`` its position in ``ops``.
        """
        start = time.perf_counter()
        if not ops:
            return ApplyResult(0, 0.0)
        view = known or self.known()
        self._validate(ops, view)
        validated = time.perf_counter()
        batch = Batch(self.table, view.sets, self.sock.next_seq())
        batch.add(ops)
        data = batch.finish()
        encoded = time.perf_counter()
        self.sock.skip_to(batch.last_seq)
        self._commit(batch, data, ops)
        self._remember(ops, view)
        end = time.perf_counter()
        return ApplyResult(
            batch.messages,
            end - start,
            validate_s=validated - start,
            encode_s=encoded - validated,
            commit_s=end - encoded,
        )

    def check(self, ops: Sequence[Operation], known: Ruleset | None = None) -> None:
        """Have the kernel check ``ops`` without applying them.

        The batch is sent without its BATCH_END message: the kernel processes every message,
        answers as it would, then aborts the transaction (nft's ``--check`` does the same), so
        the table is untouched whatever the outcome.

        Raises:
            InvalidNftObject: an operation is invalid; nothing was sent.
            KernelError: the kernel would reject the batch (as :meth:`apply` would raise it).
        """
        if not ops:
            return
        view = known or self.known()
        self._validate(ops, view)
        batch = Batch(self.table, view.sets, self.sock.next_seq())
        batch.add(ops)
        data = batch.finish()
        self.sock.skip_to(batch.last_seq)
        self._commit(batch, data[: len(data) - _BATCH_END_LEN], ops)

    def known(self) -> Ruleset:
        """The backend's view of the table's chains and sets (read from the kernel once)."""
        if self._known is None:
            self._known = self.read_declarations()
        return self._known

    def forget(self) -> None:
        """Drop the cached view; the next :meth:`apply` reads it from the kernel again."""
        self._known = None

    def table_exists(self) -> bool:
        """Whether the table exists in the kernel (as seen from this socket's namespace)."""
        name = str_attr(NFTA_TABLE_NAME, self.table.name)
        return any(True for _ in self._dump(NFT_MSG_GETTABLE, name))

    def delete_table(self) -> bool:
        """Delete the table if it exists; returns whether it did."""
        if not self.table_exists():
            return False
        self.apply([Operation(Verb.DELETE, self.table)])
        return True

    def close(self) -> None:
        """Close the socket. An owned table without persist disappears with it."""
        self.sock.close()

    def __enter__(self) -> NftBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commit -----------------------------------------------------------------------------

    def _validate(self, ops: Sequence[Operation], view: Ruleset) -> None:
        validation.validate(self.table, ops, view)
        if not kernel_supports_destroy():
            for op in ops:
                if op.verb is Verb.DESTROY:
                    reason = "destroy needs Linux >= 6.3; use delete"
                    raise InvalidNftObject(validation.describe(op.obj), reason)

    def _commit(self, batch: Batch, data: memoryview, ops: Sequence[Operation]) -> None:
        self.sock.ensure_sndbuf(len(data))
        self.sock.drain()  # stale answers (none expected) must not be read as ours
        self.sock.send(data)
        answers, overflow = self.sock.drain()
        errors = []
        acked = False
        for msg in answers:
            if msg.type != NLMSG_ERROR:
                continue
            seq = msg.error_seq
            if not batch.first_seq <= seq <= batch.last_seq:
                continue
            if msg.error == 0:
                acked = acked or seq == batch.last_seq - 1
                continue
            errors.append((seq, msg.error, *msg.ext_ack()))
        if errors:
            raise self._error(batch, ops, min(errors))
        if overflow or not acked:
            raise KernelError(
                f"table {self.table.family} {self.table.name}",
                "the kernel's answer to the batch was lost"
                + (" (receive buffer overflow)" if overflow else ""),
                errno=0,
            )

    def _error(
        self, batch: Batch, ops: Sequence[Operation], err: tuple[int, int, str, int | None]
    ) -> KernelError:
        seq, errno, text, offset = err
        index, what = batch.locate(seq, offset)
        reason = os.strerror(errno) + (f" ({text})" if text else "")
        if index is None:
            ref = f"batch for table {self.table.family} {self.table.name}"
            return KernelError(ref, reason, errno=errno)
        obj, element = ops[index].obj, None
        refused = batch.refused_element(seq, offset)
        if refused is not None:  # named as the element it is, as an IR element would be
            run, i = refused
            element = run.keys[i]
            store = PackedElements(batch.sets[run.set])
            if run.data is None:  # a delete carries keys only, also from a map
                obj = Element(set=run.set, key=store.decode_key(element))
            else:
                obj = store.element(element, run.data[i])
        ref = validation.describe(obj, batch.sets)
        if what:
            ref = f"{ref}: {what}"
        return KernelError(ref, reason, errno=errno, index=index, element=element)

    def _remember(self, ops: Sequence[Operation], view: Ruleset) -> None:
        """Keep the view of chains and sets in step with what the kernel now has."""
        steps(view, ops, declarations=True)

    # -- reading declarations ---------------------------------------------------------------

    def read_declarations(self) -> Ruleset:
        """Chain names and set declarations of the table, from the kernel (no rules/elements).

        Sets whose types nlproxy cannot express (e.g. made by ``nft`` with ``typeof``) are left
        out; operations on them then fail validation with a message naming them.
        """
        rs = Ruleset(table=self.table)
        table = self.table.name.encode() + b"\0"
        chains = str_attr(NFTA_CHAIN_TABLE, self.table.name)
        for attrs in self._dump(NFT_MSG_GETCHAIN, chains):
            if attrs.get(NFTA_CHAIN_TABLE) == table:
                rs.add_chain(Chain(name=text(attrs[NFTA_CHAIN_NAME])))
        sets = str_attr(NFTA_SET_TABLE, self.table.name)
        for attrs in self._dump(NFT_MSG_GETSET, sets):
            if attrs.get(NFTA_SET_TABLE) == table:
                s = _decode_set(attrs)
                if s is not None:
                    rs.add_set(s)
        return rs

    def _dump(self, msg: int, attrs: bytes) -> Iterator[dict[int, bytes]]:
        seq = self.sock.next_seq()
        flags = NLM_F_REQUEST | NLM_F_DUMP | NLM_F_ACK
        mtype = nfnl_type(NFNL_SUBSYS_NFTABLES, msg)
        request = nfnl_message(mtype, flags, seq, self.table.family.nfproto, attrs)
        try:
            for reply in self.sock.dump(request, seq):
                yield nfnl_attributes(reply.payload)
        except OSError as exc:
            if exc.errno != errno_mod.ENOENT:  # no such table
                raise


def _be32(raw: bytes | None) -> int:
    return be32(raw) if raw else 0


def _types(type_id: int, length: int) -> tuple[DataType, ...] | None:
    """Split nft's concatenated type id (6 bits per part) and check it against ``length``."""
    parts: list[DataType] = []
    for part in type_ids(type_id):
        dt = _TYPES.get(part)
        if dt is None or dt is DataType.VERDICT:
            return None
        parts.append(dt)
    if not parts:
        return None
    return tuple(parts) if concat_len(parts) == length else None


def _decode_set(a: dict[int, bytes]) -> SetLike | None:
    """NFTA_SET_* attributes to a declaration."""
    key = _types(_be32(a.get(NFTA_SET_KEY_TYPE)), _be32(a.get(NFTA_SET_KEY_LEN)))
    if key is None:
        return None
    raw_flags = _be32(a.get(NFTA_SET_FLAGS))
    flags = SetFlag(raw_flags & ~int(SetFlag.MAP | SetFlag.CONCAT))
    timeout_ms = be64(a[NFTA_SET_TIMEOUT]) if NFTA_SET_TIMEOUT in a else None
    timeout = timeout_ms // 1000 if timeout_ms else None
    name = text(a[NFTA_SET_NAME])
    if not raw_flags & SetFlag.MAP:
        return Set(name=name, key=key, flags=flags, timeout=timeout)
    dtype = _be32(a.get(NFTA_SET_DATA_TYPE))
    dlen = _be32(a.get(NFTA_SET_DATA_LEN))
    data = (DataType.VERDICT,) if dtype == NFT_DATA_VERDICT else _types(dtype, dlen)
    if data is None:
        return None
    return Map(name=name, key=key, data=data, flags=flags, timeout=timeout)


if TYPE_CHECKING:  # the backend is what ``tables.Tables`` declares (mypy checks it)
    _tables: Tables = NftBackend(Table(family=Family.IP, name="t"))
