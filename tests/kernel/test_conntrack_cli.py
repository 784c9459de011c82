"""``nlproxy conntrack list|flush`` and bulk behaviour, on flows created in the kernel.

Filter tests fill a namespace's table with ctnetlink NEW messages (``conntrack -I`` runs at
~1 ms per flow, far too slow for 100k); ``--service``/``--all-stale`` use real DNAT'd traffic and
an ``ip nlproxy`` table written with ``nft -f`` in the shape the planner programs.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterable, Iterator
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from nlproxy.cli import main
from nlproxy.conntrack.kernel import (
    Backend,
    Conntrack,
    ConntrackError,
    Frontend,
    stale_flow_filters,
)
from nlproxy.conntrack.messages import Flow, FlowFilter, FlowTuple, encode_new
from nlproxy.log import configure
from nlproxy.netlink.nlsock import NLMSG_ERROR, NetfilterSocket
from tests.kernel.conntrack_bed import PORT, V4, V6, Bed, make_bed
from tests.netns import sh

Addr = IPv4Address | IPv6Address
PROTO = {"tcp": 6, "udp": 17, "sctp": 132}


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr() -> None:
    """``cli.main`` binds structlog to the stderr of the test that called it; rebind it here."""
    configure(level="warning")


def fill(ns: str, flows: Iterable[Flow], *, chunk: int = 4000) -> None:
    """Create ``flows`` in ``ns``'s table with batched ctnetlink NEW messages; fail on any error."""
    with NetfilterSocket(ns) as sock:
        batch: list[bytes] = []
        first = sock.next_seq()
        for flow in flows:
            batch.append(encode_new(flow, sock.next_seq(), ack=True))
            if len(batch) == chunk:
                _send(sock, batch, first)
                batch, first = [], sock.next_seq()
        _send(sock, batch, first)


def _send(sock: NetfilterSocket, batch: list[bytes], first: int) -> None:
    if not batch:
        return
    sock.send(b"".join(batch))
    pending = len(batch)
    while pending:
        for msg in sock.recv(timeout=10):
            if msg.type == NLMSG_ERROR:
                assert msg.error == 0, f"creating flow seq {msg.seq}: errno {msg.error}"
                pending -= 1


def flow(proto: str, client: str, cport: int, dst: str, dport: int, be: str, bport: int) -> Flow:
    c, d, b = ip_address(client), ip_address(dst), ip_address(be)
    p = PROTO[proto]
    return Flow(
        orig=FlowTuple(c, d, p, cport, dport), reply=FlowTuple(b, c, p, bport, cport), timeout=600
    )


def grid() -> list[Flow]:
    """Flows to 2 VIPs, 2 ports, 3 protocols, two backends each, IPv4 and IPv6."""
    out = []
    for v, (vips, bes, cl) in {
        4: (["10.96.0.10", "10.96.0.11"], ["10.244.0.1", "10.244.0.2"], "10.0.0.2"),
        6: (["fd00:96::10", "fd00:96::11"], ["fd00:244::1", "fd00:244::2"], "fd00:1::2"),
    }.items():
        for i, (vip, dport, proto, be) in enumerate(
            (vip, dport, proto, be)
            for vip in vips
            for dport in (53, 80)
            for proto in PROTO
            for be in bes
        ):
            out.append(flow(proto, cl, 20000 + i, vip, dport, be, 8000 + dport + v))
    return out


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, (json.loads(out) if code == 0 and "--json" in argv else {"text": out})


@pytest.fixture
def table(make_netns: Callable[[str], str]) -> tuple[str, list[Flow]]:
    ns = make_netns("ctcli")
    flows = grid()
    fill(ns, flows)
    return ns, flows


