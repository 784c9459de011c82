"""``nft list ruleset`` of a node running nlproxy loads back with ``nft -f``.

Operators and host tooling save the whole ruleset and restore it (``nft list ruleset > f;
nft -f f``, nftables.service, a scratch namespace for debugging). One table that nft cannot
parse back breaks that for every table on the node, so every shape nlproxy programs is checked
here: both families, ClusterIP/NodePort/external/LB frontends, source ranges, both traffic
policies, ClientIP affinity (with a learned client), ``--service-counters``, an owned table, and
round-robin and consistent-hash ports (their own chains and maps).
The saved text must pass ``nft -c -f``, load with ``nft -f`` into a fresh namespace, and read back
there as exactly what was planned (the next sync would send nothing).
"""

from __future__ import annotations

import copy
import dataclasses
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from nlproxy.cluster.model import LoadBalancing
from nlproxy.netlink.nlsock import NetfilterSocket
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.dump import NFT_MSG_GETSET, dump, get_bytes, get_str, nftnl, parsed
from nlproxy.nft.ir import DataType, Family, Map, Ruleset, SetFlag, Table
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.nft.render import render_ruleset
from nlproxy.nft.udata import TYPEOF_MODULUS
from nlproxy.proxy.planner import plan
from tests.netns import sh
from tests.world import config, world


