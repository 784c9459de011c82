"""The restart fingerprint: what changes the digest, that updating it follows only what changed,
and when the tables' records are trusted (``sync/fingerprint.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from ipaddress import ip_address, ip_network
from pathlib import Path

import msgspec
import pytest

from nlproxy.cluster import parse, typed
from nlproxy.cluster.model import ClusterSnapshot
from nlproxy.nft.ir import Chain, Family, Rule, Ruleset, Table
from nlproxy.nft.reconcile import stamp
from nlproxy.proxy.config import ProxyConfig
from nlproxy.sync.fingerprint import (
    NFT_COMMENT_MAX,
    RECORD_CHAIN,
    Fingerprint,
    Record,
    take_record,
    trusted,
)
from tests import objects
from tests.unit.builders import NODE, endpoint, eps_slice, node, service, snapshot

CONFIG = ProxyConfig(node_name=NODE, cluster_cidrs=(ip_network("10.0.0.0/8"),))
FAMILIES = (Family.IP, Family.IP6)


def world(n: int = 5, *, last_ep: str = "10.1.0.9") -> ClusterSnapshot:
    services = [service("ns", f"s{i}", f"172.30.0.{i + 1}") for i in range(n)]
    slices = [eps_slice("ns", f"s{i}", [endpoint(f"10.1.0.{i + 1}")]) for i in range(n - 1)]
    slices.append(eps_slice("ns", f"s{n - 1}", [endpoint(last_ep)]))
    return snapshot(services, slices, node=node())


def digest(snap: ClusterSnapshot, config: ProxyConfig = CONFIG, version: str = "1") -> str:
    return Fingerprint(config, version).digest(snap)


def test_equal_inputs_give_equal_digests_whatever_the_objects_identity() -> None:
    assert digest(world()) == digest(world())


@pytest.mark.parametrize(
    ("case", "other"),
    [
        pytest.param("endpoint", lambda: digest(world(last_ep="10.1.0.10")), id="an-endpoint"),
        pytest.param("service", lambda: digest(world(6)), id="one-more-service"),
        pytest.param(
            "config",
            lambda: digest(world(), replace(CONFIG, masquerade_bit=13)),
            id="configuration",
        ),
        pytest.param("version", lambda: digest(world(), version="2"), id="nlproxy-version"),
        pytest.param(
            "node", lambda: digest(replace(world(), node=node(("192.168.0.3",)))), id="node"
        ),
        pytest.param(
            "addresses",
            lambda: digest(replace(world(), local_addresses=(ip_address("192.168.9.9"),))),
            id="local-addresses",
        ),
    ],
)
def test_a_changed_input_changes_the_digest(case: str, other: object) -> None:
    assert callable(other)
    assert other() != digest(world()), case


def test_kept_up_to_date_it_equals_a_fresh_digest() -> None:
    fp = Fingerprint(CONFIG, "1")
    fp.digest(world(6))
    assert fp.digest(world(6, last_ep="10.1.0.10")) == digest(world(6, last_ep="10.1.0.10"))
    assert fp.digest(world(3)) == digest(world(3))  # services and slices deleted
    small = world(3)
    no_slices = replace(small, slices={})
    assert fp.digest(no_slices) == digest(no_slices)  # slices deleted, services kept
    orphan = replace(small, services={})
    assert fp.digest(orphan) == digest(orphan)  # services deleted, slices kept
    assert fp.digest(world(3)) == digest(world(3))


def test_unchanged_objects_are_not_hashed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fp = Fingerprint(CONFIG, "1")
    snap = world(50)
    fp.digest(snap)
    hashed: list[str] = []
    monkeypatch.setattr(
        "nlproxy.sync.fingerprint._h", lambda text: hashed.append(text) or len(text)
    )
    key = next(iter(snap.services))
    changed = replace(
        snap, services={**snap.services, key: msgspec.structs.replace(snap.services[key])}
    )
    fp.digest(changed)
    assert len(hashed) == 1


def test_records_are_trusted_only_for_the_digest_and_the_last_two_generations() -> None:
    good = {Family.IP: Record("a" * 64, 41), Family.IP6: Record("a" * 64, 42)}
    assert trusted(good, "a" * 64, 42, FAMILIES)
    assert not trusted(good, "b" * 64, 42, FAMILIES)  # other inputs
    assert not trusted(good, "a" * 64, 43, FAMILIES)  # someone committed since
    gap = {Family.IP: Record("a" * 64, 40), Family.IP6: Record("a" * 64, 42)}
    assert not trusted(gap, "a" * 64, 42, FAMILIES)  # someone committed in between
    assert not trusted({Family.IP: good[Family.IP], Family.IP6: None}, "a" * 64, 42, FAMILIES)


def test_a_record_reads_back_from_its_rule_and_leaves_the_table() -> None:
    rec = Record("c" * 64, 7)
    rs = Ruleset(table=Table(family=Family.IP, name="nlproxy"))
    rs.add_chain(Chain(name=RECORD_CHAIN))
    rs.rules[RECORD_CHAIN] = [Rule(chain=RECORD_CHAIN, exprs=(), comment=rec.comment() + " fp=1")]
    assert take_record(rs) == rec
    assert RECORD_CHAIN not in rs.chains
    assert RECORD_CHAIN not in rs.rules
    assert take_record(rs) is None


@pytest.mark.parametrize("files", [None, "e" * 64], ids=["daemon", "run-once"])
def test_the_longest_record_as_programmed_fits_what_nft_reads_back(files: str | None) -> None:
    """``nft -f`` refuses a comment over 128 characters, and with it a whole saved ruleset:
    the record, with the rule's fingerprint the kernel keeps after it, stays within that."""
    rec = Record("f" * 64, 0xFFFFFFFF, files)
    programmed = stamp(Rule(chain=RECORD_CHAIN, exprs=(), comment=rec.comment()))
    assert len(programmed.comment) <= NFT_COMMENT_MAX
    assert Record.parse(programmed.comment) == rec


