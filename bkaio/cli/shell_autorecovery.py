"""`bkaio shell` commands of autorecovery: recover, decommission, recommission, autorecovery,
lostbookierecoverydelay, triggeraudit, listunderreplicated, whoisauditor.

Each one calls a plain function of `bkaio.autorecovery` (the same ones the bookies'
/api/v1/autorecovery/... endpoints call) and prints with `bkaio.cli.output`. Added to the
shell group by `add_autorecovery_commands(shell)`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from bkaio.cli.common import client_options, json_option, metadata_option, run
from bkaio.cli.output import emit, table
from bkaio.cli.params import BOOKIE_ID, FiniteFloat
from bkaio.errors import BKError

F = TypeVar("F", bound=Callable[..., Any])
_PROGRESS_LINE_SECONDS = 5.0  # Without a terminal: one progress line this often, at most.


class ReplicationIncompleteError(BKError):
    """recover/decommission returned with ledgers it could not re-replicate (or skipped)."""


def admin_token_option(function: F) -> F:
    decorator = click.option(
        "--admin-token",
        envvar="BKAIO_ADMIN_TOKEN",
        default="",
        help="The bookies' admin token (default: $BKAIO_ADMIN_TOKEN); needed to copy entries.",
    )
    return decorator(function)


def require_admin_token(admin_token: str, command: str) -> None:
    """Copying a ledger's entries needs its master key, which bookies give only to a request
    with their admin token: without one every ledger would fail, after the whole timeout."""
    if not admin_token:
        raise click.UsageError(
            f"{command} copies entries, which needs the bookies' admin token ([admin] token): "
            "pass --admin-token or set BKAIO_ADMIN_TOKEN (bkaio standalone keeps its token in "
            "standalone.json)"
        )


def timeout_option(action: str, default: float) -> Callable[[F], F]:
    # Not `--timeout`: every shell command's `--timeout` is the wait for etcd (metadata_option).
    return click.option(
        f"--{action}-timeout",
        "timeout_seconds",
        default=default,
        show_default=True,
        type=FiniteFloat(min=1.0),
        help="Give up after this many seconds (ledgers left stay marked for the workers).",
    )


def format_age(seconds: float) -> str:
    """3 s, 4m05s, 2h03m, 3d04h: the age of a mark at a glance."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


class _ProgressView:
    """Progress of a drain on stderr: a live bar on a terminal, a line every few seconds
    otherwise; failed ledgers as one line each, at once."""

    def __init__(self, action: str, bookie_id: str) -> None:
        self._console = Console(stderr=True)
        self._live = self._console.is_terminal
        self._label = f"{action} {bookie_id}"
        self._last_line = 0.0
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[ledgers]}"),
            TextColumn("{task.fields[entries]}"),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
            disable=not self._live,
        )
        self._task = self._bar.add_task(self._label, total=None, ledgers="", entries="")

    def __enter__(self) -> _ProgressView:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)

    def update(self, step: Any) -> None:
        ledgers = f"{step.ledgers_done}/{step.ledgers_total} ledgers"
        entries = f"{step.entries}/{step.entries_total} entries"
        if self._live:
            self._bar.update(
                self._task,
                total=step.entries_total or None,
                completed=step.entries,
                ledgers=ledgers,
                entries=entries,
            )
            return
        now = time.monotonic()
        if now - self._last_line >= _PROGRESS_LINE_SECONDS:
            self._last_line = now
            sys.stderr.write(f"{self._label}: {ledgers}, {entries}, {step.seconds:.0f} s\n")

    def failed(self, failure: Any) -> None:
        where = f" entry {failure.entry_id}" if failure.entry_id is not None else ""
        line = f"FAILED ledger {failure.ledger_id}{where}: {failure.error}"
        if self._live:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            sys.stderr.write(line + "\n")