CASES = [
    pytest.param(["--dst", "10.96.0.10"], lambda f: str(f.orig.dst) == "10.96.0.10", id="dst"),
    pytest.param(["--dst", "fd00:96::11"], lambda f: str(f.orig.dst) == "fd00:96::11", id="dst6"),
    pytest.param(["--dport", "80"], lambda f: f.orig.dport == 80, id="dport"),
    pytest.param(["--proto", "sctp"], lambda f: f.proto == "sctp", id="proto"),
    pytest.param(
        ["--endpoint", "fd00:244::2"], lambda f: str(f.reply.src) == "fd00:244::2", id="endpoint6"
    ),
    pytest.param(
        ["--dst", "10.96.0.11", "--dport", "53", "--proto", "udp", "--endpoint", "10.244.0.1"],
        lambda f: (
            (str(f.orig.dst), f.orig.dport, f.proto, str(f.reply.src))
            == ("10.96.0.11", 53, "udp", "10.244.0.1")
        ),
        id="all-four",
    ),
    pytest.param(
        ["--dport", "53", "--proto", "sctp", "--endpoint", "fd00:244::1"],
        lambda f: (f.orig.dport, f.proto, str(f.reply.src)) == (53, "sctp", "fd00:244::1"),
        id="sctp-port-checked-here",
    ),
]


@pytest.mark.parametrize(("argv", "want"), CASES)
def test_list_then_flush_each_filter(
    table: tuple[str, list[Flow]],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    want: Callable[[Flow], bool],
) -> None:
    ns, flows = table
    expected = {(f.orig, f.reply) for f in flows if want(f)}
    assert expected
    assert len(expected) < len(flows)

    code, out = run_cli(capsys, "--netns", ns, "conntrack", "list", *argv, "--json")
    assert code == 0
    listed = out["flows"]
    assert isinstance(listed, list)
    got = {
        (d["orig"]["src"], d["orig"]["dst"], d["orig"]["dport"], d["reply"]["src"], d["proto"])
        for d in listed
    }
    assert got == {
        (str(o.src), str(o.dst), o.dport, str(r.src), {6: "tcp", 17: "udp", 132: "sctp"}[o.proto])
        for o, r in expected
    }
    assert out["matched"] == len(expected)

    code, out = run_cli(capsys, "--netns", ns, "conntrack", "flush", *argv)
    assert code == 0
    assert out["text"] == f"{len(expected)} flows matched, {len(expected)} deleted\n"
    left = {(f.orig, f.reply) for f in Conntrack(ns).list()}
    assert left == {(f.orig, f.reply) for f in flows} - expected


def test_flush_without_filter_is_refused(
    table: tuple[str, list[Flow]], capsys: pytest.CaptureFixture[str]
) -> None:
    ns, flows = table
    assert main(["--netns", ns, "conntrack", "flush"]) == 2
    assert "refusing to delete every flow" in capsys.readouterr().err
    assert sum(1 for _ in Conntrack(ns).list()) == len(flows)


def test_mixed_family_filter_is_a_usage_error(
    table: tuple[str, list[Flow]], capsys: pytest.CaptureFixture[str]
) -> None:
    ns, _ = table
    code = main(
        ["--netns", ns, "conntrack", "list", "--dst", "10.96.0.10", "--endpoint", "fd00::1"]
    )
    assert code == 2
    assert "mixes IPv4 and IPv6" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["0", "65536", "99999", "http"])
def test_impossible_port_is_a_usage_error(
    table: tuple[str, list[Flow]], capsys: pytest.CaptureFixture[str], port: str
) -> None:
    ns, flows = table
    assert main(["--netns", ns, "conntrack", "flush", "--dport", port]) == 2
    assert "argument --dport" in capsys.readouterr().err
    assert sum(1 for _ in Conntrack(ns).list()) == len(flows)


