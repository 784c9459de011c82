"""Conntrack cleanup that runs out of file descriptors (the commit before it took the last
ones, ``EMFILE``) keeps what it could not delete and deletes it on the next call, once
descriptors are free again: the stale flows do not outlive their backends.

A child process gives the cleanup 0 to a few free descriptors under a low ``RLIMIT_NOFILE``
(each more opens one more of the sockets and namespace handles a cleanup takes, so the failure
lands at each step: entering the namespace, the dump, the deletes), then frees them and calls
the cleanup again with nothing new: real flows in a fresh namespace, checked from outside.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from nlproxy.conntrack.kernel import Conntrack
from tests.kernel.test_conntrack_cli import fill, flow

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, resource, sys
from ipaddress import ip_address
from nlproxy.conntrack.kernel import Conntrack, ConntrackError
from nlproxy.conntrack.messages import FlowFilter
from nlproxy.log import configure, get_logger

ns, free = sys.argv[1], int(sys.argv[2])
configure(level="warning")
get_logger("conntrack").info("ready")  # logging loaded before the descriptors run out
flows = Conntrack(ns)
stale = [
    FlowFilter(proto="udp", orig_dst=ip_address("10.96.0.7"), orig_dport=53,
               reply_src=ip_address(be))
    for be in ("10.244.0.8", "10.244.0.9")
]
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
for _ in range(free):
    os.close(held.pop())
try:
    first = ["deleted", flows.delete(stale)]
except (ConntrackError, OSError) as exc:
    first = ["failed", str(exc)]
for fd in held:
    os.close(fd)
again = flows.delete(())  # nothing new: only what the first call left, if anything
print(json.dumps({"first": first, "again": again}))
"""


def test_flows_a_cleanup_could_not_delete_go_on_the_next_call(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("nlp-fds")
    outcomes = []
    for free in range(8):
        gone = [
            flow("udp", "10.1.0.1", 1000 + 10 * free + i, "10.96.0.7", 53, be, 5353)
            for i, be in enumerate(("10.244.0.8", "10.244.0.9", "10.244.0.8", "10.244.0.9"))
        ]
        kept = flow("udp", "10.1.0.2", 2000 + free, "10.96.0.7", 53, "10.244.0.10", 5353)
        fill(ns, [*gone, kept])
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, ns, str(free)],
            capture_output=True, text=True, cwd=REPO, check=False, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        outcomes.append(result["first"][0])
        left = sorted((str(f.reply.src), f.orig.sport) for f in Conntrack(ns).list())
        assert left == [("10.244.0.10", 2000 + free)], (free, result)
        if result["first"][0] == "failed":
            assert "filters kept for the next cleanup" in result["first"][1], result
            assert result["again"] == len(gone), result
        else:
            assert (result["first"][1], result["again"]) == (len(gone), 0), result
        for f in Conntrack(ns).list():  # the next round starts from an empty table
            Conntrack(ns).delete_flows([f])
    # The descriptors ran out at some step, and enough of them let the first call finish.
    assert outcomes[0] == "failed", outcomes
    assert outcomes[-1] == "deleted", outcomes
