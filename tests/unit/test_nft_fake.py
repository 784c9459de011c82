"""The fake table takes a batch whole or not at all, and says which step it refused."""

from __future__ import annotations

import errno

import pytest

from nlproxy.errors import KernelError
from nlproxy.nft.fake import FakeTable
from nlproxy.nft.ir import Chain, Family, Operation, Rule, Table, Verb, jump

T = Table(family=Family.IP, name="nlproxy")


def test_a_refused_batch_leaves_the_table_as_it_was() -> None:
    table = FakeTable()
    table.commit([Operation(Verb.ADD, T), Operation(Verb.ADD, Chain(name="a"))])
    held = table.ruleset
    with pytest.raises(KernelError) as refused:
        table.commit(
            [
                Operation(Verb.ADD, Chain(name="b")),
                Operation(Verb.ADD, Rule(chain="a", exprs=(jump("b"),))),
                Operation(Verb.DELETE, Chain(name="b")),  # referenced by the rule just added
            ]
        )
    assert (refused.value.errno, refused.value.index) == (errno.EBUSY, 2)
    assert table.ruleset is held
    assert sorted(table.ruleset.chains) == ["a"]
    assert table.batches == 1


def test_destroy_of_an_absent_chain_is_no_error_and_delete_is() -> None:
    table = FakeTable()
    table.commit([Operation(Verb.ADD, T), Operation(Verb.DESTROY, Chain(name="gone"))])
    with pytest.raises(KernelError) as refused:
        table.commit([Operation(Verb.DELETE, Chain(name="gone"))])
    assert refused.value.errno == errno.ENOENT
