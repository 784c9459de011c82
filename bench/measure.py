"""Measuring helpers shared by the benchmarks: throwaway network namespaces and child processes
timed with their own resource usage (wall, user, sys, peak RSS) from ``wait4``.

Benchmarks may exec tools (``ip``, ``nft``, ``iptables-restore``, ``nlproxy`` itself); nlproxy's
own code never does. Nothing here asserts on time: it only measures and reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python")
if str(REPO) not in sys.path:  # the namespace and command helpers are the tests' own
    sys.path.insert(0, str(REPO))

from tests.netns import namespace as netns  # noqa: E402, F401 - for the benchmarks
from tests.netns import sh  # noqa: E402, F401 - for the benchmarks

NO_BYTECODE = "PYTHONDONTWRITEBYTECODE"


class Sink(Protocol):
    """Where JSON lines go: a text file, stdout, or both (``run.Tee``)."""

    def write(self, s: str, /) -> object: ...
    def flush(self) -> object: ...


class BenchError(RuntimeError):
    """A benchmark step failed; the message names the step and the tool's stderr."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """One child process run: seconds of wall, user and sys time, peak RSS in MiB, exit code,
    and its stderr (kept for log lines such as nlproxy's ``sync.applied``)."""

    wall: float
    user: float
    sys: float
    rss_mib: float
    rc: int
    stderr: str = ""
    timed_out: bool = False

    def figures(self) -> dict[str, float | bool]:
        d = asdict(self)
        del d["stderr"]
        del d["rc"]
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}


def run_measured(
    argv: Sequence[str],
    *,
    stdin: Path | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Usage:
    """Run ``argv`` to completion; its own rusage comes from ``wait4`` (children it reaped
    included), so parallel runs of others do not leak into the figures. On ``timeout`` the
    process group is killed and the usage so far is returned with ``timed_out``.

    The child may write bytecode whatever ``PYTHONDONTWRITEBYTECODE`` says (here or in ``env``):
    an installed nlproxy runs from bytecode, and with the variable set every run of a checkout
    without ``__pycache__`` compiled nlproxy's modules again (0.25 s of a 0.34 s ``conntrack
    flush``). The first run of a tree writes it; a benchmark's warm-up round should be that run.

    Peak RSS is the child's own high-water mark (``VmHWM``), sampled every few milliseconds
    while it runs: ``wait4``'s ``ru_maxrss`` starts from the high-water mark of the process it
    was exec'd from (Linux keeps the old image's mark across ``exec``), so every child of a
    benchmark that had grown to 200 MiB reported at least 200 MiB. Only a child too quick to be
    sampled falls back to ``ru_maxrss``.
    """
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != NO_BYTECODE}
    fin = stdin.open("rb") if stdin else subprocess.DEVNULL
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            stdin=fin,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        assert proc.stderr is not None
        err_chunks: list[bytes] = []
        deadline = None if timeout is None else t0 + timeout
        hwm = [0]
        timed_out = _drain(proc, err_chunks, deadline, hwm)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if stdin:
            fin.close()  # type: ignore[union-attr]
    return Usage(
        wall=wall,
        user=ru.ru_utime,
        sys=ru.ru_stime,
        rss_mib=(hwm[0] or ru.ru_maxrss) / 1024,
        rc=proc.returncode,
        stderr=b"".join(err_chunks).decode(errors="replace"),
        timed_out=timed_out,
    )


def _drain(
    proc: subprocess.Popen[bytes], chunks: list[bytes], deadline: float | None, hwm: list[int]
) -> bool:
    """Read stderr until EOF (the child exited) or the deadline (then kill its group); keep
    the child's largest ``VmHWM`` (KiB) in ``hwm[0]``."""
    import selectors

    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    status = f"/proc/{proc.pid}/status"
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            hwm[0] = max(hwm[0], _vm_hwm(status))
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.stderr.close()
                return True
            if sel.select(HWM_PERIOD if left is None else min(left, HWM_PERIOD)):
                data = os.read(fd, 65536)
                if not data:
                    proc.stderr.close()
                    return False
                chunks.append(data)


HWM_PERIOD = 0.005
"""Seconds between samples of a measured child's ``VmHWM``."""


def _vm_hwm(status: str) -> int:
    """The ``VmHWM`` (KiB) in a ``/proc/PID/status``; 0 once the process has exited."""
    try:
        with open(status, "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def in_ns(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def nlproxy_argv(ns: str, manifests: Path, *extra: str) -> list[str]:
    """``nlproxy --netns NS run --once`` for a generated cluster (see ``gen.py``)."""
    from gen import CLUSTER_CIDR, NODE_NAME, SERVICE_CIDR

    return [
        PY,
        "-m",
        "nlproxy",
        "--log-format",
        "json",
        "--netns",
        ns,
        "run",
        "--once",
        "--manifests",
        str(manifests),
        "--node-name",
        NODE_NAME,
        "--cluster-cidr",
        str(CLUSTER_CIDR),
        "--service-cidr",
        str(SERVICE_CIDR),
        *extra,
    ]


def healthz_ok(ns: str, port: int) -> bool:
    """Whether ``/healthz`` on ``127.0.0.1:port`` inside ``ns`` answers 200 (a daemon started
    with ``--netns`` serves its ports there)."""
    import http.client

    from nlproxy.netlink import netns as nlnetns

    try:
        with nlnetns.entered(ns):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.connect()
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        finally:
            conn.close()
    except OSError:
        return False


def sync_applied(stderr: str) -> dict[str, Any]:
    """nlproxy's ``sync.applied`` log line (``--log-format json``), or {} when absent."""
    for line in stderr.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("event") == "sync.applied":
                return rec
    return {}


def emit(out: Sink, record: Mapping[str, Any]) -> None:
    """Print one JSON line and flush (a killed run keeps what it measured)."""
    out.write(json.dumps(record, sort_keys=False) + "\n")
    out.flush()


def log(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)
