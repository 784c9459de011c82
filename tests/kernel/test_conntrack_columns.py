"""``nlproxy conntrack list`` shows what ``conntrack -L`` shows: state, timeout, mark, flags.

Real flows in a fresh namespace: an nft table there marks new connections (``meta mark`` copied
to ``ct mark``) and DNATs one address, then the test opens TCP connections (one established, one
closed into TIME_WAIT), sends UDP with and without an answer and an ICMP echo request, over IPv4
and IPv6. The lines
nlproxy prints are compared with ``conntrack -L -o extended``'s in the same namespace, the
timeouts (which tick between the two reads) within a few seconds.
"""

from __future__ import annotations

import json
import re
import socket
import struct
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from nlproxy.cli import main
from nlproxy.log import configure
from nlproxy.netlink import netns as nsmod
from tests.netns import sh

MARK = 0x4001
RULES = f"""
table inet ctcols {{
    chain out {{
        type filter hook output priority 0;
        ct state new meta mark set {MARK} ct mark set meta mark
    }}
    chain nat-out {{
        type nat hook output priority -100;
        ip daddr 10.96.0.1 tcp dport 80 dnat ip to 127.0.0.1:{{port}}
    }}
}}
"""
_TIMEOUT = re.compile(r"^(ipv\d +\d+ \w+ +\d+) (\d+) ")


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr() -> None:
    """``cli.main`` binds structlog to the stderr of the test that called it; rebind it here."""
    configure(level="warning")


@pytest.fixture
def flows(make_netns: Callable[[str], str], tmp_path: Path) -> Iterator[str]:
    """A namespace holding TCP (established, TIME_WAIT, DNAT'd) and UDP flows of both families."""
    ns = make_netns("ctcols")
    sh("ip", "link", "add", "svc0", "type", "veth", "peer", "name", "svc1", ns=ns)
    sh("ip", "link", "set", "svc0", "up", ns=ns)
    sh("ip", "route", "add", "10.96.0.0/16", "dev", "svc0", ns=ns)
    with ExitStack() as stack:
        with nsmod.entered(ns):
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            lone = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        for s in (server, server6, udp, peer, lone):
            stack.enter_context(s)
        server.bind(("127.0.0.1", 0))
        server.listen()
        server6.bind(("::1", 0))
        server6.listen()
        port = server.getsockname()[1]
        rules = tmp_path / "rules.nft"
        rules.write_text(RULES.replace("{port}", str(port)))
        sh("nft", "-f", str(rules), ns=ns)
        with nsmod.entered(ns):
            for dst in (("127.0.0.1", port), ("10.96.0.1", 80), server6.getsockname()[:2]):
                stack.enter_context(socket.create_connection(dst, timeout=5))
            closing = socket.create_connection(("127.0.0.1", port), timeout=5)
        for listener in (server, server, server6):
            stack.enter_context(listener.accept()[0])
        closed = server.accept()[0]
        closing.close()  # the client closes first: TIME_WAIT on its side
        closed.close()
        udp.bind(("127.0.0.1", 0))
        peer.bind(("127.0.0.1", 0))
        udp.sendto(b"ping", peer.getsockname())
        peer.sendto(b"pong", udp.getsockname())
        lone.sendto(b"nobody", ("::1", 9))  # unanswered (and refused): UNREPLIED
        with nsmod.entered(ns):
            icmp = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))
        icmp.sendto(_echo_request(ident=0x1234), ("127.0.0.1", 0))
        icmp.settimeout(5)
        icmp.recv(128)  # our own request, looped back
        icmp.recv(128)  # the kernel's reply
        yield ns


def _echo_request(ident: int) -> bytes:
    """An ICMP echo request with a correct checksum."""
    body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"ping"
    total = sum(struct.unpack(f"!{len(body) // 2}H", body))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return body[:2] + struct.pack("!H", ~total & 0xFFFF) + body[4:]


def _split(line: str) -> tuple[str, int]:
    """The line without its timeout, and the timeout."""
    m = _TIMEOUT.match(line)
    assert m, f"no timeout in {line!r}"
    return _TIMEOUT.sub(r"\1 ", line), int(m.group(2))


def _conntrack_tool(ns: str) -> list[str]:
    return [line.strip() for line in sh("conntrack", "-L", "-o", "extended", ns=ns).splitlines()]


def test_list_prints_what_conntrack_L_prints(
    flows: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--netns", flows, "conntrack", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"{len(out) - 1} flows matched"
    ours = dict(map(_split, out[:-1]))
    theirs = dict(map(_split, _conntrack_tool(flows)))
    assert sorted(ours) == sorted(theirs)
    for line, timeout in ours.items():
        assert abs(timeout - theirs[line]) <= 3, line
    text = "\n".join(ours)
    # The cases the fixture made are all there, with the columns conntrack shows.
    assert re.search(r" ESTABLISHED src=\S+ dst=10.96.0.1 sport=\d+ dport=80 src=127.0.0.1 ", text)
    assert " TIME_WAIT src=127.0.0.1 dst=127.0.0.1 " in text
    assert re.search(r"ipv6 +10 tcp +6 ESTABLISHED src=::1 dst=::1 .* \[ASSURED\] mark=16385", text)
    assert re.search(r"udp +17 src=::1 dst=::1 sport=\d+ dport=9 \[UNREPLIED\] src=::1", text)
    assert re.search(
        r"icmp +1 \d+ src=127.0.0.1 dst=127.0.0.1 type=8 code=0 id=4660 "
        r"src=127.0.0.1 dst=127.0.0.1 type=0 code=0 id=4660 mark=16385",
        "\n".join(out),
    )
    assert all(f"mark={MARK}" in line for line in ours)


def test_flush_deletes_icmp_flows(flows: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An ICMP flow is keyed by type, code and id, not ports: a delete must send those."""
    assert main(["--netns", flows, "conntrack", "flush", "--dst", "127.0.0.1", "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["matched"] == counts["deleted"] >= 4  # TCP, TIME_WAIT, UDP and ICMP flows
    assert sh("conntrack", "-L", "-d", "127.0.0.1", ns=flows) == ""


def test_json_carries_state_timeout_mark_and_flags(
    flows: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--netns", flows, "conntrack", "list", "--proto", "tcp", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["flows"]
    dnat = [f for f in listed if f["orig"]["dst"] == "10.96.0.1"]
    assert len(dnat) == 1
    assert dnat[0]["state"] == "ESTABLISHED"
    assert dnat[0]["mark"] == MARK
    assert 0 < dnat[0]["timeout"] <= 432000
    assert dnat[0]["flags"] == ["ASSURED", "DNAT"]
    assert {f["state"] for f in listed} == {"ESTABLISHED", "TIME_WAIT"}