def test_only_stale_flows_go_among_100k_unrelated(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("ct100k")
    vip, gone, kept = "10.96.5.5", "10.244.9.1", "10.244.9.2"

    def unrelated() -> Iterator[Flow]:
        for i in range(100_000):
            client = str(ip_address("10.1.0.0") + i)
            # Same VIP and backend, other port; same VIP and port, other backend; other VIPs.
            dst, be = [(vip, gone), (vip, kept), ("10.96.7.7", gone)][i % 3]
            dport = 54 if i % 3 == 0 else 53
            yield flow("udp", client, 30000 + i % 30000, dst, dport, be, PORT)

    fill(ns, unrelated())
    stale = [flow("udp", f"10.2.0.{i}", 40000, vip, 53, gone, PORT) for i in range(1, 51)]
    tcp = [flow("tcp", "10.2.1.1", 40000, vip, 53, gone, PORT)]
    fill(ns, stale + tcp)

    fe = Frontend("udp", ip_address(vip), 53)
    old = {fe: frozenset({Backend(ip_address(gone), PORT), Backend(ip_address(kept), PORT)})}
    new = {fe: frozenset({Backend(ip_address(kept), PORT)})}
    ct = Conntrack(ns)
    assert ct.delete(stale_flow_filters(old, new, node_addrs=[])) == len(stale)
    count = sh("conntrack", "-C", ns=ns).strip()
    assert int(count) == 100_000 + len(tcp)
    left = FlowFilter(
        proto="udp", orig_dst=ip_address(vip), orig_dport=53, reply_src=ip_address(gone)
    )
    assert list(ct.list(left)) == []


# -- --service and --all-stale: real DNAT'd flows, frontends read back from `ip nlproxy` ----------


@pytest.fixture(params=[V4, V6], ids=["ipv4", "ipv6"])
def bed(request: pytest.FixtureRequest, make_netns: Callable[[str], str]) -> Iterator[Bed]:
    yield from make_bed(make_netns, request.param)


def write_nlproxy_table(bed: Bed, services: dict[str, tuple[Addr | None, int, list[Addr]]]) -> None:
    """``ip``/``ip6 nlproxy`` holding only the dispatch and backend maps, as the planner fills
    them: ``services`` maps ``ns/name:port/UDP`` to (address or None for a NodePort, port,
    backends)."""
    fam, v = bed.fam.nft_family, bed.fam.version
    addr_t = "ipv4_addr" if v == 4 else "ipv6_addr"
    maps: dict[str, list[str]] = {k: [] for k in ("sips", "bes", "nps", "npbes")}
    for ref, (addr, port, backends) in services.items():
        if addr is None:
            maps["nps"].append(f'udp . {port} comment "{ref}" : goto lb')
        else:
            maps["sips"].append(f'{addr} . udp . {port} comment "{ref}" : goto lb')
        for i, be in enumerate(backends):
            prefix = f"udp . {port} . {i}" if addr is None else f"{addr} . udp . {port} . {i}"
            maps["npbes" if addr is None else "bes"].append(f"{prefix} : {be} . {PORT}")

    def decl(name: str, typ: str, elems: list[str]) -> str:
        body = f"type {typ}; " + (f"elements = {{ {', '.join(elems)} }}" if elems else "")
        return f"  map {name} {{ {body} }}\n"

    text = (
        f"table {fam} nlproxy {{}}\ndelete table {fam} nlproxy\n"
        f"table {fam} nlproxy {{\n  chain lb {{ }}\n"
        + decl("service-ips", f"{addr_t} . inet_proto . inet_service : verdict", maps["sips"])
        + decl(
            "backends",
            f"{addr_t} . inet_proto . inet_service . mark : {addr_t} . inet_service",
            maps["bes"],
        )
        + decl("service-nodeports", "inet_proto . inet_service : verdict", maps["nps"])
        + decl(
            "nodeport-backends",
            f"inet_proto . inet_service . mark : {addr_t} . inet_service",
            maps["npbes"],
        )
        + "}\n"
    )
    subprocess.run(
        ["ip", "netns", "exec", bed.node, "nft", "-f", "-"], input=text, text=True, check=True
    )


def test_service_and_all_stale_resolved_from_programmed_tables(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    f = bed.fam
    bed.nft(
        [
            bed.dnat("udp", f.vip, 53, f.a),
            bed.dnat("udp", f.vip2, 53, f.a),
            bed.dnat("udp", f.node, 30053, f.a),
        ]
    )
    dns, other, empty = "default/dns:dns/UDP", "kube-system/other:dns/UDP", "default/empty:/UDP"
    write_nlproxy_table(
        bed, {dns: (f.vip, 53, [f.a]), "default/dns:np/UDP": (None, 30053, [f.a]),
              other: (f.vip2, 53, [f.a]), empty: (f.vip_empty, 53, [])}
    )  # fmt: skip
    c1, c2, c3, c4 = (bed.sock(bed.client) for _ in range(4))
    assert [bed.ask(c1, f.vip, 53), bed.ask(c2, f.vip2, 53), bed.ask(c3, f.node, 30053)] == [
        "A",
        "A",
        "A",
    ]
    assert bed.ask(c4, f.vip_empty, 53) is None

    # A leaves default/dns; default/empty gets B.
    bed.nft(
        [
            bed.dnat("udp", f.vip, 53, f.b),
            bed.dnat("udp", f.vip2, 53, f.a),
            bed.dnat("udp", f.node, 30053, f.b),
            bed.dnat("udp", f.vip_empty, 53, f.b),
        ]
    )
    write_nlproxy_table(
        bed, {dns: (f.vip, 53, [f.b]), "default/dns:np/UDP": (None, 30053, [f.b]),
              other: (f.vip2, 53, [f.a]), empty: (f.vip_empty, 53, [f.b])}
    )  # fmt: skip

    code, out = run_cli(capsys, "--netns", bed.node, "conntrack", "list", "--service",
                        "default/dns", "--json")  # fmt: skip
    assert code == 0
    assert sorted(d["orig"]["dst"] for d in out["flows"]) == sorted([str(f.vip), str(f.node)])

    code, out = run_cli(capsys, "--netns", bed.node, "conntrack", "list", "--all-stale", "--json")
    assert code == 0
    stale = sorted(d["orig"]["dst"] for d in out["flows"])
    assert stale == sorted([str(f.vip), str(f.node), str(f.vip_empty)])

    code, out = run_cli(capsys, "--netns", bed.node, "conntrack", "flush", "--all-stale")
    assert code == 0
    assert out["text"] == "3 flows matched, 3 deleted\n"
    assert [bed.ask(c1, f.vip, 53), bed.ask(c2, f.vip2, 53), bed.ask(c3, f.node, 30053)] == [
        "B",
        "A",
        "B",
    ]
    assert bed.ask(c4, f.vip_empty, 53) == "B"


def test_unknown_service_is_a_usage_error(bed: Bed, capsys: pytest.CaptureFixture[str]) -> None:
    write_nlproxy_table(bed, {"default/dns:dns/UDP": (bed.fam.vip, 53, [bed.fam.a])})
    code = main(["--netns", bed.node, "conntrack", "flush", "--service", "default/nope"])
    assert code == 2
    assert "service default/nope: nlproxy programmed no frontend for it" in capsys.readouterr().err


def test_many_frontends_in_one_pass_delete_only_their_stale_flows(
    make_netns: Callable[[str], str],
) -> None:
    """40 services each lose a different endpoint: past MAX_PASSES, one pass per family."""
    ns = make_netns("ctmany")
    old: dict[Frontend, frozenset[Backend]] = {}
    new: dict[Frontend, frozenset[Backend]] = {}
    flows, doomed = [], set()
    for i in range(40):
        v = 4 if i % 2 else 6
        vip = f"10.96.1.{i}" if v == 4 else f"fd00:96::1:{i}"
        gone, kept = (
            (f"10.244.1.{i}", f"10.244.2.{i}")
            if v == 4
            else (f"fd00:244::1:{i}", f"fd00:244::2:{i}")
        )
        client = "10.0.0.2" if v == 4 else "fd00:1::2"
        fe = Frontend("udp", ip_address(vip), 53)
        old[fe] = frozenset({Backend(ip_address(gone), PORT), Backend(ip_address(kept), PORT)})
        new[fe] = frozenset({Backend(ip_address(kept), PORT)})
        for j, be in enumerate((gone, kept, gone)):
            # the third flow reached `gone` through another service port: not stale
            f = flow("udp", client, 20000 + 3 * i + j, vip, 53 if j < 2 else 54, be, PORT)
            flows.append(f)
            if j == 0:
                doomed.add((f.orig, f.reply))
    fill(ns, flows)
    counted: list[int] = []
    ct = Conntrack(ns, on_deleted=counted.append)
    filters = stale_flow_filters(old, new, node_addrs=[])
    assert len(filters) == 40
    assert ct.delete(filters) == 40
    assert sum(counted) == 40
    assert ct.deleted_total == 40
    left = {(f.orig, f.reply) for f in ct.list()}
    assert left == {(f.orig, f.reply) for f in flows} - doomed


def test_delete_refuses_an_empty_filter(make_netns: Callable[[str], str]) -> None:
    ns = make_netns("ctempty")
    fill(ns, [flow("udp", "10.0.0.2", 1000, "10.96.0.1", 53, "10.244.0.1", PORT)])
    with pytest.raises(ConntrackError, match="refusing to delete every flow"):
        Conntrack(ns).delete([FlowFilter(proto="udp"), FlowFilter()])
    assert len(list(Conntrack(ns).list())) == 1
