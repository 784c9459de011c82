"""The drift watch by generation: it reports every move of the namespace's generation, and
neither it nor the daemon that runs it is a member of NFNLGRP_NFTABLES, the group whose members
make the kernel build a message per committed element for every writer on the host."""

from __future__ import annotations

import errno
import gc
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from nlproxy.demo.testbed import Testbed
from nlproxy.netlink.nlsock import NETLINK_NETFILTER
from nlproxy.nft.monitor import GenerationWatch
from nlproxy.nft.uapi import NFNLGRP_NFTABLES
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, nft, objects, publish, wait_until
from tests.netns import sh

testbed = topo.testbed


def members(ns: str) -> int:
    """Sockets of namespace ``ns`` that are members of NFNLGRP_NFTABLES (``/proc/net/netlink``
    lists the first 32 groups of each socket as a hex mask)."""
    count = 0
    for line in sh("cat", "/proc/net/netlink", ns=ns).splitlines()[1:]:
        cols = line.split()
        if int(cols[1]) == NETLINK_NETFILTER and int(cols[3], 16) & 1 << (NFNLGRP_NFTABLES - 1):
            count += 1
    return count


async def test_the_watch_reports_each_move_and_joins_no_group(
    make_netns: Callable[[str], str],
) -> None:
    ns = make_netns("gw")
    watch = GenerationWatch(netns_name=ns, interval=0.05)
    assert members(ns) == 0
    assert watch.look() is None
    first = watch.seen
    await trio.run_process(["ip", "netns", "exec", ns, "nft", "add", "table", "ip", "t"])
    await trio.run_process(["ip", "netns", "exec", ns, "nft", "add", "chain", "ip", "t", "c"])
    assert watch.current() == first + 2
    assert watch.look() == (first, first + 2)  # both transactions, in one span
    assert watch.look() is None
    spans: list[tuple[int, int]] = []
    moved = trio.Event()

    def on_moved(after: int, upto: int) -> None:
        spans.append((after, upto))
        moved.set()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run, on_moved)
            await trio.run_process(["ip", "netns", "exec", ns, "nft", "delete", "table", "ip", "t"])
            await moved.wait()
            assert members(ns) == 0
            nursery.cancel_scope.cancel()
    assert spans == [(first + 2, first + 3)]


def test_the_daemon_is_no_member_and_still_repairs(testbed: Testbed, tmp_path: Path) -> None:
    d = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as proc:
        assert members(testbed.node.netns) == 0
        chain = ("ip", "nlproxy", "nat-output")
        before = nft(testbed, "list", "chain", *chain)
        nft(testbed, "flush", "chain", *chain)
        assert nft(testbed, "list", "chain", *chain) != before
        # Bounds are loose (a loaded machine); the repair time is measured in bench/.
        wait_until(lambda: nft(testbed, "list", "chain", *chain) == before, 10.0, "rules back")
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        assert [e["generations"] for e in proc.events("drift.notifications_lost")]
        assert members(testbed.node.netns) == 0


class OtherSteps(trio.abc.Instrument):
    """Counts the steps of every task but ``me``: who else the event loop ran."""

    def __init__(self, me: trio.lowlevel.Task) -> None:
        self.me = me
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is not self.me:
            self.steps += 1


async def test_an_idle_watch_never_wakes_the_event_loop(
    make_netns: Callable[[str], str],
) -> None:
    """The looks are a thread's: while the generation holds still the event loop runs nothing
    of the watch's; a move still reaches ``on_moved`` on the loop."""
    ns = make_netns("gi")
    watch = GenerationWatch(netns_name=ns, interval=0.01)
    spans: list[tuple[int, int]] = []
    loop_thread = threading.get_ident()
    moved = trio.Event()

    def on_moved(after: int, upto: int) -> None:
        assert threading.get_ident() == loop_thread
        spans.append((after, upto))
        moved.set()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            threads = set(threading.enumerate())
            await nursery.start(watch.run, on_moved)
            await trio.testing.wait_all_tasks_blocked()
            others = OtherSteps(trio.lowlevel.current_task())
            trio.lowlevel.add_instrument(others)
            looks = watch.looks
            # Polled on purpose: the test's own steps are the only ones the loop may run.
            while watch.looks < looks + 20:  # noqa: ASYNC110
                await trio.sleep(0.05)
            trio.lowlevel.remove_instrument(others)
            assert others.steps == 0, "the event loop was woken for looks that found nothing"
            # The looks are none of the interpreter's either: no Python thread makes them.
            assert set(threading.enumerate()) <= threads
            assert watch.wakes == 0
            first = watch.seen
            await trio.run_process(["ip", "netns", "exec", ns, "nft", "add", "table", "ip", "t"])
            await moved.wait()
            nursery.cancel_scope.cancel()
    assert spans == [(first, first + 1)]
    assert watch.wakes == 1


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_a_stop_waits_for_no_look_and_leaves_no_descriptor(
    make_netns: Callable[[str], str],
) -> None:
    """Cancelled while its thread sleeps for an hour, the run returns (the thread is woken by
    the close of the loop's end, it is not waited for); the thread then ends of itself and
    closes the netlink socket, and once the watch is dropped no descriptor is left."""
    ns = make_netns("gs")
    before = open_fds()
    watch = GenerationWatch(netns_name=ns, interval=3600.0)
    with trio.fail_after(60):  # a stop that waited for the next look would take an hour
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run, lambda after, upto: None)
            assert watch.running
            nursery.cancel_scope.cancel()

    def ended(w: GenerationWatch = watch) -> bool:
        return not w.running

    wait_until(ended, 30.0, "the watch's thread ended")
    with pytest.raises(OSError, match="Bad file descriptor") as closed:
        watch.look()
    assert closed.value.errno == errno.EBADF
    assert watch.looks == 1  # the failed look above: the thread made none
    del watch, ended
    gc.collect()
    assert open_fds() == before


async def test_a_look_takes_a_move_from_the_running_watch(
    make_netns: Callable[[str], str],
) -> None:
    """A move that :meth:`look` took is not reported by the thread; the next one is."""
    ns = make_netns("gl")
    watch = GenerationWatch(netns_name=ns, interval=0.01)
    spans: list[tuple[int, int]] = []
    moved = trio.Event()

    def on_moved(after: int, upto: int) -> None:
        spans.append((after, upto))
        moved.set()

    first = watch.seen
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run, on_moved)
            # The thread and the look race for this move: exactly one of them reports it.
            await trio.run_process(["ip", "netns", "exec", ns, "nft", "add", "table", "ip", "t"])
            taken = watch.look()
            looks = watch.looks
            while watch.looks < looks + 5:  # noqa: ASYNC110
                await trio.sleep(0.02)
            await trio.testing.wait_all_tasks_blocked()
            if taken is not None:
                assert taken == (first, first + 1)
                assert spans == []
            else:
                assert spans == [(first, first + 1)]
            moved = trio.Event()
            await trio.run_process(["ip", "netns", "exec", ns, "nft", "delete", "table", "ip", "t"])
            await moved.wait()
            nursery.cancel_scope.cancel()
    assert spans[-1] == (first + 1, first + 2)
    assert len(spans) == (1 if taken is not None else 2)
