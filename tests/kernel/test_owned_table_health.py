"""With ``--owned-table``, a kept ``externalTrafficPolicy: Local`` Service keeps its health-check
node port answering across restarts, as without the flag (``test_daemon_keep_healthcheck.py``).

The health-check record (``sync/health.py``) is the only place the port and its local endpoint
count outlive the process. An owned table carries no restart record (it is re-taken by a batch
at every start), but it must carry the health-check record all the same; and a plain table
that the first ``--owned-table`` start deletes and creates owned loses the chain with it, so
that batch writes the record again.
"""

from __future__ import annotations

from pathlib import Path

from nlproxy.demo.testbed import Testbed
from tests.kernel import topo
from tests.kernel.daemon import (
    VIP_A,
    Daemon,
    answered_by,
    daemon,
    free_node_port,
    hc_get,
    lb_local,
    local_endpoints,
    nft,
    objects,
    wait_until,
    write_manifests,
)

testbed = topo.testbed

OWNED = "--owned-table"


def _break(path: Path) -> None:
    path.write_text(path.read_text() + "\n---\nkind: Service\nmetadata: {name: [oops\n")


def _kept_answers(tb: Testbed, proc: Daemon, port: int) -> None:
    """``proc`` keeps the broken file's Service and answers its health check for 2 endpoints."""
    wait_until(lambda: bool(proc.events("sync.kept")), 10.0, "the Service kept")
    assert answered_by(tb, VIP_A, 3) == {"pod-a"}
    wait_until(lambda: hc_get(proc, port)[0] != 0, 10.0, "the kept health check")
    code, body = hc_get(proc, port)
    assert code == 200, body
    assert local_endpoints(body) == 2


def _setup(tb: Testbed, tmp_path: Path) -> tuple[Path, Path, int]:
    d = tmp_path / "m"
    d.mkdir()
    write_manifests(d / "objects.yaml", objects(tb, ["pod-a"]))
    lb = d / "lb.yaml"
    port = free_node_port()
    write_manifests(lb, lb_local(tb, port, ["pod-a", "pod-b"]))
    return d, lb, port


def test_an_owned_table_keeps_the_health_check_record(testbed: Testbed, tmp_path: Path) -> None:
    d, lb, port = _setup(testbed, tmp_path)
    with daemon(testbed, d, OWNED) as first:
        wait_until(lambda: hc_get(first, port)[0] == 200, 10.0, "the health check")
        assert local_endpoints(hc_get(first, port)[1]) == 2
        assert first.stop() == 0
    assert "health-check-record" in nft(testbed, "list", "table", "ip", "nlproxy")

    _break(lb)
    with daemon(testbed, d, OWNED) as second:
        _kept_answers(testbed, second, port)
        assert second.stop() == 0
    # Still broken: the record the second process found and kept is there for a third.
    with daemon(testbed, d, OWNED) as third:
        _kept_answers(testbed, third, port)
        assert third.stop() == 0


def test_a_plain_table_made_owned_writes_the_record_again(testbed: Testbed, tmp_path: Path) -> None:
    d, lb, port = _setup(testbed, tmp_path)
    with daemon(testbed, d) as plain:
        wait_until(lambda: hc_get(plain, port)[0] == 200, 10.0, "the health check")
        assert plain.stop() == 0

    _break(lb)
    with daemon(testbed, d, OWNED) as owned:
        _kept_answers(testbed, owned, port)
        # The plain table was deleted and created owned in one batch: the record with it.
        (event,) = [e for e in owned.events("table.owned") if e["family"] == "ip"]
        assert event["recreated"] is True
        assert owned.stop() == 0
    assert "health-check-record" in nft(testbed, "list", "table", "ip", "nlproxy")
    with daemon(testbed, d, OWNED) as again:
        _kept_answers(testbed, again, port)
        assert again.stop() == 0
