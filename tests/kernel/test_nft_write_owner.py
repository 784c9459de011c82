"""Owned tables (NFT_TABLE_F_OWNER, + NFT_TABLE_F_PERSIST) on this kernel, as backend.py documents.

Ownership is tied to a netlink socket, so "the owner exits" is a child process that creates the
table through NftBackend and exits; everything else is checked with ``nft`` from outside.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from nlproxy.errors import KernelError
from nlproxy.nft.backend import NftBackend, kernel_release, kernel_supports_persist
from nlproxy.nft.ir import Chain, Family, Operation, Table, Verb
from tests.netns import sh

OWNED = Table(family=Family.IP, name="nlp", owner=True)
PERSIST = Table(family=Family.IP, name="nlp", owner=True, persist=True)
CHILD = """
import sys
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import Chain, Family, Operation, Table, Verb
t = Table(family=Family.IP, name="nlp", owner=True, persist=sys.argv[2] == "1")
b = NftBackend(t, netns=sys.argv[1])
b.apply([Operation(Verb.ADD, t), Operation(Verb.ADD, Chain(name="kept"))])
"""


def nft(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", *args], capture_output=True, text=True, check=False
    )


def tables(ns: str) -> str:
    return sh("nft", "list", "tables", ns=ns)


def owner_exits(ns: str, persist: bool) -> None:
    subprocess.run(
        [sys.executable, "-c", CHILD, ns, "1" if persist else "0"], check=True, timeout=60
    )


@pytest.fixture
def ns(make_netns: Callable[[str], str]) -> str:
    return make_netns("nfto")


def test_this_kernel_has_persist() -> None:
    assert kernel_release() >= (6, 9), "these tests document Linux >= 6.9 behaviour"
    assert kernel_supports_persist()


def test_only_the_owning_socket_may_change_it(ns: str) -> None:
    with NftBackend(OWNED, netns=ns) as owner:
        owner.apply([Operation(Verb.ADD, OWNED), Operation(Verb.ADD, Chain(name="c"))])
        assert "flags owner" in sh("nft", "list", "table", "ip", "nlp", ns=ns)
        for args in (("add", "chain", "ip", "nlp", "x"), ("delete", "table", "ip", "nlp")):
            proc = nft(ns, *args)
            assert proc.returncode != 0
            assert "Operation not permitted" in proc.stderr
        with (
            NftBackend(OWNED, netns=ns) as other,
            pytest.raises(KernelError, match=r"^chain d: Operation not permitted$"),
        ):
            other.apply([Operation(Verb.ADD, Chain(name="d"))])
        owner.apply([Operation(Verb.ADD, Chain(name="d"))])  # the owner still may
        assert "chain d" in sh("nft", "list", "table", "ip", "nlp", ns=ns)


def test_flush_ruleset_leaves_an_owned_table(ns: str) -> None:
    with NftBackend(OWNED, netns=ns) as owner:
        owner.apply([Operation(Verb.ADD, OWNED), Operation(Verb.ADD, Chain(name="c"))])
        sh("nft", "add", "table", "ip", "other", ns=ns)
        sh("nft", "flush", "ruleset", ns=ns)
        assert tables(ns) == "table ip nlp\n"
        assert "chain c" in sh("nft", "list", "table", "ip", "nlp", ns=ns)


def test_without_persist_the_table_dies_with_its_owner(ns: str) -> None:
    owner_exits(ns, persist=False)
    assert tables(ns) == ""
    with NftBackend(OWNED, netns=ns) as owner:
        owner.apply([Operation(Verb.ADD, OWNED)])
        assert tables(ns) == "table ip nlp\n"
    assert tables(ns) == ""  # close() is the owner leaving, too


def test_persistent_table_outlives_its_owner_and_can_be_retaken(ns: str) -> None:
    owner_exits(ns, persist=True)
    listed = sh("nft", "list", "table", "ip", "nlp", ns=ns)
    assert "chain kept" in listed
    # orphaned: anyone may change it
    sh("nft", "add", "chain", "ip", "nlp", "by-nft", ns=ns)
    # a new process re-takes it by adding it again with the same flags
    with NftBackend(PERSIST, netns=ns) as heir:
        with NftBackend(OWNED, netns=ns) as other, pytest.raises(KernelError) as info:
            other.apply([Operation(Verb.ADD, OWNED)])  # flags must match: persist cannot go
        assert str(info.value) == "table ip nlp: Operation not supported"
        heir.apply([Operation(Verb.ADD, PERSIST), Operation(Verb.ADD, Chain(name="mine"))])
        proc = nft(ns, "add", "chain", "ip", "nlp", "x")
        assert "Operation not permitted" in proc.stderr
        assert {"kept", "by-nft", "mine"} <= set(heir.read_declarations().chains)
    assert "chain mine" in sh("nft", "list", "table", "ip", "nlp", ns=ns)
