"""Commands about the store itself, not a task: ``doctor`` and ``iam-policy``.

``doctor`` runs the whole probe (``objmanifest.store.probe``) against the URL's bucket and
prefix and prints what the store enforces and how it answers, one row per check, with the
permission a refused call lacked. ``iam-policy`` prints the least-privilege access policy
of a role for the URL in its cloud's form (an AWS IAM policy, an Azure custom role and its
condition, a GCS custom role and its conditional binding: ``objmanifest.store.access_policy``);
it sends no request.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timezone
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

import objmanifest as om
from objmanifest.store import PROBE_PREFIX, access_needed, access_policy
from objmanifest.store.probe import Check, ProbeReport, probe_store

from ..wire.errors import UsageError
from ..wire.exits import ExitCode
from .context import NO_STORE, Context

SKEW_LIMIT = 15 * 60.0
"""Beyond this much skew AWS (and SeaweedFS) refuse signed requests (RequestTimeTooSkewed)."""

_RESULT_STYLE = {"ok": "green", "failed": "bold red", "denied": "yellow", "error": "yellow"}


def cmd_doctor(ctx: Context) -> int:
    store = ctx.store()
    # One listing first: a missing bucket, an endpoint that does not answer or refused
    # credentials are one error (its exit code and fix), not a table of the same one. A
    # refused listing goes on: the checks below say which permission is missing.
    with contextlib.suppress(om.AccessDenied):
        next(iter(store.list(PROBE_PREFIX)), None)
    report = probe_store(store, PROBE_PREFIX + store.runtime.new_id(), racers=ctx.args.racers)
    skew = _skew(report.store_time)
    code = exit_code(report)
    ctx.out.result(doctor_json(report, skew, code), doctor_table(report, skew), verdict(report))
    return int(code)


def _skew(store_time: datetime | None) -> float | None:
    """Seconds the store's clock is ahead of this machine's (whole seconds: ``Date`` has no
    more); None if the store's time is not known."""
    if store_time is None:
        return None
    return round((store_time - datetime.now(timezone.utc)).total_seconds(), 1)


def exit_code(report: ProbeReport) -> ExitCode:
    """0 when safe; 12 when the store failed a required check; 13 when a required check
    could not be asked (a refused call, a store fault)."""
    if report.failed:
        return ExitCode.UNSUPPORTED
    if report.undecided:
        return ExitCode.STORE_ERROR
    return ExitCode.OK


def missing(check: Check) -> str | None:
    """The permission a refused call of ``check`` lacked, in words."""
    if check.denied is None:
        return None
    return access_needed(check.denied.op, check.denied.address)


def doctor_json(report: ProbeReport, skew: float | None, code: ExitCode) -> dict[str, Any]:
    return {
        "url": report.url,
        "safe": report.safe,
        "exit_code": int(code),
        "store_time": report.store_time.isoformat() if report.store_time else None,
        "skew_seconds": skew,
        "checks": [
            {
                "name": c.name,
                "required": c.required,
                "verdict": c.verdict,
                "answer": c.answer,
                "problem": c.problem or None,
                "missing_permission": missing(c),
            }
            for c in report.checks
        ],
    }


def _result(check: Check) -> Text:
    if check.verdict == "failed" and not check.required:
        return Text("no", style="yellow")
    return Text(check.verdict, style=_RESULT_STYLE.get(check.verdict, "dim"))


def doctor_table(report: ProbeReport, skew: float | None) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=f"doctor {report.url}", title_justify="left")
    for name in ("check", "needed", "result", "how the store answered"):
        table.add_column(name)
    for check in report.checks:
        answer = check.answer
        lacking = missing(check)
        if lacking:
            answer = f"AccessDenied: needs {lacking}"
        table.add_row(
            Text(check.name),
            Text("required" if check.required else "info", style="" if check.required else "dim"),
            _result(check),
            Text(answer),
        )
    if skew is None:
        table.add_row("clock skew", Text("info", style="dim"), Text("-", style="dim"), "unknown")
    else:
        far = abs(skew) > SKEW_LIMIT
        note = (
            " (over 15 minutes: AWS refuses signed requests as RequestTimeTooSkewed)"
            if far
            else " (leases follow the store's clock, so skew does not matter to them)"
        )
        table.add_row(
            "clock skew",
            Text("info", style="dim"),
            Text("far" if far else "ok", style="yellow" if far else "green"),
            f"store {skew:+.1f}s from this machine{note}",
        )
    return table


def verdict(report: ProbeReport) -> str:
    if report.failed:
        problems = "; ".join(c.problem for c in report.failed)
        return f"NOT SAFE: {report.url} {problems}"
    if report.undecided:
        names = ", ".join(c.name for c in report.undecided)
        return (
            f"UNDECIDED: {names} could not be checked (a refused call or a store fault, "
            "see above); `objmanifest iam-policy` prints the permissions objmanifest needs"
        )
    return f"safe: {report.url} enforces everything objmanifest relies on"


def cmd_iam_policy(ctx: Context) -> int:
    url = ctx.opt("url")
    if not url:
        raise UsageError(NO_STORE)
    document = access_policy(str(url), ctx.args.role)
    if ctx.out.json_mode:
        ctx.out.emit_json(document)
    else:
        ctx.out.line(_indented(document))
    return 0


def _indented(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2)
