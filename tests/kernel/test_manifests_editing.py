"""Editing the manifests by hand is safe: a file that does not parse keeps its last good objects
(named and counted, taken up again when fixed), a file written in pieces is read once it is
whole, and a misspelt kind is named. Real packets keep flowing throughout."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import VIP_A, answered_by, daemon, nft, objects, wait_until

testbed = topo.testbed
IN_OPEN = 0x20
_libc = ctypes.CDLL(None, use_errno=True)


def _invalid(proc: Any) -> float:
    for line in proc.get(proc.metrics, "/metrics")[1].splitlines():
        if line.startswith("nlproxy_invalid_objects "):
            return float(line.split()[1])
    raise AssertionError("nlproxy_invalid_objects missing")


class Prober:
    """Probes the service from pod-a, in the background, and counts what went unanswered."""

    def __init__(self, tb: Testbed) -> None:
        self.tb, self.lost, self.sent = tb, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sent += 1
            if not answered_by(self.tb, VIP_A, 1):
                self.lost += 1

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_a_syntax_error_keeps_the_files_services(testbed: Testbed, tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    f = d / "objects.yaml"
    text = yaml.safe_dump_all(objects(testbed, ["pod-a"]), sort_keys=False)
    f.write_text(text)
    with daemon(testbed, d) as proc, Prober(testbed) as probes:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        f.write_text(text + "\n---\nkind: Service\nmetadata: {name: [oops\n")  # an editor's typo
        wait_until(lambda: _invalid(proc) == 1, 5.0, "the broken file counted")
        (event,) = [e for e in proc.events("object.invalid") if "objects.yaml" in e["error"]]
        assert "not valid YAML" in event["error"]
        assert "its last good objects are kept" in event["error"]
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}, "the file's Service was taken out"
        f.write_text(text.replace(str(testbed.pod("pod-a").ipv4), str(testbed.pod("pod-b").ipv4)))
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-b"}, 5.0, "fixed: taken up")
        assert _invalid(proc) == 0
    assert probes.sent > 3
    assert probes.lost == 0, f"{probes.lost} of {probes.sent} probes lost"


def test_a_file_written_in_pieces_is_read_whole(testbed: Testbed, tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    f = d / "objects.yaml"
    text = yaml.safe_dump_all(objects(testbed, ["pod-a"]), sort_keys=False)
    f.write_text(text)
    with daemon(testbed, d) as proc, Prober(testbed) as probes:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        programmed = len([e for e in proc.events("sync.applied") if e.get("ops")])
        for _ in range(3):  # truncate, then write in three pieces, as a careless tool does
            with f.open("w") as out:
                for i in range(3):
                    out.write(text[i * len(text) // 3 : (i + 1) * len(text) // 3])
                    out.flush()
                    time.sleep(0.07)  # longer than the old 50 ms settle, shorter than 100 ms
            time.sleep(0.3)
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        assert _invalid(proc) == 0
        # The same content written again: nothing to program, no half-read file programmed.
        changed = [e for e in proc.events("sync.applied") if e.get("ops")][programmed:]
        assert changed == [], changed
    assert probes.lost == 0, f"{probes.lost} of {probes.sent} probes lost"


def test_truncate_then_write_loses_no_probe(testbed: Testbed, tmp_path: Path) -> None:
    """A rewrite that truncates, then writes a moment later (after a reload saw the file
    empty): the Services stay programmed throughout; a file left empty deletes them."""
    d = tmp_path / "m"
    d.mkdir()
    f = d / "objects.yaml"
    text = yaml.safe_dump_all(objects(testbed, ["pod-a"]), sort_keys=False)
    f.write_text(text)
    with daemon(testbed, d) as proc, Prober(testbed) as probes:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        for _ in range(3):
            f.write_text("")
            time.sleep(0.5)  # a reload has read it empty meanwhile
            f.write_text(text)
            time.sleep(0.5)
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        assert probes.lost == 0, f"{probes.lost} of {probes.sent} probes lost"
        f.write_text("")  # emptied for good: its Services go once it has stayed empty
        wait_until(lambda: not answered_by(testbed, VIP_A, 1), 30.0, "the Services deleted")
        assert proc.proc.poll() is None


@pytest.mark.parametrize(
    "first",
    [
        pytest.param("header", id="comment-header-first"),
        pytest.param("marker", id="document-marker-first"),
        pytest.param("service", id="service-before-its-slice"),
    ],
)
def test_a_file_written_in_two_steps_loses_no_probe(
    testbed: Testbed, tmp_path: Path, first: str
) -> None:
    """A writer that writes its first part (a comment header, ``---``, or the Service without
    its EndpointSlice), closes the file, and writes the whole half a second later: nothing is
    deleted and re-created, no probe is lost."""
    d = tmp_path / "m"
    d.mkdir()
    f = d / "objects.yaml"
    objs = objects(testbed, ["pod-a"])
    text = "# written by the deploy tool\n" + yaml.safe_dump_all(objs, sort_keys=False)
    part = {
        "header": "# written by the deploy tool\n",
        "marker": "---\n",
        "service": yaml.safe_dump_all(objs[:2], sort_keys=False),  # the Node and Service a
    }[first]
    f.write_text(text)
    with daemon(testbed, d) as proc, Prober(testbed) as probes:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        programmed = len([e for e in proc.events("sync.applied") if e.get("ops")])
        for _ in range(3):
            f.write_text(part)
            time.sleep(0.5)  # a reload reads the first part meanwhile
            f.write_text(text)
            time.sleep(0.5)
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        changed = [e for e in proc.events("sync.applied") if e.get("ops")][programmed:]
        assert changed == [], "the file's objects were deleted and programmed again"
        assert _invalid(proc) == 0
    assert probes.sent > 3
    assert probes.lost == 0, f"{probes.lost} of {probes.sent} probes lost"


def test_a_fifo_swapped_in_during_a_reload_hangs_nothing(testbed: Testbed, tmp_path: Path) -> None:
    """The FIFO takes b.yaml's name after the reload listed the directory (when a.yaml, read
    first, is opened): the daemon neither blocks opening it nor stops answering ``/livez`` or
    repairing its table; the file is named, and its Services keep their last good objects."""
    d = tmp_path / "m"
    d.mkdir()
    body = "".join(f"  key{i}: value {i}\n" for i in range(100_000))
    (d / "a.yaml").write_text(
        f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big}}\ndata:\n{body}"
    )
    (d / "b.yaml").write_text(yaml.safe_dump_all(objects(testbed, ["pod-a"]), sort_keys=False))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with daemon(testbed, d) as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        fd = _libc.inotify_init1(os.O_CLOEXEC)
        assert fd >= 0
        try:
            assert _libc.inotify_add_watch(fd, os.fsencode(d / "a.yaml"), IN_OPEN) >= 0
            (d / "c.yaml").write_text("")  # a reload
            os.read(fd, 4096)  # a.yaml opened: the names are listed
            fifo.rename(d / "b.yaml")
        finally:
            os.close(fd)
        wait_until(lambda: _livez(proc), 30.0, "/livez answered")
        nft(testbed, "delete", "table", "ip", "nlproxy")
        wait_until(lambda: answered_by(testbed, VIP_A, 1) == {"pod-a"}, 30.0, "the table repaired")
        wait_until(lambda: _invalid(proc) == 1, 30.0, "the FIFO named")
        assert _livez(proc)
    with contextlib.suppress(OSError):  # frees a daemon blocked in open(), if it was
        os.close(os.open(d / "b.yaml", os.O_WRONLY | os.O_NONBLOCK))


def _livez(proc: Any) -> bool:
    try:
        return bool(proc.get(proc.healthz, "/livez")[0] == 200)
    except OSError:
        return False


def test_a_misspelt_kind_is_named(
    testbed: Testbed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = topo.service("web", "10.96.0.77")
    typo["kind"] = "Servcie"
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}
    topo.write_manifests(tmp_path, [*objects(testbed, ["pod-a"]), typo, deployment])
    assert topo.run_once(testbed, tmp_path) == topo.EXIT_INVALID
    err = capsys.readouterr().err
    assert "web: unknown kind 'Servcie' (did you mean Service?)" in err
    assert "Deployment" not in err  # someone else's kind: ignored, as documented
    assert answered_by(testbed, VIP_A, 3) == {"pod-a"}


def _write(directory: Path, objs: list[Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "objects.yaml").write_text(yaml.safe_dump_all(objs, sort_keys=False))


def test_a_directory_published_by_rename_is_followed(testbed: Testbed, tmp_path: Path) -> None:
    d = tmp_path / "m"
    _write(d, objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        for n, pod in enumerate(["pod-b", "pod-c"]):  # twice: the new directory is watched too
            new = tmp_path / f"new-{n}"
            _write(new, objects(testbed, [pod]))
            d.rename(tmp_path / f"old-{n}")
            new.rename(d)
            wait_until(lambda p=pod: answered_by(testbed, VIP_A, 3) == {p}, 5.0, f"{pod} taken up")
        assert proc.proc.poll() is None


def test_a_symlink_swap_is_followed(testbed: Testbed, tmp_path: Path) -> None:
    """``ln -sfn v2 dir`` done atomically (a new link renamed over the old), as deploy tools
    and a ConfigMap volume's ``..data`` do."""
    v1, v2, link = tmp_path / "v1", tmp_path / "v2", tmp_path / "m"
    _write(v1, objects(testbed, ["pod-a"]))
    _write(v2, objects(testbed, ["pod-b"]))
    link.symlink_to(v1)
    with daemon(testbed, link):
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        tmp = tmp_path / "m.tmp"
        tmp.symlink_to(v2)
        tmp.rename(link)
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-b"}, 5.0, "v2 taken up")


def test_a_deleted_directory_keeps_the_rules_until_it_is_back(
    testbed: Testbed, tmp_path: Path
) -> None:
    import shutil

    d = tmp_path / "m"
    _write(d, objects(testbed, ["pod-a"]))
    with daemon(testbed, d) as proc:
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}
        shutil.rmtree(d)
        wait_until(lambda: proc.events("source.directory_missing"), 5.0, "the loss reported")
        time.sleep(0.5)
        assert proc.proc.poll() is None, "the daemon died with its manifests directory"
        assert answered_by(testbed, VIP_A, 3) == {"pod-a"}, "the rules went with the directory"
        _write(d, objects(testbed, ["pod-c"]))
        wait_until(lambda: answered_by(testbed, VIP_A, 3) == {"pod-c"}, 8.0, "back and read")