def _report_line(verb: str, report: Any) -> str:
    line = (
        f"{verb} {report.bookie_id}: {report.ledgers_replicated} ledgers, "
        f"{report.fragments} fragments, {report.entries} entries "
        f"({report.bytes / 1e6:.1f} MB) in {report.seconds:.1f} s "
        f"({report.entries_per_second:.0f} entries/s)"
    )
    if report.open_ledgers_recovered:
        line += f"; {report.open_ledgers_recovered} open ledgers fenced and closed"
    if report.skipped_open:
        line += f"; {len(report.skipped_open)} open ledgers skipped: {list(report.skipped_open)}"
    if report.failed:
        line += f"; FAILED ledgers: {sorted(report.failed)}"
    return line


def _finish(action: str, report: Any, as_json: bool) -> None:
    emit(report.to_dict(), as_json=as_json, human=_report_line(f"{action}ed", report))
    if report.failed:
        failed = sorted(report.failed)
        shown = ", ".join(map(str, failed[:10])) + (", ..." if len(failed) > 10 else "")
        raise ReplicationIncompleteError(
            f"{action} {report.bookie_id}: {len(failed)} ledger(s) not re-replicated: {shown}; "
            "they stay marked for the replication workers"
        )
    if report.skipped_open:
        raise ReplicationIncompleteError(
            f"{action} {report.bookie_id}: {len(report.skipped_open)} open ledgers skipped"
        )


def _plan_human(plan: Any, detailed: bool) -> str:
    if not plan.ledgers:
        return f"no ledger names {plan.bookie_id}"
    rows = []
    for ledger in plan.ledgers:
        row: dict[str, Any] = {
            "ledger_id": ledger.ledger_id,
            "state": ledger.state,
            "fragments": len(ledger.fragments),
            "entries": ledger.entries,
            "action": "skip (open)"
            if ledger.skipped
            else ("fence, close, copy" if ledger.would_fence else "copy"),
        }
        if detailed:
            row["to"] = ",".join(sorted({f.replacement or "NONE" for f in ledger.fragments}))
        rows.append(row)
    columns = list(rows[0])
    state = "registered (needs --force)" if plan.registered else "not registered"
    summary = f"{len(plan.ledgers)} ledgers, {plan.entries} entries on {plan.bookie_id} ({state})"
    return table(rows, columns) + "\n" + summary


@click.command("recover")
@click.argument("bookie_id", type=BOOKIE_ID)
@click.option("--force", is_flag=True, help="Recover although the bookie is registered and alive.")
@click.option("--query", is_flag=True, help="Only list the ledgers that would be recovered.")
@click.option(
    "--dry-run", is_flag=True, help="Print the plan (fragments, entries, targets); change nothing."
)
@click.option(
    "--skip-open-ledgers", is_flag=True, help="Leave ledgers that are not closed alone (no fence)."
)
@timeout_option("recover", 600.0)
@admin_token_option
@metadata_option
@json_option
def recover(
    bookie_id: str,
    force: bool,
    query: bool,
    dry_run: bool,
    skip_open_ledgers: bool,
    timeout_seconds: float,
    admin_token: str,
    metadata_uri: str,
    as_json: bool,
) -> None:
    """Re-replicate now every fragment a dead (or, with --force, live) bookie holds."""
    from bkaio import autorecovery

    if query or dry_run:
        plan = run(
            autorecovery.plan_recovery(
                metadata_uri,
                bookie_id,
                skip_open_ledgers=skip_open_ledgers,
                replacements=dry_run,
            )
        )
        emit(plan.to_dict(), as_json=as_json, human=_plan_human(plan, detailed=dry_run))
        return
    require_admin_token(admin_token, "recover")
    options = client_options()  # $BKAIO_TLS_CA (also for HTTPS admin APIs), the HELLO token.

    async def go() -> Any:
        with _ProgressView("recover", bookie_id) as view:
            return await autorecovery.recover_bookie(
                metadata_uri,
                bookie_id,
                view.update,
                admin_token=admin_token,
                **options,
                force=force,
                skip_open_ledgers=skip_open_ledgers,
                on_failure=view.failed,
                timeout_seconds=timeout_seconds,
            )

    _finish("recover", run(go()), as_json)


