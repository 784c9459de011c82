"""``nlproxy cleanup``: remove nlproxy's tables (``ip nlproxy``, ``ip6 nlproxy``), or what every
kube-proxy mode leaves; idempotent.

:func:`remove_tables` touches no other table. :func:`remove_kube_proxy` removes kube-proxy's
nftables tables, its chains in the iptables-nft tables and IPVS mode's ipsets, ``kube-ipvs0``
device and virtual servers (``inspect/foreign.py``, ``inspect/ipvs.py``), as kube-proxy's own
``--cleanup`` would, over netlink and by exact name; nlproxy's tables are left alone then.
"""

from __future__ import annotations

from nlproxy.nft.ir import FAMILIES


def remove_tables(netns: str | None) -> list[str]:
    """Delete nlproxy's tables; returns those there were (``ip nlproxy``, ...)."""
    from nlproxy.nft.backend import NftBackend
    from nlproxy.nft.ir import Operation, Table, Verb
    from nlproxy.nft.readback import read_ruleset
    from nlproxy.proxy.naming import TABLE

    removed = []
    for family in FAMILIES:
        if read_ruleset(family, TABLE, netns=netns) is None:
            continue
        table = Table(family=family, name=TABLE)
        backend = NftBackend(table, netns=netns)
        try:
            backend.apply([Operation(Verb.DELETE, table)])
        finally:
            backend.close()
        removed.append(f"{family} {TABLE}")
    return removed


def remove_kube_proxy(netns: str | None) -> list[str]:
    """Delete every kube-proxy mode's rules and devices; returns what was found, one line each."""
    from nlproxy.inspect.foreign import find, remove_all

    found = find(netns)
    if not found:
        return []
    remove_all(found, netns)
    return list(found.describe())
