"""``deploy/kubernetes/rbac.yaml`` grants what the source asks for and nothing more, and the
source syncs under it (and under the same role without ServiceCIDRs, as written before 1.33).

The role is enforced by the in-repo API server: every verb it does not grant on a kind is
answered 403, as kube-apiserver's RBAC authorizer would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import yaml

from nlproxy.cluster.kube import kinds
from tests.kube.apiserver import RESOURCES, ApiServer
from tests.kube.conftest import NODE, by_kind, names, populate, start_source

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "rbac.yaml"
SOURCE_VERBS = {"list", "watch"}


def role_rules() -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all(RBAC.read_text()))
    [role] = [d for d in docs if d["kind"] == "ClusterRole"]
    [binding] = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    [account] = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "kube-system"}
    ]
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def granted(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(API group, plural) -> verbs, from resource rules."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for plural in rule.get("resources", []):
                out.setdefault((group, plural), set()).update(rule["verbs"])
    return out


def read_kinds() -> dict[tuple[str, str], str]:
    """(API group, plural) -> kind, for what the source reads."""
    out = {}
    for spec in kinds(NODE):
        res = RESOURCES[spec.path]
        out[(res.api_version.rpartition("/")[0], res.plural)] = spec.kind
    return out


def enforce(apiserver: ApiServer, rules: list[dict[str, Any]]) -> None:
    grants = granted(rules)
    for res in RESOURCES.values():
        key = (res.api_version.rpartition("/")[0], res.plural)
        refused = SOURCE_VERBS - grants.get(key, set())
        if refused:
            apiserver.forbid(res.plural, *refused)


def test_role_grants_list_and_watch_of_what_the_source_reads_only() -> None:
    rules = role_rules()
    assert granted(rules) == dict.fromkeys(read_kinds(), SOURCE_VERBS)
    extra = [r for r in rules if "resources" not in r]
    assert extra == [{"nonResourceURLs": ["/readyz"], "verbs": ["get"]}]  # the outage probe


async def test_source_syncs_under_the_role(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    enforce(apiserver, role_rules())
    seen: list[dict[str, Any]] = []
    feed, source = await start_source(nursery, api_client, on_unavailable=seen.append)
    assert names(by_kind(feed.batches[0])["ServiceCIDR"]) == {"kubernetes"}
    assert source.unavailable == {}
    assert seen == []


async def test_source_syncs_under_the_role_without_service_cidrs(
    apiserver: ApiServer, api_client: Any, nursery: trio.Nursery
) -> None:
    populate(apiserver)
    rules = [r for r in role_rules() if "servicecidrs" not in r.get("resources", [])]
    enforce(apiserver, rules)
    feed, source = await start_source(nursery, api_client)
    replaces = by_kind(feed.batches[0])
    assert names(replaces["Service"]) == {"svc-0", "svc-1", "svc-2"}
    assert replaces["ServiceCIDR"].changes == ()
    assert list(source.unavailable) == ["ServiceCIDR"]
