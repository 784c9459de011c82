"""Real packets through the per-Service-port affinity map that ``bench_affinity.py`` times.

The layout the planner now gives ClientIP affinity's ClusterIP-only IPv4 ports
(``proxy/affinity.py``: one dynamic map per Service port instead of per-endpoint sets and
chains), checked on the kernel with ``nft -f`` alone: the map keeps upstream's semantics. The
table is written into node1 of the demo test bed (pods pod-a, pod-b, pod-c on
node1, pod-r on node2; the outside client has two addresses; the node connects too), for a
TCP Service port ``10.96.0.10:80`` of the four pods:

* a known client is DNAT'd through ``aff-web`` (``client -> endpoint``), a new one through the
  shared ``numgen random`` backends map;
* after DNAT (filter, priority -99) the connection is found by its original destination in two
  steps nft can list and load again (``ct original ip daddr . meta l4proto``, then
  ``ct original proto-dst`` alone: nft 1.0.6 refuses ``ct original proto-dst`` inside a
  concatenation) and ``update`` learns ``client -> endpoint`` or refreshes its timeout;
* the packet path cannot delete a map's element or change its data, so when an endpoint goes
  the control plane deletes the clients the map holds for it, in the batch that removes it.

Prints one JSON line per check (``ok`` and what was seen) and exits 1 when one fails. Usage:
``.venv/bin/python bench/affinity_datapath.py``
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nlproxy.demo.echo import Result, request
from nlproxy.demo.testbed import Testbed

VIP, PORT, TARGET, TIMEOUT = "10.96.0.10", 80, 8080, 3
T = "ip affinity"
PODS = ("pod-a", "pod-b", "pod-c", "pod-r")


def _nft(ns: str, text: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=text.encode(), check=True)


def _out(ns: str, *args: str) -> str:
    cmd = ["ip", "netns", "exec", ns, "nft", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def _table(eps: list[str]) -> str:
    slots = ", ".join(f"{VIP} . {PORT} . {i} : {ip} . {TARGET}" for i, ip in enumerate(eps))
    return f"""
table ip affinity {{
  map backends {{ typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ;
                  elements = {{ {slots} }} }}
  map service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}
  map learn-frontends {{ type ipv4_addr . inet_proto : verdict ; }}
  map aff-web {{ type ipv4_addr : ipv4_addr . inet_service ; flags dynamic,timeout ;
                 timeout {TIMEOUT}s ; size 65535 ; }}
  chain service-web {{
    meta l4proto tcp dnat ip to ip saddr map @aff-web
    meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod {len(eps)} map @backends
  }}
  chain learn-web {{ update @aff-web {{ ip saddr timeout {TIMEOUT}s : ip daddr . th dport }} ; }}
  chain learn-web-tcp {{
    meta l4proto tcp ct original proto-dst vmap {{ {PORT} : goto learn-web }} ; }}
  chain services {{ ip daddr . meta l4proto . th dport vmap @service-ips ; }}
  chain nat-prerouting {{ type nat hook prerouting priority -100 ; jump services ; }}
  chain nat-output {{ type nat hook output priority -100 ; jump services ; }}
  chain learn-prerouting {{ type filter hook prerouting priority -99 ;
    ct state new ct status dnat ct original ip daddr . meta l4proto vmap @learn-frontends ; }}
  chain learn-output {{ type filter hook output priority -99 ;
    ct state new ct status dnat ct original ip daddr . meta l4proto vmap @learn-frontends ; }}
}}
add element {T} service-ips {{ {VIP} . tcp . {PORT} : goto service-web }}
add element {T} learn-frontends {{ {VIP} . tcp : goto learn-web-tcp }}
"""


def _remove(eps: list[str], gone: str, clients: list[str]) -> str:
    """Endpoint ``gone`` leaves: the last slot's endpoint takes its slot, the last slot goes,
    the modulus shrinks, and the clients the map holds for it are deleted (one batch)."""
    i, last = eps.index(gone), len(eps) - 1
    lines = [f"delete element {T} backends {{ {VIP} . {PORT} . {last} }}"]
    if i != last:
        lines += [
            f"delete element {T} backends {{ {VIP} . {PORT} . {i} }}",
            f"add element {T} backends {{ {VIP} . {PORT} . {i} : {eps[last]} . {TARGET} }}",
        ]
    lines += [
        f"flush chain {T} service-web",
        f"add rule {T} service-web meta l4proto tcp dnat ip to ip saddr map @aff-web",
        f"add rule {T} service-web meta l4proto tcp dnat ip to ip daddr . tcp dport . "
        f"numgen random mod {last} map @backends",
    ]
    lines += [f"delete element {T} aff-web {{ {c} }}" for c in clients]
    return "\n".join(lines) + "\n"


def _held(ns: str) -> dict[str, str]:
    """The map's clients -> endpoint address, as the kernel holds them now."""
    doc = json.loads(_out(ns, "-j", "list", "map", "ip", "affinity", "aff-web"))
    out: dict[str, str] = {}
    for item in doc["nftables"]:
        for key, data in item.get("map", {}).get("elem", []):
            client = key["elem"]["val"] if isinstance(key, dict) else key
            out[str(client)] = str(data["concat"][0])
    return out


