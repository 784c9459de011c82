"""Drift detection from nftables notifications (message folding, without a socket)."""

import struct

from nlproxy.nft.monitor import DriftDetector

NFTABLES = 10 << 8


def attr(kind: int, value: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(value), kind) + value
    return raw + b"\0" * (-len(raw) % 4)


def msg_for_table(table: str) -> bytes:
    return b"\x02\x00\x00\x00" + attr(1, table.encode() + b"\0")


def newgen(pid: int, comm: str) -> bytes:
    return (
        b"\x00\x00\x00\x00"
        + attr(1, struct.pack(">I", 7))
        + attr(2, struct.pack(">I", pid))
        + attr(3, comm.encode() + b"\0")
    )


def test_foreign_change_to_our_table_is_a_drift() -> None:
    d = DriftDetector("nlproxy", is_own=lambda pid: pid == 100)
    assert d.feed(NFTABLES | 5, msg_for_table("nlproxy")) is None  # DELCHAIN
    assert d.feed(NFTABLES | 14, msg_for_table("nlproxy")) is None  # DELSETELEM
    drift = d.feed(NFTABLES | 15, newgen(4242, "nft"))
    assert drift is not None
    assert (drift.pid, drift.comm, drift.objects) == (4242, "nft", 2)


def test_own_changes_and_other_tables_are_not_drift() -> None:
    d = DriftDetector("nlproxy", is_own=lambda pid: pid == 100)
    d.feed(NFTABLES | 6, msg_for_table("nlproxy"))
    assert d.feed(NFTABLES | 15, newgen(100, "nlproxy")) is None
    d.feed(NFTABLES | 6, msg_for_table("filter"))
    assert d.feed(NFTABLES | 15, newgen(4242, "nft")) is None
