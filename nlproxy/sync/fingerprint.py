"""Restart by fingerprint: a digest of everything the plan depends on, recorded in the tables.

Where it sits: beside the Syncer. After each commit the Syncer writes, in each family's table,
one record: the digest of what it planned from and the kernel generation id its commit was
expected to get. On start, if both records carry the digest of the inputs at hand and the
kernel's current generation is the last record's (nobody committed anything in the namespace
since nlproxy's last batch), the tables hold exactly what planning those inputs would program:
the read-back and the diff are skipped, and the full verify runs later, off the sync loop.
Anything else (no record, another digest, another generation) is the ordinary read-back.

The digest covers nlproxy's version, the planner's configuration and the snapshot the planner
sees (every Service with its EndpointSlices, the Node, the ServiceCIDRs, the node's interface
addresses). Each Service's objects are encoded together by msgspec's MessagePack encoder, in C:
every field of every model value, in field order (the model's Structs are ``array_like``), sets
sorted so that the bytes do not depend on the process's string hashing (the model holds no
``resourceVersion``, which is no change to what is proxied); addresses, the one kind of value
the encoder does not know, go through ``_encode_other``. Services are hashed one by one and
summed (modulo 2**256), so a sync rehashes only the services whose objects changed (by
identity, as ``ClusterState`` keeps unchanged objects): the cost follows the change, not the
cluster. The sum is an integrity check against stale state, not against an adversary who
chooses thousands of Services to make two clusters collide; a wrong match costs at most the
time to the deferred verify.

Pure: no I/O, clock or logging.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Set
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import msgspec

from nlproxy import __version__
from nlproxy.cluster.model import ClusterSnapshot, EndpointSlice, Service, ServiceKey
from nlproxy.nft.ir import Chain, Family, Operation, Rule, Ruleset, Verb
from nlproxy.proxy.config import ProxyConfig

RECORD_CHAIN = "restart-record"
"""The chain (never jumped to) whose one rule's comment holds the record."""
HEALTH_CHAIN = "health-check-record"
"""The chain (never jumped to) of the health-check record beside it (``health.py``)."""

NFT_COMMENT_MAX = 128
"""The longest comment ``nft`` reads back (NFTNL_UDATA_COMMENT_MAXLEN): one longer in a saved
ruleset makes ``nft -f`` refuse the whole file, every table of the node with it."""
RECORD_COMMENT_MAX = NFT_COMMENT_MAX - len(" fp=") - 12
"""The longest record :meth:`Record.comment` writes: the rule's fingerprint follows it in the
kernel (``nft/reconcile.py``'s ``stamp``)."""

_MOD = 1 << 256
_B64 = r"[A-Za-z0-9_-]{43}"  # 32 bytes, URL-safe base64 without padding
_RECORD_RE = re.compile(rf"nlproxy d=({_B64}) g=(\d+)(?: f=({_B64}))?")


def _short(digest: str) -> str:
    """A 64-hex-digit digest in 43 characters (a comment has room for two with a generation)."""
    return base64.urlsafe_b64encode(bytes.fromhex(digest)).rstrip(b"=").decode()


def _hex(short: str) -> str:
    return base64.urlsafe_b64decode(short + "=").hex()


@dataclass(frozen=True, slots=True)
class Record:
    """What one table's record says: the digest of the inputs of the commit that wrote it, and
    the kernel generation id that commit was expected to get; ``files``, written by ``run
    --once`` after a run that had nothing to warn about, the digest of its manifest files and
    settings (:func:`files_digest`), which a later run can check before parsing anything."""

    digest: str
    generation: int
    files: str | None = None

    def comment(self) -> str:
        """The record as its rule's comment, at most :data:`RECORD_COMMENT_MAX` characters.

        The digests are written in base64 (not hex) and nlproxy's version not at all (the
        digests cover it), so that two digests and a 32-bit generation fit in what ``nft``
        reads back.
        """
        text = f"nlproxy d={_short(self.digest)} g={self.generation}"
        return text if self.files is None else f"{text} f={_short(self.files)}"

    @classmethod
    def parse(cls, comment: str) -> Record | None:
        """The record in a rule comment, or None when it is not one (an older nlproxy's
        record is none: its inputs included another version, so it would not match)."""
        m = _RECORD_RE.search(comment)
        if m is None:
            return None
        files = m.group(3)
        return cls(_hex(m.group(1)), int(m.group(2)), None if files is None else _hex(files))


def record_ops(record: Record) -> list[Operation]:
    """The operations that make the table's record ``record`` (creating its chain if needed)."""
    chain = Chain(name=RECORD_CHAIN)
    return [
        Operation(Verb.ADD, chain),
        Operation(Verb.FLUSH, chain),
        Operation(Verb.ADD, Rule(chain=RECORD_CHAIN, exprs=(), comment=record.comment())),
    ]


def take_record(rs: Ruleset | None) -> Record | None:
    """Remove the record's chain from a read-back (the plan has none) and return the record;
    the health-check record's chain (``health.py``), if still there, goes too."""
    if rs is not None and rs.chains.pop(HEALTH_CHAIN, None) is not None:
        rs.rules.pop(HEALTH_CHAIN, None)
    if rs is None or rs.chains.pop(RECORD_CHAIN, None) is None:
        return None
    rules = rs.rules.pop(RECORD_CHAIN, [])
    return Record.parse(rules[0].comment) if len(rules) == 1 else None