@click.command("decommission")
@click.argument("bookie_id", type=BOOKIE_ID)
@click.option(
    "--grace",
    "grace_seconds",
    default=30.0,
    show_default=True,
    type=FiniteFloat(min=0.0),
    help="Seconds writers get to move open ledgers off the bookie before they are fenced.",
)
@timeout_option("decommission", 900.0)
@admin_token_option
@metadata_option
@json_option
def decommission(
    bookie_id: str,
    grace_seconds: float,
    timeout_seconds: float,
    admin_token: str,
    metadata_uri: str,
    as_json: bool,
) -> None:
    """Drain a bookie: read-only for good (until recommission), copy its fragments elsewhere."""
    from bkaio import autorecovery

    require_admin_token(admin_token, "decommission")
    options = client_options()  # $BKAIO_TLS_CA (also for HTTPS admin APIs), the HELLO token.

    async def go() -> Any:
        with _ProgressView("decommission", bookie_id) as view:
            return await autorecovery.decommission_bookie(
                metadata_uri,
                bookie_id,
                view.update,
                admin_token=admin_token,
                **options,
                open_ledger_grace_seconds=grace_seconds,
                on_failure=view.failed,
                timeout_seconds=timeout_seconds,
            )

    _finish("decommission", run(go()), as_json)


@click.command("recommission")
@click.argument("bookie_id", type=BOOKIE_ID)
@metadata_option
@json_option
def recommission(bookie_id: str, metadata_uri: str, as_json: bool) -> None:
    """Let a decommissioned bookie take writes again (it turns writable within a moment)."""
    from bkaio import autorecovery

    removed = run(autorecovery.recommission_bookie(metadata_uri, bookie_id))
    human = (
        f"recommissioned {bookie_id}"
        if removed
        else f"{bookie_id} was not decommissioned: nothing to do"
    )
    emit({"bookie_id": bookie_id, "was_decommissioned": removed}, as_json=as_json, human=human)


@click.command("autorecovery")
@click.option("--enable", is_flag=True, help="Turn autorecovery on.")
@click.option("--disable", is_flag=True, help="Turn autorecovery off.")
@click.option("--status", is_flag=True, help="Show its state (the default).")
@metadata_option
@json_option
def autorecovery_switch(
    enable: bool, disable: bool, status: bool, metadata_uri: str, as_json: bool
) -> None:
    """The cluster-wide autorecovery switch: --enable, --disable or --status."""
    from bkaio import autorecovery

    if sum((enable, disable, status)) > 1:
        raise click.UsageError("give one of --enable, --disable, --status")

    async def go() -> Any:
        if enable or disable:
            await autorecovery.set_autorecovery_enabled(metadata_uri, enable)
        return await autorecovery.autorecovery_status(metadata_uri)

    state = run(go())
    delay = state.lost_bookie_delay_seconds
    human = "\n".join(
        [
            f"autorecovery: {'enabled' if state.enabled else 'DISABLED'}",
            f"auditor: {state.auditor or 'none elected'}",
            f"lost bookie delay: {'each config' if delay is None else f'{delay:g} s'}",
            f"under-replicated ledgers: {state.under_replicated_ledgers}",
            f"decommissioned: {', '.join(state.decommissioned_bookies) or 'none'}",
        ]
    )
    emit(state.to_dict(), as_json=as_json, human=human)


