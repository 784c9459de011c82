"""``nlproxy run --once``: reconcile once from a manifests directory, report, and exit.

Loads the directory, plans and commits one sync (nothing at all when the files, the settings
and the tables' records show that nothing changed), names on stderr each object left out and
returns the exit status: 0 applied; 3 applied but some objects were invalid and left out; a
:class:`~nlproxy.errors.ConfigError` for a directory that is not one. The command line's
checks, its namespace lock and its ending are ``commands/run.py``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from nlproxy.config import Settings
from nlproxy.errors import ConfigError
from nlproxy.operate.text import printable

if TYPE_CHECKING:
    from nlproxy.cluster.manifests import DirectoryRead
    from nlproxy.sync.kernel import SyncKernel

EXIT_INVALID_OBJECTS = 3


def run_once(
    s: Settings,
    *,
    end: Callable[[int], int] = lambda status: status,
    kernel: SyncKernel | None = None,
) -> int:
    """Reconcile once from ``--manifests`` and return the exit status.

    Args:
        s: the settings; ``s.manifests`` is the directory.
        end: given the exit status last, while the cluster and the plan are still referenced,
            and returns it (the command line's may end the process there, freeing nothing one
            by one).
        kernel: the kernel to sync (default: the real one of ``s.netns``).

    Raises:
        ConfigError: ``s.manifests`` is not a directory.
        KernelError: the kernel rejected a batch and no Service could be blamed (nothing of
            that family's batch was applied).
    """
    from nlproxy.runtime.hotpath import collection_paused

    # Collecting cycles among the plan's objects only costs time in a one-shot sync (about
    # 0.5 s of 4 s at 10k services x 10 endpoints); collection resumes when it is done.
    with collection_paused():
        return _run_once(s, end, kernel)


# One piece (72 lines): what it lets go early (``del``) and what stays referenced until
# ``end()`` (the cluster, the plan) are seen in one frame, which memory at scale depends on.
def _run_once(s: Settings, end: Callable[[int], int], kernel: SyncKernel | None) -> int:
    from nlproxy.cluster.manifests import load_manifests, read_manifests
    from nlproxy.log import get_logger
    from nlproxy.nft.ir import FAMILIES
    from nlproxy.operate.inputs import cluster_inputs, local_addresses
    from nlproxy.sync.kernel import real as real_kernel
    from nlproxy.sync.syncer import Syncer, SyncResult

    log = get_logger("run")
    if s.manifests is None or not s.manifests.is_dir():
        raise ConfigError("--manifests", f"{s.manifests} is not a directory")
    syncer = Syncer(
        s.proxy,
        real_kernel(s.netns) if kernel is None else kernel,
        owner=s.owned_table,
        flush_tcp=s.conntrack_flush_tcp,
    )
    try:
        # Each file is read once, as the loader reads it (beneath the directory, regular files
        # only, within the budget): the digest is of the bytes the loader is given.
        read = read_manifests(s.manifests)
        local = local_addresses(s)
        files = _manifests_digest(s, read, local)
        # The same files and settings as a run that had nothing to report, and nobody wrote
        # since: nothing to parse, plan or send (docs/ruleset.md, restart by fingerprint).
        if files is not None and syncer.files_unchanged(files):
            log.info("sync.applied", ops=0, duration_ms=0.0, plan_ms=0.0, invalid=0, unchanged=True)
            return 0
        loaded = load_manifests(s.manifests, read=read, proxy_name=s.service_proxy_name)
        del read
        for warning in loaded.warnings:
            print(f"nlproxy: warning: {printable(warning)}", file=sys.stderr)
        # The loader's per-file changes (kept for a daemon's reload) are not needed once the
        # state holds the model: let them go before the plan is built, not after.
        inputs = cluster_inputs(s, loaded.changes, loaded.errors, local=local)
        warned = bool(loaded.warnings)
        del loaded
        for gap in inputs.warnings:
            print(f"nlproxy: warning: {printable(gap)}", file=sys.stderr)
        problems: list[object] = list(inputs.problems)
        clean = not (warned or inputs.warnings or problems)
        syncer.files_digest = files if clean else None
        snapshot = inputs.snapshot
        # The tables' records vouch that they hold this input's plan: nothing to plan or send.
        if syncer.unchanged_since_last_run(snapshot):
            result = SyncResult(ops=dict.fromkeys(FAMILIES, 0), restarted=True)
            if syncer.files_digest not in (None, syncer.recorded_files):
                # Other files (or settings) that plan the same: the next run trusts these.
                syncer.rewrite_records()
        else:
            result = syncer.sync(snapshot)
        if result.excluded and syncer.files_digest is not None:
            syncer.files_digest = None  # the next run must parse to name them again
            syncer.rewrite_records()
    finally:
        syncer.close()
    problems += [
        f"Service {key}: refused by the kernel: {why}" for key, why in result.excluded.items()
    ]
    log.info(
        "sync.applied",
        ops=result.total_ops,
        duration_ms=round(result.plan_ms + result.apply_ms, 3),
        plan_ms=round(result.plan_ms, 3),
        conntrack_deleted=result.conntrack_deleted,
        invalid=len(problems),
        unchanged=result.restarted,
    )
    for problem in problems:
        print(f"nlproxy: left out: {printable(problem)}", file=sys.stderr)
    # Ends here, with the cluster and the plan still referenced: nothing is freed one by one.
    return end(EXIT_INVALID_OBJECTS if problems else 0)


def _manifests_digest(s: Settings, read: DirectoryRead, local: object) -> str | None:
    """The digest of the manifest files as read (each file's BLAKE2b, computed as it was read;
    None for a directory), of the settings and of the interface addresses; None if a file could
    not be read (a link out of the directory, not a regular file, past the budget, changing):
    the loader names it."""
    from nlproxy.cluster.readdir import FileRead
    from nlproxy.sync.fingerprint import files_digest

    contents: list[tuple[str, bytes | None]] = []
    for name, outcome in read.files.items():
        if outcome is not None and not isinstance(outcome, FileRead):
            return None
        contents.append((name, None if outcome is None else outcome.digest))
    return files_digest(contents, repr((s, local)))
