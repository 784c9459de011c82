"""The inspector on a fake node (``inspect/fake.py``): classification reads the routes the
fake holds, of the endpoints' families only, in one dump."""

from __future__ import annotations

import socket
from ipaddress import ip_address, ip_network

from nlproxy.inspect.classify import classify
from nlproxy.inspect.fake import FakeNode
from nlproxy.inspect.rtnl import Link, NextHop, Route, Snapshot

ETH0 = Link(index=2, name="eth0", kind=None, admin_up=True, oper="UP")


def via(dst: str, gateway: str) -> Route:
    return Route(
        dst=ip_network(dst),
        table=254,
        type=1,
        scope=0,
        priority=0,
        nexthops=(NextHop(oif=2, gateway=ip_address(gateway)),),
    )


def test_endpoints_are_classified_from_the_routes_the_node_holds() -> None:
    node = FakeNode(
        Snapshot(
            links={2: ETH0},
            routes=(via("10.2.0.0/16", "192.168.0.3"), via("fd00:2::/64", "fd00:192::3")),
        ),
        addrs=[ip_address("192.168.0.2")],
    )
    got = classify([ip_address("10.2.0.7"), ip_address("10.9.0.1")], node=node)

    assert got[ip_address("10.2.0.7")].kind == "remote"
    assert got[ip_address("10.9.0.1")].kind == "unreachable"
    assert node.dumps == 1
    assert node.dump([socket.AF_INET6]).routes == (via("fd00:2::/64", "fd00:192::3"),)
    assert node.addresses() == (ip_address("192.168.0.2"),)
