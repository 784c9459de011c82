"""The daemon's periodic look for another proxy's rules (``inspect/foreign_check.py``): the nftables
tables are dumped again only when the namespace's generation moved; IPVS is looked at each time."""

from __future__ import annotations

from collections.abc import Callable

from nlproxy.inspect.foreign_check import ForeignCheck
from nlproxy.nft.monitor import GenerationWatch
from tests.netns import sh


def test_the_tables_are_dumped_again_only_after_a_commit(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("nlpfc")
    watch = GenerationWatch(netns_name=ns, interval=3600.0)
    check = ForeignCheck(ns, watch.current)
    assert not check.look()
    for _ in range(3):  # nothing committed: the generation answers for the tables
        assert not check.look()
    assert check.table_looks == 1

    sh("nft", "add", "table", "ip", "kube-proxy", ns=ns)  # another proxy commits
    found = check.look()
    assert [(t.table, t.mode) for t in found.tables] == [("kube-proxy", "nftables")]
    assert check.look().tables == found.tables
    assert check.table_looks == 2

    sh("nft", "delete", "table", "ip", "kube-proxy", ns=ns)
    assert not check.look()
    assert check.table_looks == 3


def test_without_a_generation_every_look_dumps_the_tables(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("nlpfc")
    check = ForeignCheck(ns)
    sh("nft", "add", "table", "ip", "kube-proxy", ns=ns)
    for _ in range(2):
        assert [t.table for t in check.look().tables] == ["kube-proxy"]
    assert check.table_looks == 2


def test_a_forgotten_look_dumps_again(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("nlpfc")
    watch = GenerationWatch(netns_name=ns, interval=3600.0)
    check = ForeignCheck(ns, watch.current)
    check.look()
    check.forget()
    check.look()
    assert check.table_looks == 2
