"""One large or broken manifest file never holds back another file's change: the source parses
a large changed file apart (its last good objects standing meanwhile) and sends the others'
changes at once; a content that did not parse is not parsed again while it stays the same."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trio

from nlproxy.cluster.manifests import DEFER_BYTES, load_manifests, parse_file
from nlproxy.cluster.model import Change, Replace
from nlproxy.cluster.readdir import Directory
from nlproxy.cluster.watchdir import ManifestSource


def _service(name: str, ip: str, port: int = 80) -> str:
    return (
        "apiVersion: v1\nkind: Service\n"
        f"metadata:\n  name: {name}\n  namespace: default\n"
        f"spec:\n  clusterIP: {ip}\n  ports:\n  - port: {port}\n    name: http\n"
    )


def _big(count: int = 6000) -> str:
    """Block YAML of ``count`` Services: well over ``DEFER_BYTES``."""
    text = "---\n".join(_service(f"s{i}", f"10.97.{i // 250}.{i % 250 + 1}") for i in range(count))
    assert len(text) > 4 * DEFER_BYTES
    return text


def _cut(text: str) -> str:
    """``text`` cut in the middle of a line, with a stray bracket: it does not parse."""
    at = text.index("clusterIP", len(text) * 3 // 4)
    return text[:at] + "clusterIP: [10.97"


def _ports(changes: Sequence[Change]) -> dict[str, int]:
    (services,) = [r for r in changes if isinstance(r, Replace) and r.kind == "Service"]
    return {c.ref.name: c.obj.ports[0].port for c in services.changes}  # type: ignore[union-attr]


def test_a_large_changed_file_is_left_to_parse_apart(tmp_path: Path) -> None:
    big, small = tmp_path / "big.yaml", tmp_path / "small.yaml"
    big.write_text(_big())
    small.write_text(_service("small", "10.96.0.1"))
    first = load_manifests(tmp_path, defer=DEFER_BYTES)  # nothing known: still deferred
    assert set(first.deferred) == {"big.yaml"}
    assert first.unread == ("big.yaml",)  # what is programmed for it may be its own
    assert set(_ports(first.changes)) == {"small"}
    with Directory(tmp_path) as d:
        read = d.read("big.yaml")
    assert read is not None
    parsed = {"big.yaml": parse_file("big.yaml", read)}
    whole = load_manifests(tmp_path, first.good, parsed=parsed, defer=DEFER_BYTES)
    assert whole.deferred == {}
    assert len(_ports(whole.changes)) == 6001
    # Changed again: its last good objects stand until it is parsed apart once more.
    big.write_text(_big().replace("port: 80", "port: 81", 1))
    small.write_text(_service("small", "10.96.0.1", 82))
    again = load_manifests(tmp_path, whole.good, parsed=parsed, defer=DEFER_BYTES)
    assert set(again.deferred) == {"big.yaml"}
    ports = _ports(again.changes)
    assert (len(ports), ports["s0"], ports["small"]) == (6001, 80, 82)
    # Without ``defer``, every file is parsed in the load itself.
    assert _ports(load_manifests(tmp_path, whole.good).changes)["s0"] == 81


def test_a_content_that_did_not_parse_is_not_parsed_again(tmp_path: Path) -> None:
    (tmp_path / "big.yaml").write_text(_big())
    good = load_manifests(tmp_path)
    (tmp_path / "big.yaml").write_text(_cut(_big()))
    broken = load_manifests(tmp_path, good.good)
    failure = broken.failed["big.yaml"]
    assert failure.error is not None
    (error,) = broken.errors
    assert error.startswith("big.yaml")
    assert error.endswith("its last good objects are kept")
    again = load_manifests(tmp_path, broken.good, parsed=broken.failed)
    assert again.failed["big.yaml"] is failure  # the same result, not a new parse
    assert again.errors == broken.errors
    assert len(_ports(again.changes)) == 6000
    # Fixed: parsed, and forgotten as a failure.
    (tmp_path / "big.yaml").write_text(_big())
    fixed = load_manifests(tmp_path, again.good, parsed=again.failed)
    assert (fixed.failed, fixed.errors) == ({}, ())


async def test_a_broken_large_file_does_not_hold_back_another_files_change(
    tmp_path: Path,
) -> None:
    """The small file's change is sent before the large file's parse is over (whose error
    comes with a later load), and the large file's Services stand throughout."""
    big, small = tmp_path / "big.yaml", tmp_path / "small.yaml"
    text = _big(8000)
    big.write_text(text)
    small.write_text(_service("small", "10.96.0.1"))
    source = ManifestSource(tmp_path, settle=0.05, max_wait=0.2)
    # Unbuffered: each load is received before the next is made, so ``source.errors`` is the
    # received load's.
    send, recv = trio.open_memory_channel[Sequence[Change]](0)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(source.run, send)  # its first send waits for this receive
            assert len(_ports(await recv.receive())) == 8001
            big.write_text(_cut(text))
            small.write_text(_service("small", "10.96.0.1", 81))
            loads: list[tuple[dict[str, int], tuple[str, ...]]] = []
            while not any(e.startswith("big.yaml") for e in source.errors):
                changes = await recv.receive()
                loads.append((_ports(changes), source.errors))
            nursery.cancel_scope.cancel()
    assert all(len(ports) == 8001 for ports, _ in loads), "the large file's Services went"
    first_new = next(i for i, (ports, _) in enumerate(loads) if ports["small"] == 81)
    assert loads[first_new][1] == (), "the small change waited for the large file's parse"
    assert not any(e.startswith("big.yaml") for _, errors in loads[:-1] for e in errors)


async def test_a_large_file_that_loses_services_lets_them_go_after_the_grace(
    tmp_path: Path,
) -> None:
    """A large file rewritten with fewer Services is parsed apart; those it lost stand for the
    grace and then go, though nothing else in the directory changes meanwhile (the watcher,
    idle on inotify, learns from the parse when to read the file again)."""
    big = tmp_path / "big.yaml"
    text = _big(2000)
    big.write_text(text)
    source = ManifestSource(tmp_path, settle=0.05, max_wait=0.2)
    send, recv = trio.open_memory_channel[Sequence[Change]](0)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(source.run, send)
            assert len(_ports(await recv.receive())) == 2000
            fewer = tmp_path / ".big.yaml.tmp"
            fewer.write_text(text[: text.index("name: s1500\n")].rsplit("---\n", 1)[0])
            fewer.rename(big)
            while len(_ports(await recv.receive())) != 1500:
                pass
            nursery.cancel_scope.cancel()


def test_a_large_file_broken_at_start_stays_unread_while_its_fix_is_parsed_apart(
    tmp_path: Path,
) -> None:
    """The daemon's first load finds it broken (unread: the sync keeps its Services as
    programmed); the load that finds it fixed leaves it to parse apart, and must still name it
    unread, or the sync would take its Services for gone until that parse ends."""
    big = tmp_path / "big.yaml"
    big.write_text(_cut(_big()))
    first = load_manifests(tmp_path)
    assert first.unread == ("big.yaml",)
    big.write_text(_big())
    fixed = load_manifests(tmp_path, first.good, parsed=first.failed, defer=DEFER_BYTES)
    assert set(fixed.deferred) == {"big.yaml"}
    assert fixed.unread == ("big.yaml",)
    with Directory(tmp_path) as d:
        read = d.read("big.yaml")
    assert read is not None
    parsed = {"big.yaml": parse_file("big.yaml", read)}
    whole = load_manifests(tmp_path, fixed.good, parsed=parsed, defer=DEFER_BYTES)
    assert (whole.unread, len(_ports(whole.changes))) == ((), 6000)
