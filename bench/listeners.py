"""How many sockets on the host are members of ``NFNLGRP_NFTABLES``: recorded beside the load
average (``run.py``'s machine line, ``bench_listeners.py``'s rows), because one member anywhere on
the host makes the kernel build a message per element of every nftables commit, in every
namespace, and so changes every commit figure (``docs/ruleset.md``, "Watching for drift").
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nlproxy.errors import ConfigError
from nlproxy.netlink.netns import entered as netns_entered
from nlproxy.netlink.nlsock import NETLINK_NETFILTER
from nlproxy.nft.uapi import NFNLGRP_NFTABLES

GROUP_MASK = 1 << (NFNLGRP_NFTABLES - 1)
"""The group's bit in ``/proc/net/netlink``'s Groups column (the first 32 groups, in hex)."""


def _members(text: str, into: set[str]) -> None:
    for line in text.splitlines()[1:]:
        cols = line.split()
        if int(cols[1]) == NETLINK_NETFILTER and int(cols[3], 16) & GROUP_MASK:
            into.add(cols[0])


def nftables_listeners() -> int:
    """Members of NFNLGRP_NFTABLES on the host, as far as it can be seen: every process's
    namespace (``/proc/PID/net/netlink``) and every named one (``/run/netns``), deduplicated by
    socket address. A member in a namespace that is neither (held by its sockets alone) is not
    counted."""
    members: set[str] = set()
    for net in Path("/proc").glob("[0-9]*/net/netlink"):
        with contextlib.suppress(OSError):  # the process ended meanwhile
            _members(net.read_text(), members)
    for named in Path("/run/netns").glob("*"):
        with contextlib.suppress(OSError, ConfigError), netns_entered(named.name):
            _members(Path("/proc/thread-self/net/netlink").read_text(), members)
    return len(members)
