"""The conntrack sysctls where the daemon itself may not set them: the shipped DaemonSet's
privileged init container, and the systemd unit's ``ExecStartPre=+`` (both ``nlproxy run
--init-only``). Each is run as shipped in a fresh network namespace whose TCP timeouts were set
to something else (per-namespace sysctls: the machine's own are not touched), and must set
kube-proxy's values there while the proxy's own container keeps its two capabilities.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.kernel import pod
from tests.netns import sh

ROOT = Path(__file__).resolve().parents[2]
TIMEOUTS = {
    "net.netfilter.nf_conntrack_tcp_timeout_established": "86400",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait": "3600",
}


def scrambled(make_netns: Callable[[str], str]) -> str:
    ns = make_netns("ctinit")
    for key in TIMEOUTS:
        sh("sysctl", "-qw", f"{key}=1234", ns=ns)
    return ns


def timeouts(ns: str) -> dict[str, str]:
    return {key: sh("sysctl", "-n", key, ns=ns).strip() for key in TIMEOUTS}


def test_the_daemonsets_init_container_sets_them(
    make_netns: Callable[[str], str], tmp_path: Path
) -> None:
    ds = pod.shipped(pod.DAEMONSET, "DaemonSet")["spec"]["template"]["spec"]
    [init] = ds["initContainers"]
    [proxy] = ds["containers"]
    assert init["securityContext"] == {"privileged": True}  # a writable /proc/sys
    assert proxy["securityContext"]["capabilities"] == {
        "drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]
    }  # fmt: skip
    assert "privileged" not in proxy["securityContext"]
    assert init["image"] == proxy["image"]
    ns = scrambled(make_netns)
    spec = pod.daemonset_pod(
        node_name="n1",
        configmaps={"nlproxy": dict(pod.shipped(pod.CONFIGMAP, "ConfigMap")["data"])},
        service_account={},
        service_env={},
        container=init["name"],
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = pod.start(spec, ns, scratch)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert timeouts(ns) == TIMEOUTS
    assert "Traceback" not in err


def test_the_systemd_units_exec_start_pre_sets_them(make_netns: Callable[[str], str]) -> None:
    unit = (ROOT / "deploy/systemd/nlproxy.service").read_text().splitlines()
    [pre] = [line.split("=", 1)[1] for line in unit if line.startswith("ExecStartPre=")]
    assert pre.startswith("+")  # full privileges for this step only
    [start] = [line.split("=", 1)[1] for line in unit if line.startswith("ExecStart=")]
    assert pre.removeprefix("+") == f"{start} --init-only"  # the same arguments as the daemon
    # The package's own arguments ($NLPROXY_ARGS), with its config file.
    default = (ROOT / "packaging/deb/default").read_text()
    [args] = [line.split("=", 1)[1] for line in default.splitlines() if line.startswith("NLPROXY_")]
    argv = shlex.split(args.strip('"'))
    argv[argv.index("--config") + 1] = str(ROOT / "packaging/deb/config.yaml")
    ns = scrambled(make_netns)
    words = shlex.split(pre.removeprefix("+"))
    assert words[0] == "/opt/nlproxy/bin/nlproxy"
    cmd = [sys.executable, "-m", "nlproxy", "--netns", ns,
           *[w for w in words[1:] if w != "$NLPROXY_ARGS"]]  # fmt: skip
    at = cmd.index("run") + 1
    cmd[at:at] = argv
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert timeouts(ns) == TIMEOUTS