def trusted(
    records: dict[Family, Record | None],
    digest: str | None,
    current: int,
    families: tuple[Family, ...],
    files: str | None = None,
) -> bool:
    """Whether the tables are known to hold what the inputs of ``digest`` (or of the manifest
    files of ``files``) plan.

    Every family's table has a record of ``digest`` (or ``files``); the records' generations
    follow each other in ``families`` order (one sync's batches, nobody in between); the last
    one is the kernel's ``current`` generation (nobody since).
    """
    expected = current - len(families) + 1
    for family in families:
        rec = records.get(family)
        if rec is None or rec.generation != expected:
            return False
        if not (rec.digest == digest or (files is not None and rec.files == files)):
            return False
        expected += 1
    return True


def files_digest(contents: list[tuple[str, bytes | None]], settings: str) -> str:
    """The digest of a manifests directory's entries (name, bytes; None for what is not a
    regular file), of ``settings`` (the ``repr`` of everything else ``run --once`` reads) and
    of nlproxy's version."""
    h = hashlib.blake2b(f"nlproxy {__version__}\n{settings}\n".encode(), digest_size=32)
    for name, data in sorted(contents, key=lambda c: c[0]):
        h.update(f"{name}\0{-1 if data is None else len(data)}\0".encode())
        if data is not None:
            h.update(data)
    return h.hexdigest()


def _h(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=32).digest(), "little")


def _encode_other(obj: object) -> object:
    """The model's values that MessagePack has no type for: an IPv4 address as its number, an
    IPv6 address or any network as its text (a string: no IPv4 number equals one)."""
    if type(obj) is IPv4Address:
        # int(obj) without a Python-level call of its __int__: one per endpoint hashed, a
        # tenth of a cold start's digest
        return obj._ip  # type: ignore[attr-defined]
    if isinstance(obj, IPv6Address | IPv4Network | IPv6Network):
        return str(obj)
    raise NotImplementedError(f"no fingerprint encoding for {type(obj).__name__}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_encode_other, order="deterministic")


class Fingerprint:
    """The digest of the snapshots a Syncer plans, kept up to date service by service."""

    def __init__(self, config: ProxyConfig, version: str = __version__) -> None:
        self._version = version
        self._base = f"nlproxy {version}\n{config!r}\n"
        # Per service: the objects last hashed (compared by identity) and their hash.
        self._per: dict[ServiceKey, tuple[Service | None, tuple[EndpointSlice, ...], int]] = {}
        self._sum = 0

    def reconfigure(self, config: ProxyConfig) -> None:
        """Digest with ``config`` from now on (the services' own hashes stay valid)."""
        self._base = f"nlproxy {self._version}\n{config!r}\n"

    def digest(self, snapshot: ClusterSnapshot, changed: Set[ServiceKey] | None = None) -> str:
        """The digest of ``snapshot``: services whose objects are the ones hashed last time
        (by identity) are not hashed again.

        Args:
            snapshot: what the planner is given.
            changed: the only services that may differ from the snapshot of the last call
                (``ClusterState.apply``'s report, as the incremental planner takes it); None:
                any, every service is looked at.
        """
        services, slices = snapshot.services, snapshot.slices
        per, total = self._per, self._sum
        empty: tuple[EndpointSlice, ...] = ()
        if changed is not None and per:
            for key in changed:
                svc, group = services.get(key), slices.get(key, empty)
                old = per.get(key)
                if svc is None and not group:
                    if old is not None:
                        total -= per.pop(key)[2]
                elif old is None or old[0] is not svc or old[1] is not group:
                    total += self._rehash(key, svc, group, old)
            return self._finish(snapshot, total)
        for key, svc in services.items():
            group = slices.get(key, empty)
            old = per.get(key)
            if old is None or old[0] is not svc or old[1] is not group:
                total += self._rehash(key, svc, group, old)
        alive = len(services)
        for key, group in slices.items():
            if key not in services:
                alive += 1
                old = per.get(key)
                if old is None or old[0] is not None or old[1] is not group:
                    total += self._rehash(key, None, group, old)
        if len(per) > alive:  # services deleted with their slices
            for key in [k for k in per if k not in services and k not in slices]:
                total -= per.pop(key)[2]
        return self._finish(snapshot, total)

    def _finish(self, snapshot: ClusterSnapshot, total: int) -> str:
        per = self._per
        self._sum = total % _MOD
        h = hashlib.blake2b(self._base.encode(), digest_size=32)
        h.update(_ENCODER.encode((snapshot.node, snapshot.service_cidrs, snapshot.local_addresses)))
        h.update(f"\n{len(per)} {self._sum:064x}".encode())
        return h.hexdigest()

    def _rehash(
        self,
        key: ServiceKey,
        svc: Service | None,
        group: tuple[EndpointSlice, ...],
        old: tuple[Service | None, tuple[EndpointSlice, ...], int] | None,
    ) -> int:
        """Hash ``key``'s objects anew; returns how much the sum moves."""
        h = _h(_ENCODER.encode((key, svc, group)))
        self._per[key] = (svc, group, h)
        return h - (old[2] if old is not None else 0)