@click.command("lostbookierecoverydelay")
@click.option("--get", "get_", is_flag=True, help="Print the delay auditors apply (default).")
@click.option(
    "--set",
    "set_seconds",
    type=FiniteFloat(min=0.0, max=7 * 24 * 3600.0),
    help="Set it cluster-wide, in seconds; the auditor re-plans at once.",
)
@click.option("--reset", is_flag=True, help="Drop the cluster-wide value: each config's again.")
@metadata_option
@json_option
def lost_bookie_recovery_delay(
    get_: bool, set_seconds: float | None, reset: bool, metadata_uri: str, as_json: bool
) -> None:
    """Seconds a bookie must stay gone before its ledgers are re-replicated: --get or --set."""
    from bkaio import autorecovery
    from bkaio.config import AutorecoveryConfig

    default_seconds = AutorecoveryConfig().lost_bookie_delay_seconds

    if sum((get_, set_seconds is not None, reset)) > 1:
        raise click.UsageError("give one of --get, --set SECONDS, --reset")

    async def go() -> Any:
        if set_seconds is not None or reset:
            await autorecovery.set_lost_bookie_delay(metadata_uri, set_seconds)
        return await autorecovery.get_lost_bookie_delay(metadata_uri, default_seconds)

    delay = run(go())
    if delay.from_metadata:
        human = f"lost bookie delay: {delay.seconds:g} s (set in metadata)"
    else:
        human = (
            "lost bookie delay: not set in metadata; auditors use their [autorecovery] "
            f"lost_bookie_delay_seconds ({delay.seconds:g} s unless configured)"
        )
    emit(delay.to_dict(), as_json=as_json, human=human)


@click.command("triggeraudit")
@metadata_option
@json_option
def trigger_audit(metadata_uri: str, as_json: bool) -> None:
    """Audit now: lost bookies' ledgers are marked without waiting out the delay."""
    from bkaio import autorecovery

    auditor = run(autorecovery.trigger_audit(metadata_uri))
    human = (
        f"audit requested from {auditor}"
        if auditor
        else "audit requested; no auditor is elected now (the next one audits when elected)"
    )
    emit({"requested": True, "auditor": auditor}, as_json=as_json, human=human)


@click.command("whoisauditor")
@metadata_option
@json_option
def who_is_auditor(metadata_uri: str, as_json: bool) -> None:
    """The bookie (or autorecovery process) currently elected auditor, if any."""
    from bkaio import autorecovery

    auditor = run(autorecovery.who_is_auditor(metadata_uri))
    emit({"auditor": auditor}, as_json=as_json, human=auditor or "no auditor elected")


@click.command("listunderreplicated")
@metadata_option
@json_option
def list_under_replicated(metadata_uri: str, as_json: bool) -> None:
    """Ledgers marked under-replicated: the bookies they miss (or that miss entries), and
    how long ago they were marked. A record that does not decode is named on stderr (autorecovery
    skips it until it is deleted)."""
    from bkaio import autorecovery
    from bkaio.meta import BadUnderreplicationRecord

    bad: list[BadUnderreplicationRecord] = []
    records = run(autorecovery.list_under_replicated(metadata_uri, bad=bad))
    for item in bad:
        click.echo(
            f"bad record {item.key} (version {item.version}), skipped by autorecovery until "
            f"deleted: {item.error}",
            err=True,
        )
    rows: list[dict[str, Any]] = []
    for record in records:
        age = autorecovery.mark_age_seconds(record)
        rows.append(
            {
                "ledger_id": record.ledger_id,
                "missing_bookies": list(record.missing_bookies),
                "forced_bookies": list(record.forced_bookies),
                "incomplete_bookies": list(record.incomplete_bookies),
                "marked_at": datetime.fromtimestamp(record.ctime_ms / 1000, UTC).isoformat(
                    timespec="seconds"
                ),
                "age_seconds": round(age, 1),
            }
        )
    human = table(
        [
            {
                "ledger_id": row["ledger_id"],
                "missing": ",".join(row["missing_bookies"]) or "-",
                "incomplete": ",".join(row["incomplete_bookies"]) or "-",
                "age": format_age(row["age_seconds"]),
                "marked_at": row["marked_at"],
            }
            for row in rows
        ],
        ["ledger_id", "missing", "incomplete", "age", "marked_at"],
    )
    emit(rows, as_json=as_json, human=human if rows else "no under-replicated ledgers")


AUTORECOVERY_COMMANDS = (
    recover,
    decommission,
    recommission,
    autorecovery_switch,
    lost_bookie_recovery_delay,
    trigger_audit,
    who_is_auditor,
    list_under_replicated,
)


def add_autorecovery_commands(group: click.Group) -> None:
    for command in AUTORECOVERY_COMMANDS:
        group.add_command(command)
