"""A file that loses objects keeps them for ``GRACE`` seconds, whatever it holds meanwhile
(nothing, comments, ``---``, part of its objects): a writer that writes in two steps is no
outage, and a real removal still lands once the grace is over. A file whose objects are not
known when nothing was read before (it does not parse, or is caught emptied) is named
``unread``, so what is programmed for it can stay."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from nlproxy.cluster.manifests import GRACE, ManifestLoad, load_manifests
from nlproxy.cluster.model import Change, Replace
from nlproxy.cluster.state import ClusterState
from nlproxy.cluster.watchdir import ManifestSource


def _service(name: str, ip: str = "10.96.0.10", port: int = 80) -> str:
    return (
        "apiVersion: v1\nkind: Service\n"
        f"metadata: {{name: {name}, namespace: default}}\n"
        f"spec: {{clusterIP: {ip}, ports: [{{port: {port}}}]}}\n"
    )


def _slice(name: str, service: str, ip: str = "10.0.0.5") -> str:
    return (
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n"
        f"metadata: {{name: {name}, namespace: default, "
        f"labels: {{kubernetes.io/service-name: {service}}}}}\n"
        f"ports: [{{port: 8080}}]\nendpoints: [{{addresses: [{ip}]}}]\n"
    )


WHOLE = _service("web") + "---\n" + _slice("web-1", "web")


def _refs(load: ManifestLoad | Sequence[Change]) -> set[str]:
    changes = load.changes if isinstance(load, ManifestLoad) else load
    return {
        f"{c.ref.kind}/{c.ref.name}" for r in changes if isinstance(r, Replace) for c in r.changes
    }


def _changed_at(path: Path) -> float:
    return os.stat(path).st_ctime


@pytest.mark.parametrize(
    "first_step",
    [
        pytest.param("", id="empty"),
        pytest.param("# web, written by the deploy tool\n", id="comment-header"),
        pytest.param("---\n", id="document-marker"),
        pytest.param("---\n---\n# nothing yet\n", id="markers-and-comments"),
        pytest.param(_service("web"), id="service-before-its-slice"),
        pytest.param(_service("web") + "---\n", id="service-and-a-marker"),
    ],
)
def test_a_file_that_loses_objects_keeps_them_for_the_grace(
    tmp_path: Path, first_step: str
) -> None:
    f = tmp_path / "web.yaml"
    f.write_text(WHOLE)
    first = load_manifests(tmp_path)
    assert _refs(first) == {"Service/web", "EndpointSlice/web-1"}
    f.write_text(first_step)
    when = _changed_at(f)
    during = load_manifests(tmp_path, first.good, now=when + GRACE / 4)
    assert _refs(during) == {"Service/web", "EndpointSlice/web-1"}
    assert during.unsettled == ("web.yaml",)  # read again once the grace is over
    assert during.errors == ()
    # Read again, unchanged, within the grace: still kept (the file is not parsed again).
    again = load_manifests(tmp_path, during.good, now=when + GRACE / 2)
    assert _refs(again) == {"Service/web", "EndpointSlice/web-1"}
    # The grace over and the file as it is: a real removal.
    after = load_manifests(tmp_path, again.good, now=when + GRACE + 0.1)
    assert _refs(after) == (set() if "kind" not in first_step else {"Service/web"})
    assert after.unsettled == ()
    # Once gone, a later load does not bring them back.
    assert _refs(load_manifests(tmp_path, after.good, now=when + 10 * GRACE)) == _refs(after)


def test_the_second_step_within_the_grace_changes_nothing(tmp_path: Path) -> None:
    f = tmp_path / "web.yaml"
    f.write_text(WHOLE)
    first = load_manifests(tmp_path)
    f.write_text("# header\n")
    when = _changed_at(f)
    during = load_manifests(tmp_path, first.good, now=when + 0.1)
    f.write_text(WHOLE.replace("port: 80}", "port: 81}"))
    whole = load_manifests(tmp_path, during.good, now=when + 0.6)
    assert _refs(whole) == {"Service/web", "EndpointSlice/web-1"}
    assert whole.unsettled == ()
    (services,) = [r for r in whole.changes if r.kind == "Service"]
    (svc,) = services.changes
    assert [p.port for p in svc.obj.ports] == [81]  # type: ignore[union-attr]
    # Nothing is held any more: the later, real removal of the slice is not hidden.
    f.write_text(_service("web", port=81))
    later = _changed_at(f)
    assert _refs(load_manifests(tmp_path, whole.good, now=later + GRACE + 0.1)) == {"Service/web"}


def test_a_removal_is_not_put_off_by_later_rewrites(tmp_path: Path) -> None:
    """The grace of an object runs from when it was first lost: a file rewritten again and
    again without it does not keep it for ever."""
    f = tmp_path / "web.yaml"
    f.write_text(WHOLE)
    load = load_manifests(tmp_path)
    f.write_text(_service("web"))
    lost_at = _changed_at(f)
    load = load_manifests(tmp_path, load.good, now=lost_at + 0.1)
    assert "EndpointSlice/web-1" in _refs(load)
    for port in (81, 82, 83):  # rewritten within the grace, never with the slice
        f.write_text(_service("web", port=port))
        load = load_manifests(tmp_path, load.good, now=lost_at + GRACE * 0.9)
        assert "EndpointSlice/web-1" in _refs(load)
    load = load_manifests(tmp_path, load.good, now=lost_at + GRACE + 0.1)
    assert _refs(load) == {"Service/web"}


def test_an_object_moved_to_another_file_is_no_duplicate(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(WHOLE)
    first = load_manifests(tmp_path)
    (tmp_path / "b.yaml").write_text(_slice("web-1", "web", ip="10.0.0.6"))
    (tmp_path / "a.yaml").write_text(_service("web"))
    moved = load_manifests(tmp_path, first.good, now=_changed_at(tmp_path / "a.yaml") + 0.1)
    assert moved.errors == ()
    (slices,) = [r for r in moved.changes if r.kind == "EndpointSlice"]
    (eps,) = slices.changes
    assert [str(e.ip) for e in eps.obj.endpoints] == ["10.0.0.6"]  # type: ignore[union-attr]


def test_a_broken_file_keeps_what_it_lost_and_lets_it_go_after_the_grace(
    tmp_path: Path,
) -> None:
    """Lost objects expire whatever the file does next, even if it stops parsing."""
    f = tmp_path / "web.yaml"
    f.write_text(WHOLE)
    load = load_manifests(tmp_path)
    f.write_text(_service("web"))
    lost_at = _changed_at(f)
    load = load_manifests(tmp_path, load.good, now=lost_at + 0.1)
    f.write_text(_service("web") + "spec: [oops\n")
    broken = load_manifests(tmp_path, load.good, now=lost_at + 0.5)
    assert _refs(broken) == {"Service/web", "EndpointSlice/web-1"}
    assert broken.unread == ()  # its last good objects are known
    later = load_manifests(tmp_path, broken.good, now=lost_at + GRACE + 0.1)
    assert _refs(later) == {"Service/web"}


@pytest.mark.parametrize(
    ("text", "age", "unread"),
    [
        pytest.param(WHOLE + "spec: [oops\n", 100.0, True, id="does-not-parse"),
        pytest.param("", 0.1, True, id="just-emptied"),
        pytest.param("# header only\n---\n", 0.1, True, id="just-cut-to-a-header"),
        pytest.param("", 100.0, False, id="empty-for-long"),
        pytest.param(WHOLE, 0.1, False, id="whole"),
    ],
)
def test_a_file_not_known_at_start_is_named_unread(
    tmp_path: Path, text: str, age: float, unread: bool
) -> None:
    (tmp_path / "other.yaml").write_text(_service("db", ip="10.96.0.11"))
    f = tmp_path / "web.yaml"
    f.write_text(text)
    load = load_manifests(tmp_path, now=_changed_at(f) + age)  # nothing read before
    assert load.unread == (("web.yaml",) if unread else ())
    assert all(r.unread == load.unread for r in load.changes)
    assert "Service/db" in _refs(load)
    state = ClusterState("node")
    state.apply(load.changes)
    assert state.snapshot().unread == load.unread
    if unread:
        # Fixed: nothing unread any more.
        f.write_text(WHOLE)
        fixed = load_manifests(tmp_path, load.good, now=_changed_at(f) + 0.1)
        assert fixed.unread == ()
        state.apply(fixed.changes)
        assert state.snapshot().unread == ()
        assert _refs(fixed) == {"Service/db", "Service/web", "EndpointSlice/web-1"}


def _write_in_two_steps(path: Path, first: str, rest: str, pause: float) -> None:
    """A real writer: opens the file (truncating it), writes ``first``, flushes, waits, writes
    ``rest`` and closes it."""
    with path.open("w") as out:
        out.write(first)
        out.flush()
        time.sleep(pause)
        out.write(rest)


@pytest.mark.parametrize(
    "split",
    [
        pytest.param(0, id="truncate-then-write"),
        pytest.param(len("# header\n"), id="header-first"),
        pytest.param(len(_service("web")), id="service-before-its-slice"),
    ],
)
async def test_a_file_written_in_two_steps_loses_nothing(tmp_path: Path, split: int) -> None:
    """The daemon's source, with a writer that writes a file in two steps half a second apart,
    again and again: every load it sends holds both objects, and the unrelated file's change
    lands meanwhile."""
    whole = ("# header\n" + WHOLE) if split == len("# header\n") else WHOLE
    f = tmp_path / "web.yaml"
    f.write_text(whole)
    (tmp_path / "db.yaml").write_text(_service("db", ip="10.96.0.11"))
    source = ManifestSource(tmp_path, settle=0.05, max_wait=0.2)
    send, recv = trio.open_memory_channel[Sequence[Change]](1000)
    seen: list[set[str]] = []
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(source.run, send)
            seen.append(_refs(await recv.receive()))

            def writer() -> None:
                for _ in range(3):
                    _write_in_two_steps(f, whole[:split], whole[split:], 0.5)
                    time.sleep(0.3)

            thread = threading.Thread(target=writer, daemon=True)
            thread.start()
            while thread.is_alive():
                with trio.move_on_after(0.1):
                    seen.append(_refs(await recv.receive()))
            thread.join()
            nursery.cancel_scope.cancel()
    assert len(seen) > 3, "the writes were not seen"
    want = {"Service/web", "EndpointSlice/web-1", "Service/db"}
    assert all(refs == want for refs in seen), seen


async def test_a_source_started_on_a_broken_file_names_it_unread_until_it_parses(
    tmp_path: Path,
) -> None:
    """As after a restart in the middle of an edit: the first load cannot know the file's
    objects, and says so on every Replace until the file parses again."""
    f = tmp_path / "web.yaml"
    f.write_text(WHOLE + "spec: [oops\n")
    (tmp_path / "db.yaml").write_text(_service("db", ip="10.96.0.11"))
    source = ManifestSource(tmp_path, settle=0.05, max_wait=0.2)
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(source.run, send)
            first = await recv.receive()
            assert _refs(first) == {"Service/db"}
            assert {r.unread for r in first if isinstance(r, Replace)} == {("web.yaml",)}
            f.write_text(WHOLE)
            fixed = await recv.receive()
            assert _refs(fixed) == {"Service/db", "Service/web", "EndpointSlice/web-1"}
            assert {r.unread for r in fixed if isinstance(r, Replace)} == {()}
            nursery.cancel_scope.cancel()
