"""``nlproxy plan``'s report as text or JSON (``plan_report.py`` builds it).

The text is for an operator: per Service (the shared objects last) each change as ``+``, ``-``
or ``~`` followed by the object nft-like, without the rules' fingerprints, and the conntrack
flows that would be deleted. The JSON is for tools: every operation of every batch in order,
and the same changes per Service. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from nlproxy.conntrack.kernel import FlowFilter
from nlproxy.operate.plan_report import Report

_FP = re.compile(r' comment "fp=[0-9a-f]{12}"| fp=[0-9a-f]{12}(?=")')


def _quiet(line: str) -> str:
    """``line`` without the rule fingerprints (``reconcile.fingerprint``): bookkeeping, not
    what the rule does."""
    return _FP.sub("", line)


def describe_filter(flt: FlowFilter) -> str:
    """A cleanup filter in words: ``udp to 10.96.0.10:53 answered by 10.244.1.5:53``."""
    text = f"{flt.proto or 'any'} to {flt.orig_dst or 'any address'}:{flt.orig_dport or 'any'}"
    if flt.reply_src is not None:
        text += f" answered by {flt.reply_src}"
        if flt.reply_sport is not None:
            text += f":{flt.reply_sport}"
    if flt.dnat is False:
        text += " not DNAT'd (rejected while the Service had no endpoints)"
    return text


def render_text(rep: Report) -> str:
    """The report as an operator reads it."""
    lines: list[str] = []
    ops = rep.operations
    if not rep.changed:
        lines.append(
            f"No changes: the kernel's rules are what the next sync would program "
            f"({rep.services} Services)."
        )
    else:
        per = ", ".join(f"{family} {count}" for family, count in ops.items())
        services = sum(1 for g in rep.groups if g.owner and g.changes)
        lines.append(
            f"The next sync would send {sum(ops.values())} operations ({per}) for {services} "
            f"Service{'' if services == 1 else 's'}"
            + (
                " and the shared objects"
                if any(not g.owner and g.changes for g in rep.groups)
                else ""
            )
            + (f", and delete {rep.flows} conntrack flows." if rep.flows else ".")
        )
    for group in rep.groups:
        lines.append("")
        lines.append(f"Service {group.owner}" if group.owner else "Shared objects")
        for c in group.changes:
            lines.append(_quiet(f"  {c.sign} {c.kind} {c.family} {c.name} {c.text}".rstrip()))
            if c.was:
                lines.append(_quiet(f"      was {c.was}"))
        lines += [
            f"  conntrack: delete {c.flows} flows: {describe_filter(c.filter)}"
            for c in group.cleanups
            if c.flows
        ]
    if rep.problems:
        lines.append("")
        lines += [f"Left out: {p}" for p in rep.problems]
    return "\n".join(lines) + "\n"


def report_json(rep: Report) -> dict[str, Any]:
    """The report as one JSON object: the batches exactly, and the changes per Service."""
    return {
        "changes": rep.changed,
        "operations": {str(f): c for f, c in rep.operations.items()},
        "conntrack_flows": rep.flows,
        "batches": [
            {
                "family": str(family),
                "operations": [
                    {
                        "verb": str(st.verb),
                        "kind": st.kind,
                        "name": st.name,
                        "object": f"{st.name} {st.text}".rstrip(),
                        "service": st.owner or None,
                    }
                    for st in family_steps
                ],
            }
            for family, family_steps in rep.batches
        ],
        "services": [
            {
                "service": g.owner or None,
                "changes": [
                    {
                        "change": {"+": "add", "-": "remove", "~": "change"}[c.sign],
                        "kind": c.kind,
                        "family": str(c.family),
                        "object": f"{c.name} {c.text}".rstrip(),
                        **({"was": c.was} if c.was else {}),
                    }
                    for c in g.changes
                ],
                "conntrack": [{"filter": str(c.filter), "flows": c.flows} for c in g.cleanups],
            }
            for g in rep.groups
        ],
        "left_out": list(rep.problems),
        "warnings": list(rep.warnings),
    }
