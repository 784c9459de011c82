"""``update @map { key : data }``: a dynamic map the packet path fills, written, read back,
rendered as nft lists it, and filled by real packets.

ClientIP affinity needs one such map per Service port (client address -> endpoint) instead of a
set and a chain per endpoint; this is the nft layer's part of it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

from nlproxy.errors import InvalidNftObject
from nlproxy.nft.backend import NftBackend
from nlproxy.nft.ir import (
    Chain,
    ChainType,
    DataType,
    DnatMap,
    Family,
    Field,
    Hook,
    Map,
    Operation,
    Policy,
    Rule,
    Ruleset,
    Set,
    SetFlag,
    SetUpdate,
    Table,
    Verb,
)
from nlproxy.nft.readback import read_ruleset
from nlproxy.nft.reconcile import diff
from nlproxy.nft.render import render_rule
from nlproxy.nft.validate import validate

DYNAMIC = SetFlag.TIMEOUT | SetFlag.EVAL


def _plan(family: Family) -> tuple[Ruleset, Rule]:
    v4 = family is Family.IP
    addr = DataType.IPV4_ADDR if v4 else DataType.IPV6_ADDR
    saddr, daddr = (Field.IP_SADDR, Field.IP_DADDR) if v4 else (Field.IP6_SADDR, Field.IP6_DADDR)
    rs = Ruleset(table=Table(family=family, name="dynmap"))
    rs.add_set(Map(name="aff", key=(addr,), data=(addr, DataType.INET_SERVICE), flags=DYNAMIC,
                   timeout=600))  # fmt: skip
    rs.add_chain(Chain(name="learn", type=ChainType.FILTER, hook=Hook.OUTPUT, priority=-99,
                       policy=Policy.ACCEPT))  # fmt: skip
    learn = Rule(chain="learn", exprs=(SetUpdate("aff", (saddr,), 600, (daddr, Field.TH_DPORT)),))
    rs.add_rule(learn)
    rs.add_chain(Chain(name="known"))
    rs.add_rule(Rule(chain="known", exprs=(DnatMap((saddr,), "aff"),)))
    return rs, learn


@pytest.mark.parametrize("family", [Family.IP, Family.IP6])
def test_written_read_back_and_listed_alike(
    make_netns: Callable[[str], str], family: Family
) -> None:
    ns = make_netns("dynmap")
    want, learn = _plan(family)
    with NftBackend(want.table, netns=ns) as backend:
        backend.apply(diff(want, None))
    got = read_ruleset(family, "dynmap", netns=ns)
    assert got is not None
    assert diff(want, got) == []
    listed = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "chain", family.value, "dynmap", "learn"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert render_rule(learn, family=family) in listed


def test_packets_fill_the_map(make_netns: Callable[[str], str]) -> None:
    """A new connection adds ``source -> destination . port``; the map's data is the packet's."""
    ns = make_netns("dynmap-pkt")
    want, _ = _plan(Family.IP)
    with NftBackend(want.table, netns=ns) as backend:
        backend.apply(diff(want, None))
    subprocess.run(["ip", "netns", "exec", ns, "ip", "addr", "add", "127.0.0.9/8", "dev", "lo"],
                   check=True)  # fmt: skip
    subprocess.run(  # a UDP datagram to nowhere still passes output
        ["ip", "netns", "exec", ns, "python3", "-c",
         "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
         "s.sendto(b'x', ('127.0.0.9', 4242))"],
        check=True,
    )  # fmt: skip
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-j", "list", "map", "ip", "dynmap", "aff"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    elems = [m["map"].get("elem", []) for m in json.loads(out)["nftables"] if "map" in m]
    assert elems, out
    assert elems[0], out
    key, data = elems[0][0]
    client = key["elem"]["val"] if isinstance(key, dict) else key
    assert (client, data["concat"]) == ("127.0.0.1", ["127.0.0.9", 4242])


def test_data_only_for_a_map_of_that_shape() -> None:
    rs, _ = _plan(Family.IP)
    plain = Set(name="plain", key=(DataType.IPV4_ADDR,), flags=DYNAMIC)
    data = SetUpdate("plain", (Field.IP_SADDR,), None, (Field.IP_DADDR,))
    short = SetUpdate("aff", (Field.IP_SADDR,), None, (Field.IP_DADDR,))
    for update in (data, short):
        ops = [*diff(rs, None), Operation(Verb.ADD, plain)]
        ops.append(Operation(Verb.ADD, Rule(chain="learn", exprs=(update,))))
        with pytest.raises(InvalidNftObject, match=update.set):
            validate(rs.table, ops)
