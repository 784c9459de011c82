"""A DaemonSet's container as the kubelet would start it on a node, for the kernel tests: its
command and environment from the shipped manifest, its ConfigMap volumes and the service
account's token and CA mounted where the manifest and the in-cluster configuration expect them,
in the node's network namespace (``hostNetwork: true``).

The mounts are made in a private mount namespace (``ip netns exec`` makes one), as overlays on
the nearest existing directory, so nothing appears on the machine itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DAEMONSET = ROOT / "deploy/kubernetes/daemonset.yaml"
CONFIGMAP = ROOT / "deploy/kubernetes/configmap.yaml"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def shipped(path: Path, kind: str) -> dict[str, Any]:
    """The one object of ``kind`` in a shipped manifest."""
    (obj,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == kind]
    return dict(obj)


@dataclass
class PodSpec:
    """What the kubelet would run: the container's argv and environment, and the files each
    mount path shows."""

    argv: list[str]
    env: dict[str, str]
    mounts: dict[str, dict[str, str]]


def daemonset_pod(
    *,
    node_name: str,
    configmaps: Mapping[str, Mapping[str, str]],
    service_account: Mapping[str, str],
    service_env: Mapping[str, str],
    container: str = "nlproxy",
) -> PodSpec:
    """The shipped DaemonSet's ``container`` (or init container) on ``node_name``.

    Args:
        configmaps: the ConfigMaps that exist, by name, with their data (one a DaemonSet
            volume names but absent here is mounted empty when optional, as the kubelet does).
        service_account: the files of the service account volume (token, ca.crt, namespace).
        service_env: what the kubelet adds for the ``kubernetes`` Service
            (``KUBERNETES_SERVICE_HOST``/``PORT``), before the container's own ``env``.
    """
    ds = shipped(DAEMONSET, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    [spec] = [
        c for c in (*pod["containers"], *pod.get("initContainers", ())) if c["name"] == container
    ]
    env = dict(service_env)
    for var in spec.get("env", ()):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = var["value"]
        elif "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "spec.nodeName", var
            env[var["name"]] = node_name
        else:
            ref = source["configMapKeyRef"]
            data = configmaps.get(ref["name"])
            if data is not None and ref["key"] in data:
                env[var["name"]] = data[ref["key"]]
            else:
                assert ref.get("optional"), f"{var['name']}: a required key is missing"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts: dict[str, dict[str, str]] = {SERVICE_ACCOUNT_DIR: dict(service_account)}
    for mount in spec.get("volumeMounts", ()):
        ref = volumes[mount["name"]]["configMap"]
        data = configmaps.get(ref["name"])
        assert data is not None or ref.get("optional"), f"ConfigMap {ref['name']} is required"
        mounts[mount["mountPath"]] = dict(data or {})
    command = [*spec["command"], *spec.get("args", ())]
    assert command[0] == "nlproxy"
    return PodSpec([sys.executable, "-m", "nlproxy", *command[1:]], env, mounts)


def start(spec: PodSpec, netns: str, scratch: Path) -> subprocess.Popen[str]:
    """Start ``spec`` in ``netns`` with its mounts; stderr is piped (JSON log lines)."""
    by_base: dict[str, Path] = {}
    for target, files in spec.mounts.items():
        real = Path(os.path.realpath(target))
        base = real
        while not base.exists():
            base = base.parent
        upper = by_base.setdefault(str(base), scratch / f"upper{len(by_base)}")
        here = upper / real.relative_to(base)
        here.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (here / name).write_text(text)
    script = ["set -e"]
    for i, (base, upper) in enumerate(by_base.items()):
        work = scratch / f"work{i}"
        work.mkdir()
        script.append(
            f"mount -t overlay overlay -o lowerdir={base},upperdir={upper},workdir={work} {base}"
        )
    script.append('exec "$@"')
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "NLPROXY_"))}
    return subprocess.Popen(
        ["ip", "netns", "exec", netns, "sh", "-c", "\n".join(script), "pod", *spec.argv],
        env={**keep, **spec.env},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
