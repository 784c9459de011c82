"""The health-check record: each ``externalTrafficPolicy: Local`` Service's health-check node
port and local endpoint count, kept in the tables beside the restart record.

Why in the tables: a Service kept as programmed while its manifest file does not parse at start
(``keep.py``) is in no plan, so a restarted daemon would stop answering its health-check node
port, and a load balancer would cut its traffic all the same. What is kept comes from the tables
(the only state that outlives the process: a container's ``/run`` does not, and a systemd unit
may not write elsewhere), so the port and the count the previous process answered with are
recorded there too.

How: a chain that nothing jumps to (:data:`HEALTH_CHAIN`), one empty rule per health-check
node port, its comment ``hc <port> <local endpoints> <namespace/name>``, in the IPv4 table. The
Syncer writes it (add chain, flush, add rules) only in a batch whose set of health checks
changed, and takes it out of every read-back (``fingerprint.take_record``): it is no drift, and
a restart whose set is unchanged sends nothing for it.

Pure: no I/O, clock or logging.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from nlproxy.cluster.model import ServiceKey
from nlproxy.nft.ir import FAMILIES, Chain, Family, Operation, Rule, Ruleset, Verb
from nlproxy.serve.healthcheck import HealthCheck
from nlproxy.sync.fingerprint import HEALTH_CHAIN, RECORD_COMMENT_MAX

__all__ = [
    "HEALTH_CHAIN",
    "HealthRecord",
    "comment",
    "fitted",
    "health_ops",
    "parse",
    "take_health",
]

_ENTRY_RE = re.compile(r"hc (\d{1,5}) (\d{1,9}) ([^ /]*)/([^ ]*)")


def fitted(service: str, port: int, local_endpoints: int) -> str:
    """``service`` (``namespace/name``) as the record of ``port`` holds it: cut to what fits
    :data:`~nlproxy.sync.fingerprint.RECORD_COMMENT_MAX` with the rest of the comment (a
    namespace and a name of 63 characters each do not). A cut name still tells a Service it
    was cut from (:meth:`nlproxy.sync.keep.Keeper.kept_health` compares names cut alike), and
    what a port answers is its count; only the name its body shows is cut."""
    room = RECORD_COMMENT_MAX - len(f"hc {port} {local_endpoints} ")
    return service[:room]


def comment(port: int, check: HealthCheck) -> str:
    """The comment of ``port``'s rule, at most ``RECORD_COMMENT_MAX`` characters (the rule's
    fingerprint may follow it in the kernel)."""
    count = check.local_endpoints
    return f"hc {port} {count} {fitted(str(check.service), port, count)}"


def parse(text: str) -> tuple[int, HealthCheck] | None:
    """The port and health check of a rule's comment; None when it is not one."""
    m = _ENTRY_RE.match(text)
    if m is None:
        return None
    key = ServiceKey(namespace=m.group(3), name=m.group(4))
    return int(m.group(1)), HealthCheck(key, int(m.group(2)))


def health_ops(checks: Mapping[int, HealthCheck]) -> list[Operation]:
    """The operations that make the table's record ``checks`` (creating its chain if needed,
    leaving it empty when there are none)."""
    chain = Chain(name=HEALTH_CHAIN)
    return [
        Operation(Verb.ADD, chain),
        Operation(Verb.FLUSH, chain),
        *(
            Operation(Verb.ADD, Rule(chain=HEALTH_CHAIN, exprs=(), comment=comment(p, c)))
            for p, c in sorted(checks.items())
        ),
    ]


def take_health(rs: Ruleset | None) -> dict[int, HealthCheck] | None:
    """Remove the record's chain from a read-back (the plan has none) and return what it holds;
    None when the table has no record."""
    if rs is None or rs.chains.pop(HEALTH_CHAIN, None) is None:
        return None
    out: dict[int, HealthCheck] = {}
    for rule in rs.rules.pop(HEALTH_CHAIN, []):
        entry = parse(rule.comment)
        if entry is not None:
            out[entry[0]] = entry[1]
    return out


class HealthRecord:
    """What the IPv4 table's health-check record holds, as the Syncer that writes it knows it.

    Args:
        enabled: keep the record at all (with the restart records; False: no operations).
    """

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._written: dict[int, HealthCheck] | None = None  # None: not known
        self._sending: dict[int, HealthCheck] | None = None  # joined to a batch, not committed

    def read(self, tables: Mapping[Family, Ruleset | None]) -> dict[int, HealthCheck] | None:
        """Take the record out of tables read back whole (every family's: the plan has none);
        what the IPv4 one held (None: no record)."""
        found = None
        for family, rs in tables.items():
            held = take_health(rs)
            if family is FAMILIES[0]:
                found = held
        self._written = found or {}
        return found

    def adopt(self, checks: dict[int, HealthCheck]) -> dict[int, HealthCheck]:
        """The tables hold ``checks`` (a restart the restart records vouch for); returns it."""
        self._written = dict(checks)
        return checks

    def forget(self) -> None:
        """The record may be gone (a table repaired): the next commit writes it."""
        self._written = None

    def ops(self, family: Family, checks: Mapping[int, HealthCheck]) -> list[Operation]:
        """The operations that write ``checks`` when ``family``'s table holds the record (the
        IPv4 one) and it holds something else; none otherwise."""
        if not self.enabled or family is not FAMILIES[0] or checks == self._written:
            return []
        return health_ops(checks)

    def joined(
        self, family: Family, checks: Mapping[int, HealthCheck], ops: list[Operation], claim: int
    ) -> tuple[list[Operation], int]:
        """``family``'s batch ``ops`` (``claim`` of them not counted) followed by :meth:`ops`
        of ``checks``, which are not counted either; then :meth:`committed`."""
        record = self.ops(family, checks)
        self._sending = dict(checks) if record else None
        return ([*ops, *record], claim + len(record)) if record else (ops, claim)

    def committed(self, programmed: Ruleset | None) -> None:
        """The batch of the last :meth:`joined` was committed; ``programmed`` (the Syncer's
        copy of that table, advanced by it) loses the chain, as a read-back does: no drift."""
        if self._sending is None:
            return
        self._written, self._sending = self._sending, None
        if programmed is not None:
            programmed.chains.pop(HEALTH_CHAIN, None)
            programmed.rules.pop(HEALTH_CHAIN, None)
