"""What the manifests directory's writers can do between the listing and the read, and while a
reload runs: a FIFO or a link out of the directory swapped in is refused, not opened blocking or
followed; a file truncated then written again loses none of its Services, and one that stays
empty deletes them after the grace."""

from __future__ import annotations

import ctypes
import os
import resource
import threading
from collections.abc import Sequence
from pathlib import Path

import trio

from nlproxy.cluster.manifests import GRACE, ManifestLoad, load_manifests
from nlproxy.cluster.model import Change, Replace
from nlproxy.cluster.watchdir import ManifestSource

IN_OPEN = 0x20
_libc = ctypes.CDLL(None, use_errno=True)


def _service(name: str, port: int = 80) -> str:
    return (
        "apiVersion: v1\nkind: Service\n"
        f"metadata: {{name: {name}, namespace: default}}\n"
        f"spec: {{clusterIP: 10.96.0.10, ports: [{{port: {port}}}]}}\n"
    )


def _slow_first_file(directory: Path) -> Path:
    """``a.yaml``: someone else's objects, long enough to parse that a rename made when it is
    opened lands before the next file is."""
    body = "".join(f"  key{i}: value {i}\n" for i in range(60_000))
    path = directory / "a.yaml"
    path.write_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big}}\ndata:\n{body}")
    return path


def _load_swapping(directory: Path, swap: Path, replacement: Path) -> ManifestLoad | None:
    """``load_manifests(directory)`` in a thread, renaming ``replacement`` over ``swap`` as
    soon as ``a.yaml`` is opened (after the listing); None if the load does not end."""
    fd = _libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0
    try:
        assert _libc.inotify_add_watch(fd, os.fsencode(directory / "a.yaml"), IN_OPEN) >= 0
        result: list[ManifestLoad] = []
        loader = threading.Thread(
            target=lambda: result.append(load_manifests(directory)), daemon=True
        )
        loader.start()
        os.read(fd, 4096)  # a.yaml opened: the names are listed
        replacement.rename(swap)
        loader.join(timeout=60)
        return result[0] if result else None
    finally:
        os.close(fd)


def _services(load: ManifestLoad) -> set[str]:
    (svcs,) = [r for r in load.changes if r.kind == "Service"]
    return {c.ref.name for c in svcs.changes}


def test_a_fifo_swapped_in_after_the_listing_is_refused_not_waited_on(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    _slow_first_file(d)
    (d / "b.yaml").write_text(_service("web"))
    (d / "c.yaml").write_text(_service("db"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    load = _load_swapping(d, d / "b.yaml", fifo)
    if load is None:  # blocked in open(): let the thread go before failing
        with open(d / "b.yaml", "wb"):
            pass
    assert load is not None, "the load blocked on the FIFO"
    assert load.errors == ("b.yaml: not a regular file; not read",)
    assert _services(load) == {"db"}


def test_a_link_out_swapped_in_after_the_listing_is_not_followed(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    _slow_first_file(d)
    (d / "b.yaml").write_text(_service("web"))
    secret = tmp_path / "secret.yaml"
    secret.write_text(_service("secret"))
    link = tmp_path / "link"
    link.symlink_to(secret)
    load = _load_swapping(d, d / "b.yaml", link)
    assert load is not None
    assert load.errors == (f"b.yaml: a symbolic link to {secret}, outside {d}; not read",)
    assert _services(load) == set()


def test_links_inside_the_directory_are_followed(tmp_path: Path) -> None:
    """A ConfigMap volume: ``name -> ..data/name``, ``..data -> ..2024_01``."""
    (tmp_path / "..2024_01").mkdir()
    (tmp_path / "..2024_01" / "web.yaml").write_text(_service("web"))
    (tmp_path / "..data").symlink_to("..2024_01")
    (tmp_path / "web.yaml").symlink_to("..data/web.yaml")
    load = load_manifests(tmp_path)
    assert load.errors == ()
    assert _services(load) == {"web"}


def _names(changes: Sequence[Change]) -> set[str]:
    (svcs,) = [r for r in changes if isinstance(r, Replace) and r.kind == "Service"]
    return {c.ref.name for c in svcs.changes}


async def test_truncate_then_write_loses_nothing_and_an_emptied_file_deletes_after_grace(
    tmp_path: Path,
) -> None:
    (tmp_path / "web.yaml").write_text(_service("web"))
    (tmp_path / "db.yaml").write_text(_service("db", 5432))
    source = ManifestSource(tmp_path, settle=0.05, max_wait=0.2)
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(source.run, send)
            assert _names(await recv.receive()) == {"web", "db"}
            # A shell's "> web.yaml": truncated, then written a moment later (after a reload
            # has seen it empty).
            (tmp_path / "web.yaml").write_text("")
            seen = [_names(await recv.receive())]
            (tmp_path / "web.yaml").write_text(_service("web", 81))
            while source._unsettled or len(seen) < 2:
                seen.append(_names(await recv.receive()))
            assert all(names == {"web", "db"} for names in seen), seen
            # Emptied for good: deleted once it has stayed empty for the grace.
            (tmp_path / "web.yaml").write_text("")
            start = trio.current_time()
            while _names(await recv.receive()) != {"db"}:
                pass
            assert trio.current_time() - start >= GRACE * 0.9
            nursery.cancel_scope.cancel()


async def test_a_reload_that_meets_emfile_is_tried_again_not_fatal(tmp_path: Path) -> None:
    """Out of descriptors, the directory cannot be opened: the objects stay, the source task
    lives on, and the reload is made once descriptors are back."""
    (tmp_path / "web.yaml").write_text(_service("web"))
    source = ManifestSource(tmp_path, settle=0.05, max_wait=0.2)
    send, recv = trio.open_memory_channel[Sequence[Change]](100)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(source.run, send)
            assert _names(await recv.receive()) == {"web"}
            (tmp_path / "db.yaml").write_text(_service("db", 5432))
            try:
                resource.setrlimit(
                    resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 1, hard)
                )
                await trio.sleep(1)  # the reload fails meanwhile
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            assert _names(await recv.receive()) == {"web", "db"}
            nursery.cancel_scope.cancel()


def test_files_past_the_reloads_budget_keep_their_last_good_objects(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(_service("web"))
    (tmp_path / "b.yaml").write_text(_service("db", 5432))
    first = load_manifests(tmp_path)
    budget = len(_service("web")) + 10
    (tmp_path / "b.yaml").write_text(_service("db", 5433))
    again = load_manifests(tmp_path, first.good, budget=budget)
    assert _services(again) == {"web", "db"}
    assert again.errors == (
        f"b.yaml: not read: {len(_service('db', 5433))} bytes, more than is left of one "
        "reload's budget (10); its last good objects are kept",
    )