def test_given_the_changed_services_it_looks_at_no_other() -> None:
    fp = Fingerprint(CONFIG, "1")
    fp.digest(world(4))
    bigger = world(6, last_ep="10.1.0.10")  # s3 changed, s4 and s5 are new
    assert fp.digest(bigger, {k for k in bigger.services if k.name >= "s3"}) == digest(bigger)
    smaller = world(2)  # s1 changed, s2..s5 deleted
    assert fp.digest(smaller, {k for k in bigger.services if k.name >= "s1"}) == digest(smaller)
    # A change left out of ``changed`` is not seen: the caller's report is trusted.
    assert fp.digest(world(2, last_ep="10.1.0.11"), set()) == digest(smaller)


def test_a_new_resource_version_alone_is_no_change() -> None:
    """As ``ClusterState`` does not report it, the digest does not see it (the model does not
    hold it): a daemon that was told nothing changed and one restarted on the new objects
    agree."""
    objs = [objects.example_service(**{"metadata.resourceVersion": rv}) for rv in ("7", "99")]
    for path in ("typed", "parser"):
        changes = [
            typed.change(msgspec.json.encode(o), "Service")
            if path == "typed"
            else parse.to_change(o, "Service")
            for o in objs
        ]
        snaps = [
            snapshot([c.obj], [])  # type: ignore[union-attr]
            for c in changes
        ]
        assert snaps[0].services == snaps[1].services
        assert digest(snaps[0]) == digest(snaps[1])


_HINTED_DIGEST = """
from tests.unit.builders import endpoint, eps_slice, service, snapshot
from tests.unit.test_fingerprint import digest
zones = [f"zone-{c}" for c in "abcdefgh"]
ep = endpoint("10.1.0.1", hints_zones=frozenset(zones), hints_nodes=frozenset(zones))
print(digest(snapshot([service("ns", "s", "172.30.0.1")], [eps_slice("ns", "s", [ep])])))
"""


def test_the_digest_does_not_depend_on_the_process_string_hashing() -> None:
    """Hints are sets, whose order follows the process's (seeded) string hashes: a restarted
    nlproxy must compute the digest its predecessor recorded."""
    root = Path(__file__).resolve().parents[2]
    out = {
        subprocess.run(
            [sys.executable, "-c", _HINTED_DIGEST],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in (1, 2, 3, 4)
    }
    assert len(out) == 1, out