def nft(ns: str, *args: str, text: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", *args],
        input=text,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _planned(counters: bool, lb: LoadBalancing = LoadBalancing.RANDOM) -> dict[Family, Ruleset]:
    return plan(world(), config(service_counters=counters, load_balancing=lb)).rulesets


@contextmanager
def _program(ns: str, rulesets: dict[Family, Ruleset], owner: bool) -> Iterator[None]:
    """Program both families' tables into ``ns``; an owned table lives while its socket does."""
    backends = []
    try:
        for rs in rulesets.values():
            table = Table(family=rs.table.family, name=rs.table.name, owner=owner)
            b = NftBackend(table, netns=ns)
            backends.append(b)
            b.apply(diff(rs, None))
        yield
    finally:
        for b in backends:
            b.close()


_LEARNED_DATA = {
    (DataType.IPV4_ADDR, DataType.INET_SERVICE): "10.9.9.9 . 80",
    (DataType.IPV6_ADDR,): "fd00:10::9",
    (DataType.INET_SERVICE,): "80",
}


def _learn_a_client(ns: str, rs: Ruleset) -> set[str]:
    """Put one client into the first clients map (``client -> endpoint``), and in IPv6 into
    its ports map too, as the datapath does."""
    learned = set()
    for role in ("clients-", "clientports-"):
        names = [s for s, obj in rs.sets.items() if obj.flags & SetFlag.TIMEOUT
                 and isinstance(obj, Map) and s.startswith(role)]  # fmt: skip
        if not names:
            continue
        m = rs.sets[names[0]]
        assert isinstance(m, Map)
        client = "fd00:10::99" if rs.table.family is Family.IP6 else "10.1.2.3"
        client += f" : {_LEARNED_DATA[m.data]}"
        family, table = str(rs.table.family), rs.table.name
        sh("nft", "add", "element", family, table, m.name, f"{{ {client} }}", ns=ns)
        learned.add(m.name)
    return learned


def _assert_reads_back_as_planned(ns: str, want: Ruleset, dynamic: set[str]) -> None:
    got = read_ruleset(want.table.family, want.table.name, netns=ns)
    assert got is not None, f"table {want.table.family} {want.table.name} is missing"
    for name in dynamic:  # learned clients belong to the datapath, not to the plan
        assert got.elements.get(name), f"the learned client in {name} was lost"
        got.elements[name] = want.elements.get(name, {})
    assert diff(want, got) == [], "the restored table differs from the plan"


@pytest.mark.parametrize(
    ("counters", "owner", "lb"),
    [
        pytest.param(False, False, LoadBalancing.RANDOM, id="plain"),
        pytest.param(True, False, LoadBalancing.RANDOM, id="service-counters"),
        pytest.param(False, True, LoadBalancing.RANDOM, id="owned-table"),
        pytest.param(False, False, LoadBalancing.ROUND_ROBIN, id="round-robin"),
        pytest.param(False, False, LoadBalancing.CONSISTENT_HASH, id="consistent-hash"),
    ],
)
def test_saved_ruleset_loads_back(
    make_netns: Callable[[str], str], counters: bool, owner: bool, lb: LoadBalancing
) -> None:
    node, scratch = make_netns("nrs"), make_netns("nrr")
    rulesets = _planned(counters, lb)
    dynamic: dict[Family, set[str]] = {}
    with _program(node, rulesets, owner):
        for family, rs in rulesets.items():
            dynamic[family] = _learn_a_client(node, rs)
        saved = sh("nft", "list", "ruleset", ns=node)
    # ClientIP affinity in both families, a learned client each: IPv4's clients map, IPv6's
    # clients map and its ports map.
    assert [x.split("-")[0] for x in dynamic[Family.IP]] == ["clients"]
    assert sorted(x.split("-")[0] for x in dynamic[Family.IP6]) == ["clientports", "clients"]
    assert "expires" in saved, "a learned client is listed with its timeout"

    check = nft(scratch, "-c", "-f", "-", text=saved)
    assert check.returncode == 0, f"nft -c -f refused the saved ruleset:\n{check.stderr}"
    load = nft(scratch, "-f", "-", text=saved)
    assert load.returncode == 0, f"nft -f refused the saved ruleset:\n{load.stderr}"
    for family, want in rulesets.items():
        _assert_reads_back_as_planned(scratch, want, dynamic[family])


def test_rules_prints_what_nft_lists_for_the_numgen_maps(make_netns: Callable[[str], str]) -> None:
    """The ``backends`` maps are declared ``typeof … numgen …`` and listed exactly as nft does."""
    ns = make_netns("nrt")
    rulesets = _planned(False)
    with _program(ns, rulesets, owner=False):
        for family, rs in rulesets.items():
            got = read_ruleset(family, rs.table.name, netns=ns)
            assert got is not None
            for name in ("backends", "nodeport-backends"):
                listed = sh("nft", "list", "map", str(family), rs.table.name, name, ns=ns)
                assert "typeof " in listed, listed
                assert "numgen random mod" in listed, listed
                one = Ruleset(table=rs.table)
                one.add_set(got.sets[name])
                for el in got.elements.get(name, {}).values():
                    one.add_element(el)
                rendered = render_ruleset(one)
                assert _declaration(rendered) == _declaration(listed)


def _declaration(text: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip().startswith("typeof"))


def _raw_set_udata(ns: str, family: Family, table: str) -> dict[str, tuple[int, bytes]]:
    """Each set's key type id and userdata, as the kernel stores them."""
    _, lib = nftnl()

    def parse(nlh: object, _family: Family) -> tuple[str, tuple[str, int, bytes]]:
        with parsed("set", nlh) as s:
            name = get_str(lib.nftnl_set_get_str, s, lib.NFTNL_SET_NAME)
            key_type = int(lib.nftnl_set_get_u32(s, lib.NFTNL_SET_KEY_TYPE))
            udata = get_bytes(lib.nftnl_set_get_data, s, lib.NFTNL_SET_USERDATA)
            return get_str(lib.nftnl_set_get_str, s, lib.NFTNL_SET_TABLE), (name, key_type, udata)

    with NetfilterSocket(ns) as sock:
        return {n: (k, u) for n, k, u in dump(sock, NFT_MSG_GETSET, family, table, parse)}


@pytest.mark.parametrize("family", [Family.IP, Family.IP6])
def test_numgen_maps_are_declared_as_nft_declares_them(
    make_netns: Callable[[str], str], family: Family
) -> None:
    """Key type and ``typeof`` userdata of the backends maps equal what nft writes itself."""
    ns = make_netns("nrd")
    rs = _planned(False)[family]
    with _program(ns, {family: rs}, owner=False):
        ours = _raw_set_udata(ns, family, rs.table.name)
    addr = "ip6 daddr" if family is Family.IP6 else "ip daddr"
    ng = f"numgen random mod {TYPEOF_MODULUS}"
    text = f"""table {family} ref {{
        map backends {{ typeof {addr} . meta l4proto . th dport . {ng} : {addr} . th dport; }}
        map nodeport-backends {{ typeof meta l4proto . th dport . {ng} : {addr} . th dport; }}
    }}"""
    loaded = nft(ns, "-f", "-", text=text)
    assert loaded.returncode == 0, loaded.stderr
    theirs = _raw_set_udata(ns, family, "ref")
    for name in ("backends", "nodeport-backends"):
        assert ours[name] == theirs[name], name


def test_maps_declared_with_a_mark_index_are_recreated(make_netns: Callable[[str], str]) -> None:
    """A table programmed by an earlier version (index typed ``mark``) is brought to the new
    declaration by one sync, and then restores with ``nft -f``."""
    ns, scratch = make_netns("nru"), make_netns("nrv")
    want = _planned(False)[Family.IP]
    old = copy.deepcopy(want)
    for name, s in want.sets.items():
        if DataType.INTEGER in s.key:
            old.sets[name] = dataclasses.replace(
                s, key=tuple(DataType.MARK if t is DataType.INTEGER else t for t in s.key)
            )
    with _program(ns, {Family.IP: old}, owner=False):
        pass
    got = read_ruleset(Family.IP, want.table.name, netns=ns)
    assert got is not None
    ops = diff(want, got)
    assert ops, "the mark-typed maps differ from the plan"
    with NftBackend(want.table, netns=ns) as b:
        b.apply(ops)
    _assert_reads_back_as_planned(ns, want, set())
    saved = sh("nft", "list", "ruleset", ns=ns)
    load = nft(scratch, "-f", "-", text=saved)
    assert load.returncode == 0, load.stderr
