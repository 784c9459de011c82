"""What a task's unexpected failure does to the running daemon (``daemon/supervise.py``).

The daemon is the real ``nlproxy run`` with one fault added to one of its tasks: once the test
creates a trigger file, the task raises (at once, and at each restart while the file is there),
as a fault of nlproxy's own would. Everything else, the kernel included, is real.

- The reachability inspector only reports: it is restarted with a backoff and counted, said
  once, and ``/healthz`` stays 200 (a load balancer must not drop the node for it), the
  Service still answered.
- The generation watch steers the rules: the daemon ends, status 1, its last line naming the
  task and the error, the rules left in force for the next process.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import (
    LOADED_MACHINE_BOUND,
    VIP_A,
    ScriptedDaemon,
    answered_by,
    nft,
    objects,
    publish,
    scrape,
    wait_until,
)

testbed = topo.testbed

FAULT = """
import os, sys, trio
from nlproxy.errors import NlproxyError
from {module} import {cls} as task_class

running = task_class.run
TRIGGER = os.environ["NLPROXY_TEST_TRIGGER"]

async def faulty(self, *args, task_status=trio.TASK_STATUS_IGNORED):
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: running(self, *args, task_status=task_status))
        task_status.started()
        while not os.path.exists(TRIGGER):
            await trio.sleep(0.05)
        raise {error}

task_class.run = faulty
from nlproxy.cli import main
sys.exit(main(sys.argv[1:]))
"""


class RawDaemon(ScriptedDaemon):
    """A scripted daemon whose stderr lines that are not JSON (the command's last line) are
    kept too."""

    raw: list[str]

    def _read(self) -> None:
        self.raw = []
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                self.lines.append(json.loads(line))
            except json.JSONDecodeError:
                self.raw.append(line.rstrip("\n"))


@contextlib.contextmanager
def faulty_daemon(
    tb: Testbed, tmp_path: Path, module: str, cls: str, error: str
) -> Iterator[tuple[RawDaemon, Path]]:
    manifests = publish(tmp_path / "m", objects(tb, ["pod-a"]))
    trigger = tmp_path / "fail-now"
    script = FAULT.format(module=module, cls=cls, error=error)
    proc = RawDaemon(tb, manifests, script, env={"NLPROXY_TEST_TRIGGER": str(trigger)})
    try:
        proc.wait_ready(timeout=LOADED_MACHINE_BOUND)
        yield proc, trigger
    finally:
        proc.kill()


def restarts(proc: RawDaemon, task: str) -> float:
    family = scrape(proc)["nlproxy_task_restarts_total"]
    return sum(s.value for s in family.samples if s.labels.get("task") == task)


def test_an_inspector_that_keeps_failing_is_restarted_and_healthz_stays_200(
    testbed: Testbed, tmp_path: Path
) -> None:
    with faulty_daemon(
        testbed,
        tmp_path,
        "nlproxy.inspect.reachability",
        "ReachabilityMonitor",
        'RuntimeError("inspector fault")',
    ) as (proc, trigger):
        assert restarts(proc, "inspector") == 0.0  # both series there from the start
        assert restarts(proc, "foreign-check") == 0.0
        trigger.touch()
        wait_until(lambda: restarts(proc, "inspector") >= 3, 10, "three inspector restarts")
        status, body = proc.get(proc.healthz, "/healthz")
        assert status == 200, body
        assert "reason" not in json.loads(body)
        assert proc.proc.poll() is None
        assert answered_by(testbed, VIP_A) == {"pod-a"}  # the rules as they were
        failed = proc.events("task.failed")
        assert [(e["task"], e["error"], e["level"]) for e in failed] == [
            ("inspector", "RuntimeError: inspector fault", "error")  # said once
        ]
        assert proc.stop() == 0


def test_a_generation_watch_failure_ends_the_daemon_naming_it_with_the_rules_in_place(
    testbed: Testbed, tmp_path: Path
) -> None:
    error = 'NlproxyError("generation watch", "its socket was closed")'
    with faulty_daemon(testbed, tmp_path, "nlproxy.nft.monitor", "GenerationWatch", error) as (
        proc,
        trigger,
    ):
        trigger.touch()
        status = proc.proc.wait(timeout=LOADED_MACHINE_BOUND)
        proc._reader.join(timeout=5)
        assert status == 1
        assert proc.raw[-1:] == [
            "nlproxy: task generation-watch: generation watch: its socket was closed"
        ]
        assert not proc.events("task.failed")  # not restarted in-process
        assert answered_by(testbed, VIP_A) == {"pod-a"}  # no process, the rules in force


FOREIGN_FAULT = """
import os, sys
from nlproxy.inspect.foreign_check import ForeignCheck

looking = ForeignCheck.look
TRIGGER = os.environ["NLPROXY_TEST_TRIGGER"]

def look(self):
    if os.path.exists(TRIGGER):  # one fault, then looks as before
        os.unlink(TRIGGER)
        raise RuntimeError("foreign check fault")
    found = looking(self)
    with open(TRIGGER + ".looks", "a") as looks:
        looks.write("look\\n")
    return found

ForeignCheck.look = look
from nlproxy.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_restarted_foreign_check_does_not_report_a_known_table_again(
    testbed: Testbed, tmp_path: Path
) -> None:
    nft(testbed, "add", "table", "ip", "kube-proxy")  # another proxy's rules, there at start
    manifests = publish(tmp_path / "m", objects(testbed, ["pod-a"]))
    trigger = tmp_path / "fail-now"
    looks = Path(f"{trigger}.looks")
    env = {"NLPROXY_TEST_TRIGGER": str(trigger)}
    proc = RawDaemon(testbed, manifests, FOREIGN_FAULT, env=env)
    try:
        proc.wait_ready(timeout=LOADED_MACHINE_BOUND)
        wait_until(lambda: proc.events("foreign_proxy.detected"), 10, "the table reported")
        trigger.touch()
        wait_until(lambda: restarts(proc, "foreign-check") == 1, 10, "a foreign-check restart")
        before = len(looks.read_text().splitlines())
        wait_until(
            lambda: len(looks.read_text().splitlines()) > before, 10, "a look after the restart"
        )
        assert [e["task"] for e in proc.events("task.failed")] == ["foreign-check"]
        detected = [e["table"] for e in proc.events("foreign_proxy.detected")]
        assert detected == ["ip kube-proxy"]  # once: the restarted check knew it
        assert proc.stop() == 0
    finally:
        proc.kill()