def _pods(tb: Testbed, src: str | None, n: int = 8, *, ns: str | None = None) -> set[str]:
    """The pods that answered ``n`` connections from the client (``src``), or from ``ns``."""
    ns = ns or tb.client.netns
    got = [request("tcp", ns, VIP, PORT, src=src, timeout=3.0) for _ in range(n)]
    bad = [str(o) for o in got if o.result is not Result.ANSWERED]
    if bad:
        raise RuntimeError(f"requests from {src} failed: {bad}")
    return {o.pod for o in got}


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def check(name: str, ok: bool, **seen: Any) -> None:
        rows.append({"check": name, "ok": ok, **seen})
        print(json.dumps(rows[-1]), flush=True)

    with Testbed(tag="affdp") as tb:
        ns = tb.node.netns
        ip_of = {p: str(tb.pod(p).ipv4) for p in PODS}
        pod_of = {v: k for k, v in ip_of.items()}
        eps = [ip_of[p] for p in PODS]
        _nft(ns, _table(eps))
        one, two = (str(a) for a in tb.client.ipv4)
        first, second = _pods(tb, one), _pods(tb, two)
        check("a client keeps one pod", len(first) == 1 and len(second) == 1,
              client1=sorted(first), client2=sorted(second))  # fmt: skip
        held = _held(ns)
        check("the map holds each client's pod", {pod_of[v] for v in held.values()} ==
              first | second and set(held) == {one, two}, held=held)  # fmt: skip
        for _ in range(3):  # 6 s in all, twice the timeout: each connection refreshes it
            time.sleep(TIMEOUT - 1)
            again = _pods(tb, one, n=1)
        check("each new connection refreshes the timeout", again == first, client1=sorted(again))
        time.sleep(TIMEOUT + 1)
        check("an idle client is forgotten after the timeout", one not in _held(ns),
              held=_held(ns))  # fmt: skip
        first = _pods(tb, one)
        keep = _pods(tb, two)
        gone = ip_of[next(iter(first))]
        clients = [c for c, ep in _held(ns).items() if ep == gone]
        _nft(ns, _remove(eps, gone, clients))
        moved = _pods(tb, one)
        left = len(moved) == 1 and ip_of[next(iter(moved))] != gone
        check("a removed endpoint's clients move, and stay", left, before=sorted(first),
              after=sorted(moved))  # fmt: skip
        now = _pods(tb, two)
        if ip_of[next(iter(keep))] == gone:
            check("the other client, on the same pod, moves too", len(now) == 1 and now != keep,
                  before=sorted(keep), after=sorted(now))  # fmt: skip
        else:
            check("the other client keeps its pod", now == keep, before=sorted(keep),
                  after=sorted(now))  # fmt: skip
        # The node's own connections: DNAT in nat output, learning in filter output.
        mine = _pods(tb, None, ns=ns)
        node_src = [c for c in _held(ns) if c not in (one, two)]
        check("the node's own connections keep one pod, learned in output", len(mine) == 1
              and len(node_src) == 1, pods=sorted(mine), learned=node_src)  # fmt: skip
        saved = _out(ns, "list", "ruleset")
        subprocess.run(["ip", "netns", "exec", ns, "nft", "flush", "ruleset"], check=True)
        load = subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "-f", "-"],
            input=saved.encode(),
            capture_output=True,
            check=False,
        )
        check("nft list ruleset loads again with nft -f", load.returncode == 0,
              error=load.stderr.decode().strip())  # fmt: skip
    return rows


def main() -> int:
    rows = run()
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
